package indexer

import (
	"slices"
	"unsafe"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/kvevents"
)

// Bounds of the BlockStored events kept per engine flagged mismatch
// (HashSamples): enough blocks to tell configurations apart, few enough
// that a fleet of misconfigured engines costs little of the budget.
const (
	// MaxHashSamples is the number of events kept per engine, the newest.
	MaxHashSamples = 8
	// MaxHashSampleTokens bounds one kept event's token ids: longer events
	// keep their leading whole blocks, and events whose one block is
	// longer are not kept.
	MaxHashSampleTokens = 1024
)

// sampleOverheadBytes is the accounted cost of one kept event beyond its
// slices' contents: the Event struct and the slice headers.
const sampleOverheadBytes = int64(unsafe.Sizeof(kvevents.Event{})) + 64

// EngineSamples is one engine's kept BlockStored events (HashSamples).
type EngineSamples struct {
	Engine kvevents.EngineID
	// Events are BlockStored events, oldest first, cut to at most
	// MaxHashSampleTokens tokens each: copies the caller owns.
	Events []kvevents.Event
}

// HashSamples returns the BlockStored events kept for each engine of
// model ("": every model) that is flagged HashMismatch: the last
// MaxHashSamples the engine sent since the mismatch was found (the one
// that revealed it first), for a search of the configuration that
// reproduces them (kvindex doctor). Engines are sorted by model, pod and
// rank.
func (ix *Index) HashSamples(model string) []EngineSamples {
	var out []EngineSamples
	for m, ns := range *ix.models.Load() {
		if model != "" && m != model {
			continue
		}
		for _, e := range ns.engines.Load().byID {
			if e == nil {
				continue
			}
			e.mu.Lock()
			if len(e.samples) > 0 {
				es := EngineSamples{Engine: e.eid, Events: make([]kvevents.Event, len(e.samples))}
				for i := range e.samples {
					es.Events[i] = copySample(kvevents.Event{}, &e.samples[i], len(e.samples[i].Hashes))
				}
				out = append(out, es)
			}
			e.mu.Unlock()
		}
	}
	slices.SortFunc(out, func(a, b EngineSamples) int { return compareEngineID(a.Engine, b.Engine) })
	return out
}

// keepSample remembers a copy of ev (a BlockStored with tokens of an
// engine flagged mismatch; mu held), dropping the oldest beyond
// MaxHashSamples, whose storage the copy reuses, and adds the byte change
// to b.
func (e *engine) keepSample(ev *kvevents.Event, b *batch) {
	n := min(len(ev.Hashes), MaxHashSampleTokens/ev.BlockSize)
	if n == 0 {
		return
	}
	var dst kvevents.Event
	if len(e.samples) == MaxHashSamples {
		dst = e.samples[0]
		d := sampleBytes(&dst)
		e.sampleBytes -= d
		b.bytes -= d
		copy(e.samples, e.samples[1:])
		e.samples = e.samples[:len(e.samples)-1]
	}
	e.samples = append(e.samples, copySample(dst, ev, n))
	d := sampleBytes(&e.samples[len(e.samples)-1])
	e.sampleBytes += d
	b.bytes += d
}

// copySample copies ev's first n blocks and what hashing them needs into
// dst, reusing its storage.
func copySample(dst kvevents.Event, ev *kvevents.Event, n int) kvevents.Event {
	out := kvevents.Event{
		Kind:         kvevents.BlockStored,
		Hashes:       append(dst.Hashes[:0], ev.Hashes[:n]...),
		HasParent:    ev.HasParent,
		Parent:       ev.Parent,
		ParentDigest: append(dst.ParentDigest[:0], ev.ParentDigest...),
		TokenIDs:     append(dst.TokenIDs[:0], ev.TokenIDs[:n*ev.BlockSize]...),
		BlockSize:    ev.BlockSize,
		LoRAName:     ev.LoRAName,
		Medium:       ev.Medium,
		GroupIdx:     ev.GroupIdx,
	}
	if ev.Digests != nil {
		out.Digests = dst.Digests[:0]
		for i := range n {
			var reuse []byte
			if i < cap(dst.Digests) {
				reuse = dst.Digests[:i+1][i]
			}
			out.Digests = append(out.Digests, append(reuse[:0], ev.Digests[i]...))
		}
	}
	if ev.ExtraKeys != nil {
		out.ExtraKeys = make([]blockhash.BlockExtra, n)
		for i := range out.ExtraKeys {
			out.ExtraKeys[i] = cloneExtra(ev.ExtraKeys[i])
		}
	}
	return out
}

// dropSamples forgets the kept events (mu held) and returns the byte
// change.
func (e *engine) dropSamples() int64 {
	d := -e.sampleBytes
	e.samples, e.sampleBytes = nil, 0
	return d
}

// sampleBytes is the accounted size of one kept event (its slices'
// capacities, which a reused one may have beyond their lengths).
func sampleBytes(ev *kvevents.Event) int64 {
	n := sampleOverheadBytes + int64(8*cap(ev.Hashes)+8*cap(ev.TokenIDs)+cap(ev.ParentDigest)+len(ev.LoRAName)+len(ev.Medium))
	for _, d := range ev.Digests[:cap(ev.Digests)] {
		n += int64(24 + cap(d))
	}
	for _, x := range ev.ExtraKeys {
		n += 24 + extraBytes(x)
	}
	return n
}

func extraBytes(x blockhash.BlockExtra) int64 {
	var n int64
	for _, v := range x {
		n += int64(unsafe.Sizeof(v)) + int64(len(v.Str)+len(v.Bytes)) + extraBytes(v.Tuple)
	}
	return n
}

// cloneExtra deep-copies one block's extra keys, keeping nil (None)
// apart from an empty tuple.
func cloneExtra(x blockhash.BlockExtra) blockhash.BlockExtra {
	if x == nil {
		return nil
	}
	out := make(blockhash.BlockExtra, len(x))
	for i, v := range x {
		out[i] = blockhash.Value{Kind: v.Kind, Str: v.Str, Int: v.Int, Bytes: slices.Clone(v.Bytes)}
		if v.Tuple != nil {
			out[i].Tuple = cloneExtra(v.Tuple)
		}
	}
	return out
}
