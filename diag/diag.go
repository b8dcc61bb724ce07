// Package diag holds compiler diagnostics and renders them in the
// `file:line:col: error: message` form, followed by the source line and a
// caret under the column.
package diag

import (
	"fmt"
	"sort"
	"strings"
)

// Diagnostic is one error at a position. Line and Col are 1-based; a
// Diagnostic with Line 0 names only its file.
type Diagnostic struct {
	File      string
	Line, Col int
	Msg       string
}

// String is the diagnostic's line, with control characters of the file
// name and message (an escape sequence in a name) shown as '?'.
func (d Diagnostic) String() string {
	if d.Line <= 0 {
		if d.File == "" {
			return "error: " + Printable(d.Msg)
		}
		return fmt.Sprintf("%s: error: %s", Printable(d.File), Printable(d.Msg))
	}
	return fmt.Sprintf("%s:%d:%d: error: %s", Printable(d.File), d.Line, d.Col, Printable(d.Msg))
}

// Printable replaces each control character of s but tab and newline
// (escape sequences that would reach the terminal) with '?', byte for
// byte, so that columns stay where they were.
func Printable(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' && c != '\n' || c == 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 && c != '\t' && c != '\n' || c == 0x7f {
			b[i] = '?'
		}
	}
	return string(b)
}

// List is an error made of one or more diagnostics.
type List []Diagnostic

func (l List) Error() string {
	parts := make([]string, len(l))
	for i, d := range l {
		parts[i] = d.String()
	}
	return strings.Join(parts, "\n")
}

// Sort orders diagnostics by file and position and removes exact repeats.
func (l List) Sort() List {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	out := l[:0]
	for i, d := range l {
		if i > 0 && d == l[i-1] {
			continue
		}
		out = append(out, d)
	}
	return out
}

// maxShown is the longest source line Render shows whole; a longer one is
// cut to a window around the column (a line of hex constants can run to
// megabytes).
const maxShown = 200

// window cuts line to at most maxShown bytes around column col (1-based)
// and returns it with the column in the cut line.
func window(line string, col int) (string, int) {
	if len(line) <= maxShown {
		return line, col
	}
	lo := max(0, min(col-1-maxShown/2, len(line)-maxShown))
	hi := min(len(line), lo+maxShown)
	cut := line[lo:hi]
	if lo > 0 {
		cut = "..." + cut
		col += 3 - lo
	}
	if hi < len(line) {
		cut += "..."
	}
	return cut, col
}

// Render writes each diagnostic followed, when the source text of its file
// is known, by the offending line (a window of it, when it is long) and a
// caret under the column.
func Render(l List, sources map[string]string) string {
	var b strings.Builder
	for _, d := range l {
		b.WriteString(d.String())
		b.WriteByte('\n')
		if d.Line <= 0 {
			continue
		}
		src, ok := sources[d.File]
		if !ok {
			continue
		}
		lines := strings.Split(src, "\n")
		if d.Line > len(lines) {
			continue
		}
		line := strings.TrimRight(lines[d.Line-1], "\r")
		col := d.Col
		if col < 1 {
			col = 1
		}
		line, col = window(line, col)
		line = Printable(line)
		b.WriteString(line)
		b.WriteByte('\n')
		// Keep tabs so the caret lines up under tab-indented source.
		var pad strings.Builder
		for i := 0; i < col-1 && i < len(line); i++ {
			if line[i] == '\t' {
				pad.WriteByte('\t')
			} else {
				pad.WriteByte(' ')
			}
		}
		for i := len(line); i < col-1; i++ {
			pad.WriteByte(' ')
		}
		b.WriteString(pad.String())
		b.WriteString("^\n")
	}
	return b.String()
}
