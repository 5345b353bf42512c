package nats

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"

	"sigs.k8s.io/yaml"
)

// Values is values.yaml, the file Helm is given.
//
//go:embed values.yaml
var Values []byte

// unquoted is what the chart's nats.formatConfig unquotes in the JSON it
// writes: a string "<< X >>" becomes X, a configuration variable or a
// number with a unit.
var unquoted = regexp.MustCompile(`"<<\s+(.*)\s+>>"`)

// ServerConfig is the NATS server configuration the chart writes for
// values' config.merge, with extra's keys set over it (where a test puts
// what the chart itself would: listen address, JetStream's directory):
// indented JSON in which "<< X >>" strings are unquoted, as the chart
// does, so that a variable such as $RELAY_PASSWORD is read from the
// server's environment. Tests run a real server on it, so what they
// prove of the permissions holds for the file Helm is given.
func ServerConfig(values []byte, extra map[string]any) ([]byte, error) {
	var v struct {
		Config struct {
			Merge map[string]any `json:"merge"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal(values, &v); err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	conf := maps.Clone(v.Config.Merge)
	if conf == nil {
		conf = map[string]any{}
	}
	maps.Copy(conf, extra)
	// Raw, as the chart's toPrettyRawJson: '>' (subject wildcards, "<<")
	// stays as it is.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(conf); err != nil {
		return nil, err
	}
	return unquoted.ReplaceAll(b.Bytes(), []byte("${1}")), nil
}

// User is one of the server's authorization users in values.yaml
// (config.merge.authorization.users).
type User struct {
	Name string `json:"user"`
	// Password is "<< $VAR >>": the server's environment variable VAR.
	Password    string      `json:"password"`
	Permissions Permissions `json:"permissions"`
}

// Permissions are the subjects a user may publish to (requests to the
// JetStream API included) and subscribe to; anything else is refused.
type Permissions struct {
	Publish   Subjects `json:"publish"`
	Subscribe Subjects `json:"subscribe"`
}

// Subjects allow and deny subjects, wildcards included.
type Subjects struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// passwordVar is the one spelling of a password values.yaml accepts.
var passwordVar = regexp.MustCompile(`^<< \$([A-Z][A-Z0-9_]*) >>$`)

// PasswordEnv is the server's environment variable that holds u's
// password; "" when the password is written out.
func (u User) PasswordEnv() string {
	m := passwordVar.FindStringSubmatch(u.Password)
	if m == nil {
		return ""
	}
	return m[1]
}

// Users reads the authorization users of values.
func Users(values []byte) ([]User, error) {
	var v struct {
		Config struct {
			Merge struct {
				Authorization struct {
					Users []User `json:"users"`
				} `json:"authorization"`
			} `json:"merge"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal(values, &v); err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	return v.Config.Merge.Authorization.Users, nil
}
