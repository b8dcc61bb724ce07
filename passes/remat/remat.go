// Package remat is the `remat` pass: it rewrites a training step so that
// its peak fits a memory budget by freeing values after their early uses
// and recomputing them (cloned ops marked recomputed = true, keeping their
// locations) just before their late uses, choosing what to recompute to
// add as few FLOPs as it can. Chains of recomputation are followed
// (operands no longer alive are recomputed too), a recomputed value is
// shared by the late users after it, dropout regenerates its mask from the
// same seed, and impure ops or values marked remat = "never" are never
// recomputed; remat = "always" values are recomputed before their late
// uses whatever the budget.
package remat

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "remat",
		Summary:     "recompute values so that the peak fits a budget, adding as few FLOPs as possible",
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		for _, f := range m.Funcs {
			peak := ctx.Liveness(f).Peak
			budget := o.Budget.Of(peak)
			res, err := Rematerialize(f, budget, o.Solver)
			if err != nil {
				return err
			}
			ctx.AddStat("peak-before", peak)
			ctx.AddStat("peak-after", res.Peak)
			ctx.AddStat("budget", budget)
			ctx.AddStat("recompute-flops", res.FLOPs)
			ctx.Stat("solver", res.Solver)
		}
		return nil
	}))
}

type options struct {
	Budget passes.Size `opt:"budget" default:"1.0" range:"(0,1]" doc:"bytes (512MiB, 2GB) or a fraction of the peak when the pass starts (0.5)"`
	Solver string      `opt:"solver" enum:"best|cheap|greedy|sqrt|exact" default:"best" doc:"cheap: keep the outputs of compute-heavy ops and recompute cheap chains from them, largest first, then greedy; greedy: cheapest recomputation per byte at the peak, repeatedly; sqrt: Chen et al. 2016 segment checkpoints; exact: every subset of saved values (small graphs); best: all that apply, fewest added FLOPs"`
}

// StepFloor is the least peak any schedule of f can have, however split
// or recomputed: its arguments on the device are live throughout and its
// results together at the end. Each buffer counts once (a view shares
// its operand's, and a result that is an argument or a view of one adds
// nothing).
func StepFloor(f *ir.Func) int64 {
	info := liveness.Analyze(f)
	n := info.ParamBytes + info.StateBytes + info.InputBytes
	seen := map[*liveness.Buffer]bool{}
	for _, r := range f.Results {
		b := info.BufferOf[r.Value]
		if b == nil || b.Arg || b.Host || seen[b] || ir.HostResult(r.Value) {
			continue
		}
		seen[b] = true
		n += b.Size
	}
	return n
}

// Result is what a solver reached.
type Result struct {
	Peak int64
	// FLOPs is what the plan's recomputation adds, net of the
	// recomputations of the input that it saves again.
	FLOPs  int64
	Solver string
}

// BudgetError says the budget cannot be met, like XLA's "can't reduce
// memory below" message.
type BudgetError struct {
	Func    string
	Budget  int64
	Reached int64
	Holders []liveness.Holder
	// Floor, when set, is what the step's arguments and results need
	// together, above the budget: no schedule goes below it, and no
	// solver ran (Reached is the peak as it was).
	Floor int64
}

func (e *BudgetError) Error() string {
	var b strings.Builder
	if e.Floor > e.Budget {
		fmt.Fprintf(&b, "@%s: the budget of %s (%d bytes) is under the %s (%d bytes) that the step's arguments and results need together, which no schedule or recomputation goes below (the peak is %s)",
			e.Func, diag.Bytes(e.Budget), e.Budget, diag.Bytes(e.Floor), e.Floor, diag.Bytes(e.Reached))
	} else {
		fmt.Fprintf(&b, "@%s: can't reduce memory below %s (%d bytes) by recomputation; the budget is %s (%d bytes)",
			e.Func, diag.Bytes(e.Reached), e.Reached, diag.Bytes(e.Budget), e.Budget)
	}
	b.WriteString(". Values live at that peak:")
	for _, h := range e.Holders {
		fmt.Fprintf(&b, "\n  %s %s (%s)", diag.Bytes(h.Bytes), h.Value, h.Op)
		if h.Loc != "" {
			fmt.Fprintf(&b, " at %s", h.Loc)
		}
	}
	return b.String()
}

// Rematerialize rewrites f to fit budget with the named solver.
func Rematerialize(f *ir.Func, budget int64, solver string) (Result, error) {
	applyAlways(f)
	info := liveness.Analyze(f)
	if info.Peak <= budget {
		return Result{Peak: info.Peak, Solver: "none"}, nil
	}
	if fl := StepFloor(f); budget < fl {
		// No solver can help: refused before any runs (on a large step
		// they take minutes to find that out).
		return Result{}, &BudgetError{Func: f.Name, Budget: budget, Reached: info.Peak, Floor: fl, Holders: info.Holders(10)}
	}
	var best *ir.Func
	bestRes := Result{FLOPs: math.MaxInt64}
	bound := func() int64 { // for solvers that can stop once they lose
		if best == nil {
			return 0
		}
		return bestRes.FLOPs
	}
	type attempt struct {
		name string
		run  func(*ir.Func) int64
	}
	var attempts []attempt
	add := func(name string, run func(*ir.Func) int64) { attempts = append(attempts, attempt{name, run}) }
	switch solver {
	case "greedy":
		add("greedy", func(g *ir.Func) int64 { return greedy(g, budget, stepping{chunks: true}) })
	case "sqrt":
		add("sqrt", func(g *ir.Func) int64 { return sqrtCheckpoints(g) })
	case "exact":
		add("exact", func(g *ir.Func) int64 { return exact(g, budget, 1<<30) })
	case "cheap":
		add("cheap", func(g *ir.Func) int64 { return cheapFirst(g, budget) })
	default:
		add("cheap", func(g *ir.Func) int64 { return cheapFirst(g, budget) })
		add("greedy", func(g *ir.Func) int64 { return greedy(g, budget, stepping{chunks: true}) })
		if len(f.Body) <= singleStepOps {
			add("greedy", func(g *ir.Func) int64 {
				if bound() == 0 {
					// Only to lower the FLOPs of a plan in hand: unbounded
					// single steps grind for minutes on budgets nothing meets.
					return -1
				}
				return greedy(g, budget, stepping{bound: bound()})
			})
		}
		add("exact", func(g *ir.Func) int64 { return exact(g, budget, 4096) })
		add("sqrt", func(g *ir.Func) int64 { return sqrtCheckpoints(g) })
	}
	lowest := int64(math.MaxInt64)
	var lowestFunc *ir.Func
	for _, a := range attempts {
		if a.name == "sqrt" && best != nil && solver == "best" && bestRes.FLOPs <= sqrtLowerBound(f) {
			continue // sqrt cannot add fewer FLOPs than the plan in hand
		}
		g := f.Clone()
		flops := a.run(g)
		if flops < 0 {
			continue
		}
		peak := liveness.Analyze(g).Peak
		if peak < lowest {
			lowest, lowestFunc = peak, g
		}
		if peak <= budget && flops < bestRes.FLOPs {
			best, bestRes = g, Result{Peak: peak, FLOPs: flops, Solver: a.name}
		}
	}
	if best == nil {
		e := &BudgetError{Func: f.Name, Budget: budget, Reached: lowest}
		if lowestFunc == nil {
			lowestFunc = f
			e.Reached = liveness.Analyze(f).Peak
		}
		e.Holders = liveness.Analyze(lowestFunc).Holders(10)
		return Result{}, e
	}
	if prune(best, budget) {
		bestRes.FLOPs = max(0, recomputeFLOPs(best)-recomputeFLOPs(f))
		bestRes.Peak = liveness.Analyze(best).Peak
	}
	*f = *best
	return bestRes, nil
}

// applyAlways recomputes values marked remat = "always" before each use
// after their first.
func applyAlways(f *ir.Func) {
	rw := &rewriter{f: f, keep: map[*ir.Value]bool{}}
	for {
		s := analyse(f)
		done := true
		for _, op := range f.Body {
			if op.Attr().String("remat") != "always" || op.Attr().Bool("recomputed") {
				continue
			}
			for _, v := range op.Results {
				if u := s.uses[v]; len(u) > 1 && rw.recompute(s, v, u[1]) {
					done = false
					break
				}
			}
			if !done {
				break
			}
		}
		if done {
			return
		}
	}
}

// maxFlatSteps bounds the recomputations in a row that leave the peak
// where it is (moving it along a plateau) before one must lower it.
const maxFlatSteps = 32

// stepping says how many candidates greedy recomputes between analyses.
type stepping struct {
	chunks bool // in chunks that grow while they help (fast on large steps)
	// bound, when positive, is a plan in hand: greedy gives up (returns
	// -1) once it has added more FLOPs.
	bound int64
}

// singleStepOps is the largest step on which `best` also runs greedy in
// single steps (when another solver met the budget): each step analyses
// the whole schedule, so the time grows with the square of the ops (about
// a second at 2,000 ops).
const singleStepOps = 2000

// greedy repeatedly takes the peak, and among the buffers live there that
// are used again later, recomputes the one that adds the fewest FLOPs per
// byte freed before its first use after the peak; a change is kept only
// when the peak drops.
// It returns the FLOPs added (the peak may still be above the budget when
// no candidate helps any more).
//
// On steps of thousands of ops the peak is lowered by hundreds of such
// steps at much the same place, so with mode.chunks the best candidates
// are tried in chunks, as many as the excess over the budget asks for, that double
// while whole chunks lower the peak and halve when one does not (down to
// single candidates, the plain greedy step). A candidate whose chain grew
// since the chunk was chosen (another member freed one of its operands)
// is left out of the chunk: with it, chunks added up to 20% more FLOPs
// than single steps on a 5,000-op residual stack; without it, the same.
// Neither mode is better everywhere: on the zoo, chunks reach lower
// budgets and single steps add fewer FLOPs at half the peak of ResNet-50.
func greedy(f *ir.Func, budget int64, mode stepping) int64 {
	rw := &rewriter{f: f, keep: map[*ir.Value]bool{}}
	flat := 0  // level steps since the peak last dropped
	chunk := 1 // candidates tried together next
	if mode.chunks {
		chunk = 2
	}
	info := rw.live()
	for iter := 0; iter < 100000; iter++ {
		if info.Peak <= budget || rw.tired() {
			return rw.flops
		}
		if mode.bound > 0 && rw.flops > mode.bound {
			return -1
		}
		p := info.PeakAt
		peakOp, peakLive := f.Body[p], info.Live[p]
		s := rw.sched()
		cands := greedyCandidates(rw, s, info, p)
		if chunk > 1 {
			// A prefix of the best, no more than the excess needs.
			n, freed := 0, int64(0)
			for n < len(cands) && n < chunk && freed < info.Peak-budget {
				freed += cands[n].size
				n++
			}
			if n > 1 {
				rw.begin()
				rw.recomputeAll(s, cands[:n])
				if after := rw.live(); after.Peak < info.Peak {
					flat, info = 0, after
					chunk *= 2
					continue
				}
				rw.undo()
				chunk = n / 2
				continue
			}
		}
		progress := false
		for k := range cands {
			if k >= 24 {
				break
			}
			rw.begin()
			if !rw.recomputeAll(s, cands[k:k+1]) {
				rw.undo()
				continue
			}
			// Keep the change when the peak drops, or stays and the bytes
			// live at the old peak point drop (peaks can be plateaus).
			after := rw.live()
			if after.Peak < info.Peak {
				progress, flat, info = true, 0, after
				break
			}
			// Along a plateau two values can trade places for ever:
			// only so many level steps in a row.
			if after.Peak == info.Peak && flat < maxFlatSteps && liveAt(after, peakOp) < peakLive {
				progress, info = true, after
				flat++
				break
			}
			rw.undo()
		}
		if !progress {
			return rw.flops // stuck above the budget: the caller sees the peak
		}
		if mode.chunks {
			chunk = 2
		}
	}
	return rw.flops
}

// candidate is a buffer live at the peak that recomputation can free: its
// values made before the peak, each recomputed at its first use after the
// peak for about cost FLOPs (its chain when chosen).
type candidate struct {
	vals  []*ir.Value
	use   []*ir.Op // where each value is recomputed: before this op
	cost  []int64
	flops int64 // sum of cost
	size  int64
}

// greedyCandidates lists the buffers live at position p that can be freed
// there, best score first.
func greedyCandidates(rw *rewriter, s *schedule, info *liveness.Info, p int) []candidate {
	var cands []candidate
	for _, b := range info.LiveAt(p) {
		c := candidate{size: b.Size}
		vals, ok := heldAt(s, b, p)
		for _, v := range vals {
			late := firstUse(s, v, func(u int) bool { return u > p })
			if late < 0 {
				continue
			}
			k, planned := rw.chainCost(s, v, late)
			if !planned {
				ok = false
				break
			}
			c.vals = append(c.vals, v)
			c.use = append(c.use, rw.f.Body[late])
			c.cost = append(c.cost, k)
			c.flops += k
		}
		if ok && len(c.vals) > 0 {
			cands = append(cands, c)
		}
	}
	slices.SortStableFunc(cands, func(a, b candidate) int {
		ra, rb := float64(a.flops)/float64(a.size+1), float64(b.flops)/float64(b.size+1)
		if c := cmp.Compare(ra, rb); c != 0 {
			return c
		}
		return cmp.Compare(b.size, a.size)
	})
	return cands
}

// recomputeAll recomputes the values of cands, latest position first so
// that the positions of the others stay valid, planned on s (made before
// any of them). With several candidates, a value whose chain now costs
// more than its estimate is skipped; with one, any failure fails
// the whole. It reports whether every value was recomputed.
func (rw *rewriter) recomputeAll(s *schedule, cands []candidate) bool {
	type site struct {
		v    *ir.Value
		use  *ir.Op
		cost int64
	}
	var sites []site
	for _, c := range cands {
		for i, v := range c.vals {
			sites = append(sites, site{v, c.use[i], c.cost[i]})
		}
	}
	slices.SortStableFunc(sites, func(a, b site) int { return cmp.Compare(s.pos[b.use], s.pos[a.use]) })
	all := true
	for n, st := range sites {
		if rw.tired() {
			return false
		}
		if n > 0 && rw.moved {
			s = rw.sched() // updates moved: positions before the last site changed
		}
		// Insertions after it leave the position of an earlier use as it was.
		at := s.pos[st.use]
		if len(cands) > 1 {
			if k, ok := rw.chainCost(s, st.v, at); !ok || k > st.cost {
				all = false
				continue
			}
		}
		if !rw.recompute(s, st.v, at) {
			all = false
			if len(cands) == 1 {
				return false
			}
			continue
		}
		if !rw.moved {
			s.forget(st.v, at)
		}
	}
	return all
}

// heldAt returns the values of buffer b made before position p (the ones
// a recomputation must replace; views made after p follow their operand's
// copy), and false when recomputing cannot free the buffer at p: it holds
// a result or an argument, or the op at p reads it.
func heldAt(s *schedule, b *liveness.Buffer, p int) ([]*ir.Value, bool) {
	var vals []*ir.Value
	for _, v := range b.Values {
		if s.result[v] || v.Def == nil {
			return nil, false
		}
		if s.pos[v.Def] < p {
			vals = append(vals, v)
		}
		for _, u := range s.uses[v] {
			if u == p {
				return nil, false
			}
		}
	}
	return vals, len(vals) > 0
}

// forwardOps returns the ops the first result (the loss) depends on.
func forwardOps(f *ir.Func) map[*ir.Op]bool {
	fwd := map[*ir.Op]bool{}
	if len(f.Results) == 0 {
		return fwd
	}
	var visit func(v *ir.Value)
	visit = func(v *ir.Value) {
		if v.Def == nil || fwd[v.Def] {
			return
		}
		fwd[v.Def] = true
		for _, u := range v.Def.Operands {
			visit(u)
		}
	}
	visit(f.Results[0].Value)
	return fwd
}

// sqrtCheckpoints is Chen et al.'s segment checkpointing: the forward ops
// are cut into about sqrt(n) segments; the values at segment ends are kept
// and every other value the backward needs is recomputed from them.
//
// Values are taken in reverse forward order, each recomputed before its
// first backward use. All of it is planned on one analysis of the
// schedule, in the positions of the original body, and the copies are
// inserted in one pass at the end: the step is linear in the ops (100k-op
// steps take seconds; analysing again after each copy took hours). The
// result is the one a copy-at-a-time rewrite gives: copies planned
// later at the same position go before earlier ones, their reads count
// as uses at that position, and a copy replaces its value in every op
// after it. A value whose copies would read an argument already
// overwritten by an update is kept (moving updates needs the body as it
// is after each copy).
func sqrtCheckpoints(f *ir.Func) int64 {
	fwd, order, keep := sqrtSegments(f)
	rw := &rewriter{f: f, keep: keep}
	s := analyse(f)
	type copies struct {
		at       int      // inserted just before f.Body[at]
		inserted []*ir.Op // in dependence order, v's copy last
		v        *ir.Value
	}
	var planned []copies
	backward := func(u int) bool { return !fwd[f.Body[u]] }
	for i := len(order) - 1; i >= 0; i-- {
		for _, v := range order[i].Results {
			if keep[v] || f.IsResult(v) {
				continue
			}
			t := firstUse(s, v, backward)
			if t < 0 {
				continue
			}
			ops, inserted, ok := rw.clones(s, v, t)
			if !ok || len(delayed(s, f.Body, ops, t)) > 0 {
				continue
			}
			planned = append(planned, copies{at: t, inserted: inserted, v: v})
			rw.flops += rw.cost(inserted)
			s.forget(v, t)
			for _, c := range inserted {
				for _, u := range c.Operands {
					if u.Def == nil || !slices.Contains(inserted, u.Def) {
						s.useAt(u, t)
					}
				}
			}
		}
	}
	at := map[int][]int{}
	for k, c := range planned {
		at[c.at] = append(at[c.at], k)
	}
	body := make([]*ir.Op, 0, len(f.Body))
	replace := map[*ir.Value]*ir.Value{}
	emit := func(op *ir.Op) {
		for j, u := range op.Operands {
			if c, ok := replace[u]; ok {
				op.Operands[j] = c
			}
		}
		body = append(body, op)
	}
	for i, op := range f.Body {
		ks := at[i]
		for k := len(ks) - 1; k >= 0; k-- {
			c := planned[ks[k]]
			for _, x := range c.inserted {
				emit(x)
			}
			replace[c.v] = c.inserted[len(c.inserted)-1].Results[c.v.Index]
		}
		emit(op)
	}
	f.Body = body
	return rw.flops
}

// sqrtSegments returns the forward ops, in order, and the values kept as
// segment checkpoints (segment ends and what cannot be recomputed).
func sqrtSegments(f *ir.Func) (fwd map[*ir.Op]bool, order []*ir.Op, keep map[*ir.Value]bool) {
	fwd = forwardOps(f)
	for _, op := range f.Body {
		if fwd[op] {
			order = append(order, op)
		}
	}
	keep = map[*ir.Value]bool{}
	seg := int(math.Ceil(math.Sqrt(float64(len(order)))))
	for i, op := range order {
		if (i+1)%seg == 0 || !recomputable(op) {
			for _, r := range op.Results {
				keep[r] = true
			}
		}
	}
	return fwd, order, keep
}

// sqrtLowerBound is at most what sqrtCheckpoints adds: every saved value
// that is not a checkpoint is recomputed at least once. (A value whose
// chain cannot be planned, through an impure op, is kept instead and
// adds nothing; the bound ignores that rare case, so best may skip a
// sqrt plan that would have won there.)
func sqrtLowerBound(f *ir.Func) int64 {
	_, _, keep := sqrtSegments(f)
	seen := map[*ir.Op]bool{}
	total := int64(0)
	for _, v := range savedValues(f) {
		if !keep[v] && !seen[v.Def] {
			seen[v.Def] = true
			total += ir.OpCost(v.Def).FLOPs
		}
	}
	return total
}

// savedValues lists forward values used by backward ops: what a training
// step keeps between its forward and backward passes.
func savedValues(f *ir.Func) []*ir.Value {
	fwd := forwardOps(f)
	s := analyse(f)
	var out []*ir.Value
	for _, op := range f.Body {
		if !fwd[op] || !recomputable(op) {
			continue
		}
		for _, v := range op.Results {
			if f.IsResult(v) {
				continue
			}
			if firstUse(s, v, func(u int) bool { return !fwd[f.Body[u]] }) >= 0 {
				out = append(out, v)
			}
		}
	}
	return out
}

// exactOpsPerSubset bounds best's exact search by work, not subsets
// alone: each subset clones and analyses the whole function, so limit
// subsets of a function of n ops cost limit·n op copies; a function above
// exactOpsPerSubset ops per allowed subset is left to the other solvers.
const exactOpsPerSubset = 64

// exact tries every subset of the saved values (at most limit subsets):
// each chosen value is recomputed before its first backward use. It keeps
// the subset that fits the budget with the fewest added FLOPs; when none
// fits, the one with the lowest peak (so that the error reports how low
// recomputation gets). It returns -1 when there are too many subsets.
func exact(f *ir.Func, budget int64, limit int) int64 {
	saved := savedValues(f)
	if len(saved) > 30 || 1<<len(saved) > limit || limit < 1<<30 && (1<<len(saved))*len(f.Body) > limit*exactOpsPerSubset {
		return -1
	}
	names := make([]string, len(saved))
	for i, v := range saved {
		names[i] = v.Name
	}
	bestFLOPs, bestMask := int64(-1), -1
	lowestPeak, lowestMask := int64(math.MaxInt64), 0
	for mask := 0; mask < 1<<len(saved); mask++ {
		g := f.Clone()
		flops := applySubset(g, names, mask)
		peak := liveness.Analyze(g).Peak
		if peak < lowestPeak {
			lowestPeak, lowestMask = peak, mask
		}
		if peak <= budget && (bestFLOPs < 0 || flops < bestFLOPs) {
			bestFLOPs, bestMask = flops, mask
		}
	}
	if bestMask < 0 {
		bestMask = lowestMask
	}
	return applySubset(f, names, bestMask)
}

// applySubset recomputes the named saved values chosen by mask before
// their first backward use (latest first) and returns the FLOPs added.
func applySubset(f *ir.Func, names []string, mask int) int64 {
	fwd := forwardOps(f)
	byName := map[string]*ir.Value{}
	f.Walk(func(op *ir.Op) {
		for _, r := range op.Results {
			byName[r.Name] = r
		}
	})
	rw := &rewriter{f: f, keep: map[*ir.Value]bool{}}
	for i := len(names) - 1; i >= 0; i-- {
		if mask&(1<<i) == 0 {
			continue
		}
		v := byName[names[i]]
		s := analyse(f)
		if u := firstUse(s, v, func(u int) bool { return !fwd[f.Body[u]] }); u >= 0 {
			rw.recompute(s, v, u)
		}
	}
	return rw.flops
}

// liveAt returns the live bytes while op runs.
func liveAt(info *liveness.Info, op *ir.Op) int64 {
	for i, o := range info.Func.Body {
		if o == op {
			return info.Live[i]
		}
	}
	return math.MaxInt64
}

// heavy reports whether op is compute-heavy (convolution, matmul, gemm):
// its outputs are worth keeping as sources for recomputation.
func heavy(op *ir.Op) bool {
	d := op.Def()
	return d != nil && d.Fusion == ir.OutFusable
}

// cheapFirst keeps the outputs of compute-heavy ops and recomputes saved
// values whose recomputation chain, stopping at those outputs, holds only
// cheap ops (elementwise, normalisation, softmax, dropout, shape ops),
// largest values first, until the budget is met; then it continues with
// the greedy solver. This is where training steps win most of their
// memory for little compute.
func cheapFirst(f *ir.Func, budget int64) int64 {
	flops := cheapPhase(f, budget)
	if liveness.Analyze(f).Peak <= budget {
		return flops
	}
	flops += cheapAtPeak(f, budget)
	if liveness.Analyze(f).Peak <= budget {
		return flops
	}
	return flops + greedy(f, budget, stepping{chunks: true})
}

// cheapAtPeak repeatedly takes the buffers live at the peak that are used
// again after it and whose recomputation chain (stopping at the outputs of
// compute-heavy ops, kept alive as sources) holds only cheap ops, and
// recomputes them, largest first, while the peak does not rise.
func cheapAtPeak(f *ir.Func, budget int64) int64 {
	rw := &rewriter{f: f, keep: map[*ir.Value]bool{}}
	for _, op := range f.Body {
		if heavy(op) {
			for _, r := range op.Results {
				rw.keep[r] = true
			}
		}
	}
	flat := 0 // level steps since the peak last dropped
	for round := 0; round < 1000 && !rw.tired(); round++ {
		info := rw.live()
		if info.Peak <= budget {
			break
		}
		p := info.PeakAt
		s := rw.sched()
		var cands []candidate
		for _, b := range info.LiveAt(p) {
			vals, ok := heldAt(s, b, p)
			if !ok || len(vals) != 1 {
				continue // views and in-place chains made before the peak: left to the greedy solver
			}
			v := vals[0]
			if rw.keep[v] || heavy(v.Def) {
				continue
			}
			late := firstUse(s, v, func(u int) bool { return u > p })
			if late < 0 {
				continue
			}
			if k, ok := rw.cheapChain(s, v, late); ok {
				cands = append(cands, candidate{vals: vals, use: []*ir.Op{f.Body[late]}, cost: []int64{k}, flops: k, size: b.Size})
			}
		}
		slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(b.size, a.size) })
		// First try them all at once; fall back to one at a time when
		// that raises the peak.
		if len(cands) > 1 {
			rw.begin()
			rw.recomputeAll(s, cands)
			if after := rw.live(); after.Peak < info.Peak {
				continue
			}
			rw.undo()
		}
		progress := false
		for _, c := range cands {
			if rw.tired() {
				break
			}
			s := rw.sched()
			rw.begin()
			if !rw.recompute(s, c.vals[0], s.pos[c.use[0]]) {
				continue
			}
			if after := rw.live(); after.Peak < info.Peak {
				progress, flat = true, 0
				break
			} else if after.Peak == info.Peak && flat < maxFlatSteps {
				progress = true
				flat++
				continue
			}
			rw.undo()
		}
		if !progress {
			break
		}
	}
	return rw.flops
}

func cheapPhase(f *ir.Func, budget int64) int64 {
	rw := &rewriter{f: f, keep: map[*ir.Value]bool{}}
	for _, op := range f.Body {
		if heavy(op) {
			for _, r := range op.Results {
				rw.keep[r] = true
			}
		}
	}
	fwd := forwardOps(f)
	saved := savedValues(f)
	type cand struct {
		name  string
		size  int64
		flops int64
	}
	var cands []cand
	s := rw.sched()
	for _, v := range saved {
		if rw.keep[v] {
			continue
		}
		first := firstUse(s, v, func(u int) bool { return !fwd[f.Body[u]] })
		if first < 0 {
			continue
		}
		if flops, ok := rw.cheapChain(s, v, first); ok {
			cands = append(cands, cand{v.Name, v.Type.SizeBytes(), flops})
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		ri := float64(cands[i].flops) / float64(cands[i].size+1)
		rj := float64(cands[j].flops) / float64(cands[j].size+1)
		return ri < rj
	})
	byName := map[string]*ir.Value{}
	f.Walk(func(op *ir.Op) {
		for _, r := range op.Results {
			byName[r.Name] = r
		}
	})
	peak := rw.live().Peak
	// one recomputes a candidate before its first backward use, kept when
	// the peak does not rise.
	one := func(c cand) {
		v := byName[c.name]
		s := rw.sched()
		first := firstUse(s, v, func(u int) bool { return !fwd[f.Body[u]] })
		if first < 0 || !rw.stillCheap(s, v, first, c.flops) {
			return
		}
		rw.begin()
		if !rw.recompute(s, v, first) {
			return
		}
		if p := rw.live().Peak; p <= peak {
			peak = p
		} else {
			rw.undo()
		}
	}
	// Candidates go in chunks that double while whole chunks keep the peak
	// from rising and stay above the budget; a chunk that raises the peak
	// or overshoots the budget is taken back and half of it tried, down to
	// single candidates. This keeps the pass fast on steps of thousands of
	// ops while adding what one-at-a-time would add.
	chunk := 1
	for i := 0; i < len(cands) && peak > budget && !rw.tired(); {
		batch := cands[i:min(i+chunk, len(cands))]
		if len(batch) == 1 {
			one(batch[0])
			i++
			chunk = 2
			continue
		}
		rw.begin()
		s := rw.sched()
		type site struct {
			v     *ir.Value
			first int
			flops int64
		}
		var sites []site
		for _, c := range batch {
			v := byName[c.name]
			if first := firstUse(s, v, func(u int) bool { return !fwd[f.Body[u]] }); first >= 0 {
				sites = append(sites, site{v, first, c.flops})
			}
		}
		// Latest first, so the positions of the others stay valid.
		sort.SliceStable(sites, func(a, b int) bool { return sites[a].first > sites[b].first })
		for _, st := range sites {
			if rw.tired() {
				break
			}
			first := firstUse(s, st.v, func(u int) bool { return !fwd[f.Body[u]] })
			if first < 0 || !rw.stillCheap(s, st.v, first, st.flops) || !rw.recompute(s, st.v, first) {
				continue
			}
			if rw.moved {
				s = rw.sched() // updates moved: positions before first changed
			} else {
				s.forget(st.v, first)
			}
		}
		if p := rw.live().Peak; p <= peak && p > budget {
			peak = p
			i += len(batch)
			chunk *= 2
			continue
		}
		rw.undo()
		chunk = len(batch) / 2
	}
	return rw.flops
}

// stillCheap reports whether recomputing v at t still costs about what
// it did when v was chosen: earlier recomputations may have freed its
// operands, and a chain reaching back through a residual stream would
// cost far more than it saves.
func (rw *rewriter) stillCheap(s *schedule, v *ir.Value, t int, flops int64) bool {
	now, ok := rw.cheapChain(s, v, t)
	return ok && now <= 2*flops
}

// cheapOnly is cheapFirst without its greedy fallback (for measurements).
func cheapOnly(f *ir.Func, budget int64) int64 {
	return cheapPhase(f, budget) + cheapAtPeak(f, budget)
}

// firstUse returns the first position using v that satisfies ok, or -1.
func firstUse(s *schedule, v *ir.Value, ok func(pos int) bool) int {
	for _, u := range s.uses[v] {
		if ok(u) {
			return u
		}
	}
	return -1
}

// cheapChain reports whether v can be recomputed at position t from values
// alive there (kept compute-heavy outputs included) through cheap ops
// only, and what that costs.
func (rw *rewriter) cheapChain(s *schedule, v *ir.Value, t int) (int64, bool) {
	ops, ok := rw.chain(s, v, t)
	if !ok {
		return 0, false
	}
	for _, op := range ops {
		if heavy(op) {
			return 0, false
		}
	}
	return rw.cost(ops) + rw.opFLOPs(v.Def), true
}

// chain lists the ops to recompute before v's own op so that v can be
// recomputed at position t; false when v cannot be.
func (rw *rewriter) chain(s *schedule, v *ir.Value, t int) ([]*ir.Op, bool) {
	if !recomputable(v.Def) {
		return nil, false
	}
	var ops []*ir.Op
	memo := map[*ir.Value]bool{}
	for _, u := range v.Def.Operands {
		if !rw.plan(s, u, t, memo, &ops) {
			return nil, false
		}
	}
	return ops, true
}

// chainCost is the FLOPs of recomputing v at position t, its chain
// included; false when v cannot be recomputed there.
func (rw *rewriter) chainCost(s *schedule, v *ir.Value, t int) (int64, bool) {
	ops, ok := rw.chain(s, v, t)
	if !ok {
		return 0, false
	}
	return rw.cost(ops) + rw.opFLOPs(v.Def), true
}
