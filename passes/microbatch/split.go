package microbatch

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/kiln-compiler/kiln/ir"
)

// How a split is proven. Every op of the whole step is placed by what its
// operands are in the split step and by its record's per-axis semantics
// (ir.Axes):
//
//   - whole: it reads nothing that depends on the batch, and runs once
//     before the slices, as in the whole step;
//   - sliced: it reads slices of the batch and runs once per slice. Its
//     sliced operands all cut the same loop of the op, which is not mixed
//     and indexes no operand or result through arithmetic; every other
//     operand dimension of that loop is cut alike (a whole operand is
//     sliced, or its cheap producer copied for the slice). Results that
//     index the loop are the slice's rows of the whole result; results
//     that do not are parts that fold (sum, max, min) into the whole;
//   - partial: it reads parts that sum to the whole in operands in which
//     the op is linear (ir.LinearIn), so its own result is such a part;
//   - late: it reads a folded value some other way, and runs once after
//     the slices on the folded value (in-place updates always do).
//
// An op that a slice needs but that needs the whole batch first (a value
// folded over the batch read with rows of the batch; a mixed loop over
// the batch: softmax along it, normalisation statistics, windows) makes
// the split an error naming the op. On data-parallel ranks that run one
// slice each, a folded value is all-reduced where it is first needed, so
// that each rank has the whole one and goes on: there, such steps split.
//
// A cut records where the batch's digits lie in a dimension of extent
// outer·batch·inner; a slice holds the batch rows of its part, so the
// slice of a dimension with outer 1 is a contiguous run.

type state uint8

const (
	whole state = iota
	sliced
	partial
	local // each slice's own: per-part statistics (an approximation)
	late
)

type cut struct {
	dim          int
	outer, inner int64
}

// valueInfo is what a value of the whole step is in the split step.
type valueInfo struct {
	state state
	cut   cut         // sliced
	fold  ir.LoopKind // partial: Summed, Averaged (a sum of the parts, over n), Maximum or Minimum
	from  *ir.Op      // partial and late: the op that folded the batch
}

// plan is how one op of the whole step runs in the split step.
type plan struct {
	state   state       // whole, sliced (a copy per slice), partial (a copy per slice on parts), late
	axes    ir.Axes     // sliced: the axes the copy follows
	loop    int         // sliced: the loop the slices cut (-1: none, a copy over each slice's own values)
	cut     cut         // sliced: how that loop is cut (dim unused)
	perPart bool        // the copy takes per-part statistics (an approximation)
	fold    ir.LoopKind // partial: the fold its parts keep
}

// Options say how Split cuts a step and which approximations it may make.
type Options struct {
	// PerSliceBN lets normalisations whose statistics span the batch take
	// each slice's (or rank's) own statistics (their PerPart semantics):
	// PyTorch's gradient accumulation and DDP. Without it such a split is
	// refused (or, for exact splits, computed in phases).
	PerSliceBN bool
	// PerRankDropout lets data-parallel ranks draw their dropout masks
	// from the same counters (DDP's ranks seeded alike), where each draws
	// its rows of the whole batch's masks otherwise.
	PerRankDropout bool
	// Trace, when not nil, gets the origin of every op made for a slice.
	Trace map[*ir.Op]Origin
}

type splitter struct {
	f     *ir.Func
	n     int64 // slices of the whole batch
	ranks int64 // > 0: the SPMD step of ranks ranks, n/ranks slices each
	per   int64 // slices this function runs
	opts  Options
	batch int64
	args  []*ir.Value
	info  map[*ir.Value]valueInfo
	plans map[*ir.Op]plan
	st    Stats

	// emission
	body     []*ir.Op
	combined map[*ir.Value]*ir.Value // a folded value made whole
	needed   map[*ir.Value]bool      // partial values that are folded
	cuts     map[cutKey]*ir.Value    // whole values cut for a slice
	inv      *ir.Value               // 1/n, for averaged parts
	invType  ir.DType
	subst    []substitution    // operands of whole and late ops, rewritten on success
	uses     map[*ir.Value]int // readers of each value of the whole step (a result counts)
}

// inOrder: one slice per rank, so folded values are all-reduced where
// they are first needed and every op runs in the whole step's order.
func (s *splitter) inOrder() bool { return s.ranks > 0 && s.per == 1 }

// split cuts f's batch into n slices: on one device (ranks = 0), or on
// ranks ranks that run n/ranks slices each. f changes only on success.
func split(f *ir.Func, n int, ranks int, opts Options) (Stats, error) {
	s, err := planSplit(f, n, ranks, opts)
	if err != nil || s == nil {
		return Stats{}, err
	}
	if err := s.emit(); err != nil {
		return Stats{}, err
	}
	return s.st, nil
}

// Sliced is the values of f that a split into n slices holds per slice
// (a slice's rows, or its own statistics), without making the split: what
// shrinks n-fold when a step is split. A step that Split refuses for a
// statistic of the whole batch is classified as its phases run it
// (SplitExact), where every slice's values are the slice's own too.
func Sliced(f *ir.Func, n int, opts Options) (map[*ir.Value]bool, error) {
	s, err := planSplit(f, n, 0, opts)
	var wb *WholeBatchError
	if errors.As(err, &wb) {
		s, err = planSplit(f, n, n, Options{PerSliceBN: true})
	}
	if err != nil || s == nil {
		return nil, err
	}
	out := map[*ir.Value]bool{}
	for v, vi := range s.info {
		if vi.state == sliced || vi.state == local {
			out[v] = true
		}
	}
	return out, nil
}

// planSplit classifies every op of f for a split into n slices (on ranks
// ranks when ranks > 0). It returns nil when n is 1.
func planSplit(f *ir.Func, n int, ranks int, opts Options) (*splitter, error) {
	for _, op := range f.Body {
		if ir.IsPointToPoint(op.Kind) {
			return nil, fmt.Errorf("%s: microbatch: @%s is a pipeline stage (it has %ss), whose microbatches parallel{pp, microbatches} makes", loc(op), f.Name, op.Kind)
		}
	}
	if n == 1 {
		return nil, nil
	}
	s := &splitter{f: f, n: int64(n), ranks: int64(ranks), per: int64(n), opts: opts}
	if ranks > 0 {
		s.per = s.n / int64(ranks)
	}
	s.uses = map[*ir.Value]int{}
	for _, op := range f.Body {
		for _, v := range op.Operands {
			s.uses[v]++
		}
	}
	for _, r := range f.Results {
		s.uses[r.Value]++
	}
	// Whole values that the slices read cut along the batch, made from
	// no batch data (a loss seed expanded to the batch's shape, and what
	// the backward computes from it alone), run per slice: their readers
	// then do too (a bias's gradient sums its slice's rows, not the
	// whole batch's before the slices). Each round promotes what the last
	// one's slices read; a round that cannot be planned keeps the last.
	promote := map[*ir.Value]cut{}
	if err := s.plan(promote); err != nil {
		return nil, err
	}
	for round := 0; round < 8; round++ {
		more := s.demands(promote)
		if len(more) == 0 {
			break
		}
		next := maps.Clone(promote)
		maps.Copy(next, more)
		saved := *s
		if err := s.plan(next); err != nil {
			*s = saved
			break
		}
		promote = next
	}
	return s, nil
}

// plan classifies every op of f, the values in promote made per slice
// along their cuts.
func (s *splitter) plan(promote map[*ir.Value]cut) error {
	s.info, s.plans, s.st = map[*ir.Value]valueInfo{}, map[*ir.Op]plan{}, Stats{}
	s.args = nil
	if err := s.findBatch(); err != nil {
		return err
	}
	s.st.Batch = s.batch
	for _, op := range s.f.Body {
		if p, ok := s.promoted(op, promote); ok {
			if err := s.place(op, p); err != nil {
				return err
			}
			continue
		}
		if err := s.classify(op); err != nil {
			return err
		}
	}
	return nil
}

// promoted is the per-slice plan of op when a result of it is promoted
// (and the op's own operands allow it: reemitCuts, and each operand is
// whole or cut, as this round planned it: one that became late or a
// slice's partial fold, since the round that promoted op, cannot be read
// per slice).
func (s *splitter) promoted(op *ir.Op, promote map[*ir.Value]cut) (plan, bool) {
	for _, r := range op.Results {
		c, ok := promote[r]
		if !ok {
			continue
		}
		if _, ok := s.reemitCuts(r, c); !ok {
			return plan{}, false
		}
		for _, x := range op.Operands {
			if st := s.info[x].state; st != whole && st != sliced {
				return plan{}, false
			}
		}
		ax, _ := ir.OpAxes(op)
		if ax.Flat {
			return plan{state: sliced, axes: ax, loop: -1, cut: c}, true
		}
		l := ax.Results[r.Index][c.dim].Loop
		return plan{state: sliced, axes: ax, loop: l, cut: c}, true
	}
	return plan{}, false
}

// demands lists the whole values the planned slices read cut along the
// batch whose producers could run per slice instead (reemitCuts), with
// their cuts: those and what they are made from.
func (s *splitter) demands(promote map[*ir.Value]cut) map[*ir.Value]cut {
	out := map[*ir.Value]cut{}
	bad := map[*ir.Value]bool{}
	var demand func(v *ir.Value, c cut)
	demand = func(v *ir.Value, c cut) {
		if _, ok := promote[v]; ok || bad[v] {
			return
		}
		if old, ok := out[v]; ok {
			if old != c {
				bad[v] = true // read cut two ways: stays whole
				delete(out, v)
			}
			return
		}
		cuts, ok := s.reemitCuts(v, c)
		if !ok {
			return
		}
		out[v] = c
		for _, oc := range cuts {
			demand(v.Def.Operands[oc.j], oc.c)
		}
	}
	for _, op := range s.f.Body {
		p := s.plans[op]
		if p.state != sliced || p.loop < 0 {
			continue
		}
		for j, v := range op.Operands {
			if s.info[v].state != whole {
				continue
			}
			for e, x := range p.axes.Operands[j] {
				if x.Loop == p.loop {
					demand(v, cut{dim: e, outer: p.cut.outer, inner: p.cut.inner})
					break
				}
			}
		}
	}
	return out
}

// findBatch picks the batch and the data arguments to slice: dimension 0
// of the first data argument, and every data argument with that leading
// dimension.
func (s *splitter) findBatch() error {
	for _, a := range s.f.Args {
		if a.Arg.Kind != ir.ArgData || len(a.Type.Shape) == 0 {
			continue
		}
		if s.batch == 0 {
			s.batch = a.Type.Shape[0]
		}
		if a.Type.Shape[0] == s.batch {
			s.args = append(s.args, a)
			s.info[a] = valueInfo{state: sliced, cut: cut{dim: 0, outer: 1, inner: 1}}
		}
	}
	switch {
	case s.batch == 0:
		return fmt.Errorf("microbatch: @%s has no data argument with a batch dimension to split", s.f.Name)
	case s.batch%s.n != 0:
		return fmt.Errorf("microbatch: the batch of @%s (%d, dimension 0 of %s) is not divisible by n=%d", s.f.Name, s.batch, s.args[0].Ref(), s.n)
	}
	return nil
}

// classify decides op's plan and what its results are.
func (s *splitter) classify(op *ir.Op) error {
	d := op.Def()
	var slicedIn, partialIn, lateIn, localIn []int
	for j, v := range op.Operands {
		switch s.info[v].state {
		case sliced:
			slicedIn = append(slicedIn, j)
		case partial:
			partialIn = append(partialIn, j)
		case late:
			lateIn = append(lateIn, j)
		case local:
			localIn = append(localIn, j)
		}
	}
	perSlice := len(slicedIn) > 0 || len(localIn) > 0
	if d == nil {
		if perSlice || len(partialIn) > 0 || len(lateIn) > 0 {
			return fmt.Errorf("%s: microbatch: unknown op %s reads the batch", loc(op), op.Kind)
		}
		return s.place(op, plan{state: whole})
	}
	if len(d.Writes) > 0 {
		if perSlice {
			v := op.Operands[append(slicedIn, localIn...)[0]]
			if v.Def != nil && v.Def.Def() != nil && len(v.Def.Def().Running) > 0 {
				return fmt.Errorf("%s: microbatch: %s writes in place with %s, a slice's running statistic: split before the optimizer pass, which chains the slices' updates (exact-bn keeps the whole batch's)", loc(op), op.Kind, v.Ref())
			}
			return fmt.Errorf("%s: microbatch: %s writes in place with %s, a slice's value", loc(op), op.Kind, v.Ref())
		}
		return s.place(op, plan{state: late})
	}
	if !perSlice && len(partialIn) == 0 {
		if len(lateIn) > 0 && !s.inOrder() {
			return s.place(op, plan{state: late})
		}
		return s.place(op, plan{state: whole})
	}
	if !perSlice {
		// Parts of folded values: a linear op keeps them parts.
		if s.linearOnSums(op, partialIn) {
			return s.place(op, plan{state: partial, loop: -1, fold: s.info[op.Operands[partialIn[0]]].fold})
		}
		if s.inOrder() {
			return s.place(op, plan{state: whole}) // on the all-reduced values
		}
		return s.place(op, plan{state: late})
	}
	if !s.inOrder() {
		for _, j := range append(partialIn, lateIn...) {
			return s.needsWhole(op, op.Operands[j])
		}
	}
	if len(slicedIn) == 0 {
		// Only each slice's own values (statistics of per-part
		// normalisations): a copy per slice, results each slice's own.
		return s.place(op, plan{state: sliced, loop: -1})
	}
	return s.classifySliced(op, slicedIn)
}

// needsWhole is the error for op, a slice's op that reads v, a value
// folded over the whole batch.
func (s *splitter) needsWhole(op *ir.Op, v *ir.Value) error {
	from := s.info[v].from
	what := "a value computed from the whole batch"
	if from != nil {
		what = fmt.Sprintf("which %s (%s) computes over the whole batch", from.Kind, loc(from))
	}
	return &WholeBatchError{fmt.Sprintf("%s: microbatch: %s (%s) reads %s, %s, with the rows of one slice: no slice can run before the whole batch has; microbatch{exact-bn=true} computes such statistics in phases (data-parallel ranks all-reduce them)",
		loc(op), op.Results[0].Ref(), op.Kind, v.Ref(), what)}
}

// WholeBatchError is a split refused because a slice would need
// statistics of the whole batch first: SplitExact computes them in
// phases, and data-parallel ranks all-reduce them.
type WholeBatchError struct{ msg string }

func (e *WholeBatchError) Error() string { return e.msg }

// linearOnSums reports whether op, reading parts in the operands set,
// keeps them parts: they are all sums (or all averages) that op alone
// reads, op is linear in exactly them, and its results are no larger
// than its largest part. Otherwise the parts are folded first, where
// they are small and once (a sum read by two ops is all-reduced once,
// not once per reader).
func (s *splitter) linearOnSums(op *ir.Op, set []int) bool {
	var largest int64
	fold := s.info[op.Operands[set[0]]].fold
	for _, j := range set {
		v := op.Operands[j]
		if f := s.info[v].fold; f != fold || f != ir.Summed && f != ir.Averaged || s.uses[v] != 1 {
			return false
		}
		largest = max(largest, v.Type.SizeBytes())
	}
	for _, r := range op.Results {
		if r.Type.SizeBytes() > largest {
			return false
		}
	}
	return !op.Def().Impure && ir.LinearIn(op, set)
}

// classifySliced places an op that reads slices of the batch.
func (s *splitter) classifySliced(op *ir.Op, slicedIn []int) error {
	d := op.Def()
	ax, ok := ir.OpAxes(op)
	if !ok {
		return fmt.Errorf("%s: microbatch: %s (%s) declares no per-axis semantics, so nothing proves that a slice of the batch computes a part of it", loc(op), op.Results[0].Ref(), op.Kind)
	}
	if ax.Flat {
		return s.classifyFlat(op)
	}
	l, c, err := s.splitLoop(op, ax, slicedIn)
	if err != nil {
		return err
	}
	perPart := false
	if ax.Loops[l].Kind == ir.Mixed {
		if d.PerPart == nil || !s.opts.PerSliceBN {
			return s.mixes(op, ax, l)
		}
		in, out := types(op.Operands), types(op.Results)
		ax, perPart = d.PerPart(in, out, op.Attr()), true
		if ax.Loops[l].Kind == ir.Mixed {
			return s.mixes(op, ax, l)
		}
		s.st.BatchNorms++
	}
	for _, side := range []struct {
		what string
		maps [][]ir.Index
	}{{"operand", ax.Operands}, {"result", ax.Results}} {
		for j, m := range side.maps {
			for e, x := range m {
				if x.Loop < 0 && x.Reads(l) {
					return fmt.Errorf("%s: microbatch: %s (%s) computes dimension %d of its %s %d from its position along the batch, which a slice shifts", loc(op), op.Results[0].Ref(), op.Kind, e, side.what, j)
				}
			}
		}
	}
	for j, m := range ax.Operands {
		v := op.Operands[j]
		vi := s.info[v]
		for e, x := range m {
			if x.Loop == l && vi.state == sliced && (vi.cut.dim != e || vi.cut.outer != c.outer || vi.cut.inner != c.inner) {
				return fmt.Errorf("%s: microbatch: %s (%s) pairs the batch of %s with a dimension of %s that holds other rows", loc(op), op.Results[0].Ref(), op.Kind, op.Operands[slicedIn[0]].Ref(), v.Ref())
			}
		}
	}
	if ir.DrawsRandom(op) {
		s.st.Dropouts++
	}
	p := plan{state: sliced, axes: ax, loop: l, cut: c, perPart: perPart}
	return s.place(op, p)
}

// splitLoop finds the loop of op that its sliced operands cut: one loop,
// with one cut.
func (s *splitter) splitLoop(op *ir.Op, ax ir.Axes, slicedIn []int) (int, cut, error) {
	l, c := -1, cut{}
	for _, j := range slicedIn {
		vi := s.info[op.Operands[j]]
		x := ax.Operands[j][vi.cut.dim]
		if x.Loop < 0 {
			what := "through arithmetic on its own positions"
			if len(x.Over) == 0 {
				what = "at positions its other operands choose (it gathers along the batch)"
			}
			return 0, c, fmt.Errorf("%s: microbatch: %s (%s) reads %s along the batch %s, which a slice does not hold whole", loc(op), op.Results[0].Ref(), op.Kind, op.Operands[j].Ref(), what)
		}
		switch {
		case l < 0:
			l, c = x.Loop, vi.cut
		case l != x.Loop:
			return 0, c, fmt.Errorf("%s: microbatch: %s (%s) pairs rows of the batch of %s with rows of %s: it mixes the batch", loc(op), op.Results[0].Ref(), op.Kind, op.Operands[slicedIn[0]].Ref(), op.Operands[j].Ref())
		}
	}
	return l, c, nil
}

// mixes is the error for op, whose loop l over the batch is mixed.
func (s *splitter) mixes(op *ir.Op, ax ir.Axes, l int) error {
	how := fmt.Sprintf("each element of its result depends on every row (its record's loop over the batch, of %d, is %s)", ax.Loops[l].Extent, ax.Loops[l].Kind)
	if op.Def().PerPart != nil {
		return &WholeBatchError{fmt.Sprintf("%s: microbatch: %s (%s) takes statistics over the batch: microbatch{exact-bn=true} keeps the whole batch's (in phases); --allow per-slice-bn lets each slice take its own, as PyTorch's gradient accumulation does", loc(op), op.Results[0].Ref(), op.Kind)}
	}
	return fmt.Errorf("%s: microbatch: %s (%s) mixes the batch: %s, so no slice computes a part of it", loc(op), op.Results[0].Ref(), op.Kind, how)
}

// classifyFlat places a view that keeps the row-major order: the batch's
// digits keep their place in the flat index, and must lie within one
// dimension of the result.
func (s *splitter) classifyFlat(op *ir.Op) error {
	vi := s.info[op.Operands[0]]
	c, ok := flatCut(vi.cut, op.Operands[0].Type.Shape, op.Results[0].Type.Shape, s.batch)
	if !ok {
		return fmt.Errorf("%s: microbatch: %s (%s) spreads the batch of %s over several dimensions of %s", loc(op), op.Results[0].Ref(), op.Kind, op.Operands[0].Ref(), op.Results[0].Type)
	}
	return s.place(op, plan{state: sliced, axes: ir.Axes{Flat: true}, loop: -1, cut: c})
}

// flatCut is where the batch of a value of shape from, cut at c, lies
// in the same elements seen with shape to.
func flatCut(c cut, from, to ir.Shape, batch int64) (cut, bool) {
	sigma := c.inner * prod(from[c.dim+1:]) // flat stride of the batch's lowest digit
	for j := range to {
		below := prod(to[j+1:])
		if below == 0 || sigma%below != 0 {
			continue
		}
		inner := sigma / below
		if to[j]%(inner*batch) != 0 {
			continue
		}
		return cut{dim: j, outer: to[j] / (inner * batch), inner: inner}, true
	}
	return cut{}, false
}

// place records op's plan and what its results are.
func (s *splitter) place(op *ir.Op, p plan) error {
	s.plans[op] = p
	switch p.state {
	case whole:
		for _, r := range op.Results {
			s.info[r] = valueInfo{state: whole}
		}
	case late:
		for _, r := range op.Results {
			s.info[r] = valueInfo{state: late, from: s.foldedFrom(op)}
		}
	case partial:
		for _, r := range op.Results {
			s.info[r] = valueInfo{state: partial, fold: p.fold, from: s.foldedFrom(op)}
		}
	case sliced:
		if p.axes.Flat {
			s.info[op.Results[0]] = valueInfo{state: sliced, cut: p.cut}
			return nil
		}
		for i, r := range op.Results {
			if p.loop < 0 {
				s.info[r] = valueInfo{state: local}
				continue
			}
			dim := slices.IndexFunc(p.axes.Results[i], func(x ir.Index) bool { return x.Loop == p.loop })
			kind := p.axes.Loops[p.loop].Kind
			switch {
			case dim >= 0:
				s.info[r] = valueInfo{state: sliced, cut: cut{dim: dim, outer: p.cut.outer, inner: p.cut.inner}}
			case kind.Folds():
				s.info[r] = valueInfo{state: partial, fold: kind, from: op}
			case p.perPart:
				s.info[r] = valueInfo{state: local}
			default:
				return fmt.Errorf("%s: microbatch: result %s of %s does not follow the batch its operands are cut along", loc(op), r.Ref(), op.Kind)
			}
		}
	}
	return nil
}

// foldedFrom names the op that folded the batch into one of op's
// operands, for messages.
func (s *splitter) foldedFrom(op *ir.Op) *ir.Op {
	for _, v := range op.Operands {
		if f := s.info[v].from; f != nil {
			return f
		}
	}
	return op
}

func types(vs []*ir.Value) []ir.Type {
	out := make([]ir.Type, len(vs))
	for i, v := range vs {
		out[i] = v.Type
	}
	return out
}

func prod(s []int64) int64 {
	p := int64(1)
	for _, v := range s {
		p *= v
	}
	return p
}
