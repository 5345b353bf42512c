package blockhash

import (
	"strings"
	"testing"
)

func TestParseMMItem(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want MMItem
		err  string
	}{
		{"img:3:16", MMItem{Identifier: "img", Offset: 3, Length: 16}, ""},
		{"sha256:ab:cd:0:1", MMItem{Identifier: "sha256:ab:cd", Offset: 0, Length: 1}, ""},
		{":0:1", MMItem{Identifier: "", Offset: 0, Length: 1}, ""},
		{"img", MMItem{}, "want ID:OFFSET:LENGTH"},
		{"img:3", MMItem{}, "want ID:OFFSET:LENGTH"},
		{"img:-1:2", MMItem{}, "OFFSET >= 0"},
		{"img:1:0", MMItem{}, "LENGTH >= 1"},
		{"img:x:2", MMItem{}, "must be integers"},
		{"img:1:99999999999999999999", MMItem{}, "must be integers"},
	} {
		got, err := ParseMMItem(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseMMItem(%q): %v, want an error saying %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseMMItem(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
