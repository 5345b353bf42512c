package zmqtransport

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/configerr"
)

// flagName names the settings as the kvindex command does, so that the
// messages read as its users see them.
func flagName(f configerr.Field) string {
	return map[configerr.Field]string{"Engines": "--engine", "Model": "--model", "Listen": "--listen"}[f]
}

// TestParseEngine: specs, their defaults, and every refusal with the
// setting it names.
func TestParseEngine(t *testing.T) {
	tests := []struct {
		in    string
		model string
		want  EngineConfig
		err   string
	}{
		{"a=tcp://10.0.0.5:5557", "m", EngineConfig{Name: "a", Model: "m", Endpoint: "tcp://10.0.0.5:5557", Ranks: 1}, ""},
		{"a=10.0.0.5:5557,replay=10.0.0.5:5567,ranks=4,model=x,topic=kv@", "",
			EngineConfig{Name: "a", Model: "x", Endpoint: "tcp://10.0.0.5:5557", ReplayEndpoint: "tcp://10.0.0.5:5567", Ranks: 4, Topic: "kv@"}, ""},
		{"a=ipc:///tmp/kv.sock", "m", EngineConfig{Name: "a", Model: "m", Endpoint: "ipc:///tmp/kv.sock", Ranks: 1}, ""},
		{"a", "m", EngineConfig{}, `--engine "a": missing "=ENDPOINT"`},
		{"a=", "m", EngineConfig{}, `--engine "a=": missing "=ENDPOINT"`},
		{"=tcp://x:1", "m", EngineConfig{}, "the name must be non-empty"},
		{"a=tcp://x:1", "", EngineConfig{}, "no model: add ,model=M or set --model"},
		{"a=tcp://x:1,ranks=0", "m", EngineConfig{}, "ranks=0: want an integer in 1..1024"},
		{"a=tcp://x:1,ranks=two", "m", EngineConfig{}, "ranks=two"},
		{"a=tcp://x:1,replay", "m", EngineConfig{}, `option "replay": want KEY=VALUE`},
		{"a=tcp://x:1,color=red", "m", EngineConfig{}, `unknown option "color"`},
		{"a=,replay=tcp://x:2", "m", EngineConfig{}, "empty endpoint"},
		// Endpoints kvindex cannot connect to, and overlapping rank layouts.
		{"a=tcp://*:5557", "m", EngineConfig{}, `--engine "a=tcp://*:5557": a connect-mode endpoint needs the engine's host, e.g. tcp://10.0.0.5:5557; "*" binds — for engines that connect to kvindex, use --listen 'tcp://*:5557' (bind mode)`},
		{"a=*:5557", "m", EngineConfig{}, `--engine "a=*:5557": a connect-mode endpoint needs the engine's host`},
		{"a=tcp://10.0.0.5:5557,replay=tcp://*:5558", "m", EngineConfig{}, `--engine "a=tcp://10.0.0.5:5557,replay=tcp://*:5558": the replay endpoint needs the engine's host, e.g. replay=tcp://10.0.0.5:5558 ("*" is where the engine binds it)`},
		{"a=127.0.0.1", "m", EngineConfig{}, `--engine "a=127.0.0.1": endpoint "tcp://127.0.0.1": no port (want tcp://HOST:PORT, e.g. tcp://10.0.0.5:5557)`},
		{"a=tcp://h:1,replay=h", "m", EngineConfig{}, `--engine "a=tcp://h:1,replay=h": replay endpoint "tcp://h": no port`},
		{"a=tcp://h:99999", "m", EngineConfig{}, `endpoint "tcp://h:99999": port "99999" is not in 1..65535`},
		{"a=udp://h:1", "m", EngineConfig{}, `unknown transport "udp" (want tcp://HOST:PORT, ipc://PATH or inproc://NAME)`},
		{"a=tcp://h:65535,ranks=2", "m", EngineConfig{}, "port 65535 cannot be offset by 2 data-parallel ranks"},
		{"pod-b=tcp://10.0.0.6:5557,replay=tcp://10.0.0.6:5558,ranks=2", "m", EngineConfig{},
			`--engine "pod-b=tcp://10.0.0.6:5557,replay=tcp://10.0.0.6:5558,ranks=2": ranks=2 uses event ports 5557-5558 and replay ports 5558-5559, which overlap at 5558; vLLM offsets both by the rank, so leave a gap: replay=tcp://10.0.0.6:5567`},
		{"a=tcp://h:5557,replay=tcp://h:5557", "m", EngineConfig{}, "the event and replay ports are both 5557"},
	}
	for _, tc := range tests {
		got, err := ParseEngine(tc.in, tc.model)
		switch {
		case tc.err != "":
			ce, ok := configerr.As(err)
			if !ok || ce.Field != "Engines" || !ce.Usage() || !strings.Contains(ce.Render(flagName), tc.err) {
				t.Errorf("ParseEngine(%q) error %v, want %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("ParseEngine(%q): %v", tc.in, err)
		case got != tc.want:
			t.Errorf("ParseEngine(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestParseEngines(t *testing.T) {
	got, err := ParseEngines([]string{"a=tcp://h:5557,ranks=2", "b=tcp://h:6000"}, "m")
	if err != nil || len(got) != 2 || got[1].Name != "b" {
		t.Fatalf("ParseEngines: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		specs []string
		want  string
	}{
		{[]string{"a=tcp://x:1", "a=tcp://y:1"}, `--engine "a=tcp://y:1": the name "a" is used twice`},
		{[]string{"a=tcp://h:5557,ranks=2", "b=tcp://h:5558"}, `--engine "b=tcp://h:5558": event port 5558 is taken: engine "a" uses it for rank 1's events`},
	} {
		_, err := ParseEngines(tc.specs, "m")
		ce, ok := configerr.As(err)
		if !ok || !strings.HasPrefix(ce.Render(flagName), tc.want) {
			t.Errorf("ParseEngines(%q): %v, want %q", tc.specs, err, tc.want)
		}
	}
}
