package kvevents_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/kvevents"
)

// FuzzDecode checks, for any payload, that Decode does not panic, that a
// failure is a classified *DecodeError leaving no events, and that a
// success is (1) well-formed msgpack by vmihailenco's reading, (2) decoded
// identically into a Batch already used for other payloads, and (3)
// re-encoded by AppendBatch and decoded again to the same Batch.
//
//	go test -run XXX -fuzz FuzzDecode -fuzztime 60s ./kvevents
func FuzzDecode(f *testing.F) {
	v := loadWireVectors(f)
	for _, g := range goldenPayloads {
		f.Add(v.vector(f, g.name).payload(f))
	}
	f.Add(pack(f, []any{1.5, []any{append([]any{"BlockStored"}, storedFields()...), []any{"Unknown", 1}, kv{"type", "BlockRemoved", "block_hashes", []any{bin{1, 2}}}}, 1}))
	f.Add(pack(f, kv{"ts", 1.0, "events", []any{kv{"block_hashes", []any{i64(-4)}, "type", "BlockRemoved"}}}))
	f.Add(pack(f, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{u16(60000), u32(1 << 20)}, 2, nil, nil, nil, []any{[]any{"a", []any{"b", -3}, bin{1}}}}}}))
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 8; i++ {
		p, err := kvevents.AppendBatch(nil, randomBatch(rng, i%2 == 0), kvevents.EncodeOptions{Shape: kvevents.Shape(1 + i%3), BytesHashes: i%2 == 0})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	dirtyPayload := pack(f, []any{1.0, []any{append([]any{"BlockStored"}, storedFields()...), append([]any{"BlockStored"}, storedFields()...)}, 2})

	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, flavor := range []kvevents.Flavor{kvevents.FlavorVLLM, kvevents.FlavorSGLang} {
			d := &kvevents.Decoder{Flavor: flavor, Limits: kvevents.Limits{MaxExtraDepth: 4}}
			var fresh kvevents.Batch
			err := d.Decode(payload, &fresh)
			if err != nil {
				var de *kvevents.DecodeError
				if !errors.As(err, &de) || errors.Is(err, kvevents.ErrMalformed) == errors.Is(err, kvevents.ErrTooLarge) {
					t.Fatalf("error %v (%T) is not a classified *DecodeError", err, err)
				}
				if len(fresh.Events) != 0 || fresh.Skipped != 0 {
					t.Fatalf("failed Decode left %d events", len(fresh.Events))
				}
				continue
			}

			// (1) The library agrees the payload is one msgpack value.
			r := bytes.NewReader(payload)
			if err := msgpack.NewDecoder(r).Skip(); err != nil || r.Len() != 0 {
				t.Fatalf("decoded a payload msgpack rejects (err %v, %d bytes left)", err, r.Len())
			}

			// (2) Reused slots give the same result.
			var dirty kvevents.Batch
			if err := d.Decode(dirtyPayload, &dirty); err != nil {
				t.Fatal(err)
			}
			if err := d.Decode(payload, &dirty); err != nil {
				t.Fatalf("second decode failed: %v", err)
			}
			if diff := diffBatch(&dirty, &fresh); diff != "" {
				t.Fatalf("decode into a used Batch differs: %s", diff)
			}

			// (3) Round trip, where the batch's hashes are all ints or all
			// digests (an event mixing both has no single encoding).
			bytesHashes, ok := hashForm(&fresh)
			if !ok {
				continue
			}
			shapes := []kvevents.Shape{kvevents.ShapeMap, kvevents.ShapeArray}
			if flavor == kvevents.FlavorSGLang {
				shapes = shapes[:1] // SGLang arrays carry fewer fields than the map form
			}
			for _, shape := range shapes {
				p, err := kvevents.AppendBatch(nil, &fresh, kvevents.EncodeOptions{Shape: shape, BytesHashes: bytesHashes})
				if err != nil {
					t.Fatalf("re-encode %v: %v", shape, err)
				}
				var again kvevents.Batch
				if err := d.Decode(p, &again); err != nil {
					t.Fatalf("decode of re-encoded %v: %v\n%x", shape, err, p)
				}
				if diff := diffBatch(&again, &fresh); diff != "" {
					t.Fatalf("round trip through %v differs: %s", shape, diff)
				}
			}
		}
	})
}

// hashForm reports whether every hash of b came as a digest (true) or
// every one as an int (false); ok is false when b mixes them.
func hashForm(b *kvevents.Batch) (bytesHashes, ok bool) {
	var ints, digests bool
	for _, ev := range b.Events {
		for i := range ev.Hashes {
			if i < len(ev.Digests) && len(ev.Digests[i]) > 0 {
				digests = true
			} else {
				ints = true
			}
		}
		if ev.HasParent {
			if len(ev.ParentDigest) > 0 {
				digests = true
			} else {
				ints = true
			}
		}
	}
	return digests, !(ints && digests)
}
