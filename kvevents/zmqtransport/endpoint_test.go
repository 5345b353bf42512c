package zmqtransport

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckEndpoint(t *testing.T) {
	tests := []struct {
		ep       string
		bind     bool
		ranks    int
		err      string // "" accepts
		wildcard bool
	}{
		{"tcp://10.0.0.5:5557", false, 1, "", false},
		{"tcp://10.0.0.5:5557", false, 8, "", false},
		{"tcp://host.svc:1", false, 1, "", false},
		{"tcp://[::1]:5557", false, 2, "", false},
		{"inproc://events", false, 4, "", false},
		{"ipc:///tmp/kv.sock", false, 1, "", false},
		{"tcp://*:5557", false, 1, `"*" is not a host to connect to`, true},
		{"tcp://[::]:5557", false, 1, `"[::]" is not a host to connect to`, true},
		{"tcp://127.0.0.1", false, 1, "no port (want tcp://HOST:PORT", false},
		{"tcp://:5557", false, 1, "no host (want tcp://HOST:PORT", false},
		{"tcp://h:*", false, 1, `port "*": connecting needs the engine's port, in 1..65535`, false},
		{"tcp://h:0", false, 1, `port "0": connecting needs`, false},
		{"tcp://h:99999", false, 1, `port "99999" is not in 1..65535`, false},
		{"tcp://h:-1", false, 1, `port "-1" is not in 1..65535`, false},
		{"tcp://h:x", false, 1, `port "x" is not in 1..65535`, false},
		{"tcp://h:65535", false, 2, "port 65535 cannot be offset by 2 data-parallel ranks: ports 65535-65536 go beyond 65535", false},
		{"ipc:///tmp/kv.sock", false, 2, "an ipc endpoint cannot carry data-parallel ranks above 0", false},
		{"ipc://", false, 1, "empty ipc name", false},
		{"udp://h:1", false, 1, `unknown transport "udp" (want tcp://HOST:PORT, ipc://PATH or inproc://NAME)`, false},
		{"10.0.0.5:5557", false, 1, "no transport (want tcp://HOST:PORT, ipc://PATH or inproc://NAME)", false},
		// Binding: "*" hosts, and ephemeral ports for one rank only.
		{"tcp://*:5557", true, 4, "", false},
		{"tcp://*:*", true, 1, "", false},
		{"tcp://127.0.0.1:0", true, 1, "", false},
		{"tcp://127.0.0.1:99999", true, 1, `port "99999" is not in 1..65535`, false},
		{"tcp://*:*", true, 2, `an ephemeral port ("*") cannot be offset by the rank`, false},
		{"tcp://*:65534", true, 3, "ports 65534-65536 go beyond 65535", false},
	}
	for _, tt := range tests {
		check := CheckConnectEndpoint
		if tt.bind {
			check = CheckBindEndpoint
		}
		err := check(tt.ep, tt.ranks)
		if tt.err == "" {
			if err != nil {
				t.Errorf("%q (bind %v, %d ranks): %v", tt.ep, tt.bind, tt.ranks, err)
			}
			continue
		}
		var ee *EndpointError
		if !errors.As(err, &ee) || !strings.Contains(err.Error(), tt.err) || ee.Wildcard != tt.wildcard ||
			!strings.HasPrefix(err.Error(), `endpoint "`+tt.ep+`": `) {
			t.Errorf("%q (bind %v, %d ranks): error %v, want an *EndpointError naming it and saying %q (wildcard %v)", tt.ep, tt.bind, tt.ranks, err, tt.err, tt.wildcard)
		}
	}
}

func TestCheckReplayTemplate(t *testing.T) {
	for tmpl, want := range map[string]string{
		"tcp://{pod}:5567":         "",
		"tcp://{model}.{pod}:5567": "",
		"tcp://{pod}":              "", // the pod may carry the port
		"tcp://{addr}:5567":        "",
		"tcp://replay:5567":        "no {addr} or {pod}",
		"tcp://{pod}:99999":        `port "99999" is not in 1..65535`,
		"tcp://{pod}:65535":        "cannot be offset by 2 data-parallel ranks",
		"{pod}:5567":               "no transport",
	} {
		err := CheckReplayTemplate(tmpl, 2)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("CheckReplayTemplate(%q) = %v, want %q", tmpl, err, want)
		}
	}
}

func TestCheckSourceReplayTemplate(t *testing.T) {
	for tmpl, want := range map[string]string{
		"tcp://{addr}:5567":       "",
		"tcp://{pod}:5567":        "want tcp://{addr}:PORT",
		"tcp://{addr}.{pod}:5567": "want tcp://{addr}:PORT",
		"tcp://{addr}:{model}":    "want tcp://{addr}:PORT",
		"ipc://{addr}":            "want tcp://{addr}:PORT",
		"tcp://{addr}:0":          `port "0" is not in 1..65535`,
		"tcp://{addr}:5567;x":     `port "5567;x"`,
	} {
		err := CheckSourceReplayTemplate(tmpl)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("CheckSourceReplayTemplate(%q) = %v, want %q", tmpl, err, want)
		}
	}
}

func TestOffsetEndpoint(t *testing.T) {
	tests := []struct {
		ep   string
		rank int
		want string // "" with wantErr
		err  bool
	}{
		{"tcp://10.0.0.5:5557", 0, "tcp://10.0.0.5:5557", false},
		{"tcp://10.0.0.5:5557", 3, "tcp://10.0.0.5:5560", false},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", false},
		{"tcp://host.svc:5558", 2, "tcp://host.svc:5560", false},
		{"inproc://events", 2, "inproc://events_dp2", false},
		{"ipc:///tmp/ev", 0, "ipc:///tmp/ev", false},
		{"", 5, "", false},
		{"ipc:///tmp/ev", 1, "", true},
		{"tcp://host", 1, "", true},
		{"tcp://host:abc", 1, "", true},
		{"tcp://host:65535", 1, "", true},
	}
	for _, tt := range tests {
		got, err := offsetEndpoint(tt.ep, tt.rank)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("offsetEndpoint(%q, %d) = %q, %v; want %q, error %v", tt.ep, tt.rank, got, err, tt.want, tt.err)
		}
	}
}

// The documented multi-rank layout and the ways it goes wrong: vLLM adds
// the rank to both ports, so the replay base must leave room for every
// rank's event port, and engines sharing a host must not share ports.
func TestCheckLayout(t *testing.T) {
	eng := func(name, ep, replay string, ranks int) EngineConfig {
		return EngineConfig{Name: name, Model: "m", Endpoint: ep, ReplayEndpoint: replay, Ranks: ranks}
	}
	tests := []struct {
		name    string
		engines []EngineConfig
		index   int
		err     string // the whole Detail; "" accepts
	}{
		{"documented layout", []EngineConfig{
			eng("pod-a", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5567", 1),
			eng("pod-b", "tcp://10.0.0.6:5557", "tcp://10.0.0.6:5567", 2),
		}, 0, ""},
		{"one rank, adjacent ports", []EngineConfig{eng("a", "tcp://h:5557", "tcp://h:5558", 1)}, 0, ""},
		{"replay below the events", []EngineConfig{eng("a", "tcp://h:5560", "tcp://h:5557", 3)}, 0, ""},
		{"replay on another host", []EngineConfig{eng("a", "tcp://h:5557", "tcp://other:5558", 2)}, 0, ""},
		{"same ports, other hosts", []EngineConfig{eng("a", "tcp://h1:5557", "", 2), eng("b", "tcp://h2:5557", "", 2)}, 0, ""},
		{"two ranks, adjacent ports", []EngineConfig{
			eng("pod-a", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5567", 1),
			eng("pod-b", "tcp://10.0.0.6:5557", "tcp://10.0.0.6:5558", 2),
		}, 1, "ranks=2 uses event ports 5557-5558 and replay ports 5558-5559, which overlap at 5558; vLLM offsets both by the rank, so leave a gap: replay=tcp://10.0.0.6:5567"},
		{"replay equals events", []EngineConfig{eng("a", "tcp://h:5557", "tcp://h:5557", 1)}, 0,
			"the event and replay ports are both 5557; the replay socket needs its own port: replay=tcp://h:5567"},
		{"hosts differ in case only", []EngineConfig{eng("a", "tcp://Host:5557", "tcp://host:5560", 4)}, 0,
			"ranks=4 uses event ports 5557-5560 and replay ports 5560-5563, which overlap at 5560; vLLM offsets both by the rank, so leave a gap: replay=tcp://host:5567"},
		{"many ranks", []EngineConfig{eng("a", "tcp://h:5557", "tcp://h:5558", 12)}, 0,
			"ranks=12 uses event ports 5557-5568 and replay ports 5558-5569, which overlap at 5558; vLLM offsets both by the rank, so leave a gap: replay=tcp://h:5577"},
		{"no room above", []EngineConfig{eng("a", "tcp://h:65530", "tcp://h:65531", 2)}, 0,
			"ranks=2 uses event ports 65530-65531 and replay ports 65531-65532, which overlap at 65531; vLLM offsets both by the rank, so leave a gap: replay=tcp://h:65520"},
		{"another engine's rank", []EngineConfig{eng("a", "tcp://h:5557", "tcp://h:5567", 2), eng("b", "tcp://h:5558", "", 1)}, 1,
			`event port 5558 is taken: engine "a" uses it for rank 1's events; engines on one host need ports of their own, counting every rank (vLLM offsets both ports by the rank)`},
		{"another engine's replay", []EngineConfig{eng("a", "tcp://h:5557", "tcp://h:5567", 1), eng("b", "tcp://h:5565", "tcp://h:5575", 3)}, 1,
			`rank 2's event port 5567 is taken: engine "a" uses it for its replay socket; engines on one host need ports of their own, counting every rank (vLLM offsets both ports by the rank)`},
		{"the same endpoint twice", []EngineConfig{eng("a", "tcp://h:5557", "", 1), eng("b", "tcp://h:5557", "", 1)}, 1,
			`event port 5557 is taken: engine "a" uses it for events; engines on one host need ports of their own, counting every rank (vLLM offsets both ports by the rank)`},
		{"inproc names", []EngineConfig{eng("a", "inproc://ev", "inproc://ev", 2)}, 0,
			`the event and replay endpoints are both "inproc://ev"; the replay socket needs its own`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckLayout(tt.engines)
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var le *LayoutError
			if !errors.As(err, &le) || le.Detail != tt.err || le.Index != tt.index || le.Engine != tt.engines[tt.index].Name {
				t.Fatalf("error %v (%#v)\nwant engine %d: %s", err, le, tt.index, tt.err)
			}
		})
	}
}
