// Package buildinfo reports what a kvindex binary was built from: module
// version, VCS commit and Go version, read from the build information the
// Go toolchain embeds (no linker flags needed).
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// Info describes one build.
type Info struct {
	// Version is the main module's version: a release tag when built with
	// `go install module@version`, "(devel)" when built from a checkout.
	Version string
	// Commit is the VCS revision of a checkout build ("" when unknown),
	// Dirty whether the tree had uncommitted changes.
	Commit string
	Dirty  bool
	// Time is the commit time in RFC 3339 ("" when unknown).
	Time string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns the running binary's build information. Test binaries and
// builds without embedded information report Version "(unknown)".
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "(unknown)"}
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(unknown)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.modified":
			in.Dirty = s.Value == "true"
		case "vcs.time":
			in.Time = s.Value
		}
	}
	return in
}

// ShortCommit is the commit's first 12 hex digits, "+dirty" appended for
// a modified tree, or "unknown".
func (in Info) ShortCommit() string {
	c := in.Commit
	if c == "" {
		return "unknown"
	}
	if len(c) > 12 {
		c = c[:12]
	}
	if in.Dirty {
		c += "+dirty"
	}
	return c
}

// String is the one-line form `kvindex version` prints.
func (in Info) String() string {
	s := fmt.Sprintf("kvindex %s (commit %s", in.Version, in.ShortCommit())
	if in.Time != "" {
		s += ", " + in.Time
	}
	return s + ", " + in.GoVersion + ")"
}
