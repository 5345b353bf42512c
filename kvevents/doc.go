// Package kvevents takes in the KV-cache events inference engines publish
// and turns them into one ordered, gap-free stream per engine.
//
// The data path:
//
//	engine PUB --[topic, seq u64 BE, msgpack EventBatch]--> subscriber
//	  -> decode (every vLLM wire version, SGLang)     -> typed Events
//	  -> sequencer per (engine, dp rank): gap -> replay over DEALER;
//	     sequence going backwards -> Reset
//	  -> Sink.Apply(engine, seq, events)
//
// The package knows nothing about the index beyond the Sink interface.
package kvevents
