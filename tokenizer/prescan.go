package tokenizer

import (
	"unicode"

	"github.com/dlclark/regexp2"
)

// The pre-tokenizer scanner replaces regexp2 for the Split patterns that
// real tokenizers use. regexp2 allocates a Match per piece and, being a
// backtracking interpreter, spends most of an encoding's time finding
// pieces; these patterns are simple enough to match by hand in one pass
// with no allocation. A pattern is scanned only when it is byte for byte
// one of scannedPatterns; any other runs through regexp2, so the scanner
// is an optimisation that never changes which tokenizers load.
//
// Exactness. The scanner reproduces regexp2's matches, which are what the
// golden tests hold against HuggingFace's ids:
//
//   - Character classes are regexp2's own: \p{L}, \p{N} and o200k's
//     \p{Lu}, \p{M} and the like are Go's unicode category tables, \s is
//     unicode.IsSpace, and (?i:...) compares unicode.ToLower of the input with the
//     pattern's lower-case letters.
//   - Alternatives are tried left to right and the first that matches
//     wins (leftmost-first, not longest), each with its backtracking
//     worked out below, in nextQwen2, nextO200k and nextGPT2.
//   - Every position starts a match in these patterns (a letter, a digit,
//     white space and any other character each have an alternative), so
//     the pieces are consecutive matches with no text between them, and
//     no match is empty.
//
// FuzzPreTokenizeScanner compares the scanner's pieces with regexp2's for
// every scanned pattern.

// scanPattern names a pattern the scanner recognises; scanNone is any
// other, run through regexp2.
type scanPattern uint8

const (
	scanNone   scanPattern = iota
	scanGPT2               // gpt2Pattern
	scanCL100k             // cl100kPattern
	scanQwen2              // qwen2Pattern
	scanO200k              // o200kPattern
)

// scannedPatterns maps each recognised pattern, as written in
// tokenizer.json, to its scanner.
var scannedPatterns = map[string]scanPattern{
	gpt2Pattern:   scanGPT2,
	cl100kPattern: scanCL100k,
	qwen2Pattern:  scanQwen2,
	o200kPattern:  scanO200k,
}

// splitter is one Split pre-tokenizer step: the scanner when its pattern
// is recognised, else the compiled regex.
type splitter struct {
	scan scanPattern
	re   *regexp2.Regexp // nil when scan != scanNone
}

// newSplitter prepares a Split step for pattern.
func newSplitter(pattern string) (splitter, error) {
	if p, ok := scannedPatterns[pattern]; ok {
		return splitter{scan: p}, nil
	}
	re, err := compileHFRegex(pattern)
	if err != nil {
		return splitter{}, err
	}
	return splitter{re: re}, nil
}

// next returns the end of the match that starts at r[i], i < len(r); the
// match is never empty.
func (p scanPattern) next(r []rune, i int) int {
	switch p {
	case scanGPT2:
		return nextGPT2(r, i)
	case scanCL100k:
		return nextQwen2(r, i, 3)
	case scanO200k:
		return nextO200k(r, i)
	default:
		return nextQwen2(r, i, 1)
	}
}

// runeClass is where a rune stands in these patterns' classes.
type runeClass uint8

const (
	classOther   runeClass = iota // [^\s\p{L}\p{N}]
	classLetter                   // \p{L}
	classNumber                   // \p{N}
	classSpace                    // \s but not [\r\n]
	classNewline                  // [\r\n]
)

// asciiClass is classOfRune for ASCII, looked up rather than computed.
var asciiClass = func() (t [128]runeClass) {
	for r := range t {
		t[r] = classOfRune(rune(r))
	}
	return t
}()

// classOfRune classifies r with the tables regexp2 uses for \p{L}, \p{N}
// and \s. No rune is in two of them.
func classOfRune(r rune) runeClass {
	switch {
	case r == '\r' || r == '\n':
		return classNewline
	case unicode.Is(unicode.Letter, r):
		return classLetter
	case unicode.Is(unicode.Number, r):
		return classNumber
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

func classOf(r rune) runeClass {
	if r < 0x80 && r >= 0 {
		return asciiClass[r]
	}
	return classOfRune(r)
}

// isSpace is \s.
func isSpace(c runeClass) bool { return c == classSpace || c == classNewline }

// runEnd returns the first position from i whose rune is not of class c.
func runEnd(r []rune, i int, c runeClass) int {
	for i < len(r) && classOf(r[i]) == c {
		i++
	}
	return i
}

// newlinesEnd is [\r\n]* from i.
func newlinesEnd(r []rune, i int) int { return runEnd(r, i, classNewline) }

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at the apostrophe r[i], folding
// case as (?i:...) does when fold is set; it returns i when none matches.
func contraction(r []rune, i int, fold bool) int {
	lower := func(c rune) rune {
		if fold {
			return unicode.ToLower(c)
		}
		return c
	}
	if i+1 >= len(r) {
		return i
	}
	var second rune
	switch lower(r[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		second = 'e'
	case 'l':
		second = 'l'
	default:
		return i
	}
	if i+2 < len(r) && lower(r[i+2]) == second {
		return i + 3
	}
	return i
}

// spacesEnd matches \s+(?!\S)|\s+ at r[i], which is white space: the
// whole run of white space when it ends the text or is one rune long,
// else the run but its last rune, which the look-ahead gives back so that
// it can start the next piece (" word").
func spacesEnd(r []rune, i int) int {
	j := i + 1
	for j < len(r) && isSpace(classOf(r[j])) {
		j++
	}
	if j == len(r) || j-i == 1 {
		return j
	}
	return j - 1
}

// nextQwen2 matches Qwen2's pattern, or cl100k's with maxDigits 3:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func nextQwen2(r []rune, i, maxDigits int) int {
	c := r[i]
	if c == '\'' {
		if j := contraction(r, i, true); j > i {
			return j
		}
	}
	cl := classOf(c)
	switch cl {
	case classLetter:
		return runEnd(r, i+1, classLetter)
	case classNumber:
		j := i + 1
		for j < len(r) && j-i < maxDigits && classOf(r[j]) == classNumber {
			j++
		}
		return j
	}
	var next runeClass = classNewline // what follows c; nothing counts as a newline here
	if i+1 < len(r) {
		next = classOf(r[i+1])
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional rune present: c is
	// other or white space but not a newline.
	if (cl == classOther || cl == classSpace) && next == classLetter {
		return runEnd(r, i+2, classLetter)
	}
	// " ?[^\s\p{L}\p{N}]+[\r\n]*": the run of others is greedy and
	// nothing after [\r\n]* can fail, so both runs are taken whole.
	if cl == classOther {
		return newlinesEnd(r, runEnd(r, i+1, classOther))
	}
	if c == ' ' && next == classOther {
		return newlinesEnd(r, runEnd(r, i+2, classOther))
	}
	// c is white space. \s*[\r\n]+: \s* takes the whole run of white
	// space and gives back one rune at a time until [\r\n]+ matches, so
	// the match ends just after the run's last newline, if it has one.
	end, lastNL := i, -1
	for end < len(r) {
		k := classOf(r[end])
		if !isSpace(k) {
			break
		}
		if k == classNewline {
			lastNL = end
		}
		end++
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	return spacesEnd(r, i)
}

// nextO200k matches GPT-4o's o200k pattern:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Each of the first two alternatives is tried with its optional first
// rune, then without it (a mark is both that rune and a word rune).
func nextO200k(r []rune, i int) int {
	cl := classOf(r[i])
	optional := cl == classOther || cl == classSpace // [^\r\n\p{L}\p{N}]
	if optional {
		if j := o200kLowerWord(r, i+1); j > 0 {
			return j
		}
	}
	if j := o200kLowerWord(r, i); j > 0 {
		return j
	}
	if optional {
		if j := o200kUpperWord(r, i+1); j > 0 {
			return j
		}
	}
	if j := o200kUpperWord(r, i); j > 0 {
		return j
	}
	if cl == classNumber {
		j := i + 1
		for j < len(r) && j-i < 3 && classOf(r[j]) == classNumber {
			j++
		}
		return j
	}
	if cl == classOther {
		return newlinesSlashesEnd(r, runEnd(r, i+1, classOther))
	}
	if r[i] == ' ' && i+1 < len(r) && classOf(r[i+1]) == classOther {
		return newlinesSlashesEnd(r, runEnd(r, i+2, classOther))
	}
	// White space: as in Qwen2's pattern.
	lastNL := -1
	for end := i; end < len(r); end++ {
		k := classOf(r[end])
		if !isSpace(k) {
			break
		}
		if k == classNewline {
			lastNL = end
		}
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	return spacesEnd(r, i)
}

// o200kLowerWord matches [UPPER]*[LOWER]+(?i:'s|...)? at r[s] (UPPER and
// LOWER as in wordCase), returning 0 when it does not match. [UPPER]*
// takes its whole run and gives back one rune at a time until [LOWER]+
// matches: right after the run when a lower-case-only rune follows,
// else at the run's last rune that is both, where [LOWER]+ ends after
// that one rune (the runes after it in the run are upper-case only).
func o200kLowerWord(r []rune, s int) int {
	u := s
	for u < len(r) && wordCase(r[u])&caseUpper != 0 {
		u++
	}
	var end int
	if u < len(r) && wordCase(r[u])&caseLower != 0 {
		end = u + 1
		for end < len(r) && wordCase(r[end])&caseLower != 0 {
			end++
		}
	} else {
		k := u - 1
		for k >= s && wordCase(r[k])&caseLower == 0 {
			k--
		}
		if k < s {
			return 0
		}
		end = k + 1
	}
	return contractionAfter(r, end)
}

// o200kUpperWord matches [UPPER]+[LOWER]*(?i:'s|...)? at r[s], returning
// 0 when it does not match; nothing after [UPPER]+ can fail, so no
// backtracking.
func o200kUpperWord(r []rune, s int) int {
	if s >= len(r) || wordCase(r[s])&caseUpper == 0 {
		return 0
	}
	u := s + 1
	for u < len(r) && wordCase(r[u])&caseUpper != 0 {
		u++
	}
	for u < len(r) && wordCase(r[u])&caseLower != 0 {
		u++
	}
	return contractionAfter(r, u)
}

// contractionAfter is an optional (?i:'s|'t|'re|'ve|'m|'ll|'d) at r[i].
func contractionAfter(r []rune, i int) int {
	if i < len(r) && r[i] == '\'' {
		return contraction(r, i, true)
	}
	return i
}

// newlinesSlashesEnd is [\r\n/]* from i.
func newlinesSlashesEnd(r []rune, i int) int {
	for i < len(r) && (r[i] == '\r' || r[i] == '\n' || r[i] == '/') {
		i++
	}
	return i
}

// The word classes of o200k's pattern, as bits: a rune in Lm, Lo or M
// is in both.
const (
	caseUpper = 1 << iota // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	caseLower             // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

// wordCase returns r's word classes, with regexp2's category tables.
func wordCase(r rune) uint8 {
	switch {
	case r < 0x80:
		switch {
		case 'A' <= r && r <= 'Z':
			return caseUpper
		case 'a' <= r && r <= 'z':
			return caseLower
		}
		return 0
	case unicode.Is(unicode.Lu, r) || unicode.Is(unicode.Lt, r):
		return caseUpper
	case unicode.Is(unicode.Ll, r):
		return caseLower
	case unicode.Is(unicode.Lm, r) || unicode.Is(unicode.Lo, r) || unicode.Is(unicode.M, r):
		return caseUpper | caseLower
	}
	return 0
}

// nextGPT2 matches GPT-2's pattern (ByteLevel's use_regex):
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func nextGPT2(r []rune, i int) int {
	c := r[i]
	if c == '\'' {
		if j := contraction(r, i, false); j > i {
			return j
		}
	}
	start, cl := i, classOf(c)
	// " ?" before a letter, number or other run; a space before anything
	// else fails the three and is white space.
	if c == ' ' && i+1 < len(r) {
		if next := classOf(r[i+1]); !isSpace(next) {
			start, cl = i+1, next
		}
	}
	if isSpace(cl) {
		return spacesEnd(r, i)
	}
	return runEnd(r, start+1, cl)
}
