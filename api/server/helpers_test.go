package server

import (
	"context"
	"net"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

const (
	testModel     = "qwen"
	testBlockSize = 16
)

var testHasher = blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: blockhash.DefaultSeed, BlockSize: testBlockSize})

// fixture is a server on loopback: gRPC on a real socket, HTTP through
// httptest, over a real index fed through a watchhub.Hub.
type fixture struct {
	srv    *Server
	index  *indexer.Index
	hub    *watchhub.Hub
	client *client.Client
	url    string // HTTP base URL
}

// newFixture starts a server; edit may change its config before start.
func newFixture(t testing.TB, edit func(*Config)) *fixture {
	t.Helper()
	return newFixtureIndex(t, indexer.Options{}, edit)
}

// newFixtureIndex starts a server over an index with opts (and the test
// hasher).
func newFixtureIndex(t testing.TB, opts indexer.Options, edit func(*Config)) *fixture {
	t.Helper()
	opts.Hasher = testHasher
	ix, err := indexer.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	hub := watchhub.New(ix, watchhub.Limits{})
	cfg := Config{Index: ix, BlockSize: testBlockSize, Hub: hub, DefaultModel: testModel, ReadyGrace: -1}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	go gs.Serve(lis)
	hs := httptest.NewServer(srv.Handler(HTTPOptions{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		srv.Shutdown()
		gs.Stop()
		hs.Close()
	})
	return &fixture{srv: srv, index: ix, hub: hub, client: c, url: hs.URL}
}

// chainKeys hashes tokens the way the engines do and returns the keys.
func chainKeys(t testing.TB, tokens []uint64, x *blockhash.Extras) []uint64 {
	t.Helper()
	hs, err := testHasher.Chain(nil, nil, 0, tokens, x)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]uint64, len(hs))
	for i := range hs {
		keys[i] = hs[i].Key
	}
	return keys
}

// stored is the BlockStored event an engine publishes for the first
// blocks full blocks of tokens.
func stored(t testing.TB, tokens []uint64, blocks int) kvevents.Event {
	t.Helper()
	toks := tokens[:blocks*testBlockSize]
	return kvevents.Event{
		Kind:      kvevents.BlockStored,
		Hashes:    chainKeys(t, toks, nil),
		TokenIDs:  toks,
		BlockSize: testBlockSize,
	}
}

func engine(pod string, rank int) kvevents.EngineID {
	return kvevents.EngineID{Model: testModel, Pod: pod, DPRank: rank}
}

// fakeStreams is a StreamSource with fixed content.
type fakeStreams struct {
	mu      sync.Mutex
	streams []kvevents.StreamStats
}

func (f *fakeStreams) Streams() []kvevents.StreamStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]kvevents.StreamStats(nil), f.streams...)
}

func (f *fakeStreams) set(s ...kvevents.StreamStats) {
	f.mu.Lock()
	f.streams = s
	f.mu.Unlock()
}
