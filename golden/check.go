package golden

import (
	"fmt"
	"strings"
)

// Check matches text against FileCheck-style directives, one per line:
//
//	CHECK: s       a later line contains s
//	CHECK-NEXT: s  the line right after the last match contains s
//	CHECK-SAME: s  the last matched line contains s after the last match
//	CHECK-NOT: s   no line after the last matched line and before the
//	               next match (or the end) contains s
//	CHECK-EMPTY:   the line right after the last match is empty
//
// Other lines are comments. It returns "" when every directive holds, or
// what failed and where.
func Check(directives, text string) string {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	type not struct {
		s    string
		line int // directive line
	}
	cur, col := -1, 0 // last matched line and the column after the match
	var nots []not
	failNot := func(upto int) string {
		for _, n := range nots {
			for i := cur + 1; i < upto && i < len(lines); i++ {
				if strings.Contains(lines[i], n.s) {
					return fmt.Sprintf("check line %d: CHECK-NOT: %q found on output line %d: %s", n.line, n.s, i+1, lines[i])
				}
			}
		}
		nots = nil
		return ""
	}
	for k, d := range strings.Split(directives, "\n") {
		d = strings.TrimSpace(d)
		kind, s, ok := strings.Cut(d, ":")
		if !ok || !strings.HasPrefix(kind, "CHECK") {
			continue
		}
		s = strings.TrimSpace(s)
		switch kind {
		case "CHECK", "CHECK-LABEL":
			found := -1
			for i := cur + 1; i < len(lines); i++ {
				if strings.Contains(lines[i], s) {
					found = i
					break
				}
			}
			if found < 0 {
				return fmt.Sprintf("check line %d: %s: %q not found after output line %d", k+1, kind, s, cur+1)
			}
			if msg := failNot(found); msg != "" {
				return msg
			}
			cur, col = found, strings.Index(lines[found], s)+len(s)
		case "CHECK-NEXT", "CHECK-EMPTY":
			i := cur + 1
			switch {
			case i >= len(lines):
				return fmt.Sprintf("check line %d: %s: the output ends at line %d", k+1, kind, cur+1)
			case kind == "CHECK-EMPTY" && lines[i] != "":
				return fmt.Sprintf("check line %d: CHECK-EMPTY: output line %d is not empty: %s", k+1, i+1, lines[i])
			case kind == "CHECK-NEXT" && !strings.Contains(lines[i], s):
				return fmt.Sprintf("check line %d: CHECK-NEXT: %q not on output line %d: %s", k+1, s, i+1, lines[i])
			}
			if msg := failNot(i); msg != "" {
				return msg
			}
			cur, col = i, strings.Index(lines[i], s)+len(s)
		case "CHECK-SAME":
			if cur < 0 || !strings.Contains(lines[cur][col:], s) {
				return fmt.Sprintf("check line %d: CHECK-SAME: %q not on the rest of output line %d", k+1, s, cur+1)
			}
			col += strings.Index(lines[cur][col:], s) + len(s)
		case "CHECK-NOT":
			nots = append(nots, not{s, k + 1})
		default:
			return fmt.Sprintf("check line %d: unknown directive %s", k+1, kind)
		}
	}
	return failNot(len(lines))
}
