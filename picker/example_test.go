package picker_test

import (
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/kvindex/kvindex/picker"
)

// ExampleScorer_Pick routes a conversation's second turn: pod-b holds most
// of its prompt (the index said so) but is busier than pod-a.
func ExampleScorer_Pick() {
	s, err := picker.New(picker.DefaultConfig())
	if err != nil {
		log.Fatal(err)
	}
	req := &picker.Request{
		Model:   "qwen",
		Keys:    []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, // 160 tokens
		Session: "conv-42",
	}
	cands := []picker.Candidate{
		{Pod: "pod-a", Endpoint: "10.0.0.1:8000", InFlight: 0},
		{Pod: "pod-b", Endpoint: "10.0.0.2:8000", InFlight: 1, Prefix: picker.Prefix{GPU: 9}},
	}
	d, err := s.Pick(time.Now(), req, cands)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := json.Marshal(d)
	fmt.Println(string(out))
	// Output:
	// {"endpoint":"10.0.0.2:8000","pod":"pod-b","index_seq":0,"scores":[{"pod":"pod-b","prefix":0.9,"load":0,"total":0.63,"matched_tokens":144},{"pod":"pod-a","prefix":0,"load":1,"total":0.3,"matched_tokens":0}]}
}
