package sim

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/configerr"
)

// Options that cannot work are refused with the field at fault, in the
// package's own terms: the messages name Options' fields.
func TestBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mod   func(*Options)
		field configerr.Field
		want  string
	}{
		{"no hasher", func(o *Options) { o.Hasher = nil }, "Hasher", "Hasher: none given"},
		{"no engines", func(o *Options) { o.Engines = 0 }, "Engines", "Engines 0: want 1..256"},
		{"no ranks", func(o *Options) { o.Ranks = 0 }, "Ranks", "Ranks 0: want 1..1024"},
		{"no capacity", func(o *Options) { o.Capacity = 0 }, "Capacity", "Capacity 0: want 1..16777216 blocks"},
		{"too many blocks", func(o *Options) { o.Engines, o.Ranks, o.Capacity = 256, 16, 8192 }, "Capacity",
			"Engines 256 x Ranks 16 x Capacity 8192 = 33554432 blocks: at most 16777216 in all"},
		{"nothing to do", func(o *Options) { o.Rate = 0 }, "Rate", "Rate 0 sends no workload, which leaves nothing to do without HTTPPort"},
		{"requests without a workload", func(o *Options) { o.Rate, o.HTTPPort, o.Requests = 0, 8000, 5 }, "Requests",
			"Requests 5 and Rate 0 contradict each other: Rate 0 sends no workload"},
		{"negative rate", func(o *Options) { o.Rate = -1 }, "Rate",
			"Rate -1: want a number of requests per second, at most 10000 (0: no workload, with HTTPPort)"},
		{"running none", func(o *Options) { o.MaxRunning = 0 }, "MaxRunning", "MaxRunning 0: want 1..65536"},
		{"negative prefill", func(o *Options) { o.PrefillPerToken = -time.Microsecond }, "PrefillPerToken", "PrefillPerToken -1µs: want 0 to 1s"},
		{"no sessions", func(o *Options) { o.Sessions = 0 }, "Sessions", "Sessions 0: want 1..4096"},
		{"no turns", func(o *Options) { o.Turns = 0 }, "Turns", "Turns 0: want at least 1"},
		{"negative requests", func(o *Options) { o.Requests = -1 }, "Requests", "Requests -1: want 0 (until Ctrl-C) or more"},
		{"model with spaces", func(o *Options) { o.Model = "a b" }, "Model", `Model "a b": want a model name without spaces`},
		{"replay port without replay", func(o *Options) { o.NoReplay, o.ReplayPort = true, 6000 }, "ReplayPort",
			"ReplayPort and NoReplay contradict each other: give one"},
		{"ports beyond 65535", func(o *Options) { o.Port = 65535 }, "Port", "Port 65535: 2 engine ranks need ports 65535-65536, beyond 1..65535"},
		{"no port", func(o *Options) { o.Port = 0 }, "Port", "Port 0: 2 engine ranks need ports 0-1, beyond 1..65535"},
		{"replay ports overlapping", func(o *Options) { o.Ranks, o.ReplayPort = 2, 5559 }, "ReplayPort",
			"Port 5557 and ReplayPort 5559 overlap: 4 engine ranks use event ports 5557-5560 and replay ports 5559-5562; vLLM adds the rank to both, so the two ranges must be apart (e.g. ReplayPort 5561)"},
		{"HTTP ports beyond 65535", func(o *Options) { o.HTTPPort = 65535 }, "HTTPPort", "HTTPPort 65535: 2 engine ranks need ports 65535-65536, beyond 1..65535"},
		{"HTTP over event ports", func(o *Options) { o.HTTPPort = 5558 }, "HTTPPort",
			"HTTPPort 5558 overlaps Port 5557: 2 engines serve HTTP on ports 5558-5559, 2 engine ranks use ports 5557-5558"},
		{"HTTP over replay ports", func(o *Options) { o.Engines, o.HTTPPort = 3, 5561 }, "HTTPPort", "HTTPPort 5561 overlaps ReplayPort 5560"},
		{"bind mode, wildcard", func(o *Options) { o.Connect = "tcp://*:5557" }, "Connect",
			`Connect "tcp://*:5557": want tcp://HOST:PORT, where a kvindex serve ServeListen binds (e.g. tcp://127.0.0.1:5557)`},
		{"bind mode, ipc", func(o *Options) { o.Connect = "ipc:///tmp/x" }, "Connect", `Connect "ipc:///tmp/x": want tcp://HOST:PORT`},
		{"bind mode, too many hosts", func(o *Options) { o.Connect, o.Engines = "127.0.0.1:5557", 255 }, "Engines",
			"Engines 255: bind mode runs engine i on 127.0.0.<i+1>, so at most 254"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.mod(&o)
			_, err := NewPlan(o)
			ce, ok := configerr.As(err)
			if !ok || ce.Field != tc.field || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("%v; want %s: %q", err, tc.field, tc.want)
			}
			if ce.Field != "Hasher" && reflect.ValueOf(o).FieldByName(string(ce.Field)).Kind() == reflect.Invalid {
				t.Errorf("%s is not a field of Options", ce.Field)
			}
		})
	}
	// The tokenizer is loaded by New: a file that is not one is refused.
	o := DefaultOptions()
	o.Tokenizer = t.TempDir() + "/none.json"
	if _, err := New(o); err == nil || !strings.HasPrefix(err.Error(), "Tokenizer "+o.Tokenizer+": open ") {
		t.Errorf("a missing tokenizer: %v", err)
	} else if ce, _ := configerr.As(err); ce.Field != "Tokenizer" {
		t.Errorf("a missing tokenizer is refused as %s", ce.Field)
	}
}

// The layout of the engines: in connect mode every rank binds its own
// event and replay ports on 127.0.0.1; in bind mode engine i is the host
// 127.0.0.<i+1> and connects to kvindex, replaying on a port plus its rank
// there. Follow is what kvindex serve needs of either.
func TestPlanLayout(t *testing.T) {
	h, err := blockhash.New(blockhash.Config{Algo: blockhash.SHA256CBOR, Seed: "0", BlockSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		mod           func(*Options)
		pods, https   []string
		pubs, replays [][]string
		follow        Follow
	}{
		{"connect mode", func(o *Options) { o.Ranks, o.Port, o.HTTPPort, o.Tokenizer = 2, 7000, 8000, "tok.json" },
			[]string{"pod-0", "pod-1"}, []string{"127.0.0.1:8000", "127.0.0.1:8001"},
			[][]string{{"tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"}, {"tcp://127.0.0.1:7002", "tcp://127.0.0.1:7003"}},
			[][]string{{"tcp://127.0.0.1:7004", "tcp://127.0.0.1:7005"}, {"tcp://127.0.0.1:7006", "tcp://127.0.0.1:7007"}},
			Follow{Tokenizer: "tok.json", Engines: []FollowEngine{
				{"pod-0", "tcp://127.0.0.1:7000", "tcp://127.0.0.1:7004", 2}, {"pod-1", "tcp://127.0.0.1:7002", "tcp://127.0.0.1:7006", 2}}}},
		{"connect mode, no replay", func(o *Options) { o.NoReplay = true },
			[]string{"pod-0", "pod-1"}, nil, [][]string{{"tcp://127.0.0.1:5557"}, {"tcp://127.0.0.1:5558"}}, [][]string{nil, nil},
			Follow{Engines: []FollowEngine{{"pod-0", "tcp://127.0.0.1:5557", "", 1}, {"pod-1", "tcp://127.0.0.1:5558", "", 1}}}},
		{"bind mode", func(o *Options) { o.Connect, o.Ranks, o.HTTPPort = "127.0.0.1:5557", 2, 8000 },
			[]string{"127.0.0.1", "127.0.0.2"}, []string{"127.0.0.1:8000", "127.0.0.2:8000"},
			[][]string{{"tcp://127.0.0.1:5557", "tcp://127.0.0.1:5557"}, {"tcp://127.0.0.1:5557", "tcp://127.0.0.1:5557"}},
			[][]string{{"tcp://127.0.0.1:5558", "tcp://127.0.0.1:5559"}, {"tcp://127.0.0.2:5558", "tcp://127.0.0.2:5559"}},
			Follow{Listen: "tcp://127.0.0.1:5557", ReplayTemplate: "tcp://{addr}:5558", EngineAllow: []string{"*=127.0.0.0/8"}}},
		{"bind mode, remote kvindex", func(o *Options) { o.Connect, o.Engines, o.ReplayPort = "tcp://kvindex.example:6000", 1, 7000 },
			[]string{"127.0.0.1"}, nil, [][]string{{"tcp://kvindex.example:6000"}}, [][]string{{"tcp://127.0.0.1:7000"}},
			Follow{Listen: "tcp://*:6000", ReplayTemplate: "tcp://{addr}:7000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Hasher, o.Model = h, "m"
			tc.mod(&o)
			p, err := NewPlan(o)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Pods(), tc.pods) || !slices.Equal(p.https, tc.https) ||
				!slices.EqualFunc(p.pubs, tc.pubs, slices.Equal) || !slices.EqualFunc(p.replays, tc.replays, slices.Equal) {
				t.Errorf("pods %v, https %v, pubs %v, replays %v", p.pods, p.https, p.pubs, p.replays)
			}
			tc.follow.Model, tc.follow.Hash = "m", h.Config()
			if got := p.Follow(); !reflect.DeepEqual(got, tc.follow) {
				t.Errorf("follow:\n got %+v\nwant %+v", got, tc.follow)
			}
		})
	}
}
