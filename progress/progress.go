// Package progress shows what a long command is doing on one line of a
// terminal: each Step replaces the line, Done clears it. It writes only
// to a terminal (or when KILN_PROGRESS=1 forces it), so logs, pipes and
// golden files never see it, and at most ten updates a second.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Reporter writes progress lines to one writer; the zero of *Reporter
// (nil) reports nothing.
type Reporter struct {
	mu    sync.Mutex
	w     io.Writer
	last  time.Time
	shown bool
}

// For returns a Reporter on w when w is a terminal or KILN_PROGRESS=1 is
// set, else nil.
func For(w io.Writer) *Reporter {
	if os.Getenv("KILN_PROGRESS") == "1" {
		return &Reporter{w: w}
	}
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return &Reporter{w: w}
}

// Step replaces the progress line with the formatted message (skipped
// when the last update was under 100 ms ago, unless it is the first).
func (r *Reporter) Step(format string, args ...any) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.shown && now.Sub(r.last) < 100*time.Millisecond {
		return
	}
	r.last, r.shown = now, true
	fmt.Fprintf(r.w, "\r\033[K%s", fmt.Sprintf(format, args...))
}

// Done clears the progress line.
func (r *Reporter) Done() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shown {
		fmt.Fprint(r.w, "\r\033[K")
		r.shown = false
	}
}
