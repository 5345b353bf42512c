package security

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func sha(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

func TestAuthFileErrors(t *testing.T) {
	h := sha("x")
	tests := []struct {
		name, file, want string
	}{
		{"empty", "", "empty"},
		{"nothing listed", "tokens: []\n", "no tokens and no identities"},
		{"unknown key", "tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: [query]\n    salt: [x]\n", "field salt not found"},
		{"no name", "tokens:\n  - sha256: " + h + "\n    scopes: [query]\n", "line 2: every entry needs a name"},
		{"short hash", "tokens:\n  - name: a\n    sha256: abc\n    scopes: [query]\n", "64 hex digits"},
		{"bad scope", "tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: [read]\n", `unknown scope "read"`},
		{"no scopes", "tokens:\n  - name: a\n    sha256: " + h + "\n", "no scopes"},
		{"empty salts", "tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: [query]\n    salts: []\n", "an empty list allows nothing"},
		{"same token twice", "tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: [query]\n  - name: b\n    sha256: " + h + "\n    scopes: [watch]\n", `the same token as "token a"`},
		{"same name twice", "tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: [query]\nidentities:\n  - name: a\n    cn: a\n    scopes: [query]\n", `the name "a" is used twice`},
		{"identity with two names", "identities:\n  - name: a\n    cn: a\n    dns: a\n    scopes: [query]\n", "exactly one of cn, dns or uri"},
		{"token with a cn", "tokens:\n  - name: a\n    sha256: " + h + "\n    cn: a\n    scopes: [query]\n", "list them under identities"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parsePolicy([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
