package main

import (
	"bytes"
	"strings"
	"testing"
)

// kvindex picker has serve's conveniences: --config, KVINDEX_*
// variables, --check, --log-level/--log-format, exit status 2 on a usage
// error, and messages naming its own flags (--index, not --server).
func TestPickerCommandLine(t *testing.T) {
	const (
		qwenTokenizer = "../../tokenizer/testdata/qwen2.5/tokenizer.json.gz"
		qwenTemplate  = "../../tokenizer/chattemplate/testdata/templates/qwen2.5.json"
	)
	cfg := writeFile(t, "picker.yaml", "index: 127.0.0.1:1\nendpoint:\n  - pod-a=10.0.0.1:8000\nunknown-model: reject\n")
	for _, tt := range []struct {
		name     string
		args     []string
		env      map[string]string
		code     int
		out, err string // substrings of stdout and stderr
	}{
		{name: "check, from the config file", args: []string{"picker", "--config", cfg, "--check"}, code: exitOK,
			out: "settings ok: index 127.0.0.1:1, ext_proc :9002, HTTP :9003, index timeout 2ms + 250µs per 1k tokens, max body 8388608, unknown model reject"},
		{name: "check, from the environment", args: []string{"picker", "--check"}, code: exitOK,
			env: map[string]string{"KVINDEX_INDEX": "10.1.1.1:50051", "KVINDEX_ENDPOINT": "pod-a=10.0.0.1:8000 pod-b=10.0.0.2:8000"},
			out: "index 10.1.1.1:50051"},
		{name: "the command line wins", args: []string{"picker", "--config", cfg, "--unknown-model", "route", "--check"}, code: exitOK, out: "unknown model route"},
		{name: "no endpoint", args: []string{"picker", "--check"}, code: exitUsage, err: "give at least one --endpoint POD=HOST:PORT"},
		{name: "bad endpoint", args: []string{"picker", "--endpoint", "a", "--check"}, code: exitUsage, err: "--endpoint: endpoint \"a\": want POD=HOST:PORT"},
		{name: "bad unknown-model", args: []string{"picker", "--endpoint", "a=10.0.0.1:8000", "--unknown-model", "drop"}, code: exitUsage, err: `--unknown-model "drop": want route or reject`},
		{name: "bad log level", args: []string{"picker", "--endpoint", "a=10.0.0.1:8000", "--log-level", "loud"}, code: exitUsage, err: `--log-level "loud"`},
		{name: "bad log format", args: []string{"picker", "--endpoint", "a=10.0.0.1:8000", "--log-format", "xml"}, code: exitUsage, err: `--log-format "xml"`},
		{name: "bad index", args: []string{"picker", "--endpoint", "a=10.0.0.1:8000", "--index", "ftp://x"}, code: exitUsage, err: `--index "ftp://x"`},
		{name: "token without TLS", args: []string{"picker", "--endpoint", "a=10.0.0.1:8000", "--token-file", cfg}, code: exitUsage, err: "--index https://HOST:PORT"},
		{name: "bad config key", args: []string{"picker", "--config", writeFile(t, "bad.yaml", "server: x\n")}, code: exitUsage, err: `unknown key "server"`},
		{name: "bad environment", args: []string{"picker", "--check"}, env: map[string]string{"KVINDEX_INDEX_TIMEOUT": "soon"}, code: exitUsage, err: "KVINDEX_INDEX_TIMEOUT"},
		{name: "no tokenizer", args: []string{"picker", "--config", cfg, "--check"}, code: exitOK, out: "tokenizer: the index (text and chat prompts are sent as they are)"},
		{name: "tokenizer", args: []string{"picker", "--config", cfg, "--check", "--tokenizer", qwenTokenizer, "--chat-template", qwenTemplate, "--tokenizer-model", "Qwen/Qwen2.5-7B-Instruct"}, code: exitOK,
			out: "tokenizer: local " + qwenTokenizer + " with chat template " + qwenTemplate + ", for model Qwen/Qwen2.5-7B-Instruct (other models: the index), checked at start against an endpoint's /tokenize"},
		{name: "tokenizer without template", args: []string{"picker", "--config", cfg, "--check", "--tokenizer", qwenTokenizer}, code: exitOK, out: "(chat prompts: the index)"},
		{name: "bad tokenizer", args: []string{"picker", "--config", cfg, "--check", "--tokenizer", cfg}, code: exitUsage, err: "--tokenizer " + cfg},
		{name: "template without tokenizer", args: []string{"picker", "--config", cfg, "--check", "--chat-template", qwenTemplate}, code: exitUsage, err: "--chat-template needs --tokenizer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stdout.String(), tt.out) || !strings.Contains(stderr.String(), tt.err) {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if strings.Contains(stderr.String(), "--server") {
				t.Errorf("the picker's message names --server: %s", stderr.String())
			}
		})
	}
}

// The picker's help names its own flags, among them serve's conveniences.
func TestPickerHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"picker", "--help"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	help := stdout.String()
	for _, flag := range []string{"--index", "--config", "--check", "--log-level", "--log-format", "--unknown-model", "x-kvindex-fallback", "/readyz", "--tokenizer", "--chat-template", "--tokenizer-model"} {
		if !strings.Contains(help, flag) {
			t.Errorf("help lacks %s", flag)
		}
	}
	if strings.Contains(help, "--server") {
		t.Error("help names --server, which the picker does not take")
	}
}
