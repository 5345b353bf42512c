package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: a string that is
// cut out of the text before normalisation and pre-tokenization and becomes
// one id, whatever the BPE model would make of it.
type addedToken struct {
	content    string
	id         uint32
	lstrip     bool // also swallow the whitespace on its left
	rstrip     bool // also swallow the whitespace on its right
	singleWord bool // match only when not inside a word
}

// addedSet finds added tokens in text, leftmost-longest, as HuggingFace's
// Aho-Corasick matcher does: the match starting earliest wins, and among
// those the longest.
type addedSet struct {
	tokens []addedToken
	first  [256]bool // first bytes of the tokens, to skip the rest quickly
	only   int       // the one first byte of all the tokens, or -1
	nodes  []trieNode
}

// trieNode is a byte trie node; children are sorted by byte.
type trieNode struct {
	keys []byte
	kids []int32
	tok  int32 // index into tokens of the token ending here, or -1
}

func newAddedSet(tokens []addedToken) *addedSet {
	if len(tokens) == 0 {
		return nil
	}
	s := &addedSet{tokens: tokens, nodes: []trieNode{{tok: -1}}, only: int(tokens[0].content[0])}
	for i, t := range tokens {
		s.first[t.content[0]] = true
		if int(t.content[0]) != s.only {
			s.only = -1
		}
		n := int32(0)
		for j := 0; j < len(t.content); j++ {
			n = s.child(n, t.content[j])
		}
		s.nodes[n].tok = int32(i)
	}
	return s
}

// child returns the child of n for byte b, creating it.
func (s *addedSet) child(n int32, b byte) int32 {
	node := &s.nodes[n]
	k := sort.Search(len(node.keys), func(i int) bool { return node.keys[i] >= b })
	if k < len(node.keys) && node.keys[k] == b {
		return node.kids[k]
	}
	c := int32(len(s.nodes))
	node.keys = append(node.keys, 0)
	copy(node.keys[k+1:], node.keys[k:])
	node.keys[k] = b
	node.kids = append(node.kids, 0)
	copy(node.kids[k+1:], node.kids[k:])
	node.kids[k] = c
	s.nodes = append(s.nodes, trieNode{tok: -1})
	return c
}

// find returns the leftmost-longest token occurrence in text at or after
// from, as byte offsets and the token's index; tok < 0 when there is none.
// When the tokens share their first byte (as "<" of "<|im_start|>" and
// the like), candidates are found with strings.IndexByte, much faster
// than a test of each byte.
func (s *addedSet) find(text string, from int) (start, end, tok int) {
	for i := from; i < len(text); i++ {
		if s.only >= 0 {
			k := strings.IndexByte(text[i:], byte(s.only))
			if k < 0 {
				break
			}
			i += k
		} else if !s.first[text[i]] {
			continue
		}
		n, best, bestEnd := int32(0), int32(-1), 0
		for j := i; j < len(text); j++ {
			node := &s.nodes[n]
			n = -1
			for k, b := range node.keys {
				if b == text[j] {
					n = node.kids[k]
					break
				}
			}
			if n < 0 {
				break
			}
			if t := s.nodes[n].tok; t >= 0 {
				best, bestEnd = t, j+1
			}
		}
		if best >= 0 {
			return i, bestEnd, int(best)
		}
	}
	return 0, 0, -1
}

// span is a piece of text: an added token (tok >= 0) or text to tokenize.
type span struct {
	start, end int
	tok        int
}

// split cuts text into spans, applying the tokens' single_word, lstrip and
// rstrip rules the way HuggingFace's AddedVocabulary does (including its
// treatment of whitespace already swallowed by the previous token).
// Text spans are never empty, except that an empty text yields one empty
// text span, so that later stages see it.
func (s *addedSet) split(dst []span, text string) []span {
	if len(text) == 0 {
		return append(dst, span{0, 0, -1})
	}
	if s == nil {
		return append(dst, span{0, len(text), -1})
	}
	done := 0 // end of the last emitted span
	for from := 0; from < len(text); {
		start, end, tok := s.find(text, from)
		if tok < 0 {
			break
		}
		from = end
		t := &s.tokens[tok]
		if t.singleWord && (endsWithWord(text[:start]) || startsWithWord(text[end:])) {
			continue
		}
		if t.lstrip {
			start = max(spaceRunStart(text[:start]), done)
		}
		if t.rstrip {
			end += spaceRunEnd(text[end:])
		}
		if start > done {
			dst = append(dst, span{done, start, -1})
		}
		dst = append(dst, span{start, end, tok})
		done = end
	}
	if done < len(text) {
		dst = append(dst, span{done, len(text), -1})
	}
	return dst
}

// isWordRune reports whether r is in the Unicode \w class of Rust's regex
// crate, which HuggingFace uses for single_word: Alphabetic, marks, decimal
// digits, connector punctuation and the join controls.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) ||
		unicode.In(r, unicode.Nl, unicode.Nd, unicode.Pc, unicode.Other_Alphabetic) ||
		r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}

// spaceRunStart returns where the run of whitespace ending s begins.
func spaceRunStart(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// spaceRunEnd returns the length of the run of whitespace starting s.
func spaceRunEnd(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
