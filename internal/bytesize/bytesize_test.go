package bytesize

import (
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "unlimited", 512: "512B", 512 << 20: "512MiB", 1536 << 20: "1.5GiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  string
	}{
		{"0", 0, ""},
		{"1048576", 1 << 20, ""},
		{"512MiB", 512 << 20, ""},
		{"2GiB", 2 << 30, ""},
		{"2Gi", 2 << 30, ""},
		{"1.5GB", 1_500_000_000, ""},
		{"1.5 gb", 1_500_000_000, ""},
		{"100kB", 100_000, ""},
		{"64K", 64_000, ""},
		{"3TiB", 3 << 40, ""},
		{"10B", 10, ""},
		{"0.5KiB", 512, ""},
		{"", 0, "want a size"},
		{"MiB", 0, "want a size"},
		{"12XB", 0, `unknown unit "XB"`},
		{"-1GiB", 0, "not a non-negative number"},
		{"1.2.3MB", 0, "not a non-negative number"},
		{"9999999EiB", 0, "unknown unit"},
		{"99999999999TiB", 0, "too large"},
	}
	for _, tc := range tests {
		got, err := Parse(tc.in)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %d, %v; want error %q", tc.in, got, err, tc.err)
			}
		case err != nil || got != tc.want:
			t.Errorf("Parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestSizeValue(t *testing.T) {
	for _, tc := range []struct{ in, out string }{{"0", "0"}, {"512MiB", "512MiB"}, {"1.5GiB", "1536MiB"}, {"1GB", "1000000000"}, {"4096", "4KiB"}} {
		var v Value
		if err := v.Set(tc.in); err != nil {
			t.Fatalf("Set(%q): %v", tc.in, err)
		}
		if got := v.String(); got != tc.out {
			t.Errorf("Set(%q).String() = %q, want %q", tc.in, got, tc.out)
		}
		var back Value
		if err := back.Set(v.String()); err != nil || back != v {
			t.Errorf("%q does not read back: %d vs %d (%v)", v.String(), back, v, err)
		}
	}
}
