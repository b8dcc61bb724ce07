// Package assign is the `assign` pass: it gives every value that needs
// arena memory an offset in one arena. Views share their operand's
// offset and in-place results their dying operand's (as the liveness
// analysis decides); values rooted at arguments take no arena memory.
package assign

import (
	"fmt"
	"time"

	"github.com/kiln-compiler/kiln/alloc"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
)

// maxAlignment bounds the alignment option: rounding a size up to a larger
// one could overflow the memory figures.
const maxAlignment = 1 << 30

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "assign",
		Summary:     "give every tensor an offset in one arena (buffer assignment)",
		Establishes: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *Options) error {
		PendingSends(m)
		for _, f := range m.Funcs {
			res, err := Assign(f, o.Algo, o.Alignment, o.Timeout)
			if err != nil {
				return err
			}
			ctx.AddStat("arena-bytes", res.Size)
			ctx.Stat("algorithm", res.Algo)
			ctx.Stat("proven-optimal", res.Optimal)
		}
		return nil
	}))
}

// Options are the assign pass's options.
type Options struct {
	Algo      string        `opt:"algo" enum:"best|greedy-size|greedy-size-lowest|coloring|time-order|search" default:"best" doc:"greedy-size: decreasing size, best fit; greedy-size-lowest: lowest offset; coloring: shared pools; time-order: schedule order, best-fit free blocks (O(n log n)); search: branch and bound; best: greedy then a bounded search (time-order where the greedy would take too long)"`
	Alignment int64         `opt:"alignment" default:"64" range:"[1,1073741824]" doc:"offsets are multiples of this many bytes (at most 1 GiB)"`
	Timeout   time.Duration `opt:"timeout" default:"10s" doc:"time limit of the other algorithms: search stops at it, greedy and coloring fall back to time-order (best bounds its work instead, so its output is deterministic)"`
}

// Problem builds the allocation problem of f's schedule: one request per
// arena buffer, live on [Start, End+1). buffers[i] is request i's buffer.
func Problem(info *liveness.Info, align int64) (*alloc.Problem, []*liveness.Buffer) {
	p := &alloc.Problem{Alignment: align}
	var bufs []*liveness.Buffer
	for _, b := range info.ArenaBuffers() {
		p.Buffers = append(p.Buffers, alloc.Buffer{ID: len(bufs), Lower: int64(b.Start), Upper: int64(b.End) + 1, Size: b.Size})
		bufs = append(bufs, b)
	}
	return p, bufs
}

// Solve runs the named algorithm on a problem within timeout: the search
// stops at it, and a heuristic that passes it falls back to
// alloc.TimeOrdered. best is deterministic: it bounds its work instead.
func Solve(p *alloc.Problem, algo string, timeout time.Duration) *alloc.Solution {
	deadline := time.Now().Add(timeout)
	switch algo {
	case "greedy-size":
		return alloc.GreedyWithin(p, true, deadline)
	case "greedy-size-lowest":
		return alloc.GreedyWithin(p, false, deadline)
	case "coloring":
		return alloc.ColoringWithin(p, deadline)
	case "time-order":
		return alloc.TimeOrdered(p)
	case "search":
		return alloc.Search(p, alloc.SearchOptions{Timeout: timeout})
	}
	return alloc.BestDeterministic(p)
}

// Assign sets the offsets of f's values and the function's arena and
// alignment attributes, and returns the solution it used. Offsets from an
// earlier assignment are replaced.
func Assign(f *ir.Func, algo string, align int64, timeout time.Duration) (*alloc.Solution, error) {
	info := liveness.Analyze(f)
	p, bufs := Problem(info, align)
	sol := Solve(p, algo, timeout)
	if err := alloc.Check(p, sol, 0); err != nil {
		return nil, fmt.Errorf("internal error: %s produced an invalid assignment: %v", sol.Algo, err)
	}
	f.Walk(func(op *ir.Op) {
		for _, r := range op.Results {
			r.Offset = ir.NoOffset
		}
	})
	for i, b := range bufs {
		for _, v := range b.Values {
			v.Offset = sol.Offsets[i]
		}
	}
	if f.Attrs == nil {
		f.Attrs = ir.Attrs{}
	}
	f.Attrs["arena"] = ir.IntAttr(sol.Size)
	f.Attrs["alignment"] = ir.IntAttr(align)
	delete(f.Attrs, "host_arena")
	if len(info.HostBuffers) > 0 {
		// Swapped-out tensors share a host arena the same way.
		hp := &alloc.Problem{Alignment: align}
		for i, b := range info.HostBuffers {
			hp.Buffers = append(hp.Buffers, alloc.Buffer{ID: i, Lower: int64(b.Start), Upper: int64(b.End) + 1, Size: b.Size})
		}
		hs := Solve(hp, algo, timeout)
		if err := alloc.Check(hp, hs, 0); err != nil {
			return nil, fmt.Errorf("internal error: %s produced an invalid host assignment: %v", hs.Algo, err)
		}
		for i, b := range info.HostBuffers {
			b.Root().Offset = hs.Offsets[i]
		}
		f.Attrs["host_arena"] = ir.IntAttr(hs.Size)
	}
	return sol, nil
}
