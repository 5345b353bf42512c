package security

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/kvindex/kvindex/internal/configerr"
)

// Settings errors name Config's fields; a front end renames them.
func TestConfigErrorsNameFields(t *testing.T) {
	flags := map[configerr.Field]string{FieldCertFile: "--cert", FieldKeyFile: "--key", FieldClientCAFile: "--ca", FieldAuthFile: "--auth"}
	missing := filepath.Join(t.TempDir(), "none")
	_, certErr := LoadCerts(Config{CertFile: missing, KeyFile: missing})
	_, authErr := LoadPolicy(missing)
	tests := []struct {
		name      string
		err       error
		field     configerr.Field
		own, flag string
	}{
		{"cert without key", Config{CertFile: "c"}.Check(), FieldCertFile,
			"CertFile and KeyFile go together: give both or neither", "--cert and --key go together: give both or neither"},
		{"client CA without cert", Config{ClientCAFile: "ca"}.Check(), FieldClientCAFile,
			"ClientCAFile needs CertFile and KeyFile: client certificates are asked for in a TLS handshake",
			"--ca needs --cert and --key: client certificates are asked for in a TLS handshake"},
		{"missing certificate", certErr, FieldCertFile,
			"CertFile " + missing + " / KeyFile " + missing + ": open " + missing + ": no such file or directory",
			"--cert " + missing + " / --key " + missing + ": open " + missing + ": no such file or directory"},
		{"missing auth file", authErr, FieldAuthFile,
			"AuthFile: open " + missing + ": no such file or directory", "--auth: open " + missing + ": no such file or directory"},
	}
	for _, tc := range tests {
		ce, ok := configerr.As(tc.err)
		if !ok {
			t.Errorf("%s: %v is not a configuration error", tc.name, tc.err)
			continue
		}
		if ce.Field != tc.field || ce.Error() != tc.own || ce.Render(func(f configerr.Field) string { return flags[f] }) != tc.flag {
			t.Errorf("%s: field %s, %q; want %s, %q (rendered %q)", tc.name, ce.Field, ce, tc.field, tc.own, tc.flag)
		}
	}
	if !errors.Is(authErr, fs.ErrNotExist) {
		t.Errorf("%v does not wrap the file's error", authErr)
	}
	if err := (Config{}).Check(); err != nil {
		t.Errorf("the zero Config: %v", err)
	}
}
