package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// A benchmark server child is this test binary run with benchServerEnv
// set to a server mode: it serves the benchmark fleet on loopback and
// reports its own CPU time when asked, so that the server's CPU is
// measured apart from the callers'.
const (
	benchServerEnv = "KVINDEX_BENCH_SERVER"
	// benchProfileEnv, when set, makes each child write a CPU profile of
	// its measured runs to <value>.<mode> (e.g. /tmp/srv.kvindex).
	benchProfileEnv = "KVINDEX_BENCH_SERVER_CPUPROFILE"
)

// Server modes of a child.
const (
	modeKvindex = "kvindex" // the kvindex server, as NewGRPCServer builds it
	modeFloor   = "floor"   // floorService: transport and decoding only
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(benchServerEnv); mode != "" {
		if err := runBenchServer(mode, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchmark server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runBenchServer serves the benchmark fleet in the given mode. It writes
// its address as the first line of out, then answers each "cpu" line of
// in with its CPU time so far in nanoseconds, and stops when in closes.
// A CPU profile, if asked for, starts at the first "cpu" (after the
// callers' warm-up) and ends with the child.
func runBenchServer(mode string, in io.Reader, out io.Writer) error {
	fl := sharedFleet()
	srv, err := New(Config{Index: fl.index, BlockSize: testBlockSize, DefaultModel: testModel})
	if err != nil {
		return err
	}
	var gs *grpc.Server
	switch mode {
	case modeKvindex:
		gs = srv.NewGRPCServer()
	case modeFloor:
		fs, err := newFloorService(srv, fl)
		if err != nil {
			return err
		}
		gs = grpc.NewServer(append(srv.transportOptions(), grpc.ForceServerCodecV2(floorCodec{fs}))...)
		kvindexv1.RegisterIndexServiceServer(gs, fs)
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go gs.Serve(lis)
	defer gs.Stop()
	if _, err := fmt.Fprintln(out, lis.Addr()); err != nil {
		return err
	}
	profile := os.Getenv(benchProfileEnv)
	profiling := false
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if sc.Text() != "cpu" {
			return fmt.Errorf("unknown command %q", sc.Text())
		}
		if profile != "" && !profiling {
			f, err := os.Create(profile + "." + mode)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
			profiling = true
		}
		if _, err := fmt.Fprintln(out, processCPU().Nanoseconds()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// floorService is the floor a LongestPrefix server cannot go below on
// this transport: registered as kvindex.v1.IndexService over the same
// transport settings (transportOptions), it decodes each request into
// the generated messages with the server's own codec, returns the ids or
// hashes to their pool, and answers with kvindex's own answer to the
// fleet's first prompt (by token ids or by block hashes, as asked),
// encoded once at start. Every answer of the fleet lists the same
// engines, so that answer has the size of the one due. None of kvindex's
// work is in it: no interceptors, model, health or candidate checks,
// prompt resolution, index walk, or building and encoding the answer.
//
// The decoding is poolingCodec's because it is the cheapest there is
// here, so that all of kvindex's excess over the floor is its own work.
// protobuf-go's decoder would raise the floor (most for token ids, which
// it allocates anew for every request) and flatter the ratio.
type floorService struct {
	kvindexv1.UnimplementedIndexServiceServer
	byTokens, byHashes *kvindexv1.LongestPrefixResponse
	encoded            map[*kvindexv1.LongestPrefixResponse][]byte
}

func newFloorService(srv *Server, fl *benchFleet) (*floorService, error) {
	fs := &floorService{encoded: make(map[*kvindexv1.LongestPrefixResponse][]byte)}
	for _, p := range []*kvindexv1.Prompt{client.TokensPrompt(fl.prompts[0]), client.HashesPrompt(mustChainKeys(fl.prompts[0]))} {
		r, err := srv.longestPrefix(context.Background(), &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: p})
		if err != nil {
			return nil, err
		}
		data, err := marshalPrefixResponse(r)
		if err != nil {
			return nil, err
		}
		// The answer the client decodes, to compare with kvindex's.
		decoded := new(kvindexv1.LongestPrefixResponse)
		b := data.Materialize()
		data.Free()
		if err := proto.Unmarshal(b, decoded); err != nil {
			return nil, err
		}
		fs.encoded[decoded] = b
		if p.GetTokens() != nil {
			fs.byTokens = decoded
		} else {
			fs.byHashes = decoded
		}
	}
	return fs, nil
}

func (fs *floorService) LongestPrefix(_ context.Context, req *kvindexv1.LongestPrefixRequest) (*kvindexv1.LongestPrefixResponse, error) {
	defer releaseRequestTokens(req.GetPrompt())
	defer releaseRequestHashes(req.GetPrompt())
	if req.GetPrompt().GetBlockHashes() != nil {
		return fs.byHashes, nil
	}
	return fs.byTokens, nil
}

// floorCodec is the server's codec, except that the floor's answers are
// sent as their bytes encoded at start.
type floorCodec struct{ fs *floorService }

func (floorCodec) Name() string { return poolingCodec{}.Name() }

func (c floorCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*kvindexv1.LongestPrefixResponse); ok {
		if b, ok := c.fs.encoded[r]; ok {
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
	}
	return poolingCodec{}.Marshal(v)
}

func (floorCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return poolingCodec{}.Unmarshal(data, v)
}

// benchServer is a running benchmark server child and a client of it.
type benchServer struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	client *client.Client
}

func startBenchServer(b *testing.B, mode string) *benchServer {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), benchServerEnv+"="+mode)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	bs := &benchServer{cmd: cmd, in: in, out: bufio.NewReader(outPipe)}
	b.Cleanup(bs.stop)
	addr, err := bs.out.ReadString('\n')
	if err != nil {
		b.Fatalf("%s server: %v", mode, err)
	}
	bs.client, err = client.Dial(context.Background(), strings.TrimSpace(addr))
	if err != nil {
		b.Fatal(err)
	}
	return bs
}

// cpu is the child's CPU time so far.
func (bs *benchServer) cpu(b *testing.B) time.Duration {
	if _, err := io.WriteString(bs.in, "cpu\n"); err != nil {
		b.Fatal(err)
	}
	line, err := bs.out.ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ns)
}

func (bs *benchServer) stop() {
	if bs.client != nil {
		bs.client.Close()
	}
	bs.in.Close() // the child stops (and writes its profile)
	if err := bs.cmd.Wait(); err != nil {
		fmt.Fprintln(os.Stderr, "benchmark server:", err)
	}
}

// BenchmarkLongestPrefixServerCPU measures the server's CPU per
// LongestPrefix over loopback gRPC, 64 callers on one connection, the
// queries of BenchmarkLongestPrefixGRPC: the server runs in a child
// process (this test binary, see runBenchServer), whose CPU time is read
// apart from the callers'. Each sub-benchmark runs b.N queries against
// the floor (floorService) and then b.N against kvindex, and reports
// server-us/op (kvindex), floor-us/op and their ratio, x-floor; ns/op
// covers both runs. KVINDEX_BENCH_SERVER_CPUPROFILE=prefix profiles the
// children.
func BenchmarkLongestPrefixServerCPU(b *testing.B) {
	fl := loadFleet(b)
	kv := startBenchServer(b, modeKvindex)
	floor := startBenchServer(b, modeFloor)
	ctx := context.Background()
	byIDs := make([]*kvindexv1.LongestPrefixRequest, len(fl.prompts))
	byHashes := make([]*kvindexv1.LongestPrefixRequest, len(fl.prompts))
	for i, p := range fl.prompts {
		byIDs[i] = &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: client.TokensPrompt(p)}
		byHashes[i] = &kvindexv1.LongestPrefixRequest{Model: testModel, Prompt: client.HashesPrompt(mustChainKeys(p))}
	}
	for _, q := range []struct {
		name string
		reqs []*kvindexv1.LongestPrefixRequest
	}{{"hashes", byHashes}, {"ids", byIDs}} {
		// The floor answers what kvindex answers (to the first prompt),
		// and both are warm before measuring.
		want, err := kv.client.Index.LongestPrefix(ctx, q.reqs[0])
		if err != nil {
			b.Fatal(err)
		}
		got, err := floor.client.Index.LongestPrefix(ctx, q.reqs[0])
		if err != nil {
			b.Fatal(err)
		}
		if !proto.Equal(got, want) {
			b.Fatalf("%s: the floor answers\n%v\nkvindex\n%v", q.name, got, want)
		}
		b.Run(q.name, func(b *testing.B) {
			measure := func(bs *benchServer) float64 {
				cpu0 := bs.cpu(b)
				if err := callConcurrently(b.N, benchConcurrency, func(i int) error {
					_, err := bs.client.Index.LongestPrefix(ctx, q.reqs[i%len(q.reqs)])
					return err
				}); err != nil {
					b.Fatal(err)
				}
				return float64((bs.cpu(b) - cpu0).Nanoseconds()) / 1e3 / float64(b.N)
			}
			floorUS := measure(floor)
			kvUS := measure(kv)
			b.ReportMetric(kvUS, "server-us/op")
			b.ReportMetric(floorUS, "floor-us/op")
			b.ReportMetric(kvUS/floorUS, "x-floor")
		})
	}
}

// callConcurrently makes n calls of do from conc goroutines and returns
// the first error.
func callConcurrently(n, conc int, do func(i int) error) error {
	var (
		next   sync.Mutex
		issued int
		wg     sync.WaitGroup
		first  error
		once   sync.Once
	)
	claim := func() (int, bool) {
		next.Lock()
		defer next.Unlock()
		if issued >= n {
			return 0, false
		}
		issued++
		return issued, true
	}
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i, ok := claim()
				if !ok {
					return
				}
				if err := do(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
