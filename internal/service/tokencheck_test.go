package service

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/picker/gateway"
	"github.com/kvindex/kvindex/tokenizer"
)

const (
	qwenTokenizerFile = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
	qwenTemplateFile  = "../../tokenizer/chattemplate/testdata/templates/qwen2.5.json"
	phiTemplateFile   = "../../tokenizer/chattemplate/testdata/templates/phi-3.5-mini.jinja"
)

// simFront is a simulated vLLM engine's HTTP front (kvindex sim's), whose
// /tokenize is Qwen2.5's tokenizer with chat rendered as ChatML: its
// host:port.
func simFront(t *testing.T) string {
	t.Helper()
	tok, err := tokenizer.LoadFile(qwenTokenizerFile)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enginesim.New(enginesim.Config{Pod: "pod-a", Model: testModel, Hasher: testHasher, CapacityBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	front, err := simhttp.New(simhttp.Config{Ranks: []*enginesim.Engine{e}, Tokenizer: tok})
	if err != nil {
		t.Fatal(err)
	}
	if err := front.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	return front.Addr().String()
}

// kvindex picker --tokenizer checks its tokenizer against its endpoint's
// /tokenize in the background, started without its index: the verdicts
// show in /metrics; stopped, it leaves no goroutine behind.
func TestPickerServiceChecksItsTokenizer(t *testing.T) {
	engine := simFront(t)
	before := runtime.NumGoroutine()
	o := &PickerServiceOptions{
		Picker: PickerOptions{Gateway: gateway.Config{Endpoints: []gateway.Endpoint{{Pod: "pod-a", Addr: engine}},
			IndexTimeout: testDeadline}, ExtProcAddr: "127.0.0.1:0"},
		Index: testutil.FreeAddr(t), Dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		HTTPAddr:      "127.0.0.1:0",
		TokenizerFile: qwenTokenizerFile, ChatTemplateFile: phiTemplateFile,
	}
	log, logs := testLogger(t)
	pk, stop := startPicker(t, o, log)
	want := []string{`kvindex_picker_local_tokenizer_verified{form="chat"} 0`, `kvindex_picker_local_tokenizer_verified{form="completion"} 1`}
	testutil.Await(t, testDeadline, "the tokenizer check's verdicts in /metrics", func() bool {
		resp, err := http.Get("http://" + pk.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), want[0]) && strings.Contains(string(body), want[1])
	})
	if !strings.Contains(logs.String(), "level=WARN msg=\"picker: the local tokenizer's ids differ from the engine's: chat prompts go to the index as text") {
		t.Errorf("no WARN of the chat template that differs:\n%s", logs)
	}
	stop()
	goroutines(t, before)
}

// kvindex serve with both --tokenize-url and --tokenizer compares them at
// start, logs each form's verdict and reports it in ListPods.
func TestServeChecksItsTokenizers(t *testing.T) {
	for _, tc := range []struct {
		name, template string
		want           []string
		disagrees      string // the forms ListPods says disagree
	}{
		{"same", qwenTemplateFile, []string{"level=INFO msg=\"tokenizer check: the local tokenizer against the engine's /tokenize\" form=completion verdict=match",
			"level=INFO msg=\"tokenizer check: the local tokenizer against the engine's /tokenize\" form=chat verdict=match"}, ""},
		{"other template", phiTemplateFile, []string{"form=completion verdict=match", "level=WARN msg=\"tokenizer check: the local tokenizer (the fallback when the engine's /tokenize fails) does not give the engine's ids: its queries would match nothing\" form=chat verdict=mismatch"}, "chat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ec := newEngine(t, "pod-a")
			o := baseOptions(ec)
			o.TokenizeURL, o.TokenizerFile, o.ChatTemplateFile = "http://"+simFront(t), qwenTokenizerFile, tc.template
			s := startService(t, o)
			testutil.Await(t, testDeadline, "the tokenizer check's log", func() bool {
				for _, w := range tc.want {
					if !strings.Contains(s.logs.String(), w) {
						return false
					}
				}
				return true
			})
			var disagrees []string
			testutil.Await(t, testDeadline, "the tokenizer check in ListPods", func() bool {
				r, err := s.client.Pods(context.Background(), "")
				if err != nil {
					t.Fatal(err)
				}
				disagrees = nil
				for _, c := range r.GetTokenizerChecks() {
					if c.GetDisagrees() {
						disagrees = append(disagrees, c.GetForm())
					}
				}
				return len(r.GetTokenizerChecks()) == 2
			})
			if got := strings.Join(disagrees, ","); got != tc.disagrees {
				t.Errorf("ListPods says the forms %q disagree, want %q", got, tc.disagrees)
			}
			// The HTTP API and kvindex pods --json carry them too.
			var pj client.PodsJSON
			testutil.GetJSON(t, "http://"+s.HTTPAddr()+"/v1/pods", &pj)
			if len(pj.TokenizerChecks) != 2 || pj.TokenizerChecks[0].Verdict == "" {
				t.Errorf("/v1/pods tokenizer_checks %+v; want both forms' verdicts", pj.TokenizerChecks)
			}
		})
	}
}
