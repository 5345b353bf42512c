package tokenizer

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Local tokenizes with a HuggingFace tokenizer.json of a byte-level BPE
// model (GPT-2 family: Llama 3, Qwen 2/2.5/3, GPT-4-style vocabularies), in
// pure Go, reproducing HuggingFace tokenizers' ids exactly. It cannot render
// chat templates; Tokenize returns ErrChatTemplate for the chat form.
//
// A Local serves one tokenizer and ignores the model name it is given. It
// is immutable and safe for concurrent use.
type Local struct {
	model     bpe
	vocabSize int

	raw       *addedSet   // added tokens matched on the raw text
	normAdded *addedSet   // added tokens matched on normalised text
	added     int         // number of added tokens
	forms     []norm.Form // normalizer steps, in order

	splits         []splitter // Split pre-tokenizers, in order
	byteLevel      bool       // a ByteLevel pre-tokenizer is present (always, once built)
	addPrefixSpace bool       // ByteLevel prepends a space to each piece not starting with one
	byteLevelSplit bool       // ByteLevel splits with gpt2Pattern (use_regex)

	prefix, suffix []uint64 // post-processor tokens around the text

	// chunks says where long segments may be cut into chunks for the
	// segment cache, from the first splitting pre-tokenizer step.
	chunks     boundaryRule
	firstSplit string    // pattern of the step that splits whole segments, "" when none or after a prefix space
	segs       *segCache // nil unless WithSegmentCache

	scratch *sync.Pool // *encodeScratch, shared by the Locals of one tokenizer
}

// maxTokenizerFile bounds what LoadFile and Load read (after
// decompression): the largest public tokenizer.json files are ~30 MB.
const maxTokenizerFile = 256 << 20

// LoadFile loads a tokenizer.json, optionally gzip-compressed (detected by
// content, so the name may be tokenizer.json or tokenizer.json.gz).
func LoadFile(path string) (*Local, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	l, err := load(f)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	return l, nil
}

// Load reads a tokenizer.json, optionally gzip-compressed, from r.
func Load(r io.Reader) (*Local, error) {
	l, err := load(r)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load: %w", err)
	}
	return l, nil
}

func load(r io.Reader) (*Local, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	data, err := io.ReadAll(io.LimitReader(r, maxTokenizerFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxTokenizerFile {
		return nil, fmt.Errorf("larger than %d bytes", maxTokenizerFile)
	}
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a valid tokenizer.json: %w", err)
	}
	return build(&f)
}

// VocabSize returns the number of model tokens plus added tokens.
func (l *Local) VocabSize() int { return l.vocabSize + l.added }

// Tokenize implements Tokenizer for the completion form. The chat form
// returns ErrChatTemplate: rendering a model's Jinja chat template exactly
// needs the engine.
func (l *Local) Tokenize(ctx context.Context, model string, in Input) ([]uint64, error) {
	ids, err := l.AppendTokenize(ctx, make([]uint64, 0, len(in.Prompt)/3+4), model, in)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// AppendTokenize implements Appender.
func (l *Local) AppendTokenize(ctx context.Context, dst []uint64, _ string, in Input) ([]uint64, error) {
	if err := in.validate(); err != nil {
		return dst, err
	}
	if in.IsChat() {
		return dst, ErrChatTemplate
	}
	n := len(dst)
	ids, err := l.encode(ctx, dst, in.Prompt, in.addSpecialTokens())
	if err != nil {
		return dst[:n], err
	}
	return ids, nil
}

// Encode returns the ids of text, with the post-processor's special tokens
// (BOS for Llama 3) when addSpecialTokens is true, as HuggingFace's
// Tokenizer.encode(text, add_special_tokens) does. Added tokens written in
// the text (such as <|im_start|>) become their ids either way. Invalid UTF-8
// is read as U+FFFD per bad byte, as encoding/json decodes it.
func (l *Local) Encode(text string, addSpecialTokens bool) []uint64 {
	ids, _ := l.encode(context.Background(), make([]uint64, 0, len(text)/3+4), text, addSpecialTokens)
	return ids
}

// encodeScratch is per-call working memory.
type encodeScratch struct {
	spans  []span
	spans2 []span
	runes  []rune
	prefix []rune
	bytes  []byte
	bpe    bpeScratch

	ctx    context.Context
	pieces int
	err    error
}

// ctxCheckEvery is how many pieces pass between checks for cancellation.
const ctxCheckEvery = 1024

func (l *Local) encode(ctx context.Context, dst []uint64, text string, addSpecial bool) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !utf8.ValidString(text) {
		text = replaceInvalid(text)
	}
	s, _ := l.scratch.Get().(*encodeScratch)
	if s == nil {
		s = &encodeScratch{}
	}
	s.ctx, s.pieces, s.err = ctx, 0, nil
	if addSpecial {
		dst = append(dst, l.prefix...)
	}
	s.spans = l.raw.split(s.spans[:0], text)
	for _, sp := range s.spans {
		if s.err != nil {
			break
		}
		if sp.tok >= 0 {
			dst = append(dst, uint64(l.raw.tokens[sp.tok].id))
			continue
		}
		seg := l.normalize(text[sp.start:sp.end])
		if l.normAdded == nil {
			dst = l.segment(dst, seg, s)
			continue
		}
		s.spans2 = l.normAdded.split(s.spans2[:0], seg)
		for _, sp2 := range s.spans2 {
			if sp2.tok >= 0 {
				dst = append(dst, uint64(l.normAdded.tokens[sp2.tok].id))
			} else {
				dst = l.segment(dst, seg[sp2.start:sp2.end], s)
			}
		}
	}
	if addSpecial {
		dst = append(dst, l.suffix...)
	}
	err := s.err
	s.ctx = nil
	l.scratch.Put(s)
	if err != nil {
		return nil, err
	}
	return dst, nil
}

// normalize applies the normalizer steps. Only the runs of non-ASCII
// text need checking, each with the ASCII character before it: ASCII is
// normal in every form, and no character composes with an ASCII one
// before it, so the text is normal when each piece cut just before an
// ASCII character is (the text scanned this way is mostly ASCII, which
// asciiPrefix skips eight bytes at a time). Text that is not UTF-8 is
// checked whole.
func (l *Local) normalize(s string) string {
	if len(l.forms) == 0 {
		return s
	}
	for i := asciiPrefix(s); i < len(s); i += asciiPrefix(s[i:]) {
		j := i + 1
		for j < len(s) && s[j] >= utf8.RuneSelf {
			j++
		}
		piece := s[max(i-1, 0):j]
		if !utf8.ValidString(piece) {
			// The forms read bytes that are not UTF-8 in their own way,
			// an incomplete sequence at the end of a piece differently
			// from one in the middle of the text.
			return l.normalizeAll(s)
		}
		for _, f := range l.forms {
			if !f.IsNormalString(piece) {
				return l.normalizeAll(s)
			}
		}
		i = j
	}
	return s
}

// normalizeAll applies the normalizer steps to the whole text.
func (l *Local) normalizeAll(s string) string {
	for _, f := range l.forms {
		if !f.IsNormalString(s) {
			s = f.String(s)
		}
	}
	return s
}

// asciiPrefix returns the length of the longest prefix of s that is
// ASCII, eight bytes at a time.
func asciiPrefix(s string) int {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := s[i : i+8]
		if (w[0]|w[1]|w[2]|w[3]|w[4]|w[5]|w[6]|w[7])&0x80 != 0 {
			break
		}
	}
	for ; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			break
		}
	}
	return i
}

// segment appends the ids of one normalised segment: text between added
// tokens, which tokenization never crosses.
func (l *Local) segment(dst []uint64, seg string, s *encodeScratch) []uint64 {
	if l.segs != nil {
		return l.cachedSegment(dst, seg, s)
	}
	return l.preTokenize(dst, seg, s)
}

// preTokenize runs the pre-tokenizer over one normalised segment and the
// model over each resulting piece.
func (l *Local) preTokenize(dst []uint64, seg string, s *encodeScratch) []uint64 {
	s.runes = s.runes[:0]
	for _, r := range seg {
		s.runes = append(s.runes, r)
	}
	return l.splitStep(dst, s.runes, 0, s)
}

// splitStep applies Split pre-tokenizer step and the ones after it to
// piece: matches and the text between them become pieces of their own
// (behavior Isolated); empty pieces are dropped.
//
// A step whose pattern the scanner recognises (scannedPatterns: GPT-2's,
// cl100k's, Qwen2's and o200k's, those of every tokenizer this package is
// known to serve) is cut by the scanner, in one pass and without allocating;
// regexp2, which allocates a Match per piece and took most of the
// encoding time (BenchmarkPreTokenizeScanner), runs any other pattern.
func (l *Local) splitStep(dst []uint64, piece []rune, step int, s *encodeScratch) []uint64 {
	if step == len(l.splits) {
		return l.byteLevelStep(dst, piece, s)
	}
	sp := &l.splits[step]
	if sp.scan != scanNone {
		for i := 0; i < len(piece) && s.err == nil; {
			j := sp.scan.next(piece, i)
			dst = l.splitStep(dst, piece[i:j], step+1, s)
			i = j
		}
		return dst
	}
	re := sp.re
	m, err := re.FindRunesMatch(piece)
	prev := 0
	for m != nil && err == nil && s.err == nil {
		if m.Index > prev {
			dst = l.splitStep(dst, piece[prev:m.Index], step+1, s)
		}
		if m.Length > 0 {
			dst = l.splitStep(dst, piece[m.Index:m.Index+m.Length], step+1, s)
		}
		prev = m.Index + m.Length
		m, err = re.FindNextMatch(m)
	}
	if err != nil && s.err == nil {
		s.err = fmt.Errorf("tokenizer: pre_tokenizer regex: %w", err)
	}
	if prev < len(piece) && s.err == nil {
		dst = l.splitStep(dst, piece[prev:], step+1, s)
	}
	return dst
}

// byteLevelStep is the ByteLevel pre-tokenizer (optional prefix space and
// GPT-2 split, always by the scanner) followed by the BPE model on the
// piece's UTF-8 bytes.
func (l *Local) byteLevelStep(dst []uint64, piece []rune, s *encodeScratch) []uint64 {
	if len(piece) == 0 {
		return dst
	}
	if l.addPrefixSpace && piece[0] != ' ' {
		s.prefix = append(append(s.prefix[:0], ' '), piece...)
		piece = s.prefix
	}
	if !l.byteLevelSplit {
		return l.modelStep(dst, piece, s)
	}
	for i := 0; i < len(piece) && s.err == nil; {
		j := nextGPT2(piece, i)
		dst = l.modelStep(dst, piece[i:j], s)
		i = j
	}
	return dst
}

// modelStep runs BPE on one piece and checks for cancellation now and then.
func (l *Local) modelStep(dst []uint64, piece []rune, s *encodeScratch) []uint64 {
	if s.err != nil {
		return dst
	}
	s.pieces++
	if s.ctx != nil && s.pieces%ctxCheckEvery == 0 {
		if err := s.ctx.Err(); err != nil {
			s.err = err
			return dst
		}
	}
	b := s.bytes[:0]
	for _, r := range piece {
		b = utf8.AppendRune(b, r)
	}
	s.bytes = b
	return l.model.encode(dst, b, &s.bpe)
}

// replaceInvalid replaces each byte that is not part of valid UTF-8 with
// U+FFFD, as a []rune conversion and encoding/json do.
func replaceInvalid(s string) string {
	out := make([]byte, 0, len(s)+8)
	for _, r := range s {
		out = utf8.AppendRune(out, r)
	}
	return string(out)
}
