package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	tests := []struct {
		name       string
		bi         debug.BuildInfo
		wantString string
	}{
		{
			name: "checkout build",
			bi: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "4a43f2f0123456789abcdef0123456789abcdef0"},
				{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
				{Key: "vcs.modified", Value: "true"},
			}},
			wantString: "kvindex (devel) (commit 4a43f2f01234+dirty, 2026-12-01T10:00:00Z, go1.26.0)",
		},
		{
			name:       "module install",
			bi:         debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}},
			wantString: "kvindex v1.2.3 (commit unknown, go1.26.0)",
		},
		{
			name:       "no main module version",
			bi:         debug.BuildInfo{GoVersion: "go1.26.0"},
			wantString: "kvindex (unknown) (commit unknown, go1.26.0)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fromBuildInfo(&tt.bi).String(); got != tt.wantString {
				t.Errorf("String() = %q, want %q", got, tt.wantString)
			}
		})
	}
}

func TestReadNamesTheToolchain(t *testing.T) {
	in := Read()
	if !strings.HasPrefix(in.GoVersion, "go1.") {
		t.Fatalf("GoVersion = %q, want the toolchain's version", in.GoVersion)
	}
}
