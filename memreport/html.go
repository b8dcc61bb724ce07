package memreport

import (
	"fmt"
	"html"
	"io"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// Categories of live bytes in the HTML report, bottom of the stack first.
var categories = []struct{ name, color, meaning string }{
	{"parameters", "#4e79a7", "the model's weights (arguments marked param)"},
	{"optimizer state", "#9c755f", "momentum and Adam moments (arguments marked state)"},
	{"inputs", "#bab0ac", "the data batch (data arguments)"},
	{"activations", "#f28e2b", "forward values kept until the backward pass reads them"},
	{"gradients", "#e15759", "values of the backward pass, the parameters' gradients among them"},
	{"temporaries", "#76b7b2", "forward values that die before the backward pass starts"},
}

// categorize assigns each buffer of info to a category (an index into
// categories). Backward values are those that depend on the loss seed;
// a forward buffer alive when the first of them is computed is an
// activation. Without a seed (no autodiff) every intermediate is a
// temporary.
func categorize(info *liveness.Info) map[*liveness.Buffer]int {
	f := info.Func
	backward := map[*ir.Value]bool{}
	firstBackward := len(f.Body)
	isSeed := func(op *ir.Op) bool { return op.Attrs["role"].Str == "loss_seed" }
	for i, op := range f.Body {
		bw := isSeed(op)
		if op.Region != nil {
			for _, inner := range op.Region.Body { // a seed fused into a kernel
				bw = bw || isSeed(inner)
			}
		}
		for _, v := range op.Operands {
			bw = bw || backward[v]
		}
		if bw {
			for _, r := range op.Results {
				backward[r] = true
			}
			firstBackward = min(firstBackward, i)
		}
	}
	out := map[*liveness.Buffer]int{}
	for _, b := range info.Buffers {
		root := b.Root()
		switch {
		case b.Arg && root.Arg != nil && root.Arg.Kind == ir.ArgParam:
			out[b] = 0
		case b.Arg && root.Arg != nil && root.Arg.Kind == ir.ArgState:
			out[b] = 1
		case b.Arg:
			out[b] = 2
		case backward[root]:
			out[b] = 4
		case b.End >= firstBackward:
			out[b] = 3
		default:
			out[b] = 5
		}
	}
	return out
}

// WriteHTML writes the report as one self-contained page (no scripts, no
// network): what the terms mean, live bytes over the schedule stacked by
// category with the peak marked, the largest values at the peak with their
// source locations, and the passes that ran.
func (r *Report) WriteHTML(w io.Writer) error {
	if r.info == nil {
		return fmt.Errorf("the report has no analysis to draw")
	}
	info := r.info
	n := len(info.Func.Body)
	cat := categorize(info)
	// live[c][t]: bytes of category c live at op t, summed from the
	// changes at each buffer's first and past its last op.
	live := make([][]int64, len(categories))
	for c := range live {
		live[c] = make([]int64, max(n, 1)+1)
	}
	for _, b := range info.Buffers {
		if b.Host {
			continue // an offloaded argument: not on the device
		}
		lo, hi := b.Start, b.End
		if b.Arg {
			lo, hi = 0, n-1
		}
		lo, hi = max(lo, 0), min(hi, n-1)
		if lo > hi {
			continue
		}
		live[cat[b]][lo] += b.Size
		live[cat[b]][hi+1] -= b.Size
	}
	for c := range live {
		for t := 1; t < len(live[c]); t++ {
			live[c][t] += live[c][t-1]
		}
	}
	var s strings.Builder
	e := html.EscapeString
	s.WriteString(PageHead("Kiln memory report: @"+r.Func, "Memory of <code>@"+e(r.Func)+"</code>"))
	fmt.Fprintf(&s, "<p>%d ops. The step needs <b>%s</b> on the device (<i>planned</i>); at its busiest moment <b>%s</b> are live (<i>peak</i>).</p>\n",
		r.Ops, diag.Bytes(r.PlannedBytes), diag.Bytes(r.PeakBytes))
	s.WriteString("<table>\n")
	row := func(name string, v int64, meaning string) {
		fmt.Fprintf(&s, "<tr><th>%s</th><td class=n>%s</td><td class=note>%s</td></tr>\n", e(name), diag.Bytes(v), e(meaning))
	}
	row("planned", r.PlannedBytes, "what the step needs: parameters + optimizer state + inputs + arena")
	row("peak", r.PeakBytes, "the most bytes live at once in the schedule")
	row("arena", r.ArenaBytes, "the one buffer that holds every intermediate value")
	row("parameters", r.ParamsBytes, "the model's weights")
	row("optimizer state", r.StateBytes, "momentum and Adam moments")
	row("inputs", r.InputsBytes, "the data batch")
	fmt.Fprintf(&s, "<tr><th>FLOPs</th><td class=n>%d</td><td class=note>%d of them recompute values to save memory</td></tr>\n", r.FLOPs, r.RecomputeFLOPs)
	s.WriteString("</table>\n")

	s.WriteString("<h2>Live bytes over the schedule</h2>\n")
	writeChart(&s, live, r, n)
	s.WriteString("<p>")
	for _, c := range categories {
		fmt.Fprintf(&s, `<span class=sw style="background:%s"></span><b>%s</b> <span class=note>%s</span><br>`+"\n", c.color, e(c.name), e(c.meaning))
	}
	s.WriteString("</p>\n")

	if r.PeakOp != nil {
		fmt.Fprintf(&s, "<h2>At the peak</h2>\n<p>The peak is reached at op %d (<code>%s</code>", r.PeakOp.Index, e(r.PeakOp.Op))
		if r.PeakOp.Value != "" {
			fmt.Fprintf(&s, " defining <code>%s</code>", e(r.PeakOp.Value))
		}
		if r.PeakOp.Loc != "" {
			fmt.Fprintf(&s, ", from <code>%s</code>", e(r.PeakOp.Loc))
		}
		s.WriteString("). The largest values live there:</p>\n<table><tr><th>bytes</th><th>value</th><th>op</th><th>source</th></tr>\n")
		for _, t := range r.TopAtPeak {
			fmt.Fprintf(&s, "<tr><td class=n>%s</td><td><code>%s</code></td><td>%s</td><td><code>%s</code></td></tr>\n", diag.Bytes(t.Bytes), e(t.Value), e(t.Op), e(t.Loc))
		}
		s.WriteString("</table>\n")
	}
	if len(r.Effects) > 1 {
		s.WriteString("<h2>What each pass did</h2>\n<p>The function before the pipeline and after each pass: the peak (most bytes live at once), the FLOPs of one run, and the kernels launched. Changes from the row above are in parentheses.</p>\n")
		s.WriteString("<table><tr><th>after</th><th>peak</th><th>FLOPs</th><th>kernels</th></tr>\n")
		delta := func(now, before int64, bytes bool) string {
			if now == before {
				return ""
			}
			d := now - before
			sign := "+"
			if d < 0 {
				sign, d = "&minus;", -d
			}
			if bytes {
				return fmt.Sprintf(" <span class=note>(%s%s)</span>", sign, diag.Bytes(d))
			}
			return fmt.Sprintf(" <span class=note>(%s%d)</span>", sign, d)
		}
		for i, x := range r.Effects {
			name := "the input"
			if x.Pass != "" {
				name = "<code>" + e(x.Pass) + "</code>"
			}
			prev := x
			if i > 0 {
				prev = r.Effects[i-1]
			}
			fmt.Fprintf(&s, "<tr><td>%s</td><td class=n>%s%s</td><td class=n>%d%s</td><td class=n>%d%s</td></tr>\n", name,
				diag.Bytes(x.Peak), delta(x.Peak, prev.Peak, true), x.FLOPs, delta(x.FLOPs, prev.FLOPs, false), x.Kernels, delta(int64(x.Kernels), int64(prev.Kernels), false))
		}
		s.WriteString("</table>\n")
	} else if len(r.Passes) > 0 {
		names := make([]string, len(r.Passes))
		for i, p := range r.Passes {
			names[i] = e(p.Name)
		}
		fmt.Fprintf(&s, "<h2>Passes</h2>\n<p>%s</p>\n", strings.Join(names, " &rarr; "))
	}
	s.WriteString("<p class=note>Written by kiln mem --html.</p>\n</body></html>\n")
	_, err := io.WriteString(w, s.String())
	return err
}

// PageHead starts a self-contained report page (no scripts, nothing
// fetched) with Kiln's report style: title is plain text, heading HTML.
func PageHead(title, heading string) string {
	return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>` + html.EscapeString(title) + `</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #ddd}
td.n{text-align:right;font-variant-numeric:tabular-nums}.note{color:#666}
.sw{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}
</style></head><body>
<h1>` + heading + "</h1>\n"
}

// writeChart draws live as stacked areas over the schedule: at most 1,000
// columns, each the op of its span with the most bytes live (so the peak
// is never averaged away).
func writeChart(s *strings.Builder, live [][]int64, r *Report, n int) {
	const width, height, left, bottom, topMargin = 1000.0, 320.0, 70.0, 24.0, 16.0
	cols := min(max(n, 1), 1000)
	pick := make([]int, cols) // the op drawn in each column
	for c := range pick {
		lo, hi := c*n/cols, max((c+1)*n/cols, c*n/cols+1)
		best, bestSum := lo, int64(-1)
		for t := lo; t < hi && t < n; t++ {
			sum := int64(0)
			for k := range live {
				sum += live[k][t]
			}
			if sum > bestSum {
				best, bestSum = t, sum
			}
		}
		pick[c] = best
	}
	top := int64(1)
	for _, t := range pick {
		sum := int64(0)
		for k := range live {
			sum += live[k][t]
		}
		top = max(top, sum)
	}
	x := func(c int) float64 { return left + (width-left)*float64(c)/float64(cols) }
	y := func(v int64) float64 { return topMargin + (height-bottom-topMargin)*(1-float64(v)/float64(top)) }
	fmt.Fprintf(s, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" role="img" aria-label="live bytes by category over the schedule">`+"\n", width, height)
	base := make([]int64, cols)
	for k, c := range categories {
		var pts []string
		for i := 0; i < cols; i++ {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x(i), y(base[i]+live[k][pick[i]]), x(i+1), y(base[i]+live[k][pick[i]])))
		}
		for i := cols - 1; i >= 0; i-- {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x(i+1), y(base[i]), x(i), y(base[i])))
		}
		fmt.Fprintf(s, `<polygon fill="%s" points="%s"><title>%s</title></polygon>`+"\n", c.color, strings.Join(pts, " "), html.EscapeString(c.name))
		for i := range base {
			base[i] += live[k][pick[i]]
		}
	}
	// Axes: bytes on the left, ops along the bottom, the peak marked.
	fmt.Fprintf(s, `<line x1="%.0f" y1="0" x2="%.0f" y2="%.0f" stroke="#444"/>`+"\n", left, left, height-bottom)
	fmt.Fprintf(s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#444"/>`+"\n", left, height-bottom, width, height-bottom)
	for _, frac := range []float64{0, 0.5, 1} {
		v := int64(frac * float64(top))
		fmt.Fprintf(s, `<text x="%.0f" y="%.1f" font-size="11" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, diag.Bytes(v))
	}
	fmt.Fprintf(s, `<text x="%.0f" y="%.0f" font-size="11">op 0</text><text x="%.0f" y="%.0f" font-size="11" text-anchor="end">op %d</text>`+"\n",
		left, height-6, width, height-6, max(n-1, 0))
	if r.PeakOp != nil && n > 0 {
		c := r.PeakOp.Index * cols / n
		fmt.Fprintf(s, `<line x1="%.1f" y1="0" x2="%.1f" y2="%.0f" stroke="#000" stroke-dasharray="4 3"/><text x="%.1f" y="11" font-size="11">peak %s at op %d</text>`+"\n",
			x(c), x(c), height-bottom, x(c)+4, diag.Bytes(r.PeakBytes), r.PeakOp.Index)
	}
	s.WriteString("</svg>\n")
}
