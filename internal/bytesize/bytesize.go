package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Format prints n bytes in the largest binary unit it reaches, to four
// significant digits; 0 is "unlimited".
func Format(n int64) string {
	if n == 0 {
		return "unlimited"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.4g%s", v, units[i])
}

// Parse parses a size: plain bytes, or a number (fractions
// allowed) with a decimal (kB, MB, GB, TB; k, M, G, T) or binary (KiB, MiB,
// GiB, TiB; Ki, Mi, Gi, Ti) unit. A trailing "B" alone means bytes.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.TrimSpace(t[i:])
	if num == "" {
		return 0, fmt.Errorf("%q: want a size such as 512MiB, 2GiB, 1.5GB or a byte count", s)
	}
	mult := float64(1)
	switch strings.ToLower(unit) {
	case "", "b":
	case "k", "kb":
		mult = 1e3
	case "m", "mb":
		mult = 1e6
	case "g", "gb":
		mult = 1e9
	case "t", "tb":
		mult = 1e12
	case "ki", "kib":
		mult = 1 << 10
	case "mi", "mib":
		mult = 1 << 20
	case "gi", "gib":
		mult = 1 << 30
	case "ti", "tib":
		mult = 1 << 40
	default:
		return 0, fmt.Errorf("%q: unknown unit %q (want B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)", s, unit)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q: %q is not a non-negative number", s, num)
	}
	bytes := v * mult
	if bytes >= math.MaxInt64 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return int64(bytes), nil
}

// Value is a flag (flag.Value, pflag.Value) holding a byte count,
// written as Parse reads it.
type Value int64

func (v *Value) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*v = Value(n)
	return nil
}

func (v *Value) Type() string { return "size" }

// String prints the size exactly, in the largest binary unit that divides
// it, so the value reads back unchanged.
func (v *Value) String() string {
	n := int64(*v)
	for _, u := range []struct {
		name  string
		bytes int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.bytes == 0 {
			return fmt.Sprintf("%d%s", n/u.bytes, u.name)
		}
	}
	return fmt.Sprintf("%d", n)
}
