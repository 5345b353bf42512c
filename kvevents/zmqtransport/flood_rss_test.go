package zmqtransport

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
)

// The flood measurement: four publishers in a child process send batches
// as fast as libzmq takes them to one subscriber in this process, whose
// Sink is a real index with its share of a 16 MiB budget
// (memlimit.Split). It reports this process's peak and final resident
// memory (VmHWM, VmRSS), which the index's share alone does not bound:
// libzmq queues up to RcvHWM messages per socket, in malloc'd memory. It reads process-wide figures and runs for seconds,
// so it only runs when asked:
//
//	KVINDEX_FLOOD_RSS=1 go test -run '^TestFloodRSS$' -v ./kvevents/zmqtransport
//
// KVINDEX_FLOOD_HWM sets SubscriberConfig.RcvHWM (default: the budget's
// share, as memlimit.Split gives four streams)
// and KVINDEX_FLOOD_N the batches per publisher (default 250000).
const (
	floodEnv      = "KVINDEX_FLOOD_RSS"
	floodChildEnv = "KVINDEX_FLOOD_CHILD"
	floodPubs     = 4
)

func TestFloodRSS(t *testing.T) {
	if os.Getenv(floodEnv) == "" {
		t.Skip("a process-wide measurement; set " + floodEnv + "=1 to run it")
	}
	n := envInt(t, "KVINDEX_FLOOD_N", 250_000)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFloodPublishers$")
	cmd.Env = append(os.Environ(), floodChildEnv+"=1", "KVINDEX_FLOOD_N="+strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewScanner(stdout)
	var eps []string
	for len(eps) < floodPubs && lines.Scan() {
		if ep, ok := strings.CutPrefix(lines.Text(), "endpoint "); ok {
			eps = append(eps, ep)
		}
	}
	if len(eps) < floodPubs {
		t.Fatalf("child gave %d endpoints", len(eps))
	}

	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	// The index and the queues get their shares of a 16 MiB budget, as
	// kvindex serve gives them.
	shares, err := memlimit.Split(16<<20, floodPubs, false)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexer.New(indexer.Options{Hasher: h, MemoryBudget: shares.Index})
	if err != nil {
		t.Fatal(err)
	}
	cfg := SubscriberConfig{RcvHWM: envInt(t, "KVINDEX_FLOOD_HWM", shares.RcvHWM)}
	for i, ep := range eps {
		cfg.Engines = append(cfg.Engines, EngineConfig{Name: fmt.Sprint("pod-", i), Model: "m", Endpoint: ep})
	}
	before := procStatus(t)
	s := startSubscriber(t, cfg, ix)
	testutil.Await(t, waitTimeout, "all connected", func() bool {
		c := 0
		for _, st := range s.Streams() {
			if st.Connected {
				c++
			}
		}
		return c == floodPubs
	})
	start := time.Now()
	fmt.Fprintln(stdin, "go")
	for lines.Scan() && lines.Text() != "sent" {
	}
	sent := time.Since(start)
	// Drained: no stream moved for a while (the last batches may have
	// been dropped at a high-water mark, so no seq can be waited for).
	var last string
	for quiet := 0; quiet < 5; {
		time.Sleep(100 * time.Millisecond)
		var b strings.Builder
		for _, st := range s.Streams() {
			fmt.Fprint(&b, st.Batches, st.LostBatches, " ")
		}
		if b.String() == last {
			quiet++
		} else {
			quiet, last = 0, b.String()
		}
	}
	drained := time.Since(start)
	var applied, lost uint64
	for _, st := range s.Streams() {
		applied += st.Batches
		lost += st.LostBatches
	}
	after := procStatus(t)
	trimMalloc(0) // what the subscriber's periodic trim does
	trimmed := procStatus(t)
	t.Logf("flood: %d publishers x %d batches, RcvHWM %d: sent in %v, drained in %v; applied %d, lost %d; index %d bytes",
		floodPubs, n, s.cfg.RcvHWM, sent.Round(time.Millisecond), drained.Round(time.Millisecond), applied, lost, ix.Stats().Bytes)
	t.Logf("flood: VmRSS before %d MiB; VmHWM (peak) %d MiB; VmRSS after draining %d MiB, after a trim %d MiB",
		before["VmRSS"]>>10, after["VmHWM"]>>10, after["VmRSS"]>>10, trimmed["VmRSS"]>>10)
}

// TestFloodPublishers is TestFloodRSS's child process: it prints its
// publishers' endpoints, waits for "go", floods, prints "sent" and waits
// for its stdin to close.
func TestFloodPublishers(t *testing.T) {
	if os.Getenv(floodChildEnv) == "" {
		t.Skip("the child process of TestFloodRSS")
	}
	n := envInt(t, "KVINDEX_FLOOD_N", 250_000)
	var pubs []*Publisher
	for range floodPubs {
		p, err := NewPublisher(PublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pubs = append(pubs, p)
		fmt.Printf("endpoint %s\n", p.Endpoint())
	}
	// A few distinct payloads per publisher, so the index keeps storing.
	const variants = 1024
	payloads := make([][][]byte, floodPubs)
	for i := range payloads {
		for v := range variants {
			var b kvevents.Batch
			b.TS = 1750000000.5
			for e := range 8 {
				toks := make([]uint64, 16)
				for j := range toks {
					toks[j] = uint64(1000*e + j + 1)
				}
				k := uint64(i)<<40 | uint64(v)<<8 | uint64(e)
				b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{0x9e3779b97f4a7c15 * (k + 1)},
					HasParent: e > 0, Parent: 0x9e3779b97f4a7c15 * k, TokenIDs: toks, BlockSize: 16, Medium: kvevents.MediumGPU})
			}
			p, err := kvevents.AppendBatch(nil, &b, kvevents.EncodeOptions{Shape: kvevents.ShapeMap})
			if err != nil {
				t.Fatal(err)
			}
			payloads[i] = append(payloads[i], p)
		}
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() && in.Text() != "go" {
	}
	var wg sync.WaitGroup
	for i, p := range pubs {
		wg.Go(func() {
			for seq := range uint64(n) {
				if err := p.Publish(seq, payloads[i][seq%variants]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Println("sent")
	for in.Scan() {
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: want an integer", name, v)
	}
	return n
}

// procStatus reads the kB figures of /proc/self/status.
func procStatus(t *testing.T) map[string]int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status: ", err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			out[k] = n
		}
	}
	return out
}
