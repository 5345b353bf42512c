package jsonstr

import (
	"encoding/json"
	"testing"
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
