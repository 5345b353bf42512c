package configerr_test

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/kvindex/kvindex/internal/configerr"
)

func TestRender(t *testing.T) {
	flags := map[configerr.Field]string{"MaxTokensInFlight": "--max-tokens-in-flight", "MaxTokens": "--max-query-tokens"}
	name := func(f configerr.Field) string { return flags[f] }
	tests := []struct {
		err       *configerr.Error
		own, flag string
	}{
		{configerr.New("MaxTokensInFlight", "%v %d is below %v %d", configerr.Field("MaxTokensInFlight"), 999, configerr.Field("MaxTokens"), 1000),
			"MaxTokensInFlight 999 is below MaxTokens 1000", "--max-tokens-in-flight 999 is below --max-query-tokens 1000"},
		// A Field the front end does not map keeps its own name; {braces}
		// and quoted values are left as they are.
		{configerr.New("Topic", "%v %q has no {pod}", configerr.Field("Topic"), "kv@{model}"),
			`Topic "kv@{model}" has no {pod}`, `Topic "kv@{model}" has no {pod}`},
		// A configuration error among the arguments is rendered alike.
		{configerr.New("Other", "%v: %w", configerr.Field("Other"), configerr.New("MaxTokens", "%v is 0", configerr.Field("MaxTokens"))),
			"Other: MaxTokens is 0", "Other: --max-query-tokens is 0"},
		// Plain strings are never names.
		{configerr.New("MaxTokens", "%s: %v", "MaxTokens", 3), "MaxTokens: 3", "MaxTokens: 3"},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.own {
			t.Errorf("Error() = %q, want %q", got, tc.own)
		}
		if got := tc.err.Render(name); got != tc.flag {
			t.Errorf("Render = %q, want %q", got, tc.flag)
		}
	}
}

func TestWraps(t *testing.T) {
	err := error(configerr.New("File", "%v: %w", configerr.Field("File"), fs.ErrNotExist))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("errors.Is does not see the wrapped error")
	}
	if got := err.Error(); got != "File: file does not exist" {
		t.Errorf("Error() = %q", got)
	}
	// %v does not wrap.
	if errors.Is(configerr.New("File", "%v", fs.ErrNotExist), fs.ErrNotExist) {
		t.Error("an error formatted with a plain verb was wrapped")
	}
	wrapped := errors.Join(errors.New("other"), err)
	ce, ok := configerr.As(wrapped)
	if !ok || ce.Field != "File" {
		t.Errorf("As = %v, %v", ce, ok)
	}
	if _, ok := configerr.As(errors.New("plain")); ok {
		t.Error("As found a configuration error in a plain one")
	}
}

func TestUsage(t *testing.T) {
	if !configerr.New("A", "bad").Usage() {
		t.Error("New is not a usage error")
	}
	f := configerr.Failed("GRPCAddr", "%v %s: %w", configerr.Field("GRPCAddr"), ":1", fs.ErrPermission)
	if f.Usage() || !errors.Is(f, fs.ErrPermission) || f.Error() != "GRPCAddr :1: permission denied" {
		t.Errorf("Failed: usage %v, %q", f.Usage(), f)
	}
}

func TestWithin(t *testing.T) {
	inner := configerr.Failed("AuthFile", "%v %s: empty", configerr.Field("AuthFile"), "a.yaml")
	err := configerr.Within("server", inner)
	ce, ok := err.(*configerr.Error)
	if !ok || ce.Field != "AuthFile" || ce.Usage() || !errors.Is(err, inner) {
		t.Fatalf("Within: %#v", err)
	}
	if got := ce.Render(func(configerr.Field) string { return "--auth-tokens" }); got != "server: --auth-tokens a.yaml: empty" {
		t.Errorf("Render = %q", got)
	}
	plain := configerr.Within("server", fs.ErrNotExist)
	if _, ok := configerr.As(plain); ok || !errors.Is(plain, fs.ErrNotExist) || plain.Error() != "server: file does not exist" {
		t.Errorf("Within a plain error: %v", plain)
	}
}
