package main

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

// fixedStreams is a server.StreamSource reporting fixed stream states.
type fixedStreams []kvevents.StreamStats

func (f fixedStreams) Streams() []kvevents.StreamStats {
	return append([]kvevents.StreamStats(nil), f...)
}

// kvindex pods prints every health state by its word, in the table and in
// the JSON view.
func TestPodsHealthWords(t *testing.T) {
	id := func(pod string) kvevents.EngineID { return kvevents.EngineID{Model: "m", Pod: pod} }
	streams := fixedStreams{
		{Engine: id("p-ok"), Connected: true, Health: kvevents.HealthOK},
		{Engine: id("p-restored"), Connected: true, Health: kvevents.HealthRestored},
		{Engine: id("p-unconfirmed"), Connected: true, Health: kvevents.HealthUnconfirmed},
		{Engine: id("p-degraded"), Connected: true, Health: kvevents.HealthDegraded},
		{Engine: id("p-disconnected"), Connected: false, Health: kvevents.HealthOK},
	}
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: blockhash.DefaultSeed, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Index: ix, BlockSize: 16, Streams: streams, DefaultModel: "m", ReadyGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	out, errOut, code := runCLI(t, "pods", "--server", lis.Addr().String())
	if code != 0 {
		t.Fatalf("pods: exit %d: %s", code, errOut)
	}
	rows, lastEvent := map[string]string{}, map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		f := strings.Fields(line)
		rows[f[0]] = f[4]             // ENGINE MODEL ENDPOINT CONNECTED HEALTH ...
		lastEvent[f[0]] = f[len(f)-2] // ... LAST EVENT LAG
	}
	// No engine sent an event to this process; the restored one's
	// entries came from a snapshot, which LAST EVENT says.
	for pod, want := range map[string]string{"p-restored": "restored", "p-ok": "never", "p-unconfirmed": "never"} {
		if lastEvent[pod] != want {
			t.Errorf("%s: LAST EVENT %q, want %q\n%s", pod, lastEvent[pod], want, out)
		}
	}
	out, errOut, code = runCLI(t, "pods", "--server", lis.Addr().String(), "--json")
	if code != 0 {
		t.Fatalf("pods --json: exit %d: %s", code, errOut)
	}
	var pj client.PodsJSON
	if err := json.Unmarshal([]byte(out), &pj); err != nil {
		t.Fatal(err)
	}
	js := map[string]string{}
	for _, p := range pj.Pods {
		js[p.Pod] = p.Health
	}
	for _, word := range []string{"ok", "restored", "unconfirmed", "degraded", "disconnected"} {
		if got := rows["p-"+word]; got != word {
			t.Errorf("table: p-%s health %q, want %q\n%s", word, got, word, out)
		}
		if got := js["p-"+word]; got != word {
			t.Errorf("json: p-%s health %q, want %q", word, got, word)
		}
	}
}
