// Package trace reads request traces: JSONL files of requests with their
// arrival times, prompts and output lengths, which "kvindex demo --trace"
// replays through a simulated fleet and "kvindex loadgen --trace" sends to
// a live one. A trace is read one line at a time,
// so a reader needs memory only for the requests its caller keeps.
//
// # Formats
//
// Mooncake: the production traces Mooncake (FAST'25) released, one
// request a line, all four fields required and no others:
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}
//
// timestamp is the arrival in milliseconds from the start of the trace,
// input_length and output_length count tokens, and hash_ids name the
// prompt's blocks of BlockTokens tokens (512 in Mooncake's traces; the
// last block may be partial): equal ids mean equal prompts up to and
// including that block. The traces carry no text and no token ids.
//
// kvindex: the same fields, for a person's own logs, plus a session and
// the prompt as it was sent. A line holds timestamp, output_length, an
// optional session_id (a string: the requests of a conversation), and the
// prompt as exactly one of token_ids (a list of token ids), text (a
// string, tokenized by Options.Tokenize) or hash_ids with input_length,
// as in Mooncake's format:
//
//	{"timestamp": 0, "session_id": "u42", "text": "You are a helpful assistant. ...", "output_length": 120}
//	{"timestamp": 850, "session_id": "u42", "token_ids": [151644, 8948, 198], "output_length": 64}
//
// The format is detected per file, from its first request: a line with
// session_id, token_ids or text makes the file a kvindex trace, any other
// line a Mooncake trace (a Mooncake line is also a valid kvindex line, with
// the same meaning). Every line is then held to its file's format.
//
// # Errors
//
// A line that is not one JSON object, has an unknown or missing field, a
// negative length, too few hash_ids for its input_length, or a timestamp
// before the previous line's is refused with an error that names the line
// (*LineError). Blank lines are skipped.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Format names.
const (
	FormatMooncake = "mooncake"
	FormatKVIndex  = "kvindex"
)

// MooncakeBlockTokens is the number of tokens a block id stands for in
// Mooncake's traces: the default of Options.BlockTokens.
const MooncakeBlockTokens = 512

// Limits of one line. A prompt of 1M tokens as token ids takes about 8 MB.
const (
	MaxLineBytes = 64 << 20
	// maxTimestampMs bounds timestamps to about 31 years, far inside
	// time.Duration's range.
	maxTimestampMs = 1e12
	// maxLength bounds input_length and output_length.
	maxLength = 1 << 30
)

// Record is one request of a trace. Its prompt is Tokens, or else the
// concatenation of the BlockTokens-token blocks Blocks names, cut at Input
// tokens.
type Record struct {
	Line    int           // 1-based line number in the file
	Time    time.Duration // arrival, from the start of the trace
	Session string        // the conversation it belongs to; "": none given
	Tokens  []uint64      // the prompt's token ids (token_ids or text); nil for block ids
	Text    string        // the prompt as text, for a text prompt; "" otherwise
	Blocks  []uint64      // the prompt's block ids (hash_ids); nil for tokens
	Input   int           // prompt tokens
	Output  int           // tokens generated
}

// Options configures a Reader.
type Options struct {
	// BlockTokens is the number of tokens a block id stands for (0:
	// MooncakeBlockTokens).
	BlockTokens int
	// Tokenize turns a text prompt into token ids; nil: a text prompt is
	// refused with ErrNoTokenizer.
	Tokenize func(text string) ([]uint64, error)
}

// ErrNoTokenizer is the cause of a LineError for a text prompt read
// without Options.Tokenize.
var ErrNoTokenizer = errors.New("a text prompt needs a tokenizer")

// LineError is a refused line: its number and what is wrong with it.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// Reader reads a trace's records one at a time.
type Reader struct {
	sc       *bufio.Scanner
	opt      Options
	format   string
	line     int
	prevLine int
	prevTime time.Duration
	err      error // sticky
}

// NewReader returns a Reader of the trace r holds.
func NewReader(r io.Reader, opt Options) *Reader {
	if opt.BlockTokens <= 0 {
		opt.BlockTokens = MooncakeBlockTokens
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	return &Reader{sc: sc, opt: opt}
}

// Format returns the trace's format, FormatMooncake or FormatKVIndex,
// once Next has returned a record ("" before).
func (r *Reader) Format() string { return r.format }

// Next returns the next record, or io.EOF after the last one. Any other
// error is final; a refused line's is a *LineError.
func (r *Reader) Next() (Record, error) {
	if r.err != nil {
		return Record{}, r.err
	}
	rec, err := r.next()
	if err != nil {
		r.err = err
	}
	return rec, err
}

func (r *Reader) next() (Record, error) {
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSpace(r.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		format := r.format
		if format == "" {
			format = Detect(b)
		}
		rec, err := DecodeLine(b, format, r.opt)
		if err != nil {
			return Record{}, &LineError{Line: r.line, Err: err}
		}
		rec.Line = r.line
		if r.prevLine > 0 && rec.Time < r.prevTime {
			return Record{}, &LineError{Line: r.line, Err: fmt.Errorf("timestamp %s is before line %d's %s: a trace lists requests in arrival order",
				msText(rec.Time), r.prevLine, msText(r.prevTime))}
		}
		r.format, r.prevLine, r.prevTime = format, r.line, rec.Time
		return rec, nil
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return Record{}, &LineError{Line: r.line + 1, Err: fmt.Errorf("longer than %d MiB", MaxLineBytes>>20)}
		}
		return Record{}, err
	}
	if r.line == 0 || r.format == "" {
		return Record{}, errors.New("the trace holds no requests")
	}
	return Record{}, io.EOF
}

func msText(d time.Duration) string {
	return fmt.Sprintf("%gms", float64(d)/float64(time.Millisecond))
}

// kvindexOnly are the fields that make a file a kvindex trace.
var kvindexOnly = []string{"session_id", "token_ids", "text"}

// Detect returns the format a file whose first request is line is in:
// FormatKVIndex if the line has a field only that format has, else
// FormatMooncake. It looks at the top-level keys only and does not check
// the line.
func Detect(line []byte) string {
	var keys map[string]json.RawMessage
	if json.Unmarshal(line, &keys) != nil {
		return FormatMooncake // the decoder says what is wrong
	}
	for k := range keys {
		for _, f := range kvindexOnly {
			if strings.EqualFold(k, f) {
				return FormatKVIndex
			}
		}
	}
	return FormatMooncake
}

// lineJSON is a line of either format; pointers tell a missing field from
// a zero.
type lineJSON struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int64    `json:"input_length"`
	OutputLength *int64    `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
	// kvindex only
	SessionID *string   `json:"session_id"`
	TokenIDs  *[]uint64 `json:"token_ids"`
	Text      *string   `json:"text"`
}

// DecodeLine decodes one line of a trace in the given format. The
// returned Record's Line is 0: the Reader sets it.
func DecodeLine(b []byte, format string, opt Options) (Record, error) {
	if opt.BlockTokens <= 0 {
		opt.BlockTokens = MooncakeBlockTokens
	}
	var l lineJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return Record{}, jsonError(err, format)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Record{}, errors.New("more than one JSON value on the line")
	}
	var rec Record
	if l.Timestamp == nil {
		return rec, errors.New(`missing "timestamp"`)
	}
	switch ts := *l.Timestamp; {
	case ts < 0:
		return rec, fmt.Errorf("negative timestamp %v", ts)
	case ts > maxTimestampMs:
		return rec, fmt.Errorf("timestamp %v ms is over the limit of %v", ts, maxTimestampMs)
	}
	rec.Time = time.Duration(math.Round(*l.Timestamp * float64(time.Millisecond)))
	if l.OutputLength == nil {
		return rec, errors.New(`missing "output_length"`)
	}
	out, err := length("output_length", *l.OutputLength)
	if err != nil {
		return rec, err
	}
	rec.Output = out
	if format == FormatMooncake {
		if l.SessionID != nil || l.TokenIDs != nil || l.Text != nil {
			return rec, fmt.Errorf("%s in a Mooncake trace (a file's first request sets its format: a kvindex trace has a field only it has there)", firstKVIndexField(&l))
		}
		if l.HashIDs == nil {
			return rec, errors.New(`missing "hash_ids"`)
		}
		if l.InputLength == nil {
			return rec, errors.New(`missing "input_length"`)
		}
	}
	if l.SessionID != nil {
		if *l.SessionID == "" {
			return rec, errors.New(`empty "session_id" (leave it out for none)`)
		}
		rec.Session = *l.SessionID
	}
	prompts := 0
	for _, set := range []bool{l.TokenIDs != nil, l.Text != nil, l.HashIDs != nil} {
		if set {
			prompts++
		}
	}
	if prompts != 1 {
		return rec, errors.New(`want the prompt as exactly one of "token_ids", "text" or "hash_ids"`)
	}
	if l.HashIDs == nil && l.InputLength != nil {
		return rec, errors.New(`"input_length" goes with "hash_ids" only (token_ids and text carry their own length)`)
	}
	switch {
	case l.HashIDs != nil:
		if l.InputLength == nil {
			return rec, errors.New(`"hash_ids" without "input_length"`)
		}
		in, err := length("input_length", *l.InputLength)
		if err != nil {
			return rec, err
		}
		ids := *l.HashIDs
		if in == 0 {
			return rec, errors.New(`"input_length" 0: a prompt has at least one token`)
		}
		if need := (in + opt.BlockTokens - 1) / opt.BlockTokens; len(ids) < need {
			return rec, fmt.Errorf("%d hash_ids of %d tokens cannot make input_length %d (want %d; is the block size right?)",
				len(ids), opt.BlockTokens, in, need)
		}
		rec.Blocks, rec.Input = ids, in
	case l.TokenIDs != nil:
		rec.Tokens = *l.TokenIDs
	case l.Text != nil:
		if opt.Tokenize == nil {
			return rec, ErrNoTokenizer
		}
		rec.Tokens, err = opt.Tokenize(*l.Text)
		if err != nil {
			return rec, fmt.Errorf("tokenizing the text: %w", err)
		}
		rec.Text = *l.Text
	}
	if rec.Blocks == nil {
		if len(rec.Tokens) == 0 {
			return rec, errors.New("empty prompt: a prompt has at least one token")
		}
		if len(rec.Tokens) > maxLength {
			return rec, fmt.Errorf("prompt of %d tokens is over the limit of %d", len(rec.Tokens), maxLength)
		}
		rec.Input = len(rec.Tokens)
	}
	return rec, nil
}

func firstKVIndexField(l *lineJSON) string {
	switch {
	case l.SessionID != nil:
		return `"session_id"`
	case l.TokenIDs != nil:
		return `"token_ids"`
	}
	return `"text"`
}

func length(name string, v int64) (int, error) {
	switch {
	case v < 0:
		return 0, fmt.Errorf("negative %q %d", name, v)
	case v > maxLength:
		return 0, fmt.Errorf("%q %d is over the limit of %d", name, v, maxLength)
	}
	return int(v), nil
}

// jsonError restates encoding/json's errors without its package prefix.
func jsonError(err error, format string) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	msg := strings.TrimPrefix(err.Error(), "json: ")
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("not a JSON object: %s (at byte %d)", msg, se.Offset)
	case errors.As(err, &te) && te.Field == "":
		return fmt.Errorf("not a JSON object but a%s", article(te.Value))
	case errors.As(err, &te):
		return fmt.Errorf("field %q: %s is not of type %s", te.Field, te.Value, te.Type)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("not a JSON object: it ends early")
	case strings.HasPrefix(msg, "unknown field"):
		name := "kvindex"
		if format == FormatMooncake {
			name = "Mooncake"
		}
		return fmt.Errorf("%s in a %s trace", msg, name)
	}
	return errors.New(msg)
}

// article puts "a" or "an" before a JSON kind: " array", "n object".
func article(kind string) string {
	if kind != "" && strings.ContainsRune("aeiou", rune(kind[0])) {
		return "n " + kind
	}
	return " " + kind
}
