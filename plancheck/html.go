package plancheck

import (
	"fmt"
	"html"
	"io"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/memreport"
)

// WriteHTML writes a self-contained page (no scripts, nothing fetched) of
// a checked plan: what was checked, the streams' work over simulated time,
// and the device and host bytes live over the same time axis.
func WriteHTML(w io.Writer, p *cuda.Plan, r *Report) error {
	var s strings.Builder
	e := html.EscapeString
	s.WriteString(memreport.PageHead("Kiln launch plan: @"+p.Function, "Launch plan of <code>@"+e(p.Function)+"</code>"))
	checked := "structure, memory, races between streams and lifetimes; the results were replayed on the CPU and match the reference interpreter"
	if !r.Replayed {
		checked = "structure, memory, races between streams and lifetimes (the results were not replayed)"
	}
	fmt.Fprintf(&s, "<p>The plan is valid: plan-check checked %s.</p>\n<table>\n", e(checked))
	row := func(name, v, meaning string) {
		fmt.Fprintf(&s, "<tr><th>%s</th><td class=n>%s</td><td class=note>%s</td></tr>\n", e(name), e(v), e(meaning))
	}
	row("simulated step", fmt.Sprintf("%.1f µs", r.Seconds*1e6), "end of the last kernel or copy under the plan's cost model")
	row("compute", fmt.Sprintf("%.1f µs", r.ComputeSeconds*1e6), "time stream 0 runs kernels")
	row("copies", fmt.Sprintf("%.1f µs", r.CopySeconds*1e6), "time the copy streams move tensors between device and host")
	row("stalled", fmt.Sprintf("%.1f µs", r.StallSeconds*1e6), "time kernels wait for a copy to finish")
	row("device arena", diag.Bytes(p.Arena.SizeBytes), "the one device buffer of every intermediate tensor and, after it, the kernels' workspace")
	row("workspace", diag.Bytes(p.Workspace.SizeBytes), "scratch memory of kernels (im2col panels, statistics), part of the device arena")
	row("host arena", diag.Bytes(p.Host.SizeBytes), "host memory of tensors swapped out of the device")
	row("nodes", fmt.Sprintf("%d launches, %d copies, %d events", r.Kernels, r.Copies, r.Events), "what the runtime issues, in order")
	s.WriteString("</table>\n")

	s.WriteString("<h2>Streams over time</h2>\n")
	writeStreams(&s, p, r)
	s.WriteString(`<p><span class=sw style="background:#4e79a7"></span>kernel <span class=sw style="background:#e15759"></span>copy to host <span class=sw style="background:#59a14f"></span>copy to device <span class=note>Each bar is one node on its stream; copies overlap with kernels when they run on the copy stream.</span></p>` + "\n")
	s.WriteString("<h2>Memory over time</h2>\n")
	writeMemory(&s, p, r)
	s.WriteString(`<p><span class=sw style="background:#f28e2b"></span>device bytes live <span class=sw style="background:#76b7b2"></span>host bytes live <span class=note>Tensors of the arenas, from the start of the first node of the op that makes them to the end of the last op that reads them; parameters and inputs are not drawn.</span></p>` + "\n")
	s.WriteString("<p class=note>Written by kiln plan-check --html.</p>\n</body></html>\n")
	_, err := io.WriteString(w, s.String())
	return err
}

const (
	chartWidth, chartLeft = 1000.0, 130.0
)

// timeX maps simulated seconds to the chart's x coordinate.
func timeX(t, end float64) float64 {
	if end <= 0 {
		return chartLeft
	}
	return chartLeft + (chartWidth-chartLeft)*t/end
}

func writeStreams(s *strings.Builder, p *cuda.Plan, r *Report) {
	const lane = 26.0
	height := lane*float64(len(p.Streams)) + 24
	fmt.Fprintf(s, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" role="img" aria-label="nodes on each stream over simulated time">`+"\n", chartWidth, height)
	row := map[int]int{}
	for i, st := range p.Streams {
		row[st.ID] = i
		fmt.Fprintf(s, `<text x="0" y="%.0f" font-size="12">stream %d (%s)</text>`+"\n", lane*float64(i)+16, st.ID, html.EscapeString(st.Name))
	}
	for _, sp := range r.Timeline {
		color := "#4e79a7"
		if n := p.Nodes[sp.Node]; n.Direction == "device_to_host" {
			color = "#e15759"
		} else if n.Direction != "" {
			color = "#59a14f"
		}
		x0, x1 := timeX(sp.Start, r.Seconds), timeX(sp.Finish, r.Seconds)
		fmt.Fprintf(s, `<rect x="%.2f" y="%.0f" width="%.2f" height="%.0f" fill="%s"><title>%s (%.2f µs)</title></rect>`+"\n",
			x0, lane*float64(row[sp.Stream])+4, max(x1-x0, 0.5), lane-8, color, html.EscapeString(sp.Name), (sp.Finish-sp.Start)*1e6)
	}
	fmt.Fprintf(s, `<text x="%.0f" y="%.0f" font-size="11">0 µs</text><text x="%.0f" y="%.0f" font-size="11" text-anchor="end">%.1f µs</text>`+"\n",
		chartLeft, height-4, chartWidth, height-4, r.Seconds*1e6)
	s.WriteString("</svg>\n")
}

// writeMemory draws the device and host bytes live as step lines over
// simulated time: a buffer is live from the first node of its first op
// to the last node of its last op.
func writeMemory(s *strings.Builder, p *cuda.Plan, r *Report) {
	const height, bottom, top = 260.0, 24.0, 12.0
	first, last := map[int]float64{}, map[int]float64{}
	for _, sp := range r.Timeline {
		op := p.Nodes[sp.Node].Op
		if op < 0 {
			continue
		}
		if t, ok := first[op]; !ok || sp.Start < t {
			first[op] = sp.Start
		}
		last[op] = max(last[op], sp.Finish)
	}
	type change struct {
		t     float64
		bytes int64
	}
	series := map[string][]change{}
	for _, b := range p.Buffers {
		if b.Space != "device" && b.Space != "host" {
			continue
		}
		t0, ok0 := first[b.FirstOp]
		t1, ok1 := last[b.LastOp]
		if !ok0 {
			t0 = 0
		}
		if !ok1 {
			t1 = r.Seconds
		}
		series[b.Space] = append(series[b.Space], change{t0, b.SizeBytes}, change{t1, -b.SizeBytes})
	}
	peak := int64(1)
	points := map[string][]change{}
	for _, space := range []string{"device", "host"} {
		cs := series[space]
		sort.SliceStable(cs, func(i, j int) bool {
			if cs[i].t != cs[j].t {
				return cs[i].t < cs[j].t
			}
			return cs[i].bytes > cs[j].bytes // a tensor made as another dies counts both
		})
		live := int64(0)
		pts := []change{{0, 0}}
		for _, c := range cs {
			live += c.bytes
			pts = append(pts, change{c.t, live})
			peak = max(peak, live)
		}
		points[space] = pts
	}
	y := func(v int64) float64 { return top + (height-bottom-top)*(1-float64(v)/float64(peak)) }
	fmt.Fprintf(s, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" role="img" aria-label="device and host bytes live over simulated time">`+"\n", chartWidth, height)
	for space, color := range map[string]string{"device": "#f28e2b", "host": "#76b7b2"} {
		var b strings.Builder
		prev := int64(0)
		for i, c := range points[space] {
			x := timeX(c.t, r.Seconds)
			if i > 0 {
				fmt.Fprintf(&b, " %.2f,%.2f", x, y(prev))
			}
			fmt.Fprintf(&b, " %.2f,%.2f", x, y(c.bytes))
			prev = c.bytes
		}
		fmt.Fprintf(&b, " %.2f,%.2f", chartWidth, y(prev))
		fmt.Fprintf(s, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s bytes live</title></polyline>`+"\n", color, strings.TrimSpace(b.String()), space)
	}
	fmt.Fprintf(s, `<line x1="%.0f" y1="0" x2="%.0f" y2="%.0f" stroke="#444"/><line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#444"/>`+"\n",
		chartLeft, chartLeft, height-bottom, chartLeft, height-bottom, chartWidth, height-bottom)
	for _, frac := range []float64{0, 0.5, 1} {
		v := int64(frac * float64(peak))
		fmt.Fprintf(s, `<text x="%.0f" y="%.1f" font-size="11" text-anchor="end">%s</text>`+"\n", chartLeft-6, y(v)+4, diag.Bytes(v))
	}
	fmt.Fprintf(s, `<text x="%.0f" y="%.0f" font-size="11">0 µs</text><text x="%.0f" y="%.0f" font-size="11" text-anchor="end">%.1f µs</text>`+"\n",
		chartLeft, height-6, chartWidth, height-6, r.Seconds*1e6)
	s.WriteString("</svg>\n")
}
