package golden

import (
	"fmt"
	"strings"
)

// Diff returns a line diff of want and got ("-" lines only in want, "+"
// lines only in got, with up to two lines of context), or "" when equal.
func Diff(want, got string) string {
	if want == got {
		return ""
	}
	a := splitLines(want)
	b := splitLines(got)
	// Longest common subsequence table, from the ends.
	n, m := len(a), len(b)
	lcs := make([][]int32, n+1)
	for i := range lcs {
		lcs[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		text string
	}
	var lines []line
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			lines = append(lines, line{' ', a[i]})
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			lines = append(lines, line{'-', a[i]})
			i++
		default:
			lines = append(lines, line{'+', b[j]})
			j++
		}
	}
	var out strings.Builder
	for k, l := range lines {
		near := false
		for d := -2; d <= 2; d++ {
			if k+d >= 0 && k+d < len(lines) && lines[k+d].op != ' ' {
				near = true
			}
		}
		if !near {
			continue
		}
		text := strings.TrimSuffix(l.text, "\n")
		if l.text != "" && !strings.HasSuffix(l.text, "\n") {
			text += " (no newline at end)"
		}
		fmt.Fprintf(&out, "%c %s\n", l.op, text)
	}
	return out.String()
}

// splitLines splits after each newline, without the empty tail.
func splitLines(s string) []string {
	l := strings.SplitAfter(s, "\n")
	if len(l) > 0 && l[len(l)-1] == "" {
		l = l[:len(l)-1]
	}
	return l
}
