package zmqtransport

import (
	"strings"
	"testing"
)

func TestTopicPattern(t *testing.T) {
	type want struct {
		pod, model string
		ok         bool
	}
	tests := []struct {
		pattern string
		topic   string
		want    want
	}{
		// llm-d's convention, the default.
		{"", "kv@10.0.0.5@Qwen/Qwen3-0.6B", want{"10.0.0.5", "Qwen/Qwen3-0.6B", true}},
		{"", "kv@10.0.0.5@org/model@rev", want{"10.0.0.5", "org/model@rev", true}},
		{"", "kv@pod@m@", want{"pod", "m@", true}},
		{"", "kv@10.0.0.5", want{}},
		{"", "kv@@model", want{}},
		{"", "kv@pod@", want{}},
		{"", "kv-events", want{}},
		{"", "", want{}},
		{LLMDTopicPattern, "kv@p@m", want{"p", "m", true}},
		// Templates.
		{"events.{model}.{pod}", "events.llama.pod-7", want{"pod-7", "llama", true}},
		{"events.{model}.{pod}", "events.llama.3.pod-7", want{"3.pod-7", "llama", true}},
		{"{pod}", "anything at all", want{"anything at all", "", true}},
		{"kv/{pod}/x", "kv/a/x", want{"a", "", true}},
		{"kv/{pod}/x", "kv/a/y", want{}},
		{"a.b+{pod}", "a.b+p", want{"p", "", true}}, // literal text is not regexp syntax
		{"a.b+{pod}", "axbb+p", want{}},
		// Regular expressions.
		{`kv-(?P<pod>[^-]+)-(?P<model>.+)`, "kv-pod1-llama-3", want{"pod1", "llama-3", true}},
		{`kv-(?P<pod>[^-]+)-(?P<model>.+)`, "xkv-pod1-llama", want{}}, // anchored
		{`^kv-(?P<pod>\d+)$`, "kv-42", want{"42", "", true}},
		{`^kv-(?P<pod>\d*)$`, "kv-", want{}}, // an empty pod never matches
	}
	for _, tt := range tests {
		tp, err := compileTopicPattern(tt.pattern)
		if err != nil {
			t.Fatalf("pattern %q: %v", tt.pattern, err)
		}
		pod, model, err := tp.parse(tt.topic)
		got := want{pod, model, err == nil}
		if got != tt.want {
			t.Errorf("pattern %q, topic %q: got %+v, want %+v", tt.pattern, tt.topic, got, tt.want)
		}
	}
}

func TestTopicPatternErrors(t *testing.T) {
	for _, p := range []string{
		"kv@{pod",           // unclosed
		"kv@{host}@{model}", // unknown placeholder
		"kv@{pod}@{pod}",    // twice
		"kv@{model}",        // no pod
		`(?P<model>.+)`,     // regexp without pod
		`(?P<pod>[)`,        // bad regexp
	} {
		if _, err := compileTopicPattern(p); err == nil {
			t.Errorf("pattern %q accepted", p)
		}
	}
}

func TestExpandReplayTemplate(t *testing.T) {
	for _, tt := range []struct {
		tmpl, pod, model, addr string
		rank                   int
		want, err              string
	}{
		{tmpl: "tcp://{pod}:5558", pod: "10.0.0.5", model: "m", rank: 2, want: "tcp://10.0.0.5:5560"},
		{tmpl: "tcp://{model}-{pod}.svc:5558", pod: "p", model: "llama", want: "tcp://llama-p.svc:5558"},
		{tmpl: "tcp://{addr}:5567", pod: "evil.example", model: "m", addr: "10.0.0.7", rank: 1, want: "tcp://10.0.0.7:5568"},
		{tmpl: "tcp://{addr}:5567", pod: "p", model: "m", addr: "fd00::7", want: "tcp://[fd00::7]:5567"},
		// A pod containing a placeholder is text, never expanded again.
		{tmpl: "tcp://{addr}:5567", pod: "{addr}", model: "m", addr: "10.0.0.7", want: "tcp://10.0.0.7:5567"},
		{tmpl: "tcp://{addr}:5567", pod: "p", model: "m", err: "source address is not known"},
	} {
		got, err := expandReplayTemplate(tt.tmpl, tt.pod, tt.model, tt.addr, tt.rank)
		if got != tt.want || (tt.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("expand(%q, pod %q, addr %q, rank %d) = %q, %v; want %q, error %q", tt.tmpl, tt.pod, tt.addr, tt.rank, got, err, tt.want, tt.err)
		}
	}
}

// FuzzTopicPattern: parsing never panics, and llm-d pods never contain
// '@' while the model keeps the rest of the topic.
func FuzzTopicPattern(f *testing.F) {
	f.Add("kv@10.0.0.5@Qwen/Qwen3-0.6B")
	f.Add("kv@@")
	f.Add("kv@a@b@c")
	tp, err := compileTopicPattern("")
	if err != nil {
		f.Fatal(err)
	}
	tmpl, err := compileTopicPattern("x.{model}.{pod}")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		if pod, model, err := tp.parse(topic); err == nil {
			if strings.Contains(pod, "@") || pod == "" || model == "" || "kv@"+pod+"@"+model != topic {
				t.Fatalf("topic %q parsed as pod %q model %q", topic, pod, model)
			}
		}
		if pod, model, err := tmpl.parse(topic); err == nil && "x."+model+"."+pod != topic {
			t.Fatalf("topic %q parsed as pod %q model %q", topic, pod, model)
		}
	})
}
