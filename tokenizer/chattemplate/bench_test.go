package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkRender30 renders a 30-message conversation (system prompt,
// then user and assistant turns of a few hundred characters, tools
// declared) through each golden template.
func BenchmarkRender30(b *testing.B) {
	msgs := []map[string]any{{"role": "system", "content": "You are a careful assistant."}}
	for i := 1; i < 30; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": fmt.Sprintf("Turn %d: %s", i, strings.Repeat("some words of the conversation ", 12))})
	}
	raw, err := json.Marshal(msgs)
	if err != nil {
		b.Fatal(err)
	}
	tools := []byte(`[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]`)
	for _, name := range []string{"qwen2.5.json", "qwen3.json", "deepseek-v3.json", "phi-3.5-mini.jinja", "mistral-nemo.jinja"} {
		tmpl := loadTestTemplate(b, name)
		r := Request{Messages: raw, Tools: tools, AddGenerationPrompt: true}
		if name == "phi-3.5-mini.jinja" || name == "deepseek-v3.json" {
			r.Tools = nil
		}
		b.Run(name, func(b *testing.B) {
			out, err := tmpl.Render(r)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tmpl.Render(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeJSON decodes an assistant message with three tool calls
// and a tool result, as a raw message of MessageList: with the one-pass
// decoder (decodeJSON) and with the reference built on Decoder.Token.
func BenchmarkDecodeJSON(b *testing.B) {
	var calls []map[string]any
	for i := range 3 {
		calls = append(calls, map[string]any{"id": fmt.Sprint("call_", i), "type": "function", "function": map[string]any{
			"name": "search", "arguments": fmt.Sprintf(`{"query": "weather in city %d", "limit": %d, "filters": {"units": "metric", "days": [1, 2, 3]}}`, i, i+5)}})
	}
	msg, err := json.Marshal(map[string]any{"role": "assistant", "content": strings.Repeat("Let me look that up for you. ", 20), "tool_calls": calls})
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range []struct {
		name   string
		decode func([]byte) error
	}{
		{"onepass", func(raw []byte) error { _, err := decodeJSON(raw); return err }},
		{"token", func(raw []byte) error { _, err := decodeJSONStd(raw, 0); return err }},
	} {
		b.Run(d.name, func(b *testing.B) {
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if err := d.decode(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
