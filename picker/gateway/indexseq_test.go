package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/picker/gateway"
)

// healthyStreams is a server.StreamSource reporting each pod's stream
// connected and ok: the index vouches for their blocks.
type healthyStreams []string

func (h healthyStreams) Streams() []kvevents.StreamStats {
	out := make([]kvevents.StreamStats, len(h))
	for i, pod := range h {
		out[i] = kvevents.StreamStats{Engine: kvevents.EngineID{Model: testModel, Pod: pod}, Connected: true, Health: kvevents.HealthOK}
	}
	return out
}

// indexReplica is one replica of kvindex: its own index, fed the events
// every replica applies, and a server reporting seq as its index
// sequence (what a NATS-fed replica reports once applied through seq).
func indexReplica(t *testing.T, seq uint64, held map[string][]uint64, pods []string) *server.Server {
	t.Helper()
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods {
		ids := held[pod]
		if len(ids) == 0 {
			continue
		}
		hs, err := h.Chain(nil, nil, 0, ids, nil)
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]uint64, len(hs))
		for i := range hs {
			keys[i] = hs[i].Key
		}
		ix.Apply(kvevents.EngineID{Model: testModel, Pod: pod}, 0, []kvevents.Event{
			{Kind: kvevents.BlockStored, Hashes: keys, TokenIDs: ids[:len(keys)*bs], BlockSize: bs},
		})
	}
	srv, err := server.New(server.Config{Index: ix, BlockSize: bs, DefaultModel: testModel, ReadyGrace: -1,
		Streams: healthyStreams(pods), IndexSeq: func() uint64 { return seq }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// promptBody is a completions request for ids.
func promptBody(ids []uint64) string {
	b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": ids, "max_tokens": 1})
	return string(b)
}

// TestReplicasAgree: two picker replicas, each in front of its own
// kvindex replica holding the same index state at the same index
// sequence (one asked over gRPC on loopback, one in process), with the
// same scorer config but their endpoints listed in other orders, and one
// having routed other requests before, make the same decision for each
// request, ties included, and both report the index sequence: in the
// decision, in /v1/pick's JSON and in the ext_proc metadata.
func TestReplicasAgree(t *testing.T) {
	const seq = 1<<40 + 42 // beyond 32 bits, and exact as a string
	held := map[string][]uint64{
		"pod-a": testutil.Seq(0, 4*bs),
		"pod-b": testutil.Seq(0, 2*bs),
		"pod-c": testutil.Seq(5000, 3*bs),
	}
	eps := []gateway.Endpoint{{Pod: "pod-a", Addr: "10.0.0.1:8000"}, {Pod: "pod-b", Addr: "10.0.0.2:8000"},
		{Pod: "pod-c", Addr: "10.0.0.3:8000"}, {Pod: "pod-d", Addr: "10.0.0.4:8000"}}
	reversed := slices.Clone(eps)
	slices.Reverse(reversed)

	pods := []string{"pod-a", "pod-b", "pod-c", "pod-d"}
	srvA := indexReplica(t, seq, held, pods)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := srvA.NewGRPCServer() // the server's own codec: the hand-written encoder
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	srvB := indexReplica(t, seq, held, pods)

	newSvc := func(eps []gateway.Endpoint, src gateway.Source) *gateway.Service {
		cfg := picker.DefaultConfig()
		cfg.BlockSize = bs
		svc, err := gateway.New(gateway.Config{Endpoints: eps, Scorer: cfg, IndexTimeout: waitFor}, src)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	replicaA := newSvc(eps, remote(t, lis.Addr().String()))
	replicaB := newSvc(reversed, gateway.Local{Server: srvB})
	ctx := context.Background()
	pick := func(svc *gateway.Service, body string, hdr map[string]string) picker.Decision {
		t.Helper()
		r, err := gateway.ParseRequest([]byte(body), func(k string) string { return hdr[k] })
		if err != nil {
			t.Fatal(err)
		}
		d, done, err := svc.Pick(ctx, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		done() // each pick ends before the next: in-flight counts stay equal
		return d
	}
	// Replica A has routed other requests, ties among them.
	for i := range 20 {
		pick(replicaA, promptBody(testutil.Seq(100_000+i*1000, 2*bs)), nil)
	}

	tests := []struct {
		name string
		body string
		hdr  map[string]string
		want string // the pod, when the prefix decides; "" for a tie
	}{
		{"held longest by a", promptBody(testutil.Seq(0, 5*bs)), nil, "pod-a"},
		{"held by c", promptBody(testutil.Seq(5000, 3*bs+5)), nil, "pod-c"},
		{"held by nobody", promptBody(testutil.Seq(9000, 3*bs)), nil, ""},
		{"another held by nobody", promptBody(testutil.Seq(19000, 3*bs)), nil, ""},
		{"shorter than a block", promptBody(testutil.Seq(7, 3)), nil, ""},
		{"a session", promptBody(testutil.Seq(29000, 2*bs)), map[string]string{gateway.HeaderSession: "conv-7"}, ""},
	}
	picked := map[string]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := pick(replicaA, tc.body, tc.hdr)
			b := pick(replicaB, tc.body, tc.hdr)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("replicas disagree:\n%+v\n%+v", a, b)
			}
			if a.IndexSeq != seq {
				t.Errorf("index_seq %d, want %d", a.IndexSeq, seq)
			}
			if tc.want != "" && a.Pod != tc.want {
				t.Errorf("picked %s, want %s: %+v", a.Pod, tc.want, a.Scores)
			}
			if tc.want == "" {
				if len(a.Scores) < 2 || a.Scores[0].Total != a.Scores[1].Total {
					t.Errorf("no tie: %+v", a.Scores)
				}
				picked[a.Pod] = true
			}
		})
	}
	if len(picked) < 2 {
		t.Errorf("every tie went to %v", picked)
	}

	// The fronts: ext_proc's metadata and /v1/pick's JSON.
	body := promptBody(testutil.Seq(0, 5*bs))
	c, _ := startPicker(t, replicaA)
	e := send(t, c, "/v1/completions", nil, nil, body, 1<<20)
	if e.dest != "10.0.0.1:8000" || e.indexSeq != strconv.FormatUint(seq, 10) {
		t.Errorf("ext_proc: destination %q, %s %s %q; want 10.0.0.1:8000, %d", e.dest, gateway.PickNamespace, gateway.IndexSeqKey, e.indexSeq, uint64(seq))
	}
	e.finish(t, []byte(`{}`))

	hs := httptest.NewServer(replicaB.Handler())
	t.Cleanup(hs.Close)
	resp, err := http.Post(hs.URL+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/pick: %d %v %s", resp.StatusCode, err, raw)
	}
	if want := fmt.Sprintf(`"pod":"pod-a","index_seq":%d,`, uint64(seq)); !strings.Contains(string(raw), want) {
		t.Errorf("/v1/pick answered %s, lacking %s", raw, want)
	}
}
