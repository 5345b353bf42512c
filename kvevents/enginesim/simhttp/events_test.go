package simhttp_test

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/enginesim"
	"github.com/kvindex/kvindex/kvevents/enginesim/simhttp"
	"github.com/kvindex/kvindex/kvevents/enginesim/simzmq"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// The blocks of HTTP requests are published as KV events like any
// others: a real ZMQ subscriber feeding kvindex's index sees them, and
// the index then says what the engine holds of the conversation, which
// is what the engine's next answer reports as cached.
func TestEventsReachIndex(t *testing.T) {
	h := hasher(t)
	eng, err := simzmq.New(enginesim.Config{Pod: "pod-0", Model: testModel, Hasher: h, CapacityBlocks: 256},
		zmqtransport.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ix, err := indexer.New(indexer.Options{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := zmqtransport.NewSubscriber(zmqtransport.SubscriberConfig{Engines: []zmqtransport.EngineConfig{{
		Name: "pod-0", Model: testModel, Endpoint: eng.PubEndpoint(), ReplayEndpoint: eng.ReplayEndpoint(),
	}}}, ix, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_, url := front(t, simhttp.Config{Ranks: []*enginesim.Engine{eng.Engine}, Tokenizer: qwen(t)})

	id := eng.EngineID()
	stream := func() kvevents.StreamStats {
		for _, st := range sub.Streams() {
			if st.Engine == id {
				return st
			}
		}
		return kvevents.StreamStats{}
	}
	// caughtUp: every batch the engine published is applied, no replay
	// outstanding.
	caughtUp := func() bool {
		st := stream()
		return st.Batches > 0 && st.LastSeq == eng.Seq()-1 && !st.Replaying
	}
	// A PUB socket gives no sign of a subscription: publish harmless
	// AllBlocksCleared batches (the cache is empty) until one arrives.
	testutil.Await(t, deadline, "the subscription", func() bool {
		if err := eng.Clear(); err != nil {
			t.Fatal(err)
		}
		return caughtUp()
	})

	conv := `[{"role":"system","content":"You are a coding agent. Read files before you edit them, and run the tests after."},` +
		`{"role":"user","content":"Why does the index lag behind the engine when a batch is lost on the socket?"}]`
	for turn := range 2 {
		body := fmt.Sprintf(`{"model":%q,"messages":%s}`, testModel, conv)
		ids := mustPost(t, url+"/tokenize", body).Tokens
		testutil.Await(t, deadline, "the index caught up", caughtUp)
		var res indexer.Result
		if err := ix.LongestPrefix(&indexer.Query{Model: testModel, Tokens: ids}, &res); err != nil {
			t.Fatal(err)
		}
		predicted := 0
		for _, p := range res.Pods {
			if p.Engine.Pod == "pod-0" {
				predicted = p.MatchedBlocks
			}
		}
		held, err := eng.Lookup(ids, nil)
		if err != nil {
			t.Fatal(err)
		}
		if predicted != held {
			t.Errorf("turn %d: the index says pod-0 holds %d blocks of the conversation, the engine holds %d", turn, predicted, held)
		}
		u := mustPost(t, url+"/v1/chat/completions", body).Usage
		if u.PromptTokensDetails.CachedTokens != predicted*bs || u.PromptTokens != len(ids) {
			t.Errorf("turn %d: usage %+v; the index predicted %d cached blocks of %d tokens", turn, u, predicted, len(ids))
		}
		if turn == 1 && predicted == 0 {
			t.Error("turn 2 found nothing of turn 1 cached")
		}
		// The next turn resends this one with the answer and a new message.
		conv = conv[:len(conv)-1] + `,{"role":"assistant","content":"Because the subscriber must replay the lost batch first."},` +
			`{"role":"user","content":"And if the replay buffer no longer has it?"}]`
	}
	testutil.Await(t, deadline, "the index caught up", caughtUp)
	if st := stream(); st.LostBatches != 0 {
		t.Errorf("stream stats %+v", st)
	}
}
