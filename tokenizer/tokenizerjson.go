package tokenizer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// The subset of HuggingFace's tokenizer.json this package reads. Unknown
// fields are ignored; known fields with values that would change the ids
// and that the package does not implement are refused with ErrUnsupported,
// so a loaded tokenizer is either exact or not loaded at all.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Model         *modelJSON       `json:"model"`
}

type addedTokenJSON struct {
	ID         *uint32 `json:"id"`
	Content    string  `json:"content"`
	SingleWord bool    `json:"single_word"`
	LStrip     bool    `json:"lstrip"`
	RStrip     bool    `json:"rstrip"`
	Normalized bool    `json:"normalized"`
	Special    bool    `json:"special"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  []mergeJSON       `json:"merges"`
}

// mergeJSON is one merge rule, "left right" (older files) or
// ["left","right"] (tokenizers >= 0.20).
type mergeJSON struct{ left, right string }

func (m *mergeJSON) UnmarshalJSON(data []byte) error {
	switch {
	case len(data) > 0 && data[0] == '"':
		var s string
		// Fast path: no escapes, so the bytes between the quotes are the
		// string (the whole document was validated by encoding/json).
		if bytes.IndexByte(data, '\\') < 0 {
			s = string(data[1 : len(data)-1])
		} else if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		l, r, ok := strings.Cut(s, " ")
		if !ok || strings.Contains(r, " ") {
			return fmt.Errorf("merge %q is not two space-separated tokens", s)
		}
		m.left, m.right = l, r
		return nil
	case len(data) > 0 && data[0] == '[':
		var pair []string
		if err := json.Unmarshal(data, &pair); err != nil {
			return err
		}
		if len(pair) != 2 {
			return fmt.Errorf("merge %s is not a pair", data)
		}
		m.left, m.right = pair[0], pair[1]
		return nil
	}
	return fmt.Errorf("merge %s is neither a string nor a pair", data)
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}

// gpt2Pattern is the regex of the ByteLevel pre-tokenizer when use_regex
// is set, as HuggingFace defines it.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// cl100kPattern is GPT-4's cl100k_base split, as in Llama 3's
// tokenizer.json.
const cl100kPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// o200kPattern is GPT-4o's o200k_base split.
const o200kPattern = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// qwen2Pattern is Qwen2's, 2.5's and 3's split: cl100k's with single
// digits.
const qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// compileHFRegex compiles a tokenizer.json regex. HuggingFace runs these
// with Oniguruma in Ruby syntax; regexp2 (a .NET-compatible engine) agrees
// on the constructs these patterns use: look-ahead, \p{L}/\p{N}, scoped
// (?i:...), and \s as Unicode White_Space. Multiline gives ^ and $ Ruby's
// line semantics.
func compileHFRegex(pattern string) (*regexp2.Regexp, error) {
	return regexp2.Compile(pattern, regexp2.Multiline)
}

// build validates f and assembles a Local from it.
func build(f *fileJSON) (*Local, error) {
	if f.Model == nil {
		return nil, errors.New("no \"model\" section (is this a tokenizer.json?)")
	}
	l := &Local{scratch: new(sync.Pool)}
	if err := l.buildModel(f.Model); err != nil {
		return nil, err
	}
	if err := l.buildNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := l.buildPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if !l.byteLevel {
		return nil, unsupported("pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer")
	}
	l.chunks = chunkPatterns[l.firstSplit]
	if err := l.buildPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if err := l.buildAdded(f.AddedTokens, f.Model.Vocab); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Local) buildModel(m *modelJSON) error {
	typ := m.Type
	if typ == "" && m.Merges != nil {
		typ = "BPE" // files written before models carried a type
	}
	if typ != "BPE" {
		if typ == "" {
			typ = "(none)"
		}
		return unsupported("model.type %s: only byte-level BPE is supported (no Unigram/SentencePiece, WordPiece or WordLevel)", typ)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return unsupported("model.dropout %v makes tokenization random", *m.Dropout)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return unsupported("model.continuing_subword_prefix %q", *m.ContinuingSubwordPrefix)
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return unsupported("model.end_of_word_suffix %q", *m.EndOfWordSuffix)
	}
	if len(m.Vocab) == 0 {
		return errors.New("model.vocab is empty")
	}
	for tok, id := range m.Vocab {
		if id == math.MaxUint32 {
			return fmt.Errorf("model.vocab[%q]: id %d out of range", tok, id)
		}
	}
	// Every byte must be a token of its own, or some input would have no
	// tokenization; this is what makes a vocabulary byte-level.
	var buf [4]byte
	for b := 0; b < 256; b++ {
		s := string(append(buf[:0], string(byteRune[b])...))
		id, ok := m.Vocab[s]
		if !ok {
			return unsupported("model.vocab has no token for byte 0x%02x (%q): not a byte-level BPE vocabulary", b, s)
		}
		l.model.byteID[b] = id
	}
	l.model.merges = make(map[uint64]uint64, len(m.Merges))
	for rank, mg := range m.Merges {
		left, ok1 := m.Vocab[mg.left]
		right, ok2 := m.Vocab[mg.right]
		merged, ok3 := m.Vocab[mg.left+mg.right]
		if !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("model.merges[%d] %q %q: token not in model.vocab", rank, mg.left, mg.right)
		}
		key := uint64(left)<<32 | uint64(right)
		if _, dup := l.model.merges[key]; dup {
			continue // HuggingFace keeps the first (lowest) rank
		}
		l.model.merges[key] = uint64(rank)<<32 | uint64(merged)
	}
	if m.IgnoreMerges {
		l.model.whole = make(map[string]uint32, len(m.Vocab))
		var raw []byte
		for tok, id := range m.Vocab {
			var ok bool
			if raw, ok = byteLevelDecode(raw[:0], tok); ok {
				l.model.whole[string(raw)] = id
			}
		}
	}
	l.vocabSize = len(m.Vocab)
	return nil
}

func (l *Local) buildNormalizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("normalizer: %v", err)
	}
	switch n.Type {
	case "NFC":
		l.forms = append(l.forms, norm.NFC)
	case "NFD":
		l.forms = append(l.forms, norm.NFD)
	case "NFKC":
		l.forms = append(l.forms, norm.NFKC)
	case "NFKD":
		l.forms = append(l.forms, norm.NFKD)
	case "Sequence":
		for _, sub := range n.Normalizers {
			if err := l.buildNormalizer(sub); err != nil {
				return err
			}
		}
	default:
		return unsupported("normalizer %s (supported: NFC, NFD, NFKC, NFKD, Sequence of them)", n.Type)
	}
	return nil
}

func (l *Local) buildPreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return unsupported("no pre_tokenizer: byte-level BPE needs a ByteLevel pre-tokenizer")
	}
	var p struct {
		Type           string            `json:"type"`
		PreTokenizers  []json.RawMessage `json:"pretokenizers"`
		AddPrefixSpace *bool             `json:"add_prefix_space"`
		UseRegex       *bool             `json:"use_regex"`
		Pattern        struct {
			Regex  *string `json:"Regex"`
			String *string `json:"String"`
		} `json:"pattern"`
		Behavior string `json:"behavior"`
		Invert   bool   `json:"invert"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("pre_tokenizer: %v", err)
	}
	if l.byteLevel {
		return unsupported("pre_tokenizer %s after ByteLevel", p.Type)
	}
	switch p.Type {
	case "Sequence":
		for _, sub := range p.PreTokenizers {
			if err := l.buildPreTokenizer(sub); err != nil {
				return err
			}
		}
		if !l.byteLevel {
			return unsupported("pre_tokenizer Sequence without ByteLevel: not a byte-level BPE tokenizer")
		}
	case "ByteLevel":
		l.byteLevel = true
		// HuggingFace's defaults when the fields are absent.
		l.addPrefixSpace = p.AddPrefixSpace == nil || *p.AddPrefixSpace
		// Without a Split step before it, ByteLevel splits the whole
		// segment first, after prepending its space to the segment only.
		if len(l.splits) == 0 && !l.addPrefixSpace && (p.UseRegex == nil || *p.UseRegex) {
			l.firstSplit = gpt2Pattern
		}
		l.byteLevelSplit = p.UseRegex == nil || *p.UseRegex
	case "Split":
		if p.Behavior != "Isolated" {
			return unsupported("pre_tokenizer Split behavior %q (supported: Isolated)", p.Behavior)
		}
		if p.Invert {
			return unsupported("pre_tokenizer Split with invert")
		}
		var pattern string
		switch {
		case p.Pattern.Regex != nil:
			pattern = *p.Pattern.Regex
		case p.Pattern.String != nil:
			pattern = regexp.QuoteMeta(*p.Pattern.String)
		default:
			return errors.New("pre_tokenizer Split has no pattern")
		}
		sp, err := newSplitter(pattern)
		if err != nil {
			return unsupported("pre_tokenizer Split regex %q: %v", pattern, err)
		}
		if len(l.splits) == 0 {
			l.firstSplit = pattern
		}
		l.splits = append(l.splits, sp)
	default:
		return unsupported("pre_tokenizer %s (supported: ByteLevel, Split, Sequence of them)", p.Type)
	}
	return nil
}

// buildPostProcessor records the special tokens the post-processor puts
// around a single sequence when add_special_tokens is true.
func (l *Local) buildPostProcessor(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var p struct {
		Type          string              `json:"type"`
		Processors    []json.RawMessage   `json:"processors"`
		Single        []templatePieceJSON `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
		CLS []json.RawMessage `json:"cls"`
		SEP []json.RawMessage `json:"sep"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("post_processor: %v", err)
	}
	switch p.Type {
	case "ByteLevel":
		// Adjusts offsets only.
	case "Sequence":
		for _, sub := range p.Processors {
			if err := l.buildPostProcessor(sub); err != nil {
				return err
			}
		}
	case "TemplateProcessing":
		var pre, post []uint64
		seen := false
		for _, piece := range p.Single {
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" || seen {
					return unsupported("post_processor TemplateProcessing single template with sequence %q", piece.Sequence.ID)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := p.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("post_processor: special token %q is not in special_tokens", piece.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if seen {
						post = append(post, uint64(id))
					} else {
						pre = append(pre, uint64(id))
					}
				}
			default:
				return errors.New("post_processor: TemplateProcessing piece is neither Sequence nor SpecialToken")
			}
		}
		if !seen {
			return unsupported("post_processor TemplateProcessing single template without sequence A")
		}
		l.wrap(pre, post)
	case "RobertaProcessing", "BertProcessing":
		cls, err := processorToken(p.CLS)
		if err != nil {
			return fmt.Errorf("post_processor %s cls: %v", p.Type, err)
		}
		sep, err := processorToken(p.SEP)
		if err != nil {
			return fmt.Errorf("post_processor %s sep: %v", p.Type, err)
		}
		l.wrap([]uint64{cls}, []uint64{sep})
	default:
		return unsupported("post_processor %s (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence)", p.Type)
	}
	return nil
}

// wrap adds a processor's tokens around what earlier processors added.
func (l *Local) wrap(pre, post []uint64) {
	l.prefix = append(pre, l.prefix...)
	l.suffix = append(l.suffix, post...)
}

type templatePieceJSON struct {
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
}

// processorToken reads a ["<s>", 0] pair.
func processorToken(pair []json.RawMessage) (uint64, error) {
	if len(pair) != 2 {
		return 0, errors.New("want [token, id]")
	}
	var id uint32
	if err := json.Unmarshal(pair[1], &id); err != nil {
		return 0, err
	}
	return uint64(id), nil
}

// buildAdded registers added_tokens the way HuggingFace's loader does:
// in id order, each getting its vocabulary id when its content is also a
// model token, else the next free id after the vocabulary (which is the
// file's id in every consistent file).
func (l *Local) buildAdded(tokens []addedTokenJSON, vocab map[string]uint32) error {
	for i, t := range tokens {
		if t.ID == nil {
			return fmt.Errorf("added_tokens[%d] %q has no id", i, t.Content)
		}
	}
	sorted := slices.Clone(tokens)
	slices.SortStableFunc(sorted, func(a, b addedTokenJSON) int { return cmp.Compare(*a.ID, *b.ID) })
	var raw, normalized []addedToken
	ids := make(map[string]uint32, len(sorted))
	var maxID int64 = -1
	for _, t := range sorted {
		if t.Content == "" {
			continue
		}
		if _, dup := ids[t.Content]; dup {
			continue
		}
		id, ok := vocab[t.Content]
		if !ok {
			switch size := int64(len(vocab)); {
			case maxID < 0:
				id = uint32(size)
			case maxID >= size:
				id = uint32(maxID + 1)
			default:
				id = uint32(size)
			}
		}
		if id == math.MaxUint32 {
			return fmt.Errorf("added token %q: id out of range", t.Content)
		}
		ids[t.Content] = id
		maxID = max(maxID, int64(id))
		at := addedToken{content: t.Content, id: id, lstrip: t.LStrip, rstrip: t.RStrip, singleWord: t.SingleWord}
		if t.Normalized {
			// Matched against normalised text, so normalise the token too.
			at.content = l.normalize(at.content)
			if at.content == "" {
				continue
			}
			normalized = append(normalized, at)
		} else {
			raw = append(raw, at)
		}
	}
	l.added = len(raw) + len(normalized)
	l.raw = newAddedSet(raw)
	l.normAdded = newAddedSet(normalized)
	return nil
}
