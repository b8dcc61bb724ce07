package diag

import (
	"fmt"
	"slices"
	"strings"
)

// DidYouMean returns ` (did you mean "x"?)` for the candidate closest to
// name by edit distance, when one is close enough to be a likely typo
// (at most a third of its length away), and "" otherwise.
func DidYouMean(name string, candidates []string) string {
	best, bestD := "", 0
	for _, c := range candidates {
		if c != name && strings.EqualFold(c, name) {
			return fmt.Sprintf(" (did you mean %q?)", c) // a slip of the shift key
		}
	}
	for _, c := range candidates {
		d := editDistance(name, c)
		if (best == "" || d < bestD) && d <= max(1, len(c)/3) {
			best, bestD = c, d
		}
	}
	if best == "" || best == name {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the edit distance between a and b with insertions,
// deletions, substitutions and swaps of adjacent characters (the commonest
// typo, "remta" for "remat") each costing 1.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			sub := d[i-1][j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			d[i][j] = min(sub, d[i-1][j]+1, d[i][j-1]+1)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// maxListed is how many names Among lists in full.
const maxListed = 10

// Among describes the names name could have been, for a message that it
// is none of them: ` (did you mean "x"?)` when one is a likely typo, else
// all of them when they are few, else the nearest few by edit distance
// and how many there are.
func Among(name string, candidates []string) string {
	if s := DidYouMean(name, candidates); s != "" {
		return s
	}
	if len(candidates) <= maxListed {
		return " (it has " + strings.Join(candidates, ", ") + ")"
	}
	near := slices.Clone(candidates)
	slices.SortStableFunc(near, func(a, b string) int { return editDistance(name, a) - editDistance(name, b) })
	return fmt.Sprintf(" (it has %d; the nearest: %s)", len(candidates), strings.Join(near[:5], ", "))
}
