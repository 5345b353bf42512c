package jsonstr

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppend(t *testing.T) {
	for _, tt := range []struct {
		in, want string
		ok       bool
	}{
		{`plain`, "plain", true},
		{`a\nb\t\"q\"\\\/\b\f\r`, "a\nb\t\"q\"\\/\b\f\r", true},
		{`\ud83d\ude00`, "😀", true},
		{`\ud800x`, "\uFFFDx", true},
		{`\ud800\u0041`, "\uFFFDA", true},
		{`\u00E9\u00e9`, "éé", true},
		{"bad \xff", "bad \uFFFD", true},
		{`\x`, "", false},
		{`\u12`, "", false},
		{"a\x01", "", false},
		{`a"b`, "", false},
		{`\`, "", false},
	} {
		got, ok := Append(nil, []byte(tt.in))
		if ok != tt.ok || ok && string(got) != tt.want {
			t.Errorf("Append(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	if End([]byte(`ab\"c"d`), 0) != 5 || End([]byte(`ab\"`), 0) != -1 {
		t.Error("End does not find the closing quote past an escaped one")
	}
}

// FuzzAppend checks Append against encoding/json on every string: the
// same contents, or both refuse.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{`plain`, `a\nb\t\"q\"\\\/`, `\ud83d\ude00`, `\ud800`, `\ud800\u0041`, `\udc00\ud800`, "\xff\xfe", `\u00E9`, `\b\f\r`, "\x01", `\q`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want string
		refErr := json.Unmarshal([]byte(`"`+s+`"`), &want)
		got, ok := Append(nil, []byte(s))
		if ok != (refErr == nil) || ok && string(got) != want {
			t.Fatalf("%q: Append %q (%v), encoding/json %q (%v)", s, got, ok, want, refErr)
		}
	})
}

func TestScan(t *testing.T) {
	for _, tt := range []struct {
		in    string
		end   int
		plain bool
	}{
		{`"`, 0, true},
		{`plain text, longer than a word"x`, 30, true},
		{`tab	inside a long string"`, 24, false},
		{`a\"b"`, 4, false},
		{`caf` + "\u00e9" + ` au lait, long enough"`, 26, true},
		{"bad \xff byte in a long string\"", 27, false},
		{`no closing quote in this one`, -1, false},
		{`ends in a backslash \`, -1, false},
		{`ends on an escaped quote \"`, -1, false},
		{`control ` + "\x1f" + ` char at the start of a word"`, 37, false},
	} {
		end, plain := Scan([]byte(tt.in), 0)
		if end != tt.end || plain != tt.plain {
			t.Errorf("Scan(%q) = %d, %v; want %d, %v", tt.in, end, plain, tt.end, tt.plain)
		}
	}
}

// FuzzScan checks Scan against End and a byte-by-byte reading of what
// plain means.
func FuzzScan(f *testing.F) {
	for _, s := range []string{`plain"`, `a\"b"`, "caf\u00e9\"", "\xff\"", "01234567\x1f89\"", `0123456\\"`, `01234567`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		end, plain := Scan([]byte(s), 0)
		if want := End([]byte(s), 0); end != want {
			t.Fatalf("%q: Scan ends at %d, End at %d", s, end, want)
		}
		if end < 0 {
			return
		}
		v := s[:end]
		want := utf8.ValidString(v) && !strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == '\\' })
		if plain != want {
			t.Fatalf("%q: plain %v, want %v", v, plain, want)
		}
		if got, ok := Append(nil, []byte(v)); plain && (!ok || string(got) != v) {
			t.Fatalf("%q: plain, but Append gives %q (%v)", v, got, ok)
		}
	})
}

// BenchmarkScan reads a chat message's text (ASCII prose) to its closing
// quote: Scan, word by word, against End, byte by byte.
func BenchmarkScan(b *testing.B) {
	text := []byte(strings.Repeat("the engine then prefills only what the turn adds: a tool result. ", 1000) + `"`)
	for _, bm := range []struct {
		name string
		scan func([]byte) int
	}{
		{"Scan", func(d []byte) int { end, _ := Scan(d, 0); return end }},
		{"End", func(d []byte) int { return End(d, 0) }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if bm.scan(text) != len(text)-1 {
					b.Fatal("wrong end")
				}
			}
		})
	}
}

// BenchmarkAppend decodes the same text with an escaped newline every
// 70 bytes, as chat messages carry.
func BenchmarkAppend(b *testing.B) {
	text := []byte(strings.Repeat(`the engine then prefills only what the turn adds: a tool result.\n`, 1000))
	b.SetBytes(int64(len(text)))
	dst := make([]byte, 0, len(text))
	for b.Loop() {
		if _, ok := Append(dst[:0], text); !ok {
			b.Fatal("not decoded")
		}
	}
}
