package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/watchhub"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/tokenizer"
)

// httpFuzzPaths are the endpoints FuzzHTTPRequest posts to, picked by the
// input's first byte.
var httpFuzzPaths = []string{"/v1/longest-prefix", "/v1/lookup"}

// FuzzHTTPRequest posts arbitrary bodies to the HTTP API of a server with
// an index, the local tokenizer and an engine's /tokenize behind it: every
// answer must be a JSON object, 200 or a 4xx with an error message (a 5xx
// would blame kvindex for a client's mistake), and every request kvindex
// forwards to the engine must be valid JSON.
//
//	go test -run '^$' -fuzz '^FuzzHTTPRequest$' -fuzztime 60s ./api/server
func FuzzHTTPRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"qwen","tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"candidate_pods":["a","b"]}`,
		`{"model":"qwen","block_hashes":[1,18446744073709551615]}`,
		`{"model":"qwen","prompt":"The KV cache of a transformer","lora_name":"l","cache_salt":"s"}`,
		`{"model":"qwen","tokens":[1,2,3],"mm_items":[{"identifier":"img","offset":1,"length":2}]}`,
		`{"model":"qwen","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"documents":[{"a":1}],"reasoning_effort":"low"}`,
		`{"model":"qwen","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"chat_template_kwargs":{"k":true}}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[]}],"add_generation_prompt":false}`,
		`{"model":"other","tokens":[1]}`,
		`{"model":"qwen","tokens":[1],"prompt":"x"}`,
		`{"model":"qwen","tools":[]}`,
		`{"model":"qwen","tokens":[1.5,-2]}`,
		`{"model":"qwen","token":[1]}`,
		`{"model":`, `[1,2]`, ``, `{} {}`,
	} {
		f.Add(byte(0), []byte(s))
	}
	f.Add(byte(1), []byte(`{"model":"qwen","tokens":[1,2,3]}`))
	f.Add(byte(1), []byte(`{"model":"qwen","candidate_pods":["a"]}`))

	var badForward atomic.Value // the first invalid body kvindex sent the engine
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !json.Valid(body) {
			badForward.CompareAndSwap(nil, string(body))
			http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"count":17,"max_model_len":4096,"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	}))
	f.Cleanup(engine.Close)
	engineTok, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: engine.URL, Timeout: 5 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	ix, err := indexer.New(indexer.Options{Hasher: testHasher})
	if err != nil {
		f.Fatal(err)
	}
	hub := watchhub.New(ix, watchhub.Limits{})
	srv, err := New(Config{
		Index: ix, BlockSize: testBlockSize, Hub: hub, DefaultModel: testModel, ReadyGrace: -1, MaxTokens: 4096,
		Tokenizers: []NamedTokenizer{{client.SourceEngine, engineTok}, {client.SourceLocal, localTokenizer(f)}},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(srv.Shutdown)
	hub.Apply(kvevents.EngineID{Model: testModel, Pod: "a"}, 0, []kvevents.Event{stored(f, testutil.Seq(1, 17), 1)})
	h := srv.Handler(HTTPOptions{})

	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		path := httpFuzzPaths[int(which)%len(httpFuzzPaths)]
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		if bad := badForward.Load(); bad != nil {
			t.Fatalf("kvindex sent the engine invalid JSON %q", bad)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %q: Content-Type %q", path, body, ct)
		}
		var answer map[string]json.RawMessage
		if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
			t.Fatalf("%s %q: %d answer %q is not a JSON object", path, body, rec.Code, rec.Body)
		}
		switch {
		case rec.Code == http.StatusOK:
			if _, ok := answer["error"]; ok {
				t.Fatalf("%s %q: 200 with an error: %s", path, body, rec.Body)
			}
		case rec.Code >= 400 && rec.Code < 500:
			var e struct{ Error string }
			if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error == "" {
				t.Fatalf("%s %q: %d without an error message: %s", path, body, rec.Code, rec.Body)
			}
		default:
			t.Fatalf("%s %q: status %d: %s", path, body, rec.Code, rec.Body)
		}
	})
}
