package main

import (
	"errors"

	"github.com/kvindex/kvindex/internal/configerr"
)

// configUsage turns a configuration error from a package (a setting that
// cannot work, named in the package's terms) into the command's usage
// error, each setting named by its flag in names; any other error is
// returned as it is. The message is the configuration error's alone,
// without what may wrap it (a lifecycle part's name): the setting it
// names says where it arose.
func configUsage(err error, names map[configerr.Field]string) error {
	if ce, ok := configerr.As(err); ok {
		return usageError{msg: ce.Render(flagNamer(names))}
	}
	return err
}

// configFailure is configUsage for a command that has started and failed
// on a setting (a port another program holds): the same message, but the
// command's failure rather than a usage error.
func configFailure(err error, names map[configerr.Field]string) error {
	if ce, ok := configerr.As(err); ok {
		return errors.New(ce.Render(flagNamer(names)))
	}
	return err
}

// flagNamer names a setting by its flag, or by its own name if names has
// none.
func flagNamer(names map[configerr.Field]string) func(configerr.Field) string {
	return func(f configerr.Field) string { return names[f] }
}
