package chattemplate

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/goldenfile"
)

// jinjaTokens are the special tokens of the models whose template is kept
// as a plain .jinja file, from their tokenizer_config.json; gen_golden.mjs
// passes the same.
var jinjaTokens = map[string]map[string]string{
	"phi-3.5-mini.jinja": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>", "pad_token": "<|endoftext|>"},
	"mistral-nemo.jinja": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
}

type goldenCase struct {
	Template            string          `json:"template"`
	Name                string          `json:"name"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Output              *string         `json:"output"`
	Error               *string         `json:"error"`
}

func readGolden(t testing.TB) []goldenCase {
	t.Helper()
	raw, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("golden.json has no cases")
	}
	return g.Cases
}

func loadTestTemplate(t testing.TB, name string) *Template {
	t.Helper()
	tmpl, err := Load(filepath.Join("testdata", "templates", name), jinjaTokens[name])
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func TestGoldenGenerator(t *testing.T) {
	if _, err := goldenfile.Generator("testdata/golden.json"); err != nil {
		t.Fatal(err)
	}
}

// TestGolden renders every case of golden.json and compares it byte for
// byte with @huggingface/jinja's rendering; a case the reference refused
// must fail here too, as an ErrRender.
func TestGolden(t *testing.T) {
	templates := map[string]*Template{}
	families := map[string]bool{}
	for _, c := range readGolden(t) {
		tmpl := templates[c.Template]
		if tmpl == nil {
			tmpl = loadTestTemplate(t, c.Template)
			templates[c.Template] = tmpl
		}
		t.Run(c.Template+"/"+c.Name, func(t *testing.T) {
			got, err := tmpl.Render(Request{Messages: c.Messages, Tools: c.Tools, AddGenerationPrompt: c.AddGenerationPrompt})
			if c.Error != nil {
				if !errors.Is(err, ErrRender) {
					t.Fatalf("reference failed with %q; got err %v, output %q", *c.Error, err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != *c.Output {
				t.Fatalf("differs from the reference at byte %d:\n got: %q\nwant: %q", firstDiff(got, *c.Output), got, *c.Output)
			}
			families[strings.TrimSuffix(strings.TrimSuffix(c.Template, ".json"), ".jinja")] = true
		})
	}
	if len(families) < 5 {
		t.Errorf("golden cases pass for %d template families, want at least 5", len(families))
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
