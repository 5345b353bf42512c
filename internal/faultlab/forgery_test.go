package faultlab

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// Forgeries: whoever reaches kvindex's inputs (the listen socket in bind
// mode, the NATS server in NATS mode) writes batches in an engine's name.
// kvindex must drop them, count them, and keep every engine it reports ok
// exact.

// claimPayload encodes a well-formed batch claiming every check prompt in
// full, under the keys kvindex itself computes (so they verify): applied
// to an engine, it would make kvindex report that engine at full depth
// for every prompt, which no engine holds (the prompts exceed its
// capacity). clear puts AllBlocksCleared first, after which the claim
// would be all the engine holds.
func claimPayload(t testing.TB, clear bool) []byte {
	t.Helper()
	b, err := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: claimEvents(clear)}, kvevents.EncodeOptions{Shape: kvevents.ShapeMap})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// claimEvents are claimPayload's events.
func claimEvents(clear bool) []kvevents.Event {
	var evs []kvevents.Event
	if clear {
		evs = append(evs, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	}
	for i, p := range checkPrompts {
		n := len(checkKeys[i])
		evs = append(evs, kvevents.Event{Kind: kvevents.BlockStored, Hashes: checkKeys[i], TokenIDs: p[:n*blockSize],
			BlockSize: blockSize, Medium: kvevents.MediumGPU})
	}
	return evs
}

// forgedSource: a bind-mode kvindex whose engines are tied to their
// source address by exact allow rules (pod-0 and pod-1 from 127.0.0.1),
// beside an engine named by its IP address (127.0.0.1, admitted with its
// neighbours by a network rule, 127.0.0.*=127.0.0.0/29). Three forgers:
// 127.0.0.9, which no rule names, is refused at the handshake; mallory,
// from 127.0.0.3, which an exact rule admits for its own pod, speaks for
// pod-0; 127.0.0.2, which the network rule admits, speaks for the engine
// named 127.0.0.1. Each sends seq 0 with AllBlocksCleared, a claim of
// every check prompt and random BlockStored batches. kvindex must refuse
// every message (counted: kvindex_listener_rejected_total{reason=
// "source"}, kvindex_listener_refused_connections_total{reason=
// "handshake"}), apply nothing to the engines spoken for, and keep them
// ok and exact.
func forgedSource(t *testing.T) {
	const ipPod = "127.0.0.1"
	listen := "tcp://" + testutil.FreeAddr(t)
	k := startKvindex(t, "--listen", listen,
		"--engine-allow", "pod-0=127.0.0.1", "--engine-allow", "pod-1=127.0.0.1",
		"--engine-allow", "mallory=127.0.0.3", "--engine-allow", "127.0.0.*=127.0.0.0/29")
	engines := []*engine{
		newEngine(t, "pod-0", 1, engineOpts{connectTo: listen}),
		newEngine(t, "pod-1", 2, engineOpts{connectTo: listen}),
		newEngine(t, ipPod, 3, engineOpts{connectTo: listen}),
	}
	warmUp(t, k, engines)
	tr := newTraffic(1)
	tr.run(t, engines, 50)
	awaitOK(t, k, engines)
	before := listPods(t, k)

	zctx := newZMQContext(t)
	from := func(src string) *rawPub {
		t.Helper()
		p, err := dialRawPub(zctx, "tcp://"+src+":0;"+strings.TrimPrefix(listen, "tcp://"), 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.sock.Close() })
		return p
	}
	// The outsider never gets past the handshake.
	outsider := from("127.0.0.9")
	testutil.Await(t, awaitBound, "the outsider refused at the handshake", func() bool {
		_, _, v := scrape(t, k, "kvindex_listener_refused_connections_total")
		return listenerValue(v, "kvindex_listener_refused_connections_total", `reason="handshake"`) >= 1
	})
	rng := rand.New(rand.NewPCG(0xf0e, 1))
	forged := [][]byte{claimPayload(t, true), claimPayload(t, false)}
	for range 10 {
		forged = append(forged, floodPayload(t, rng, 4, false))
	}
	for seq, p := range forged {
		if err := outsider.send("kv@pod-0@"+model, uint64(seq), p); err != nil {
			t.Fatal(err)
		}
	}
	// Admitted forgers speak for another engine, then for themselves:
	// once kvindex lists them, it has read (and refused) what came
	// before on the same connection.
	sent := 0
	for _, f := range []struct{ src, self, victim string }{
		{"127.0.0.3", "mallory", "pod-0"},
		{"127.0.0.2", "127.0.0.2", ipPod},
	} {
		p := from(f.src)
		if err := p.subscribed(); err != nil {
			t.Fatalf("%s: %v", f.src, err)
		}
		for seq, b := range forged {
			if err := p.send("kv@"+f.victim+"@"+model, uint64(seq), b); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		if err := p.send("kv@"+f.self+"@"+model, 0, forged[0]); err != nil {
			t.Fatal(err)
		}
		testutil.Await(t, awaitBound, f.self+" listed", func() bool { return listPods(t, k)[podKey(f.self, 0)] != nil })
	}
	_, _, values := scrape(t, k, listenerSeries...)
	refusedSrc := listenerValue(values, "kvindex_listener_rejected_total", `reason="source"`)
	refusedHS := listenerValue(values, "kvindex_listener_refused_connections_total", `reason="handshake"`)
	t.Logf("%d forged messages from admitted sources, %v refused by source; %v connections refused at the handshake", sent, refusedSrc, refusedHS)
	if int(refusedSrc) < sent {
		t.Errorf("%v of %d forged messages refused by their source: the others reached a stream", refusedSrc, sent)
	}
	after := listPods(t, k)
	for _, e := range engines {
		b, a := before[podKey(e.name, 0)], after[podKey(e.name, 0)]
		if a.GetBatches() != b.GetBatches() || a.GetResets() != b.GetResets() || a.GetHealth() != healthOK {
			t.Errorf("%s spoken for: batches %d -> %d, resets %d -> %d, health %v; want untouched and ok",
				e.name, b.GetBatches(), a.GetBatches(), b.GetResets(), a.GetResets(), a.GetHealth())
		}
	}
	// Answered right after the forgery too: a forgery applied would be
	// reported ok until the engine's next batch.
	early := check(t, k, engines, nil)
	faultEnd := time.Now()
	tr.run(t, engines, 20)
	tail(t, tr, engines)
	r, total := measure(t, k, faultEnd, engines, nil, 0)
	total.add(early)
	r.checked, r.wrongOK, r.wrongFlagged = total.checked, total.wrongOK, total.wrongFlagged
	record(r)
	failWrongOK(t, total)
}

// natsServer runs Debian's nats-server with JetStream on a free port and
// returns its URL. Without it the row fails: make test-deps installs it.
func natsServer(t *testing.T) string {
	t.Helper()
	url, out := testutil.NATSServer(t, t.Fatal)
	t.Cleanup(func() {
		if t.Failed() && !*tableFlag {
			t.Logf("nats-server:\n%s", out.String())
		}
	})
	return url
}

var relayingLine = regexp.MustCompile(`msg=relaying http=(\S+)`)

// natsStream is serve's and relay's default --nats-stream.
const natsStream = "KVEVENTS"

// natsForgeries: NATS mode through the binary: nats-server, one kvindex
// relay following 2 engines, a serve --nats replica, all sharing a key.
// A client without the key then writes to the server: a batch for a pod
// that does not exist (unsigned, and signed with another key), a reset
// record and a claim for pod-0, a real record of pod-0 captured from the
// stream and re-published under pod-1's subject, and two snapshots of an
// index claiming every check prompt for the engines (one unsigned, one
// signed with another key), with the pointer moved to them. A second
// replica then starts: it must refuse the forged snapshots and restore
// the last real one. Both replicas must drop every forged record
// (kvindex_nats_consumer_dropped_total{reason="forged"}), never list the
// invented pod, and keep the real engines ok and exact.
func natsForgeries(t *testing.T) {
	url := natsServer(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "nats.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("5eed", 16)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	engines := []*engine{
		newEngine(t, "pod-0", 1, engineOpts{replay: true}),
		newEngine(t, "pod-1", 2, engineOpts{replay: true}),
	}
	relayArgs := []string{"relay", "--model", model, "--nats", url, "--nats-auth-key", key,
		"--http-addr", "127.0.0.1:0", "--heartbeat", "200ms"}
	for _, e := range engines {
		relayArgs = append(relayArgs, "--engine", e.engineFlag())
	}
	startProc(t, relayArgs, relayingLine)
	replicaArgs := []string{"--nats", url, "--nats-auth-key", key, "--snapshot-interval", "1s"}
	k1 := startKvindex(t, replicaArgs...)
	warmUp(t, k1, engines)
	tr := newTraffic(1)
	tr.run(t, engines, 50)
	awaitOK(t, k1, engines)
	// A real snapshot to fall back on.
	testutil.Await(t, awaitBound, "a snapshot written", func() bool {
		_, _, v := scrape(t, k1, "kvindex_snapshot_writes_total")
		return v[`kvindex_snapshot_writes_total{result="ok"}`] >= 1
	})

	nc, err := nats.Connect(url, nats.Name("forger"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), awaitBound)
	defer cancel()
	stream, err := js.Stream(ctx, natsStream)
	if err != nil {
		t.Fatal(err)
	}
	si, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wrongKey, err := natstransport.NewAuth([]byte(strings.Repeat("f0e", 16)))
	if err != nil {
		t.Fatal(err)
	}

	// (d) first: the forged pointer names a later stream sequence than
	// any real snapshot, and the forged snapshots list before the real
	// ones; the second replica must refuse both and restore a real one.
	writes := func() (ok, superseded float64) {
		_, _, v := scrape(t, k1, "kvindex_snapshot_writes_total")
		return v[`kvindex_snapshot_writes_total{result="ok"}`], v[`kvindex_snapshot_writes_total{result="superseded"}`]
	}
	okBefore, supBefore := writes()
	forgedSeq := si.State.LastSeq + 1_000_000
	forgeSnapshots(t, ctx, js, engines, forgedSeq, wrongKey)

	id := func(pod string) kvevents.EngineID { return kvevents.EngineID{Model: model, Pod: pod} }
	publish := func(what string, msg *nats.Msg) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	forge := func(subject string, r natstransport.Record, data []byte, auth *natstransport.Auth) *nats.Msg {
		m := &nats.Msg{Subject: subject, Header: r.Header(), Data: data}
		if auth != nil {
			auth.Sign(m)
		}
		return m
	}
	forgedRecords := 0
	// (a) a batch for a pod that does not exist, unsigned and signed
	// with another key.
	claim := claimPayload(t, true)
	for _, auth := range []*natstransport.Auth{nil, wrongKey} {
		publish("a new pod's batch", forge(natstransport.BatchSubject(id("forged-pod")),
			natstransport.Record{Kind: natstransport.KindBatch, Seq: 0, Print: kvevents.BatchPrint(claim), Health: kvevents.HealthOK}, claim, auth))
		forgedRecords++
	}
	// (b) a reset of pod-0, then a claim in its name.
	publish("a reset", forge(natstransport.BatchSubject(id("pod-0")),
		natstransport.Record{Kind: natstransport.KindReset, Reason: kvevents.ResetRestart, Health: kvevents.HealthOK}, nil, wrongKey))
	publish("pod-0's claim", forge(natstransport.BatchSubject(id("pod-0")),
		natstransport.Record{Kind: natstransport.KindBatch, Seq: 0, Print: kvevents.BatchPrint(claim), Health: kvevents.HealthOK}, claim, wrongKey))
	forgedRecords += 2
	// (c) a real record of pod-0 under pod-1's subject (a new message id:
	// JetStream would drop the old one as a duplicate).
	captured, err := stream.GetLastMsgForSubject(ctx, natstransport.BatchSubject(id("pod-0")))
	if err != nil {
		t.Fatal(err)
	}
	moved := &nats.Msg{Subject: natstransport.BatchSubject(id("pod-1")), Header: nats.Header{}, Data: captured.Data}
	for name, vs := range captured.Header {
		if name != nats.MsgIdHdr {
			moved.Header[name] = vs
		}
	}
	publish("a moved record", moved)
	forgedRecords++

	forgedDrops := func(k *kvindexProc) float64 {
		_, _, v := scrape(t, k, "kvindex_nats_consumer_dropped_total")
		return v[`kvindex_nats_consumer_dropped_total{reason="forged"}`]
	}
	testutil.Await(t, awaitBound, "the first replica dropping every forged record", func() bool { return forgedDrops(k1) >= float64(forgedRecords) })
	early := check(t, k1, engines, nil) // before any real record follows the forged ones

	k2 := startKvindex(t, replicaArgs...)
	testutil.Await(t, awaitBound, "the second replica dropping every forged record", func() bool { return forgedDrops(k2) >= float64(forgedRecords) })
	_, _, v := scrape(t, k2, "kvindex_snapshot_restores_total", "kvindex_nats_snapshot_restored_stream_sequence")
	restoredSeq := v["kvindex_nats_snapshot_restored_stream_sequence"]
	refusedSnaps := strings.Count(k2.logs.String(), "snapshot unusable; trying an older one")
	t.Logf("%d forged records dropped by each replica; the second restored the snapshot at stream seq %v (restores: latest %v, fallback %v, none %v) after refusing %d",
		forgedRecords, restoredSeq, v[`kvindex_snapshot_restores_total{result="latest"}`], v[`kvindex_snapshot_restores_total{result="fallback"}`],
		v[`kvindex_snapshot_restores_total{result="none"}`], refusedSnaps)
	if v[`kvindex_snapshot_restores_total{result="fallback"}`] != 1 || restoredSeq == 0 || restoredSeq >= float64(forgedSeq-1) || refusedSnaps < 2 {
		t.Errorf("the second replica did not refuse both forged snapshots and fall back on the real one")
	}

	// The forged pointer names a sequence past the stream's end: were it
	// taken, every real snapshot after it would be superseded, and new
	// replicas would restore ever older ones. The writer ignores it (not
	// signed with the key) and keeps writing.
	testutil.Await(t, awaitBound, "the first replica keeping a snapshot after the forged pointer", func() bool {
		ok, _ := writes()
		return ok > okBefore
	})
	okAfter, supAfter := writes()
	t.Logf("the first replica's snapshot writes since the forged pointer: %v kept, %v superseded", okAfter-okBefore, supAfter-supBefore)
	if supAfter > supBefore {
		t.Errorf("%v snapshots superseded after the forged pointer: the writer took its sequence", supAfter-supBefore)
	}

	faultEnd := time.Now()
	tr.run(t, engines, 20)
	tail(t, tr, engines)
	total := early
	var rows []row
	for _, k := range []*kvindexProc{k1, k2} {
		r, tl := measure(t, k, faultEnd, engines, nil, 0)
		rows = append(rows, r)
		total.add(tl)
		if p := listPods(t, k)[podKey("forged-pod", 0)]; p != nil {
			t.Errorf("the invented pod is listed: %v", p)
		}
	}
	r := rows[0]
	r.checked, r.wrongOK, r.wrongFlagged = total.checked, total.wrongOK, total.wrongFlagged
	r.recovered = rows[0].recovered + " / " + rows[1].recovered
	r.rss = rows[0].rss + ", " + rows[1].rss
	r.note = strings.Trim(rows[0].note+" "+rows[1].note, " ")
	record(r)
	failWrongOK(t, total)
}

// forgeSnapshots writes two snapshots of an index in which the engines
// and an invented pod hold every check prompt, at stream sequence seq
// (past the stream's end) and the one before, and moves the model's
// pointer to them: one unsigned, one signed with wrongKey.
func forgeSnapshots(t *testing.T, ctx context.Context, js jetstream.JetStream, engines []*engine, seq uint64, wrongKey *natstransport.Auth) {
	t.Helper()
	ix, err := indexer.New(indexer.Options{Hasher: hasher})
	if err != nil {
		t.Fatal(err)
	}
	var pos []kvevents.Position
	for _, pod := range []string{engines[0].name, engines[1].name, "forged-pod"} {
		id := kvevents.EngineID{Model: model, Pod: pod}
		ix.Apply(id, 1<<40, claimEvents(true))
		pos = append(pos, kvevents.Position{Engine: id, Seq: 1 << 40, Health: kvevents.HealthOK})
	}
	log := slog.New(slog.DiscardHandler)
	for i, auth := range []*natstransport.Auth{nil, wrongKey} {
		store, err := snapstore.Open(ctx, js, snapstore.Config{Model: model, Keep: 100, Auth: auth}, log)
		if err != nil {
			t.Fatal(err)
		}
		h := &statefile.Header{Written: time.Now().UTC(), Positions: statefile.FromPositions(pos),
			Hashing: statefile.Hashing{Algo: string(blockhash.SHA256CBOR), Seed: "0", BlockSize: blockSize},
			Stream:  natsStream, StreamSeq: seq - 1 + uint64(i)}
		if _, err := store.Put(ctx, h, ix.Snapshot); err != nil {
			t.Fatalf("forged snapshot %d: %v", i, err)
		}
	}
}
