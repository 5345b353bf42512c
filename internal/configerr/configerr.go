// Package configerr is the one shape of a configuration error in kvindex:
// which setting is wrong and why, said in the terms of the package that
// checked it, so that each front end names the setting its own way.
//
// A library never names a command-line flag. It returns an *Error whose
// Field is the setting in its own configuration (a Go field name such as
// "MaxTokensInFlight"), and whose message may refer to further settings
// as Field values among its arguments. The kvindex command maps each Field
// to its flag when it prints the error (Render), so that the library's
// message and the command's agree word for word except for the names:
//
//	configerr.New("MaxTokensInFlight", "%v %d is below %v %d", configerr.Field("MaxTokensInFlight"), 999, configerr.Field("MaxTokens"), 1000)
//
// reads "MaxTokensInFlight 999 is below MaxTokens 1000" from Error and
// "--max-tokens-in-flight 999 is below --max-query-tokens 1000" from the
// command.
package configerr

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
)

// Field names a setting as the package that checks it spells it: a field
// of its configuration, "Engines" or "Limits.MaxWatchers".
type Field string

// Error is a setting that cannot work. It wraps the errors among its
// arguments (as fmt.Errorf's %w does), so errors.Is and errors.As see
// through it.
type Error struct {
	// Field is the setting at fault.
	Field Field
	// format and args make the message; Field arguments are names.
	format string
	args   []any
	// failed: the setting is well formed but failed when used.
	failed bool
}

// New returns the configuration error of field, whose message is format
// with args as fmt.Errorf formats them; an argument of type Field is
// written as the setting's name (Render chooses it). %w wraps an error.
func New(field Field, format string, args ...any) *Error {
	return &Error{Field: field, format: format, args: args}
}

// Failed returns the error of a setting that is well formed but failed
// when it was used: a port another process holds, a server that cannot
// be reached. A front end tells it from a bad setting (New): the command
// exits with its runtime status rather than its usage status.
func Failed(field Field, format string, args ...any) *Error {
	e := New(field, format, args...)
	e.failed = true
	return e
}

// Usage reports whether the setting itself is wrong (New), rather than
// failed when used (Failed).
func (e *Error) Usage() bool { return !e.failed }

// Error writes the message with each setting under its own name.
func (e *Error) Error() string { return e.Render(nil) }

// Render writes the message with each setting named by name (nil: by its
// Field). A name of "" keeps the Field. Configuration errors among the
// arguments are rendered the same way.
func (e *Error) Render(name func(Field) string) string {
	args := make([]any, len(e.args))
	for i, a := range e.args {
		switch v := a.(type) {
		case Field:
			s := string(v)
			if name != nil {
				s = cmp.Or(name(v), s)
			}
			a = s
		case *Error:
			a = v.Render(name)
		}
		args[i] = a
	}
	// %w formats as %v; wrapping is Unwrap's business.
	return fmt.Sprintf(strings.ReplaceAll(e.format, "%w", "%v"), args...)
}

// Unwrap returns the errors the message wraps (%w), as fmt.Errorf does.
func (e *Error) Unwrap() []error {
	switch w := fmt.Errorf(e.format, e.args...).(type) {
	case interface{ Unwrap() error }:
		return []error{w.Unwrap()}
	case interface{ Unwrap() []error }:
		return w.Unwrap()
	}
	return nil
}

// Within puts context before err's message ("server: ..."). A
// configuration error stays one, of the same setting and kind, so that a
// front end still names its settings; any other error is wrapped as
// fmt.Errorf's %w does.
func Within(context string, err error) error {
	if ce, ok := err.(*Error); ok {
		return &Error{Field: ce.Field, format: "%s: %w", args: []any{context, ce}, failed: ce.failed}
	}
	return fmt.Errorf("%s: %w", context, err)
}

// As finds the configuration error in err's chain, if any.
func As(err error) (*Error, bool) {
	var ce *Error
	ok := errors.As(err, &ce)
	return ce, ok
}
