package tokenizer_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"

	"github.com/kvindex/kvindex/tokenizer"
)

// A local tokenizer.json reproduces HuggingFace's ids for completion
// prompts, special tokens written in the text included.
func ExampleLocal() {
	tok, err := tokenizer.LoadFile("testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		log.Fatal(err)
	}
	ids, err := tok.Tokenize(context.Background(), "Qwen/Qwen2.5-7B-Instruct",
		tokenizer.Input{Prompt: "Hello world<|im_end|>"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ids)

	_, err = tok.Tokenize(context.Background(), "",
		tokenizer.Input{Messages: []tokenizer.Message{{Role: "user", Content: "hi"}}})
	fmt.Println(err)
	// Output:
	// [9707 1879 151645]
	// tokenizer: the local tokenizer encodes completion prompts only; it cannot render chat templates, so chat messages, tools and chat_template_kwargs need the engine's /tokenize
}

// The engine's own /tokenize is exact for both forms, chat templates
// included; repeated requests are answered from the cache.
func ExampleNewHTTP() {
	// A stand-in for vLLM's /tokenize.
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"count":3,"max_model_len":32768,"tokens":[151644,872,198]}`)
	}))
	defer engine.Close()

	tok, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: engine.URL})
	if err != nil {
		log.Fatal(err)
	}
	in := tokenizer.Input{Messages: []tokenizer.Message{{Role: "user", Content: "hi"}}}
	for range 2 {
		ids, err := tok.Tokenize(context.Background(), "Qwen/Qwen2.5-7B-Instruct", in)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ids)
	}
	s := tok.Stats()
	fmt.Println("engine requests:", s.Requests, "cache hits:", s.CacheHits)
	// Output:
	// [151644 872 198]
	// [151644 872 198]
	// engine requests: 1 cache hits: 1
}

// Fallback prefers the engine and falls back to the local tokenizer.json
// when the engine is unavailable.
func ExampleFallback() {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "starting", http.StatusServiceUnavailable)
	}))
	defer down.Close()

	engine, err := tokenizer.NewHTTP(tokenizer.HTTPConfig{BaseURL: down.URL})
	if err != nil {
		log.Fatal(err)
	}
	local, err := tokenizer.LoadFile("testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		log.Fatal(err)
	}
	tok := tokenizer.Fallback{engine, local}
	ids, err := tok.Tokenize(context.Background(), "Qwen/Qwen2.5-7B-Instruct", tokenizer.Input{Prompt: "Hello world"})
	fmt.Println(ids, err)
	// Output: [9707 1879] <nil>
}

// A Local with a segment cache re-encodes only what is new when the same
// conversation comes back with one more turn.
func ExampleLocal_WithSegmentCache() {
	local, err := tokenizer.LoadFile("testdata/qwen2.5/tokenizer.json.gz")
	if err != nil {
		log.Fatal(err)
	}
	tok := local.WithSegmentCache(64 << 20)
	turn1 := "<|im_start|>user\nWhat is a KV cache?<|im_end|>\n<|im_start|>assistant\n"
	turn2 := turn1 + "The attention keys and values of earlier tokens.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"
	a := tok.Encode(turn1, false)
	b := tok.Encode(turn2, false)
	fmt.Println(len(a), len(b), slices.Equal(b, local.Encode(turn2, false)))
	s := tok.Stats()
	fmt.Println("hits:", s.SegmentHits, "misses:", s.SegmentMisses)
	// Output:
	// 14 34 true
	// hits: 5 misses: 5
}
