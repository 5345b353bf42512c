package faultlab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestFaults runs each fault against a fresh kvindex process and checks
// that no answer is wrong for an engine kvindex reports ok.
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the fault suite builds and runs the kvindex binary")
	}
	// The faults that wait on sockets and timers run side by side (make
	// faults runs one at a time, -test.parallel 1, so that each time to
	// recover is its fault's alone); the flood, the churn and the slow
	// clients and the budget eviction load the machine and run alone,
	// first, the flood first of all, as its peak memory is measured
	// against a bound.
	for _, f := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"drop-1pct/replay", func(t *testing.T) { liveFault(t, true, 0.01, 0, 0) }},
		{"drop-1pct/no-replay", func(t *testing.T) { liveFault(t, false, 0.01, 0, 0) }},
		{"duplicate-2pct/replay", func(t *testing.T) { liveFault(t, true, 0, 0.02, 0) }},
		{"duplicate-2pct/no-replay", func(t *testing.T) { liveFault(t, false, 0, 0.02, 0) }},
		{"reorder-2pct/replay", func(t *testing.T) { liveFault(t, true, 0, 0, 0.02) }},
		{"reorder-2pct/no-replay", func(t *testing.T) { liveFault(t, false, 0, 0, 0.02) }},
		{"engine-restart/slow", func(t *testing.T) { engineRestart(t, restartSlow) }},
		{"engine-restart/fast", func(t *testing.T) { engineRestart(t, restartFast) }},
		{"engine-restart/no-replay", func(t *testing.T) { engineRestart(t, restartNoReplay) }},
		{"kvindex-sigkill/state-dir", func(t *testing.T) { kvindexKill(t, true) }},
		{"kvindex-sigkill/plain", func(t *testing.T) { kvindexKill(t, false) }},
		{"flood-16MiB-budget", flood},
		{"churn-1000-engines", churn},
		{"slow-watchers-and-http", slowClients},
		{"budget-eviction-1MiB", budgetEviction},
		{"mismatched-flood-2MiB", mismatchedFlood},
		{"seq-wrap", seqWrap},
		{"topic-flood-8000", topicFlood},
		{"random-hash-flood-1000", randomHashFlood},
		{"http-body-flood", httpBodyFlood},
		{"http-slow-conns", httpSlowConns},
		{"picker-body-flood", pickerBodyFlood},
		{"forged-source", forgedSource},
		{"nats-forgeries", natsForgeries},
	} {
		tableOrder = append(tableOrder, f.name)
		heavy := slices.Contains([]string{"flood-16MiB-budget", "churn-1000-engines", "slow-watchers-and-http", "budget-eviction-1MiB", "mismatched-flood-2MiB", "topic-flood-8000", "random-hash-flood-1000",
			"http-body-flood", "http-slow-conns", "picker-body-flood"}, f.name)
		t.Run(f.name, func(t *testing.T) {
			if !heavy {
				t.Parallel()
			}
			f.run(t)
		})
	}
}

// start starts n engines and a kvindex connected to them (connect mode),
// with extra serve flags, and waits until kvindex reports each engine ok
// and caught up.
func start(t *testing.T, n int, o engineOpts, extra ...string) (*kvindexProc, []*engine, *traffic) {
	t.Helper()
	var engines []*engine
	var args []string
	for i := range n {
		e := newEngine(t, fmt.Sprintf("pod-%d", i), uint64(i+1), o)
		engines = append(engines, e)
		args = append(args, "--engine", e.engineFlag())
	}
	k := startKvindex(t, append(args, extra...)...)
	warmUp(t, k, engines)
	return k, engines, newTraffic(1)
}

// warmUp makes each engine clear its cache (AllBlocksCleared, after which
// an engine's entries are known exactly whatever came before) until
// kvindex reports it ok and caught up: a SUB socket misses what is
// published before its subscription reaches the engine.
func warmUp(t *testing.T, k *kvindexProc, engines []*engine) {
	t.Helper()
	pending := engines
	deadline := time.Now().Add(awaitBound)
	for len(pending) > 0 {
		for _, e := range pending {
			if err := e.Clear(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(pollEvery)
		pods := listPods(t, k)
		var still []*engine
		for _, e := range pending {
			if p := pods[podKey(e.name, 0)]; p == nil || p.GetHealth() != healthOK || !caughtUp(p, e) {
				still = append(still, e)
			}
		}
		pending = still
		if len(pending) > 0 && time.Now().After(deadline) {
			t.Fatalf("warm-up: kvindex does not report %d engines (e.g. %s) ok and caught up", len(pending), pending[0].name)
		}
	}
}

// tail makes every engine publish one clean batch after a fault, so that
// kvindex sees any gap the fault left at the end of the stream.
func tail(t *testing.T, tr *traffic, engines []*engine) {
	t.Helper()
	for _, e := range engines {
		tr.unique(t, e)
	}
}

// liveFault: 4 engines, 300 requests each, with batches dropped,
// duplicated or swapped with the next one on the live path at the given
// rates (seeded), with or without a replay endpoint.
func liveFault(t *testing.T, replay bool, drop, dup, swap float64) {
	k, engines, tr := start(t, 4, engineOpts{replay: replay})
	tr.run(t, engines, 50)
	awaitOK(t, k, engines)
	for _, e := range engines {
		e.fp.setFaults(drop, dup, swap)
	}
	tr.run(t, engines, 300)
	for _, e := range engines {
		if err := e.fp.endFaults(); err != nil {
			t.Fatal(err)
		}
	}
	faultEnd := time.Now()
	tail(t, tr, engines)
	injected := 0
	for _, e := range engines {
		e.fp.mu.Lock()
		injected += e.fp.dropped + e.fp.duplicated + e.fp.swapped
		e.fp.mu.Unlock()
	}
	if injected == 0 {
		t.Fatal("no fault was injected: the seeds or rates are wrong")
	}
	settle(t, k, faultEnd, engines, nil, 0)
}

// How an engine restarts in engineRestart.
type restartKind int

const (
	// restartSlow: kvindex sees the connection close and hears the new
	// process from its first batches.
	restartSlow restartKind = iota
	// restartFast: the new process publishes more batches than the old
	// one did before kvindex can hear it, so the first batch kvindex
	// hears is past the old process's last.
	restartFast
	// restartNoReplay: an engine without a replay endpoint; the new
	// process's first batches go out before kvindex has reconnected
	// (lost), so the first batch kvindex hears carries the old process's
	// next seq. Nothing tells the processes apart: kvindex must not
	// report the engine ok with the old process's entries.
	restartNoReplay
)

// engineRestart: one of 2 engines restarts (new process: empty cache,
// sequence from 0, same endpoints), as kind says.
func engineRestart(t *testing.T, kind restartKind) {
	k, engines, tr := start(t, 2, engineOpts{replay: kind != restartNoReplay})
	tr.run(t, engines, 100)
	awaitOK(t, k, engines)
	e := engines[0]
	old := e.Seq()
	e.close()
	e.Restart()
	switch kind {
	case restartSlow:
		awaitPod(t, k, e, "the old connection closed", func(p *kvindexv1.PodInfo) bool { return !p.GetConnected() })
	case restartFast, restartNoReplay:
		next := old + 10 // past the old process's last
		if kind == restartNoReplay {
			next = old // the old process's next seq
		}
		for e.Seq() < next {
			if _, err := e.Process(tr.prompt(), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.open(t)
	awaitPod(t, k, e, "the new connection", func(p *kvindexv1.PodInfo) bool { return p.GetConnected() })
	faultEnd := time.Now()
	tr.run(t, engines, 50)
	tail(t, tr, engines)
	settle(t, k, faultEnd, engines, nil, 0)
}

// awaitPod waits until cond holds for kvindex's view of e.
func awaitPod(t *testing.T, k *kvindexProc, e *engine, what string, cond func(*kvindexv1.PodInfo) bool) {
	t.Helper()
	deadline := time.Now().Add(awaitBound)
	for {
		if p := listPods(t, k)[podKey(e.name, 0)]; p != nil && cond(p) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvindex never reported %s of %s", what, e.name)
		}
		time.Sleep(pollEvery)
	}
}

// kvindexKill: kvindex is killed with SIGKILL and started again while 2
// engines keep their caches. Their replay buffers (32 batches) no longer
// hold the batches that stored the long-lived blocks (every check prompt,
// kept warm by full hits, which publish nothing). With --state-dir the new
// process restores its snapshot and verifies it with the engines; without
// it, it must not report ok an engine whose early history it cannot know.
func kvindexKill(t *testing.T, stateDir bool) {
	var extra []string
	var dir string
	if stateDir {
		for _, f := range []string{"state-dir", "snapshot-interval"} {
			if !serveSupports(t, f) {
				skip(t, "kvindex serve has no --"+f+" flag yet")
			}
		}
		dir = t.TempDir()
		extra = append(extra, "--state-dir", dir, "--snapshot-interval", "200ms")
	}
	k, engines, tr := start(t, 2, engineOpts{replay: true, capacity: 1024, bufferSteps: 32}, extra...)
	for _, e := range engines {
		for _, p := range checkPrompts {
			if _, err := e.Process(p, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 60 {
		tail(t, tr, engines)
	}
	awaitOK(t, k, engines)
	if stateDir {
		// The second write after this point began after the first was
		// complete: a whole snapshot of the current state is on disk.
		awaitSnapshot(t, dir, awaitSnapshot(t, dir, time.Now()))
		for range 5 { // within the replay buffer: the new process verifies the snapshot by replay
			tail(t, tr, engines)
		}
	}
	k.kill()
	k = startKvindex(t, k.extra...)
	faultEnd := time.Now()
	tail(t, tr, engines)
	settle(t, k, faultEnd, engines, nil, 0)
}

// awaitSnapshot waits until dir's state file was written after since and
// returns its modification time.
func awaitSnapshot(t *testing.T, dir string, since time.Time) time.Time {
	t.Helper()
	deadline := time.Now().Add(awaitBound)
	for {
		if fi, err := os.Stat(filepath.Join(dir, statefile.Name)); err == nil && fi.ModTime().After(since) {
			return fi.ModTime()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot written in %s", dir)
		}
		time.Sleep(pollEvery)
	}
}

// churn: 1,000 engines join a bind-mode kvindex in waves of 100, each
// publishing a few requests; each wave leaves (closes its socket, its
// cache gone) once the next has joined. Departed engines hold nothing, so
// whatever kvindex still reports for them must not be reported ok.
func churn(t *testing.T) {
	const waves, perWave = 10, 100
	listen := "tcp://" + testutil.FreeAddr(t)
	// Departed engines are forgotten 2 s after their connection went.
	k := startKvindex(t, "--listen", listen, "--engine-allow", "*=127.0.0.1", "--forget-after", "2s")
	tr := newTraffic(2)
	var live, departed []*engine
	for w := range waves {
		var wave []*engine
		for i := range perWave {
			n := w*perWave + i
			wave = append(wave, newEngine(t, fmt.Sprintf("pod-%04d", n), uint64(n+1), engineOpts{connectTo: listen}))
		}
		warmUp(t, k, wave)
		tr.run(t, wave, 3)
		for _, e := range live {
			e.close()
		}
		departed = append(departed, live...)
		live = wave
	}
	faultEnd := time.Now()
	tail(t, tr, live)
	// Departed engines must not be reported ok (connected and in
	// sequence): nothing can be vouched for an engine that is gone.
	var stale []string
	deadline := time.Now().Add(2 * recoverBound)
	for {
		pods := listPods(t, k)
		stale = stale[:0]
		for _, e := range departed {
			if p := pods[podKey(e.name, 0)]; p != nil && p.GetHealth() == healthOK {
				stale = append(stale, e.name)
			}
		}
		if len(stale) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(stale) > 0 {
		t.Errorf("%d of %d departed engines still reported ok, e.g. %s", len(stale), len(departed), stale[0])
	}
	settle(t, k, faultEnd, live, departed, 0)
}

// Each flooding engine makes floodRequests requests, every other one a
// fresh prompt of floodBlocks blocks (a large batch: as many stores and
// evictions), into a kvindex with --memory-budget floodBudget.
const (
	floodRequests = 10_000
	floodBlocks   = 32
	floodBudget   = 16 << 20
)

// flood: 4 engines publish as fast as they can (floodRequests each,
// concurrently) into a kvindex with --memory-budget 16MiB; their caches
// (4,096 blocks each) fit the budget, so every answer must stay exact,
// and the process's peak RSS must stay within the process bound of the
// budget (memlimit.ProcessBound).
func flood(t *testing.T) {
	k, engines, _ := start(t, 4, engineOpts{replay: true, capacity: 4096}, "--memory-budget", strconv.Itoa(floodBudget))
	var wg sync.WaitGroup
	errs := make(chan error, len(engines))
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := newTraffic(uint64(100 + i))
			for i := range floodRequests {
				p := tr.prompt()
				if i%2 == 1 {
					p = tr.fresh(floodBlocks)
				}
				if _, err := e.Process(p, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	faultEnd := time.Now()
	tr := newTraffic(3)
	tail(t, tr, engines)
	settle(t, k, faultEnd, engines, nil, floodBudget)
	checkBound(t, k, floodBudget)
}

// checkBound fails the test if kvindex's peak RSS (read when settle
// stopped it) passed the process bound of its budget.
func checkBound(t *testing.T, k *kvindexProc, budget int64) {
	t.Helper()
	if limit := memlimit.ProcessBound(budget); k.peakRSS > limit {
		t.Errorf("peak RSS %s exceeds the process bound of the budget %s (memlimit.ProcessBound, fixed overhead %s) = %s",
			mib(k.peakRSS), mib(budget), mib(memlimit.FixedOverhead), mib(limit))
	}
}

// budgetEviction: 3 healthy engines whose caches (4,096 blocks each)
// outgrow a 1 MiB --memory-budget, so kvindex evicts entries the engines
// still hold (the check prompts, kept warm by hits, which store nothing).
// An engine whose entries were evicted must not be reported ok: its
// matches are lower bounds (partial).
func budgetEviction(t *testing.T) {
	const budget = 1 << 20
	k, engines, tr := start(t, 3, engineOpts{replay: true, capacity: 4096}, "--memory-budget", strconv.Itoa(budget))
	for i := range 600 {
		for _, e := range engines {
			p := tr.prompt()
			if i%2 == 1 {
				p = tr.fresh(16)
			}
			if _, err := e.Process(p, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	faultEnd := time.Now()
	tail(t, tr, engines)
	r := settle(t, k, faultEnd, engines, nil, budget)
	checkBound(t, k, budget)
	if r.wrongFlagged == 0 {
		t.Errorf("no answer differed from the engines' caches: the budget evicted nothing they hold, so the row tests nothing")
	}
}

// mismatchedFlood: 2 engines hashing with another seed (kvindex keys
// them by its own chain, through a fallback map) flood a kvindex with a
// 2 MiB budget, beside a healthy engine whose cache fits it. The
// mismatched engines' entries must go first: the healthy engine keeps
// every entry and stays ok, and every answer about it is exact.
func mismatchedFlood(t *testing.T) {
	const budget = 2 << 20
	other := blockhash.MustNew(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "1", BlockSize: blockSize})
	healthy := []*engine{newEngine(t, "pod-0", 1, engineOpts{replay: true})}
	args := []string{"--engine", healthy[0].engineFlag(), "--memory-budget", strconv.Itoa(budget)}
	var wrong []*engine
	for i := range 2 {
		e := newEngine(t, fmt.Sprintf("wrong-seed-%d", i), uint64(50+i), engineOpts{replay: true, capacity: 8192, hasher: other})
		wrong = append(wrong, e)
		args = append(args, "--engine", e.engineFlag())
	}
	k := startKvindex(t, args...)
	warmUp(t, k, append(slices.Clone(healthy), wrong...))
	tr := newTraffic(1)
	tr.run(t, healthy, 50)
	flood := newTraffic(7)
	for range 1500 {
		for _, e := range wrong {
			if _, err := e.Process(flood.fresh(16), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	faultEnd := time.Now()
	tail(t, tr, healthy)
	r := settle(t, k, faultEnd, healthy, nil, budget)
	checkBound(t, k, budget)
	if r.wrongFlagged != 0 {
		t.Errorf("%d answers about the healthy engine flagged: the mismatched engines pushed its entries out", r.wrongFlagged)
	}
	pods := listPods(t, k)
	for _, e := range wrong {
		if h := pods[podKey(e.name, 0)].GetHealth(); h != kvindexv1.EngineHealth_ENGINE_HEALTH_PARTIAL {
			t.Errorf("%s is %v, want partial: the budget never shed it, so the row tests nothing", e.name, h)
		}
	}
}

// slowClients: 200 Watch streams that never read and 64 HTTP connections
// sending their headers a byte at a time, while 2 engines publish 2,000
// requests each and queries continue. Ingest must keep up (kvindex ends
// caught up and ok), /healthz and queries must answer throughout, and
// answers stay right.
func slowClients(t *testing.T) {
	k, engines, tr := start(t, 2, engineOpts{replay: true})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for range 4 {
		dctx, dcancel := context.WithTimeout(ctx, awaitBound)
		c, err := client.Dial(dctx, k.grpcAddr)
		dcancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		for range 50 {
			wg.Add(1)
			go func() { // opens a stream and never reads from it
				defer wg.Done()
				if _, err := c.Index.Watch(ctx, &kvindexv1.WatchRequest{}); err == nil {
					<-ctx.Done()
				}
			}()
		}
	}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", k.httpAddr)
			if err != nil {
				return
			}
			defer conn.Close()
			trickleOn(ctx, conn, "GET /healthz HTTP/1.1\r\nHost: kvindex\r\nX-Slow: ")
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			for _, e := range engines {
				if _, err := e.Process(tr.prompt(), nil); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	hc := &http.Client{Timeout: 5 * time.Second}
	var probeErrs []string
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-time.After(100 * time.Millisecond):
		}
		resp, err := hc.Get("http://" + k.httpAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %s", resp.Status)
			}
		}
		if err != nil {
			probeErrs = append(probeErrs, "/healthz: "+err.Error())
		}
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := k.c.LongestPrefixTokens(qctx, model, checkPrompts[0], nil); err != nil {
			probeErrs = append(probeErrs, "query: "+err.Error())
		}
		qcancel()
	}
	faultEnd := time.Now()
	tail(t, newTraffic(4), engines)
	settle(t, k, faultEnd, engines, nil, 0)
	if len(probeErrs) > 0 {
		t.Errorf("%d probes failed while slow clients were connected, e.g. %s", len(probeErrs), probeErrs[0])
	}
	pods := listPods(t, k)
	for _, e := range engines {
		if p := pods[podKey(e.name, 0)]; p.GetHealth() != healthOK || !caughtUp(p, e) {
			t.Errorf("ingest did not keep up with %s: engine at seq %d, kvindex reports %v", e.name, e.Seq()-1, p)
		}
	}
}
