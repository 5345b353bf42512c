package main

import (
	"strings"

	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/internal/configerr"
)

// serverFlagNames are serve's flags for the settings that the server's
// packages (api/server, api/server/security) name in their configuration
// errors: the libraries name their own fields, the command its flags.
var serverFlagNames = map[configerr.Field]string{
	server.FieldMaxTokens:         "--max-query-tokens",
	server.FieldMaxTokensInFlight: "--max-tokens-in-flight",
	security.FieldCertFile:        "--tls-cert",
	security.FieldKeyFile:         "--tls-key",
	security.FieldClientCAFile:    "--tls-client-ca",
	security.FieldAuthFile:        "--auth-tokens",
}

// configUsage returns a configuration error in err (*configerr.Error) as
// a usage error whose message names its settings by names (a setting not
// in names keeps its own name); any other err is returned as it is.
func configUsage(err error, names map[configerr.Field]string) error {
	if ce, ok := configerr.As(err); ok {
		return usageError{msg: ce.Render(func(f configerr.Field) string { return names[f] })}
	}
	return err
}

// configFlags is configUsage for an error found once the settings were
// accepted (a file they name cannot be loaded): it stays a runtime error,
// and only the configuration error's part of its message changes, so that
// what wraps it ("server: ...") still reads as it did.
func configFlags(err error, names map[configerr.Field]string) error {
	ce, ok := configerr.As(err)
	if !ok {
		return err
	}
	msg := strings.Replace(err.Error(), ce.Error(), ce.Render(func(f configerr.Field) string { return names[f] }), 1)
	return &renamedError{msg: msg, err: err}
}

// renamedError is err with its message rewritten; errors.Is and errors.As
// still see err.
type renamedError struct {
	msg string
	err error
}

func (e *renamedError) Error() string { return e.msg }
func (e *renamedError) Unwrap() error { return e.err }
