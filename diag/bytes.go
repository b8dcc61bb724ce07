package diag

import "fmt"

// Bytes writes a byte count for people: "512 B", "1.50 KiB", "3.67 GiB"
// (binary units, two decimals).
func Bytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	u := 0
	for (f >= 1024 || f <= -1024) && u < len(units)-1 {
		f /= 1024
		u++
	}
	if u == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.2f %s", f, units[u])
}
