package client_test

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api/client"
)

// Token ids as a file holds them: a JSON array, or ids separated by commas
// or whitespace; anything else is refused naming the element at fault.
func TestParseTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []uint64
		err  string // the whole error
	}{
		{in: "[1,2,3]", want: []uint64{1, 2, 3}},
		{in: " \n[ 1 , 2 ]\n", want: []uint64{1, 2}},
		{in: "[18446744073709551615]", want: []uint64{1<<64 - 1}},
		{in: "[9007199254740993]", want: []uint64{1<<53 + 1}}, // not a double
		{in: "1,2,3", want: []uint64{1, 2, 3}},
		{in: "1 2\t3\r\n4", want: []uint64{1, 2, 3, 4}},
		{in: ",1,,2,", want: []uint64{1, 2}},
		{in: "007", want: []uint64{7}},
		{in: "[]", err: "empty token array"},
		{in: "", err: "no token ids"},
		{in: " \n", err: "no token ids"},
		{in: ",,", err: "no token ids"},
		{in: "[1,x]", err: "not a JSON array of integers: invalid character 'x' looking for beginning of value"},
		{in: "[1,2", err: "not a JSON array of integers: unexpected EOF"},
		{in: "[1,2][3]", err: "not a JSON array of integers: more data after the array"},
		{in: "[1,2] 3", err: "not a JSON array of integers: more data after the array"},
		{in: "[1,2]]", err: "not a JSON array of integers: more data after the array"},
		{in: `[1,"2"]`, err: "element 1 is 2, not an integer"},
		{in: "[1,null]", err: "element 1 is <nil>, not an integer"},
		{in: "[[1]]", err: "element 0 is [1], not an integer"},
		{in: "[1,1.5]", err: `element 1: "1.5" is not a non-negative integer`},
		{in: "[1e3]", err: `element 0: "1e3" is not a non-negative integer`},
		{in: "[-1]", err: `element 0: "-1" is negative; token ids are non-negative integers`},
		{in: "[18446744073709551616]", err: `element 0: "18446744073709551616" is not a non-negative integer`},
		{in: "1,-2", err: `token 1: "-2" is negative; token ids are non-negative integers`},
		{in: "1,x", err: `token 1: "x" is not a non-negative integer`},
		{in: "1;2", err: `token 0: "1;2" is not a non-negative integer`},
		{in: "+1", err: `token 0: "+1" is not a non-negative integer`},
		{in: "0x10", err: `token 0: "0x10" is not a non-negative integer`},
		{in: "18446744073709551616", err: `token 0: "18446744073709551616" is not a non-negative integer`},
		{in: `{"ids":[1]}`, err: `token 0: "{\"ids\":[1]}" is not a non-negative integer`},
		{in: strings.Repeat("[", 20000), err: "not a JSON array of integers: invalid character '[' exceeded max depth"},
	} {
		got, err := client.ParseTokenIDs([]byte(tc.in))
		switch {
		case tc.err == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("ParseTokenIDs(%.40q) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || err.Error() != tc.err || got != nil):
			t.Errorf("ParseTokenIDs(%.40q) = %v, %v; want the error %q", tc.in, got, err, tc.err)
		}
	}
}

// The list form alone: a JSON array is not a list.
func TestParseTokenList(t *testing.T) {
	if got, err := client.ParseTokenList(" 1,2 3 "); err != nil || !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("ParseTokenList = %v, %v", got, err)
	}
	if _, err := client.ParseTokenList("[1,2]"); err == nil || err.Error() != `token 0: "[1" is not a non-negative integer` {
		t.Errorf("ParseTokenList of a JSON array: %v", err)
	}
}

// FuzzParseTokenIDs: any input gives ids or an error, never a panic or
// both; ids read back from their JSON array and from their list.
func FuzzParseTokenIDs(f *testing.F) {
	for _, s := range []string{"[1,2,3]", "1 2 3", "[]", "[1,x]", "[-0]", "[1e3]", ",,", "[9007199254740993]", "[1][2]", "[\"1\"]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ids, err := client.ParseTokenIDs(data)
		if (err == nil) == (len(ids) == 0) {
			t.Fatalf("ParseTokenIDs(%q) = %v, %v", data, ids, err)
		}
		if err != nil {
			return
		}
		asJSON, _ := json.Marshal(ids)
		list := make([]string, len(ids))
		for i, id := range ids {
			list[i] = strconv.FormatUint(id, 10)
		}
		for _, in := range []string{string(asJSON), strings.Join(list, ",")} {
			if again, err := client.ParseTokenIDs([]byte(in)); err != nil || !slices.Equal(again, ids) {
				t.Errorf("ParseTokenIDs(%q) = %v, %v; want %v", in, again, err, ids)
			}
		}
	})
}

// FuzzParseTokenList: any input gives ids or an error, never a panic; the
// ids are exactly the input's fields.
func FuzzParseTokenList(f *testing.F) {
	for _, s := range []string{"1,2,3", "1 2\t3", "", ",", "1,-2", "18446744073709551616", "1,\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := client.ParseTokenList(s)
		if err != nil {
			if ids != nil {
				t.Errorf("ParseTokenList(%q) = %v with the error %v", s, ids, err)
			}
			return
		}
		fields := strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(", \t\r\n", r) })
		if len(fields) != len(ids) {
			t.Errorf("ParseTokenList(%q) = %v: %d fields", s, ids, len(fields))
		}
	})
}
