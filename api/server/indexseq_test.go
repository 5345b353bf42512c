package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// seqIndex is an Index whose LongestPrefix and Engines advance the
// sequence while they read, as a message applied concurrently would: an
// answer must report the sequence read before the index was.
type seqIndex struct {
	Index
	seq *atomic.Uint64
}

func (x seqIndex) LongestPrefix(q *indexer.Query, res *indexer.Result) error {
	x.seq.Add(1)
	return x.Index.LongestPrefix(q, res)
}

func (x seqIndex) Engines() []indexer.EngineInfo {
	x.seq.Add(1)
	return x.Index.Engines()
}

// TestIndexSeq: Config.IndexSeq's value reaches LongestPrefix and
// ListPods answers over gRPC (through the client's hand-written decoder)
// and HTTP/JSON, read before the index is asked; without a source every
// answer says 0.
func TestIndexSeq(t *testing.T) {
	tests := []struct {
		name   string
		source bool
		start  uint64
		want   uint64 // the sequence each answer reports
	}{
		{"no source", false, 0, 0},
		{"source", true, 41, 41},
		{"beyond 32 bits", true, 1<<40 + 7, 1<<40 + 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var seq atomic.Uint64
			f := newFixture(t, func(c *Config) {
				if tc.source {
					c.Index = seqIndex{Index: c.Index, seq: &seq}
					c.IndexSeq = seq.Load
				}
			})
			tokens := testutil.Seq(1000, 5*testBlockSize)
			f.hub.Apply(engine("a", 0), 0, []kvevents.Event{stored(t, tokens, 4)})
			ctx := context.Background()

			// Each answer advances the sequence once (seqIndex): reset it
			// before each so that every answer must report tc.want.
			seq.Store(tc.start)
			r, err := f.client.LongestPrefixTokens(ctx, testModel, tokens, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.GetIndexSeq() != tc.want || len(r.GetPods()) != 1 || r.GetPods()[0].GetMatchedBlocks() != 4 {
				t.Errorf("gRPC LongestPrefix: index_seq %d, pods %v; want index_seq %d and pod a with 4 blocks", r.GetIndexSeq(), r.GetPods(), tc.want)
			}

			seq.Store(tc.start)
			pods, err := f.client.Pods(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if pods.GetIndexSeq() != tc.want || len(pods.GetPods()) != 1 {
				t.Errorf("gRPC ListPods: index_seq %d, %d pods; want %d, 1", pods.GetIndexSeq(), len(pods.GetPods()), tc.want)
			}

			ids, _ := json.Marshal(tokens)
			seq.Store(tc.start)
			code, body := post(t, f.url+"/v1/longest-prefix", `{"tokens":`+string(ids)+`}`)
			var lp client.LongestPrefixJSON
			if err := json.Unmarshal(body, &lp); code != http.StatusOK || err != nil {
				t.Fatalf("HTTP longest-prefix: %d %v %s", code, err, body)
			}
			if lp.IndexSeq != tc.want {
				t.Errorf("HTTP longest-prefix: index_seq %d, want %d (%s)", lp.IndexSeq, tc.want, body)
			}

			seq.Store(tc.start)
			resp, err := http.Get(f.url + "/v1/pods")
			if err != nil {
				t.Fatal(err)
			}
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			var pj client.PodsJSON
			if err == nil {
				err = json.Unmarshal(body, &pj)
			}
			if resp.StatusCode != http.StatusOK || err != nil {
				t.Fatalf("HTTP pods: %d %v %s", resp.StatusCode, err, body)
			}
			if pj.IndexSeq != tc.want {
				t.Errorf("HTTP pods: index_seq %d, want %d (%s)", pj.IndexSeq, tc.want, body)
			}
		})
	}
}
