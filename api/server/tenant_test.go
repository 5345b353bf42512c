package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// storedWith is the BlockStored event a vLLM engine publishes for a
// request with x's cache salt and LoRA adapter: keys chained over the
// per-block extra keys (the salt in the first block's, the adapter in
// every block's), which the event carries, and the adapter's name.
func storedWith(t *testing.T, tokens []uint64, blocks int, x *blockhash.Extras) kvevents.Event {
	t.Helper()
	toks := tokens[:blocks*testBlockSize]
	ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: chainKeys(t, toks, x), TokenIDs: toks, BlockSize: testBlockSize, LoRAName: x.LoRAName}
	for i := range blocks {
		ev.ExtraKeys = append(ev.ExtraKeys, x.BlockKeys(i, testBlockSize))
	}
	return ev
}

// The same prompt cached for three tenants, on three pods: unsalted on
// "plain", with cache_salt "salt-a" on "salted", with LoRA "x" on "lora".
// A query matches only the blocks of its own salt and adapter, through
// the hashing alone (an unrestricted caller shows it); a restricted caller
// may only ask with its own salt or adapter, may not ask by block hashes,
// and may Watch only if restricted by adapters alone, and then sees only
// its adapters' blocks.
func TestTenantIsolation(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	sp := ca.Server(t, "kvindex")
	auth := filepath.Join(dir, "auth.yaml")
	err := os.WriteFile(auth, []byte(fmt.Sprintf(`tokens:
  - name: ops
    sha256: %s
    scopes: [query, watch]
  - name: tenant-a
    sha256: %s
    scopes: [query, watch]
    salts: [salt-a]
  - name: lora-x
    sha256: %s
    scopes: [query, watch]
    loras: [x]
`, sha("ops"), sha("tenant-a"), sha("lora-x"))), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s := startSecure(t, security.Config{CertFile: sp.CertFile, KeyFile: sp.KeyFile, AuthFile: auth}, nil)
	tokens := testutil.Seq(500, 4*testBlockSize)
	saltA := &blockhash.Extras{CacheSalt: "salt-a"}
	loraX := &blockhash.Extras{LoRAName: "x"}
	s.hub.Apply(engine("plain", 0), 0, []kvevents.Event{storedWith(t, tokens, 4, &blockhash.Extras{})})
	s.hub.Apply(engine("salted", 0), 0, []kvevents.Event{storedWith(t, tokens, 4, saltA)})
	s.hub.Apply(engine("lora", 0), 0, []kvevents.Event{storedWith(t, tokens, 4, loraX)})

	clients := map[string]*client.Client{}
	for _, tok := range []string{"ops", "tenant-a", "lora-x"} {
		c, err := s.dial(t, tlsOption(t, client.TLSConfig{CAFile: ca.CertFile}), client.WithToken(tok))
		if err != nil {
			t.Fatal(err)
		}
		clients[tok] = c
	}
	tests := []struct {
		name, caller string
		prompt       *kvindexv1.Prompt
		code         codes.Code
		matched      map[string]uint32 // LongestPrefix's matched blocks by pod, 0s left out
		holders      []string          // Lookup's holders of the first block
	}{
		{"no salt matches unsalted blocks only", "ops", client.TokensPrompt(tokens), codes.OK, map[string]uint32{"plain": 4}, []string{"plain"}},
		{"salt-a matches salt-a's blocks only", "ops", withSalt(client.TokensPrompt(tokens), "salt-a", ""), codes.OK, map[string]uint32{"salted": 4}, []string{"salted"}},
		{"another salt matches nothing", "ops", withSalt(client.TokensPrompt(tokens), "salt-b", ""), codes.OK, map[string]uint32{}, nil},
		{"LoRA x matches x's blocks only", "ops", withSalt(client.TokensPrompt(tokens), "", "x"), codes.OK, map[string]uint32{"lora": 4}, []string{"lora"}},
		{"tenant with its salt", "tenant-a", withSalt(client.TokensPrompt(tokens), "salt-a", ""), codes.OK, map[string]uint32{"salted": 4}, []string{"salted"}},
		{"tenant without a salt", "tenant-a", client.TokensPrompt(tokens), codes.PermissionDenied, nil, nil},
		{"tenant with another salt", "tenant-a", withSalt(client.TokensPrompt(tokens), "salt-b", ""), codes.PermissionDenied, nil, nil},
		{"tenant by block hashes", "tenant-a", client.HashesPrompt(chainKeys(t, tokens, saltA)), codes.PermissionDenied, nil, nil},
		{"adapter tenant with its adapter", "lora-x", withSalt(client.TokensPrompt(tokens), "", "x"), codes.OK, map[string]uint32{"lora": 4}, []string{"lora"}},
		{"adapter tenant on the base model", "lora-x", client.TokensPrompt(tokens), codes.PermissionDenied, nil, nil},
	}
	ctx := context.Background()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := clients[tc.caller]
			r, err := c.LongestPrefix(ctx, testModel, tc.prompt, nil)
			if status.Code(err) != tc.code {
				t.Fatalf("LongestPrefix: %v, want %v", err, tc.code)
			}
			l, lerr := c.Lookup(ctx, testModel, tc.prompt, nil)
			if status.Code(lerr) != tc.code {
				t.Fatalf("Lookup: %v, want %v", lerr, tc.code)
			}
			if err != nil {
				return
			}
			got := map[string]uint32{}
			for _, p := range r.GetPods() {
				if p.GetMatchedBlocks() > 0 {
					got[p.GetPod()] = p.GetMatchedBlocks()
				}
			}
			if !mapsEq(got, tc.matched) {
				t.Errorf("matched %v, want %v", got, tc.matched)
			}
			var holders []string
			for _, h := range l.GetBlocks()[0].GetHolders() {
				holders = append(holders, h.GetPod())
			}
			if !slices.Equal(holders, tc.holders) {
				t.Errorf("Lookup's first block held by %v, want %v", holders, tc.holders)
			}
		})
	}

	if code := watchCode(t, clients["tenant-a"], s.hub); code != codes.PermissionDenied {
		t.Errorf("Watch by a salt-restricted caller: %v, want PermissionDenied", code)
	}
	if n := counterValue(t, s.srv.sec.refused.WithLabelValues(security.ReasonTenant, "Watch")); n != 1 {
		t.Errorf("tenant refusals of Watch = %v, want 1", n)
	}
	t.Run("watch restricted to an adapter", func(t *testing.T) { watchAdapter(t, s, clients["lora-x"]) })
}

// watchAdapter: a watcher restricted to LoRA x gets x's stores, of a
// removal only x's blocks, and clears and resets; never another adapter's
// blocks, the base model's, or those of an adapter without a name.
func watchAdapter(t *testing.T, s *secureServer, c *client.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := s.hub.Open()
	stream, err := c.Index.Watch(ctx, &kvindexv1.WatchRequest{Pods: []string{"w"}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, awaitBound, "the watch open", func() bool { return s.hub.Open() > before })
	tokens := testutil.Seq(9000, 3*testBlockSize)
	x := storedWith(t, tokens, 3, &blockhash.Extras{LoRAName: "x"})
	y := storedWith(t, tokens, 2, &blockhash.Extras{LoRAName: "y"})
	base := storedWith(t, tokens, 2, &blockhash.Extras{})
	unnamed := storedWith(t, tokens, 1, &blockhash.Extras{})
	unnamed.HasLoRAID, unnamed.LoRAID = true, 7
	e := engine("w", 0)
	s.hub.Apply(e, 0, []kvevents.Event{x, y, base, unnamed})
	s.hub.Apply(e, 1, []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []uint64{y.Hashes[0], x.Hashes[2], base.Hashes[1]}}})
	s.hub.Apply(e, 2, []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: []uint64{y.Hashes[1]}}, {Kind: kvevents.AllBlocksCleared}})
	s.hub.Reset(e, kvevents.ResetRestart)

	want := []string{
		fmt.Sprintf("EVENT_KIND_BLOCK_STORED %v lora=x", x.Hashes),
		fmt.Sprintf("EVENT_KIND_BLOCK_REMOVED %v lora=", x.Hashes[2:]),
		"EVENT_KIND_ALL_BLOCKS_CLEARED [] lora=",
		"EVENT_KIND_RESET [] lora=",
	}
	for i, w := range want {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("%s %v lora=%s", ev.GetKind(), ev.GetBlockHashes(), ev.GetLoraName())
		if got != w {
			t.Errorf("event %d: %s, want %s", i, got, w)
		}
	}
}

func withSalt(p *kvindexv1.Prompt, salt, lora string) *kvindexv1.Prompt {
	p.CacheSalt, p.LoraName = salt, lora
	return p
}

func mapsEq(a, b map[string]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
