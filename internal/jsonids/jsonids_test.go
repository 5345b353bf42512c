package jsonids

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want []uint64
		end  int // index after the array; -1: len(in) less trailing text
		err  string
	}{
		{in: `[]`, want: nil, end: 2},
		{in: ` [ 1 , 2,3 ] `, want: []uint64{1, 2, 3}, end: 12},
		{in: `[0, 18446744073709551615]`, want: []uint64{0, 1<<64 - 1}, end: 25},
		{in: `[9007199254740993],"x":1`, want: []uint64{9007199254740993}, end: 18}, // above 2^53: exact
		{in: `[18446744073709551616]`, err: "ids[0]: 18446744073709551616 does not fit in 64 bits"},
		{in: `[1, -1]`, err: "ids[1]: -1 is negative"},
		{in: `[1.5]`, err: "ids[0]: 1.5 is not an integer"},
		{in: `[1e3]`, err: "ids[0]: 1e3 is not an integer"},
		{in: `[01]`, err: "ids[0]: 01 has a leading zero"},
		{in: `[0,]`, err: "ids[1]: ']' is not an integer"},
		{in: `[1 2]`, err: "ids[0]: unexpected '2'"},
		{in: `[1,2`, err: "ids: unterminated array"},
		{in: `[1, "2"]`, err: "ids[1]: a string is not an integer"},
		{in: `[null]`, err: "ids[0]: null is not an integer"},
		{in: `[[1]]`, err: "ids[0]: an array is not an integer"},
		{in: `"1,2"`, err: "ids must be an array"},
		{in: ``, err: "ids must be an array"},
	}
	for _, tc := range tests {
		got, end, err := Parse(nil, []byte(tc.in), 0, "ids")
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case !slices.Equal(got, tc.want) || end != tc.end:
			t.Errorf("%s: %v ending at %d, want %v ending at %d", tc.in, got, end, tc.want, tc.end)
		}
	}
}

// FuzzParse checks, on arbitrary bytes (valid JSON or not), that Parse
// never panics, accepts only valid JSON and reads it as encoding/json
// does, and refuses no array encoding/json decodes into []uint64.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`[]`, `[1,2,3]`, `[-1]`, `[1.0]`, `[18446744073709551615]`, `["a"]`, `[1,]`, `[ 1 ]`, `[01]`, `[0]x`, `[-0]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, end, err := Parse(nil, []byte(s), 0, "ids")
		var ref []uint64
		if err == nil {
			if refErr := json.Unmarshal([]byte(s[:end]), &ref); refErr != nil {
				t.Fatalf("%q: accepted %v; encoding/json: %v", s[:end], ids, refErr)
			}
			if !slices.Equal(ids, ref) && !(len(ids) == 0 && len(ref) == 0) {
				t.Fatalf("%q: %v, encoding/json %v", s, ids, ref)
			}
			return
		}
		if json.Unmarshal([]byte(s), &ref) == nil && strings.TrimSpace(s) != "null" {
			t.Fatalf("%q: %v; encoding/json decodes %v", s, err, ref)
		}
	})
}
