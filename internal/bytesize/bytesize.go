package bytesize

import "fmt"

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
