package kvevents

import (
	"errors"
	"math"
	"strconv"
	"sync"

	"github.com/kvindex/kvindex/blockhash"
)

// Error classes of Decode. Every decoding error wraps exactly one of them,
// so callers can count failures by class with errors.Is.
var (
	// ErrMalformed: the payload is not a well-formed EventBatch (bad
	// msgpack, wrong types, truncated data, impossible lengths).
	ErrMalformed = errors.New("kvevents: malformed payload")
	// ErrTooLarge: the payload is well-formed so far but exceeds the
	// Decoder's Limits.
	ErrTooLarge = errors.New("kvevents: payload exceeds decoder limits")
)

// DecodeError describes why a payload was rejected and where.
type DecodeError struct {
	Class  error  // ErrMalformed or ErrTooLarge
	Event  int    // index of the event in the batch; -1 for the envelope
	Kind   string // the event's tag, when known
	Field  string // wire field, with an element index when relevant
	Msg    string // what was wrong
	Offset int    // byte offset in the payload where it was detected
}

func (e *DecodeError) Error() string {
	b := make([]byte, 0, 96)
	b = append(b, "kvevents: "...)
	if e.Event < 0 {
		b = append(b, "batch"...)
	} else {
		b = append(b, "event "...)
		b = strconv.AppendInt(b, int64(e.Event), 10)
		if e.Kind != "" {
			b = append(b, " ("...)
			b = append(b, e.Kind...)
			b = append(b, ')')
		}
	}
	b = append(b, ": "...)
	if e.Field != "" {
		b = append(b, e.Field...)
		b = append(b, ": "...)
	}
	b = append(b, e.Msg...)
	b = append(b, " (at byte "...)
	b = strconv.AppendInt(b, int64(e.Offset), 10)
	b = append(b, ')')
	return string(b)
}

// Unwrap returns the error class, ErrMalformed or ErrTooLarge.
func (e *DecodeError) Unwrap() error { return e.Class }

// Limits bounds the work and memory one payload can cause. A zero field
// takes its default. Allocation is in any case bounded by the payload
// size: no declared length is trusted beyond the bytes that remain.
type Limits struct {
	MaxPayload int // payload bytes (default 64 MiB)
	MaxEvents  int // events per batch (default 1<<20)
	MaxHashes  int // block hashes (and extra_keys entries) per event (default 1<<18)
	MaxTokens  int // token ids per event (default 1<<22)
	// Per-batch totals: with one-byte ints, a payload at MaxPayload
	// could otherwise make Decode hold eight times its size in uint64s.
	MaxBatchHashes int // block hashes per batch (default 1<<22)
	MaxBatchTokens int // token ids per batch (default 1<<24)
	MaxDigest      int // bytes of one bytes-form block hash (default 4096; hybrid models concatenate digests)
	MaxExtraDepth  int // nesting depth of one block's extra keys, the block's own tuple being 1 (default 8)
}

// DefaultLimits returns the limits a zero Limits stands for.
func DefaultLimits() Limits {
	return Limits{
		MaxPayload:     64 << 20,
		MaxEvents:      1 << 20,
		MaxHashes:      1 << 18,
		MaxTokens:      1 << 22,
		MaxBatchHashes: 1 << 22,
		MaxBatchTokens: 1 << 24,
		MaxDigest:      4096,
		MaxExtraDepth:  8,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxPayload <= 0 {
		l.MaxPayload = d.MaxPayload
	}
	if l.MaxEvents <= 0 {
		l.MaxEvents = d.MaxEvents
	}
	if l.MaxHashes <= 0 {
		l.MaxHashes = d.MaxHashes
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = d.MaxTokens
	}
	if l.MaxBatchHashes <= 0 {
		l.MaxBatchHashes = d.MaxBatchHashes
	}
	if l.MaxBatchTokens <= 0 {
		l.MaxBatchTokens = d.MaxBatchTokens
	}
	if l.MaxDigest <= 0 {
		l.MaxDigest = d.MaxDigest
	}
	if l.MaxExtraDepth <= 0 {
		l.MaxExtraDepth = d.MaxExtraDepth
	}
	return l
}

// Decoder decodes EventBatch payloads. The zero value decodes vLLM
// payloads with default limits. A Decoder holds no state between calls and
// is safe for concurrent use.
//
// It accepts every layout vLLM has published (see the package
// documentation of the wire format): the batch as [ts, events],
// [ts, events, dp_rank] or, defensively, a map; events as tagged arrays of
// any historical length or as tagged maps with defaulted fields omitted.
// Unknown trailing array elements and unknown map keys are ignored. An
// event with an unknown tag is skipped and counted in Batch.Skipped; the
// rest of its batch is kept.
type Decoder struct {
	Flavor Flavor
	Limits Limits
}

// Decode decodes one msgpack EventBatch payload into out, reusing out's
// slices where it can: out.Events and, per event slot, the backing arrays
// of Hashes, TokenIDs, Digests, ParentDigest and ExtraKeys. Everything
// Decode stores in out is therefore valid only until the next Decode into
// the same Batch; copy what must outlive it. For the same reason out's
// events must not share backing arrays with each other (a Batch that only
// Decode has filled never does; one built by hand from sub-slices of one
// buffer may). Decode never retains payload.
//
// On error out holds no events, and the error is a *DecodeError wrapping
// ErrMalformed or ErrTooLarge.
func (d *Decoder) Decode(payload []byte, out *Batch) error {
	out.TS, out.HasDPRank, out.DPRank, out.Skipped = 0, false, 0, 0
	out.Events = out.Events[:0]
	lim := d.Limits.withDefaults()
	if len(payload) > lim.MaxPayload {
		return &DecodeError{Class: ErrTooLarge, Event: -1,
			Msg: "payload of " + strconv.Itoa(len(payload)) + " bytes exceeds the limit of " + strconv.Itoa(lim.MaxPayload)}
	}
	s := statePool.Get().(*decodeState)
	s.lim, s.flavor, s.out, s.ev, s.kind = lim, d.Flavor, out, -1, ""
	s.nHashes, s.nTokens = 0, 0
	s.algo = blockhash.SHA256CBOR // any vLLM algorithm: the key is the digest's last 8 bytes
	if d.Flavor == FlavorSGLang {
		s.algo = blockhash.SGLang
	}
	s.r.reset(payload)
	err := s.batch()
	if err == nil && s.r.left() > 0 {
		s.ev, s.kind = -1, ""
		err = s.fail(ErrMalformed, "", strconv.Itoa(s.r.left())+" trailing bytes after the batch")
	}
	s.r.reset(nil)
	s.out, s.prev = nil, Event{}
	statePool.Put(s)
	if err != nil {
		out.Events = out.Events[:0]
		out.Skipped = 0
	}
	return err
}

// Errors of the msgpack reader, turned into DecodeErrors by decodeState.
var (
	errTruncated = errors.New("truncated: payload ends inside a value")
	errNotUint   = errors.New("not an unsigned int")
	errInvalid   = errors.New("invalid msgpack code 0xc1")
)

var statePool = sync.Pool{New: func() any { return newDecodeState() }}

// decodeState is the per-call state of Decode, pooled so that a call
// allocates nothing in steady state.
type decodeState struct {
	r      reader
	lim    Limits
	flavor Flavor
	algo   blockhash.Algo
	out    *Batch
	ev     int    // index of the event being decoded; -1 for the envelope
	kind   string // tag of the event being decoded, for errors
	prev   Event  // the previous content of the slot being filled, for reuse

	nHashes, nTokens int // batch totals so far, against the Limits
}

// fail builds the error for the current position.
func (s *decodeState) fail(class error, field, msg string) error {
	return &DecodeError{Class: class, Event: s.ev, Kind: s.kind, Field: field, Msg: msg, Offset: s.r.pos()}
}

// failAt is fail for element i of a list field.
func (s *decodeState) failAt(class error, field string, i int, msg string) error {
	return s.fail(class, field+"["+strconv.Itoa(i)+"]", msg)
}

// wrap turns a reader error into a DecodeError.
func (s *decodeState) wrap(field string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*DecodeError); ok {
		return err
	}
	return s.fail(ErrMalformed, field, err.Error())
}

func (s *decodeState) wrapAt(field string, i int, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*DecodeError); ok {
		return err
	}
	return s.failAt(ErrMalformed, field, i, err.Error())
}

// expected reports a type mismatch.
func (s *decodeState) expected(field, want string, c byte) error {
	return s.fail(ErrMalformed, field, "expected "+want+", got "+typeName(c))
}

// peek returns the code of the next value; at the end of the payload it
// fails naming field.
func (s *decodeState) peek(field string) (byte, error) {
	c, ok := s.r.peek()
	if !ok {
		return 0, s.fail(ErrMalformed, field, "truncated: payload ends where a value was expected")
	}
	return c, nil
}

// list reads an array header for field and checks its length against max
// and the bytes that remain (each element needs at least one).
func (s *decodeState) list(field string, max int) (int, error) {
	c, err := s.peek(field)
	if err != nil {
		return 0, err
	}
	if familyOf(c) != famArray {
		return 0, s.expected(field, "array", c)
	}
	n, err := s.r.arrayLen()
	if err != nil {
		return 0, s.wrap(field, err)
	}
	if n > max {
		return 0, s.fail(ErrTooLarge, field, strconv.Itoa(n)+" elements exceed the limit of "+strconv.Itoa(max))
	}
	if n > s.r.left() {
		return 0, s.fail(ErrMalformed, field, "declares "+strconv.Itoa(n)+" elements but only "+strconv.Itoa(s.r.left())+" bytes remain")
	}
	return n, nil
}

func (s *decodeState) batch() error {
	c, err := s.peek("")
	if err != nil {
		return err
	}
	switch familyOf(c) {
	case famArray:
		n, err := s.r.arrayLen()
		if err != nil {
			return s.wrap("", err)
		}
		if n > s.r.left() {
			return s.fail(ErrMalformed, "", "declares "+strconv.Itoa(n)+" elements but only "+strconv.Itoa(s.r.left())+" bytes remain")
		}
		if n < 2 {
			return s.fail(ErrMalformed, "", "expected an array [ts, events, dp_rank?], got "+strconv.Itoa(n)+" elements")
		}
		if err := s.ts(); err != nil {
			return err
		}
		if err := s.events(); err != nil {
			return err
		}
		if n >= 3 {
			if err := s.dpRank("data_parallel_rank"); err != nil {
				return err
			}
		}
		return s.skipValues("", n-3)
	case famMap:
		n, err := s.r.mapLen()
		if err != nil {
			return s.wrap("", err)
		}
		if 2*n > s.r.left() {
			return s.fail(ErrMalformed, "", "declares "+strconv.Itoa(n)+" entries but only "+strconv.Itoa(s.r.left())+" bytes remain")
		}
		sawEvents := false
		for i := 0; i < n; i++ {
			key, err := s.key("")
			if err != nil {
				return err
			}
			switch string(key) {
			case "ts":
				err = s.ts()
			case "events":
				if sawEvents {
					return s.fail(ErrMalformed, "events", "duplicate key")
				}
				sawEvents = true
				err = s.events()
			case "data_parallel_rank", "attn_dp_rank":
				err = s.dpRank("data_parallel_rank")
			default:
				err = s.skipKeyed(key)
			}
			if err != nil {
				return err
			}
		}
		if !sawEvents {
			return s.fail(ErrMalformed, "", "map-shaped batch has no events")
		}
		return nil
	}
	return s.expected("", "array or map", c)
}

func (s *decodeState) ts() error {
	c, err := s.peek("ts")
	if err != nil {
		return err
	}
	switch familyOf(c) {
	case famFloat:
		f, err := s.r.float()
		s.out.TS = f
		return s.wrap("ts", err)
	case famInt:
		v, neg, err := s.r.integer()
		if neg {
			s.out.TS = float64(int64(v))
		} else {
			s.out.TS = float64(v)
		}
		return s.wrap("ts", err)
	}
	return s.expected("ts", "float", c)
}

func (s *decodeState) dpRank(field string) error {
	c, err := s.peek(field)
	if err != nil {
		return err
	}
	switch familyOf(c) {
	case famNil:
		s.out.HasDPRank, s.out.DPRank = false, 0
		return s.r.skip()
	case famInt:
		v, err := s.smallInt(field)
		s.out.HasDPRank, s.out.DPRank = err == nil, v
		return err
	}
	return s.expected(field, "int or nil", c)
}

// smallInt reads an int in [0, MaxInt32]: ranks, sizes, indexes.
func (s *decodeState) smallInt(field string) (int, error) {
	v, neg, err := s.r.integer()
	if err != nil {
		return 0, s.wrap(field, err)
	}
	if neg || v > math.MaxInt32 {
		if neg {
			return 0, s.fail(ErrMalformed, field, "negative value "+strconv.FormatInt(int64(v), 10))
		}
		return 0, s.fail(ErrMalformed, field, "value "+strconv.FormatUint(v, 10)+" out of range")
	}
	return int(v), nil
}

// key reads a map key, which must be a string; the result aliases the
// reader's scratch buffer.
func (s *decodeState) key(where string) ([]byte, error) {
	c, err := s.peek(where)
	if err != nil {
		return nil, err
	}
	if f := familyOf(c); f != famStr && f != famBin {
		return nil, s.fail(ErrMalformed, where, "expected a str map key, got "+typeName(c))
	}
	b, err := s.r.bytes()
	return b, s.wrap(where, err)
}

func (s *decodeState) skipValues(field string, n int) error {
	for ; n > 0; n-- {
		if err := s.r.skip(); err != nil {
			return s.wrap(field, err)
		}
	}
	return nil
}

// skipKeyed skips the value of an unknown map key.
func (s *decodeState) skipKeyed(key []byte) error {
	if err := s.r.skip(); err != nil {
		return s.wrap(string(key), err)
	}
	return nil
}

func (s *decodeState) events() error {
	n, err := s.list("events", s.lim.MaxEvents)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		s.ev, s.kind = i, ""
		if err := s.event(); err != nil {
			return err
		}
	}
	s.ev, s.kind = -1, ""
	return nil
}

// slot returns the next event slot of out, reset, with the previous
// content saved in s.prev so its backing arrays and strings can be reused.
func (s *decodeState) slot(kind Kind) *Event {
	evs := s.out.Events
	if len(evs) < cap(evs) {
		evs = evs[:len(evs)+1]
	} else {
		evs = append(evs, Event{})
	}
	s.out.Events = evs
	ev := &evs[len(evs)-1]
	s.prev = *ev
	*ev = Event{Kind: kind, Hashes: ev.Hashes[:0], TokenIDs: ev.TokenIDs[:0]}
	return ev
}

// tag reads an event tag. ok is false for a tag that names no known event
// (including non-string tags, which vLLM never sends).
func (s *decodeState) tag() (k Kind, ok bool, err error) {
	c, err := s.peek("type")
	if err != nil {
		return 0, false, err
	}
	if f := familyOf(c); f != famStr && f != famBin {
		s.kind = "<" + typeName(c) + ">"
		return 0, false, s.wrap("type", s.r.skip())
	}
	b, err := s.r.bytes()
	if err != nil {
		return 0, false, s.wrap("type", err)
	}
	switch string(b) {
	case "BlockStored":
		s.kind = "BlockStored"
		return BlockStored, true, nil
	case "BlockRemoved":
		s.kind = "BlockRemoved"
		return BlockRemoved, true, nil
	case "AllBlocksCleared":
		s.kind = "AllBlocksCleared"
		return AllBlocksCleared, true, nil
	}
	s.kind = "unknown tag " + strconv.Quote(string(b))
	return 0, false, nil
}

func (s *decodeState) event() error {
	c, err := s.peek("")
	if err != nil {
		return err
	}
	switch familyOf(c) {
	case famArray:
		n, err := s.r.arrayLen()
		if err != nil {
			return s.wrap("", err)
		}
		if n > s.r.left() {
			return s.fail(ErrMalformed, "", "declares "+strconv.Itoa(n)+" elements but only "+strconv.Itoa(s.r.left())+" bytes remain")
		}
		if n == 0 {
			return s.fail(ErrMalformed, "", "empty event array has no tag")
		}
		kind, ok, err := s.tag()
		if err != nil {
			return err
		}
		if !ok {
			s.out.Skipped++
			return s.skipValues("", n-1)
		}
		return s.arrayEvent(s.slot(kind), n-1)
	case famMap:
		n, err := s.r.mapLen()
		if err != nil {
			return s.wrap("", err)
		}
		if 2*n > s.r.left() {
			return s.fail(ErrMalformed, "", "declares "+strconv.Itoa(n)+" entries but only "+strconv.Itoa(s.r.left())+" bytes remain")
		}
		return s.mapEvent(n)
	}
	return s.expected("", "array or map", c)
}

// field identifies a wire field of an event.
type field uint8

const (
	fSkip field = iota
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fWindow
)

var fieldNames = [...]string{
	fSkip:      "",
	fHashes:    "block_hashes",
	fParent:    "parent_block_hash",
	fTokens:    "token_ids",
	fBlockSize: "block_size",
	fLoRAID:    "lora_id",
	fMedium:    "medium",
	fLoRAName:  "lora_name",
	fExtraKeys: "extra_keys",
	fGroupIdx:  "group_idx",
	fSpecKind:  "kv_cache_spec_kind",
	fWindow:    "kv_cache_spec_sliding_window",
}

// Positional layouts of array-encoded events, after the tag. Fields were
// only ever appended, so a shorter array is an older engine and the
// missing fields keep their defaults; longer arrays carry fields this
// decoder does not know, which are skipped.
var (
	storedFieldsVLLM  = []field{fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fWindow}
	removedFieldsVLLM = []field{fHashes, fMedium, fGroupIdx}
	// SGLang copies vLLM's publisher, but its event schema has moved
	// quickly (medium, then metadata and extra-key variants in differing
	// positions across releases). Only the leading fields that every
	// release agrees on are read; anything after medium is ignored.
	storedFieldsSGLang  = []field{fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium}
	removedFieldsSGLang = []field{fHashes, fMedium}
)

// minFields is the number of fields after the tag an array event must
// carry: the fields without a default in every version.
var minFields = [...]int{BlockStored: 4, BlockRemoved: 1, AllBlocksCleared: 0}

func (s *decodeState) layout(kind Kind) []field {
	switch kind {
	case BlockStored:
		if s.flavor == FlavorSGLang {
			return storedFieldsSGLang
		}
		return storedFieldsVLLM
	case BlockRemoved:
		if s.flavor == FlavorSGLang {
			return removedFieldsSGLang
		}
		return removedFieldsVLLM
	}
	return nil
}

func (s *decodeState) arrayEvent(ev *Event, n int) error {
	if n < minFields[ev.Kind] {
		return s.fail(ErrMalformed, "", "expected at least "+strconv.Itoa(minFields[ev.Kind])+" fields after the tag, got "+strconv.Itoa(n))
	}
	fields := s.layout(ev.Kind)
	for i := 0; i < n; i++ {
		f := fSkip
		if i < len(fields) {
			f = fields[i]
		}
		if err := s.field(ev, f); err != nil {
			return err
		}
	}
	return nil
}

// mapField maps a map key to the field it names for kind.
func mapField(kind Kind, key []byte) field {
	switch kind {
	case BlockStored:
		switch string(key) {
		case "block_hashes":
			return fHashes
		case "parent_block_hash":
			return fParent
		case "token_ids":
			return fTokens
		case "block_size":
			return fBlockSize
		case "lora_id":
			return fLoRAID
		case "medium":
			return fMedium
		case "lora_name":
			return fLoRAName
		case "extra_keys":
			return fExtraKeys
		case "group_idx":
			return fGroupIdx
		case "kv_cache_spec_kind":
			return fSpecKind
		case "kv_cache_spec_sliding_window":
			return fWindow
		}
	case BlockRemoved:
		switch string(key) {
		case "block_hashes":
			return fHashes
		case "medium":
			return fMedium
		case "group_idx":
			return fGroupIdx
		}
	}
	return fSkip
}

// mapEvent decodes a tagged-map event of n entries. msgspec writes the
// tag first; another producer may not, in which case the map is scanned
// for the tag and then decoded from its start.
func (s *decodeState) mapEvent(n int) error {
	start := s.r.pos()
	kind, ok, found := Kind(0), false, false
	first := true
	for i := 0; i < n && !found; i++ {
		key, err := s.key("")
		if err != nil {
			return err
		}
		if string(key) == "type" {
			if kind, ok, err = s.tag(); err != nil {
				return err
			}
			found = true
			break
		}
		first = false
		if err := s.skipKeyed(key); err != nil {
			return err
		}
	}
	if !found {
		return s.fail(ErrMalformed, "", "event map has no \"type\" tag")
	}
	if !ok {
		s.out.Skipped++
		if !first {
			s.r.seek(start)
			return s.skipValues("", 2*n)
		}
		return s.skipValues("", 2*(n-1))
	}
	rest := n - 1
	if !first {
		s.r.seek(start)
		rest = n
	}
	ev := s.slot(kind)
	var seen uint16
	for i := 0; i < rest; i++ {
		key, err := s.key("")
		if err != nil {
			return err
		}
		f := mapField(kind, key)
		if f == fSkip {
			if err := s.skipKeyed(key); err != nil {
				return err
			}
			continue
		}
		if seen&(1<<f) != 0 {
			return s.fail(ErrMalformed, fieldNames[f], "duplicate key")
		}
		seen |= 1 << f
		if err := s.field(ev, f); err != nil {
			return err
		}
	}
	// Fields without a default are always present in msgspec's map form.
	need := uint16(0)
	switch kind {
	case BlockStored:
		need = 1<<fHashes | 1<<fTokens | 1<<fBlockSize
	case BlockRemoved:
		need = 1 << fHashes
	}
	if miss := need &^ seen; miss != 0 {
		for f := fHashes; f <= fWindow; f++ {
			if miss&(1<<f) != 0 {
				return s.fail(ErrMalformed, fieldNames[f], "missing field")
			}
		}
	}
	return nil
}

// field decodes the value of field f into ev.
func (s *decodeState) field(ev *Event, f field) error {
	name := fieldNames[f]
	switch f {
	case fSkip:
		return s.wrap("", s.r.skip())
	case fHashes:
		return s.hashes(ev)
	case fParent:
		return s.parent(ev)
	case fTokens:
		return s.tokens(ev)
	case fExtraKeys:
		return s.extraKeys(ev)
	}
	c, err := s.peek(name)
	if err != nil {
		return err
	}
	fam := familyOf(c)
	switch f {
	case fBlockSize:
		if fam != famInt {
			return s.expected(name, "int", c)
		}
		ev.BlockSize, err = s.smallInt(name)
		return err
	case fGroupIdx, fWindow:
		if fam == famNil {
			return s.r.skip()
		}
		if fam != famInt {
			return s.expected(name, "int or nil", c)
		}
		v, err := s.smallInt(name)
		if f == fGroupIdx {
			ev.GroupIdx = v
		} else {
			ev.SlidingWindow = v
		}
		return err
	case fLoRAID:
		if fam == famNil {
			return s.r.skip()
		}
		if fam != famInt {
			return s.expected(name, "int or nil", c)
		}
		v, neg, err := s.r.integer()
		if err != nil {
			return s.wrap(name, err)
		}
		if !neg && v > math.MaxInt64 {
			return s.fail(ErrMalformed, name, "value "+strconv.FormatUint(v, 10)+" out of range")
		}
		ev.HasLoRAID, ev.LoRAID = true, int64(v)
		return nil
	case fMedium, fLoRAName, fSpecKind:
		if fam == famNil {
			return s.r.skip()
		}
		if fam != famStr {
			return s.expected(name, "str or nil", c)
		}
		b, err := s.r.bytes()
		if err != nil {
			return s.wrap(name, err)
		}
		switch f {
		case fMedium:
			ev.Medium = intern(b, s.prev.Medium)
		case fLoRAName:
			ev.LoRAName = intern(b, s.prev.LoRAName)
		default:
			ev.SpecKind = intern(b, s.prev.SpecKind)
		}
		return nil
	}
	return s.wrap(name, s.r.skip())
}

// intern returns b as a string without allocating when it is a value
// engines send all the time, or equal to the slot's previous value.
func intern(b []byte, prev string) string {
	switch string(b) {
	case "":
		return ""
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "STORAGE":
		return "STORAGE"
	case "full_attention":
		return "full_attention"
	case "mla_attention":
		return "mla_attention"
	case "sliding_window":
		return "sliding_window"
	case "sliding_window_mla":
		return "sliding_window_mla"
	case "mamba":
		return "mamba"
	case "chunked_local_attention":
		return "chunked_local_attention"
	case "sink_full_attention":
		return "sink_full_attention"
	case "encoder_only_attention":
		return "encoder_only_attention"
	case "cross_attention":
		return "cross_attention"
	case "unknown":
		return "unknown"
	}
	if string(b) == prev {
		return prev
	}
	return string(b)
}

// hash reads one block hash: an int of any width (negative ints, as old
// engines and SGLang send, keep their 64-bit pattern) or a digest as bin
// or str, whose key is what the int form would carry. digest aliases the
// reader's scratch buffer and is nil for ints.
func (s *decodeState) hash(field string, i int) (key uint64, digest []byte, err error) {
	c, ok := s.r.peek()
	if !ok {
		return 0, nil, s.failAt(ErrMalformed, field, i, "truncated: payload ends where a value was expected")
	}
	switch familyOf(c) {
	case famInt:
		v, _, err := s.r.integer()
		return v, nil, s.wrapAt(field, i, err)
	case famBin, famStr:
		b, err := s.r.bytes()
		if err != nil {
			return 0, nil, s.wrapAt(field, i, err)
		}
		if len(b) == 0 {
			return 0, nil, s.failAt(ErrMalformed, field, i, "empty digest")
		}
		if len(b) > s.lim.MaxDigest {
			return 0, nil, s.failAt(ErrTooLarge, field, i, "digest of "+strconv.Itoa(len(b))+" bytes exceeds the limit of "+strconv.Itoa(s.lim.MaxDigest))
		}
		return blockhash.KeyOfDigest(s.algo, b), b, nil
	}
	return 0, nil, s.failAt(ErrMalformed, field, i, "expected int or bytes, got "+typeName(c))
}

func (s *decodeState) hashes(ev *Event) error {
	const name = "block_hashes"
	n, err := s.list(name, s.lim.MaxHashes)
	if err != nil {
		return err
	}
	if s.nHashes += n; s.nHashes > s.lim.MaxBatchHashes {
		return s.fail(ErrTooLarge, name, "the batch's hashes exceed the limit of "+strconv.Itoa(s.lim.MaxBatchHashes))
	}
	ev.Hashes = grow(ev.Hashes[:0], n)
	for i := 0; i < n; i++ {
		key, d, err := s.hash(name, i)
		if err != nil {
			return err
		}
		ev.Hashes = append(ev.Hashes, key)
		if d != nil || ev.Digests != nil {
			if ev.Digests == nil {
				ev.Digests = grow(s.prev.Digests[:0], n)
				ev.Digests = ev.Digests[:i] // earlier hashes were ints: no digest
				clear(ev.Digests)
			}
			ev.Digests = append(ev.Digests, s.copyDigest(len(ev.Digests), d))
		}
	}
	return nil
}

// copyDigest copies d into the slot's previous digest buffer j when it
// fits, else into a new one. A nil d (an int hash among bytes) stays nil.
func (s *decodeState) copyDigest(j int, d []byte) []byte {
	if d == nil {
		return nil
	}
	if j < cap(s.prev.Digests) {
		if old := s.prev.Digests[:j+1][j]; cap(old) >= len(d) {
			return append(old[:0], d...)
		}
	}
	return append([]byte(nil), d...)
}

func (s *decodeState) parent(ev *Event) error {
	const name = "parent_block_hash"
	c, err := s.peek(name)
	if err != nil {
		return err
	}
	switch familyOf(c) {
	case famNil:
		return s.r.skip()
	case famInt:
		v, _, err := s.r.integer()
		ev.HasParent, ev.Parent = err == nil, v
		return s.wrap(name, err)
	case famBin, famStr:
		b, err := s.r.bytes()
		if err != nil {
			return s.wrap(name, err)
		}
		if len(b) == 0 {
			// An empty digest is falsy in Python: the engine chained from
			// NONE_HASH, as for no parent.
			return nil
		}
		if len(b) > s.lim.MaxDigest {
			return s.fail(ErrTooLarge, name, "digest of "+strconv.Itoa(len(b))+" bytes exceeds the limit of "+strconv.Itoa(s.lim.MaxDigest))
		}
		ev.HasParent, ev.Parent = true, blockhash.KeyOfDigest(s.algo, b)
		ev.ParentDigest = append(s.prev.ParentDigest[:0], b...)
		return nil
	}
	return s.expected(name, "int, bytes or nil", c)
}

func (s *decodeState) tokens(ev *Event) error {
	const name = "token_ids"
	n, err := s.list(name, s.lim.MaxTokens)
	if err != nil {
		return err
	}
	if s.nTokens += n; s.nTokens > s.lim.MaxBatchTokens {
		return s.fail(ErrTooLarge, name, "the batch's token ids exceed the limit of "+strconv.Itoa(s.lim.MaxBatchTokens))
	}
	toks := grow(ev.TokenIDs[:0], n)[:n]
	for i := range toks {
		v, err := s.r.token()
		if err != nil {
			return s.tokenError(i, err)
		}
		toks[i] = v
	}
	ev.TokenIDs = toks
	return nil
}

// tokenError explains why token i could not be read.
func (s *decodeState) tokenError(i int, err error) error {
	const name = "token_ids"
	if err == errNotUint {
		c, ok := s.r.peek()
		if !ok {
			return s.failAt(ErrMalformed, name, i, "truncated: payload ends where a value was expected")
		}
		if familyOf(c) == famInt {
			return s.failAt(ErrMalformed, name, i, "negative token id")
		}
		return s.failAt(ErrMalformed, name, i, "expected int, got "+typeName(c))
	}
	return s.wrapAt(name, i, err)
}

func (s *decodeState) extraKeys(ev *Event) error {
	const name = "extra_keys"
	c, err := s.peek(name)
	if err != nil {
		return err
	}
	if familyOf(c) == famNil {
		return s.r.skip()
	}
	n, err := s.list(name, s.lim.MaxHashes)
	if err != nil {
		return err
	}
	keys := grow(s.prev.ExtraKeys[:0], n)[:n]
	if keys == nil {
		keys = []blockhash.BlockExtra{} // [] is not None
	}
	for i := range keys {
		var old blockhash.BlockExtra
		if i < len(s.prev.ExtraKeys) {
			old = s.prev.ExtraKeys[i]
		}
		c, ok := s.r.peek()
		if !ok {
			return s.failAt(ErrMalformed, name, i, "truncated: payload ends where a value was expected")
		}
		switch familyOf(c) {
		case famNil:
			keys[i] = nil
			if err := s.r.skip(); err != nil {
				return s.wrapAt(name, i, err)
			}
		case famArray:
			be, err := s.tuple(name, i, 1, old)
			if err != nil {
				return err
			}
			keys[i] = be
		default:
			return s.failAt(ErrMalformed, name, i, "expected array or nil, got "+typeName(c))
		}
	}
	ev.ExtraKeys = keys
	return nil
}

// tuple reads one array of extra-key values at nesting depth depth,
// reusing old's storage and equal strings. The result is never nil.
func (s *decodeState) tuple(field string, i, depth int, old []blockhash.Value) ([]blockhash.Value, error) {
	if depth > s.lim.MaxExtraDepth {
		return nil, s.failAt(ErrTooLarge, field, i, "extra keys nested deeper than "+strconv.Itoa(s.lim.MaxExtraDepth))
	}
	n, err := s.r.arrayLen()
	if err != nil {
		return nil, s.wrapAt(field, i, err)
	}
	if n > s.r.left() {
		return nil, s.failAt(ErrMalformed, field, i, "declares "+strconv.Itoa(n)+" values but only "+strconv.Itoa(s.r.left())+" bytes remain")
	}
	var vs []blockhash.Value
	switch {
	case n == 0:
		vs = []blockhash.Value{} // the empty tuple, which is not None
	case cap(old) >= n:
		vs = old[:n]
	default:
		vs = make([]blockhash.Value, n)
	}
	for j := range vs {
		var prev blockhash.Value
		if j < len(old) {
			prev = old[j]
		}
		c, ok := s.r.peek()
		if !ok {
			return nil, s.failAt(ErrMalformed, field, i, "truncated: payload ends where a value was expected")
		}
		switch familyOf(c) {
		case famStr:
			b, err := s.r.bytes()
			if err != nil {
				return nil, s.wrapAt(field, i, err)
			}
			str := prev.Str
			if prev.Kind != blockhash.KindStr || string(b) != str {
				str = string(b)
			}
			vs[j] = blockhash.Value{Kind: blockhash.KindStr, Str: str}
		case famBin:
			b, err := s.r.bytes()
			if err != nil {
				return nil, s.wrapAt(field, i, err)
			}
			vs[j] = blockhash.Value{Kind: blockhash.KindBytes, Bytes: append([]byte{}, b...)}
		case famInt:
			v, neg, err := s.r.integer()
			if err != nil {
				return nil, s.wrapAt(field, i, err)
			}
			if !neg && v > math.MaxInt64 {
				return nil, s.failAt(ErrMalformed, field, i, "int value "+strconv.FormatUint(v, 10)+" out of range")
			}
			vs[j] = blockhash.Value{Kind: blockhash.KindInt, Int: int64(v)}
		case famArray:
			var prevTuple []blockhash.Value
			if prev.Kind == blockhash.KindTuple {
				prevTuple = prev.Tuple
			}
			t, err := s.tuple(field, i, depth+1, prevTuple)
			if err != nil {
				return nil, err
			}
			vs[j] = blockhash.Value{Kind: blockhash.KindTuple, Tuple: t}
		default:
			return nil, s.failAt(ErrMalformed, field, i, "unsupported extra-key value "+typeName(c)+" (want str, int, bytes or array)")
		}
	}
	return vs, nil
}

// grow returns s with room for n more elements.
func grow[T any](s []T, n int) []T {
	if cap(s)-len(s) < n {
		g := make([]T, len(s), len(s)+n)
		copy(g, s)
		return g
	}
	return s
}

// family is the msgpack type family of a value, from its first byte.
type family uint8

const (
	famInvalid family = iota // 0xc1, never used
	famNil
	famBool
	famInt
	famFloat
	famStr
	famBin
	famArray
	famMap
	famExt
)

var familyNames = [...]string{
	famInvalid: "invalid code 0xc1",
	famNil:     "nil",
	famBool:    "bool",
	famInt:     "int",
	famFloat:   "float",
	famStr:     "str",
	famBin:     "bin",
	famArray:   "array",
	famMap:     "map",
	famExt:     "ext",
}

// families maps every first byte to its family.
var families = func() (t [256]family) {
	for c := 0; c < 256; c++ {
		var f family
		switch {
		case c <= 0x7f || c >= 0xe0:
			f = famInt // positive and negative fixint
		case c <= 0x8f:
			f = famMap
		case c <= 0x9f:
			f = famArray
		case c <= 0xbf:
			f = famStr
		case c == 0xc0:
			f = famNil
		case c == 0xc1:
			f = famInvalid
		case c == 0xc2 || c == 0xc3:
			f = famBool
		case c <= 0xc6:
			f = famBin
		case c <= 0xc9:
			f = famExt
		case c <= 0xcb:
			f = famFloat
		case c <= 0xd3:
			f = famInt
		case c <= 0xd8:
			f = famExt
		case c <= 0xdb:
			f = famStr
		case c <= 0xdd:
			f = famArray
		default:
			f = famMap
		}
		t[c] = f
	}
	return t
}()

func familyOf(c byte) family { return families[c] }

// typeName names the type of the value starting with c, for errors.
func typeName(c byte) string { return familyNames[families[c]] }
