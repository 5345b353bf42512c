// Package chattemplate renders a model's HuggingFace chat template in Go,
// so that a chat request can be turned into its prompt text (and then
// tokenized locally) without asking the engine's /tokenize.
//
// A template is loaded from a tokenizer_config.json carrying chat_template
// (a string, or a list of {name, template} from which the entry named
// "default" is used, as transformers does when no name is given) and its
// special tokens, or from a plain .jinja file, whose special tokens the
// caller supplies. Render is given the request as transformers'
// apply_chat_template (the path vLLM takes) gives it: messages, tools
// (none when absent), add_generation_prompt, the special tokens
// (bos_token, eos_token, ...) and extra keyword arguments
// (chat_template_kwargs). Messages and tools stay raw JSON up to the
// template and are decoded with their key order kept, because templates
// print tool schemas and tool-call arguments key by key.
//
// # Engine
//
// The Jinja engine is github.com/ardanlabs/jinja (v1.8.0, the newest that
// builds with this module's Go toolchain), a pure-Go engine made for chat
// templates, with no dependencies. It was chosen over
// github.com/nikolalohinski/gonja/v2 (v2.9.1), the other maintained Go
// Jinja engine the module proxy offers:
//   - correctness on the real templates: on the golden cases both render
//     every case whose input has no JSON object printed through tojson;
//     but gonja's values are Go maps, so a tool schema or tool-call
//     arguments are printed in sorted or random key order, which no
//     template author intended and which changes the tokens. ardanlabs'
//     dicts keep insertion order, so with the ordered decoder here every
//     golden case matches byte for byte;
//   - it already has the chat-template extras transformers adds to Jinja:
//     raise_exception, strftime_now, loop controls ({% break %},
//     {% continue %}), the {% generation %} tag, Python string and dict
//     methods (.strip(), .split(), .items(), .get(), ...);
//   - it brings no dependency, where gonja brings logrus, json-iterator,
//     pkg/errors and x/exp.
//
// What the engine lacks is written here, and only that:
//   - tojson as transformers defines it (json.dumps with ensure_ascii=False,
//     indent, separators, sort_keys): the engine's escapes U+2028/U+2029
//     and, with indent, sorts keys and escapes HTML. The engine looks its
//     own filters up first, so the template's tojson is renamed in its
//     code (never in text or string literals) to this package's filter;
//   - decoding of the request's JSON into ordered values, integers kept
//     apart from floats (json.dumps prints 3 and 3.0 differently; floats
//     are printed as Python's repr);
//   - recovery, so that no input makes Render panic: engine failures and
//     the template's own raise_exception come back as ErrRender.
//
// # Golden tests
//
// testdata/golden.json holds prompts rendered by @huggingface/jinja, the
// engine behind transformers.js's apply_chat_template, for the templates
// in testdata/templates (Qwen2.5, Qwen3, DeepSeek-V3, Phi-3.5-mini,
// Mistral-Nemo; sources and licences in testdata/templates/NOTICE): system
// prompts, multi-turn, add_generation_prompt on and off, tools, a tool
// call with its result, reasoning in the history, content as a list of
// parts, and templates raising an exception. testdata/gen_golden.mjs
// writes it; its header says how to rerun it.
//
// Known differences from Python's Jinja, which vLLM uses: where
// @huggingface/jinja and Python disagree (a float such as 1.0 printed by
// tojson: "1" against "1.0"; a backslash-newline inside a string literal,
// which @huggingface/jinja refuses, as in Mistral-Small-3.1's template),
// this package follows Python; the golden cases avoid such input.
package chattemplate
