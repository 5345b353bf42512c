package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/tokenizer"
	"github.com/kvindex/kvindex/tokenizer/chattemplate"
)

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return out.String(), errb.String(), code
}

const range48 = "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47"

func TestHashGolden(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "toks.json")
	os.WriteFile(jsonFile, []byte("[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47]"), 0o644)
	wsFile := filepath.Join(dir, "toks.txt")
	os.WriteFile(wsFile, []byte(strings.ReplaceAll(range48, ",", "\n ")+"\n"), 0o644)

	sha0 := "0 12687895063098490012 d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c\n" +
		"1 1814341696565857452 fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac\n" +
		"2 2713165534665270607 ee4c34c217da17ac84268f864db16efed5fcefe10fcc4a9625a719adc68e654f\n"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"sha256_cbor seed 0", []string{"hash", "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "16", "--tokens", range48}, sha0},
		{"json file", []string{"hash", "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--tokens-file", jsonFile}, sha0},
		{"whitespace file", []string{"hash", "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--tokens-file", wsFile}, sha0},
		{"lora", []string{"hash", "--hash-algo", "sha256_cbor", "--hash-seed", "42", "--lora-name", "sql-lora", "--tokens", range48},
			"0 8214087371883436700 827cb8ed980f55f82e059bbb4d1050e6eadb5c6d0b84e6a671fe4cf1d3225a9c\n" +
				"1 14796880342763126230 06c4032dfa3460de4e4bc4261f33773dd9d2fd649b0d0d52cd591446465b3dd6\n" +
				"2 5087286281818352452 95dc6e4e3bde90b4c5a945d359f13389a7c186836ba5a56e4699abeb72802b44\n"},
		{"salt", []string{"hash", "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--cache-salt", "tenant-a", "--tokens", range48},
			"0 8020952614053081591 a31aa6d7bd52d1db44c2e2c50ce6687164f2a198c45e6f9c6f5025e7d8dff1f7\n" +
				"1 2326720499465815097 39f45a6b06306f789ee0b456170e79d009c2e4f00c40d6e0204a2bf77e478439\n" +
				"2 16210581411607175761 59f83564ae58034a0fd88246f2d7be1b3554df85624a8854e0f78de811656251\n"},
		// A trailing partial block is not hashed (fewer tokens than one
		// block are refused: TestHashShortInput).
		{"partial block ignored", []string{"hash", "--hash-algo", "sha256_cbor", "--hash-seed", "0", "--tokens", range48[:strings.Index(range48, ",19,")]}, sha0[:strings.Index(sha0, "\n")+1]},
		{"default algo is vLLM's sha256", []string{"hash", "--hash-seed", "0", "--tokens", range48},
			"0 7982712666671721126 "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !strings.HasPrefix(out, tc.want) || (tc.name == "partial block ignored" && out != tc.want) {
				t.Errorf("output\n%s\nwant (prefix)\n%s", out, tc.want)
			}
		})
	}
}

func TestHashJSON(t *testing.T) {
	out, errOut, code := runCLI(t, "hash", "--hash-algo", "xxhash_cbor", "--hash-seed", "0", "--tokens", range48, "--json")
	if code != 0 {
		t.Fatal(errOut)
	}
	var got struct {
		NoneHash string `json:"none_hash"`
		Blocks   []struct {
			Index    int    `json:"index"`
			Hash     string `json:"hash"`
			EventInt uint64 `json:"event_int"`
		} `json:"blocks"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.NoneHash != "1ebe36576dcb573f26b99533a20aaeca" || len(got.Blocks) != 3 {
		t.Fatalf("got %+v", got)
	}
	if b := got.Blocks[0]; b.Index != 0 || b.Hash != "209f5d549fc07c8e39d823615ede61ce" || b.EventInt != 4168120356241826254 {
		t.Errorf("block 0 = %+v", b)
	}
}

func TestHashBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	badJSON := filepath.Join(dir, "bad.json")
	os.WriteFile(badJSON, []byte(`[1, 2.5]`), 0o644)
	emptyArr := filepath.Join(dir, "arr.json")
	os.WriteFile(emptyArr, []byte(`[]`), 0o644)
	tests := []struct {
		name string
		args []string
		want string // substring of the one-line error
		code int    // 2: usage error, 1: the input's content is bad
	}{
		{"unknown algo", []string{"hash", "--hash-algo", "md5", "--tokens", "1"}, `unknown --hash-algo "md5"`, 2},
		{"block size 0", []string{"hash", "--block-size", "0", "--tokens", "1"}, "--block-size 0 out of range", 2},
		{"negative block size", []string{"hash", "--block-size", "-4", "--tokens", "1"}, "--block-size -4", 2},
		{"negative token", []string{"hash", "--tokens", "1,-2"}, `"-2" is negative`, 2},
		{"non-integer token", []string{"hash", "--tokens", "1,x"}, `"x" is not a non-negative integer`, 2},
		{"float token", []string{"hash", "--tokens-file", badJSON}, "element 1", 1},
		{"overflowing token", []string{"hash", "--tokens", "18446744073709551616"}, "not a non-negative integer", 2},
		{"empty file", []string{"hash", "--tokens-file", empty}, "is empty", 1},
		{"empty array", []string{"hash", "--tokens-file", emptyArr}, "empty token array", 1},
		{"missing file", []string{"hash", "--tokens-file", filepath.Join(dir, "nope")}, "no such file", 1},
		{"no tokens", []string{"hash"}, "no tokens", 2},
		{"both inputs", []string{"hash", "--tokens", "1", "--tokens-file", empty}, "mutually exclusive", 2},
		{"bad mm", []string{"hash", "--tokens", "1", "--mm", "img:x:3"}, "--mm", 2},
		{"sglang with lora", []string{"hash", "--hash-algo", "sglang", "--lora-name", "a", "--tokens", range48}, "SGLang", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stdout %q, stderr %q)", code, tc.code, out, errOut)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "kvindex: ") {
				t.Errorf("stderr %q: want exactly one line starting with \"kvindex: \"", errOut)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q does not name the problem (%q)", errOut, tc.want)
			}
		})
	}
}

// kvindex hash --tokenizer renders and tokenizes a prompt or a chat
// locally, as kvindex serve and kvindex picker do, and hashes the ids:
// the same lines as hashing those ids given by hand.
func TestHashPrompt(t *testing.T) {
	const (
		tok  = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
		tmpl = "../../tokenizer/chattemplate/testdata/templates/qwen2.5.json"
	)
	dir := t.TempDir()
	chat := filepath.Join(dir, "chat.json")
	os.WriteFile(chat, []byte(`[{"role":"system","content":"You route requests to the pod that holds their prefix."},`+
		`{"role":"user","content":"Which pod holds this conversation, and why does the turn after it go there too?"}]`), 0o644)
	l, err := tokenizer.LoadFile(tok)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := chattemplate.Load(tmpl, nil)
	if err != nil {
		t.Fatal(err)
	}
	text := "The picker asks kvindex which engine holds the longest prefix of each prompt, then routes there."
	chatIDs, err := (&tokenizer.ChatLocal{Local: l, Template: ct}).Tokenize(context.Background(), "", tokenizer.Input{Messages: []tokenizer.Message{
		{Role: "system", Content: "You route requests to the pod that holds their prefix."},
		{Role: "user", Content: "Which pod holds this conversation, and why does the turn after it go there too?"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		ids  []uint64
	}{
		{"text", []string{"--tokenizer", tok, "--prompt", text}, l.Encode(text, true)},
		{"chat", []string{"--tokenizer", tok, "--chat-template", tmpl, "--messages-file", chat}, chatIDs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errOut, code := runCLI(t, append([]string{"hash", "--block-size", "4"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			want, _, _ := runCLI(t, "hash", "--block-size", "4", "--tokens", strings.Trim(strings.ReplaceAll(fmt.Sprint(tc.ids), " ", ","), "[]"))
			if got != want || got == "" {
				t.Errorf("hash of the prompt:\n%s\nhash of its ids:\n%s", got, want)
			}
		})
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", text}, "need --tokenizer"},
		{[]string{"--tokenizer", tok, "--prompt", text, "--tokens", "1,2"}, "give one of"},
		{[]string{"--tokenizer", tok, "--messages-file", chat}, "chat"},
	} {
		_, errOut, code := runCLI(t, append([]string{"hash"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("hash %v: exit %d, %q; want an error saying %q", tc.args, code, errOut, tc.want)
		}
	}
}
