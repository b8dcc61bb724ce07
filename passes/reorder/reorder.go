package reorder

import (
	"time"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "reorder",
		Summary:     "choose a topological order of the ops that lowers peak live bytes (never raises it)",
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *Options) error {
		for _, f := range m.Funcs {
			r := Reorder(f, *o)
			ctx.AddStat("peak-before", r.Before)
			ctx.AddStat("peak-after", r.After)
			ctx.Stat("winner", r.Winner)
		}
		return nil
	}))
}

// Options select the algorithms and bound their work.
type Options struct {
	Algo        string        `opt:"algo" enum:"best|list|dfs|rpo|exact" default:"best" doc:"list: greedy by bytes freed; dfs: depth-first; rpo: reverse post-order; exact: dynamic programming (whole graph, or segments between single-value cut points); best: all of them plus local improvement"`
	ExactStates int           `opt:"exact-states" default:"200000" range:"[1,inf)" doc:"largest number of states one exact search may visit"`
	Improve     int           `opt:"improve" default:"200" range:"[0,inf)" doc:"local moves tried by the improvement phase (best)"`
	Budget      time.Duration `opt:"budget" default:"0s" doc:"time budget for best (0: none; the other limits keep it fast and deterministic)"`
}

// Result reports what the pass did.
type Result struct {
	Before, After int64
	Winner        string
}

// Reorder rewrites f's schedule and returns the peaks before and after.
// The new order is a topological order with a peak no higher than before.
func Reorder(f *ir.Func, opt Options) Result {
	if opt.ExactStates <= 0 {
		opt.ExactStates = 200000
	}
	g := newGraph(f)
	identity := make([]int, g.n)
	for i := range identity {
		identity[i] = i
	}
	before := peakOf(g, identity)
	res := Result{Before: before, After: before, Winner: "input"}
	if g.n < 2 {
		return res
	}
	var deadline time.Time
	if opt.Budget > 0 {
		deadline = time.Now().Add(opt.Budget)
	}
	expired := func() bool { return !deadline.IsZero() && time.Now().After(deadline) }
	best := identity
	try := func(name string, order []int) {
		if order == nil || !g.isTopological(order) {
			return
		}
		if p := peakOf(g, order); p < res.After {
			res.After, res.Winner, best = p, name, order
		}
	}
	algo := opt.Algo
	if algo == "" {
		algo = "best"
	}
	if algo == "best" || algo == "list" {
		try("list", g.listSchedule())
	}
	if algo == "best" || algo == "dfs" {
		try("dfs", g.depthFirst())
	}
	if algo == "best" || algo == "rpo" {
		try("rpo", g.reversePostOrder())
	}
	if (algo == "best" || algo == "exact") && !expired() {
		try("exact", g.exactSegments(best, opt.ExactStates))
	}
	if algo == "best" && !expired() {
		// Each try measures the whole schedule: bound the total work so the
		// phase stays linear in the size of the graph.
		tries := min(opt.Improve, max(1, 2_000_000/g.n))
		try("improve", g.improve(best, res.After, tries, deadline))
	}
	g.apply(best)
	return res
}

// peakOf measures an order with the liveness analysis.
func peakOf(g *graph, order []int) int64 {
	saved := append([]*ir.Op(nil), g.f.Body...)
	body := make([]*ir.Op, len(order))
	for k, i := range order {
		body[k] = saved[i]
	}
	g.f.Body = body
	p := liveness.Analyze(g.f).Peak
	g.f.Body = saved
	return p
}

// exactSegments splits order at points where at most one value (besides
// arguments and results) is alive, solves every segment exactly when it is
// small enough, and returns the combined order (nil if nothing changed).
func (g *graph) exactSegments(order []int, maxStates int) []int {
	if g.n <= 20 {
		if o := g.exactOrder(order, maxStates); o != nil {
			return o
		}
	}
	// Crossing roots at each boundary of the order.
	pos := make([]int, g.n)
	for k, i := range order {
		pos[i] = k
	}
	lastUse := map[*ir.Value]int{}
	defAt := map[*ir.Value]int{}
	for k, i := range order {
		op := g.f.Body[i]
		for _, v := range op.Operands {
			r := g.root[v]
			if k > lastUse[r] {
				lastUse[r] = k
			}
		}
		for _, r := range op.Results {
			if g.root[r] == r {
				defAt[r] = k
				if _, ok := lastUse[r]; !ok {
					lastUse[r] = k
				}
			}
		}
	}
	crossing := make([]int, g.n+1) // roots alive between position k-1 and k
	for r, d := range defAt {
		if g.pinned[r] {
			continue
		}
		for k := d + 1; k <= lastUse[r] && k < g.n; k++ {
			crossing[k]++
		}
	}
	out := append([]int(nil), order...)
	changed := false
	start := 0
	for k := 1; k <= g.n; k++ {
		if k < g.n && crossing[k] > 1 {
			continue
		}
		if k-start >= 3 && k-start <= 40 {
			if seg := g.exactOrder(out[start:k], maxStates); seg != nil {
				copy(out[start:k], seg)
				changed = true
			}
		}
		start = k
	}
	if !changed {
		return nil
	}
	return out
}

// improve tries local moves on the ops whose buffers are live at the peak:
// sinking an op to just before its first user, keeping a move when the
// peak drops. It returns nil when no move helped.
func (g *graph) improve(order []int, peak int64, tries int, deadline time.Time) []int {
	cur := append([]int(nil), order...)
	improved := false
	for round := 0; round < 3 && tries > 0; round++ {
		saved := append([]*ir.Op(nil), g.f.Body...)
		body := make([]*ir.Op, len(cur))
		for k, i := range cur {
			body[k] = saved[i]
		}
		g.f.Body = body
		info := liveness.Analyze(g.f)
		g.f.Body = saved
		opIndex := map[*ir.Op]int{}
		for i, op := range saved {
			opIndex[op] = i
		}
		var candidates []int
		for _, b := range info.Largest(1 << 30) {
			if d := b.Root().Def; d != nil {
				candidates = append(candidates, opIndex[d])
			}
		}
		progress := false
		for _, op := range candidates {
			if tries <= 0 || !deadline.IsZero() && time.Now().After(deadline) {
				break
			}
			tries--
			next := sink(g, cur, op)
			if next == nil {
				continue
			}
			if p := peakOf(g, next); p < peak {
				cur, peak, improved, progress = next, p, true, true
			}
		}
		if !progress {
			break
		}
	}
	if !improved {
		return nil
	}
	return cur
}

// sink moves op to just before its first user in order (nil if it is
// already there or has no user).
func sink(g *graph, order []int, op int) []int {
	pos := make([]int, g.n)
	for k, i := range order {
		pos[i] = k
	}
	first := -1
	for _, s := range g.succs[op] {
		if first < 0 || pos[s] < first {
			first = pos[s]
		}
	}
	from := pos[op]
	if first < 0 || first == from+1 {
		return nil
	}
	out := make([]int, 0, g.n)
	out = append(out, order[:from]...)
	out = append(out, order[from+1:first]...)
	out = append(out, op)
	out = append(out, order[first:]...)
	return out
}
