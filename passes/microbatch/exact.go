package microbatch

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

// SplitExact is Split keeping the statistics of the whole batch, so that
// the split step computes what the whole-batch step computes even where
// rows read values folded over the whole batch (batch normalisation in
// training mode, a mean over the batch subtracted back). On error f is
// unchanged.
//
// Steps that need no such statistic split as Split splits them. Others
// are first written as the SPMD step of n ranks with one slice each,
// batch normalisations written out as sums over the batch
// (DecomposeBatchNorm; with opts.PerSliceBN, which the user allows by
// name, they keep each slice's statistics and only the other statistics,
// such as a loss's count of labels not ignored, stay whole), so that
// Shard all-reduces every statistic where rows first read it; then that step runs on one device in phases:
// phase p computes, slice after slice, what the all-reduces of depth p
// read (those that wait for p−1 others), summing (or taking the maximum)
// over the slices where the ranks would all-reduce and joining where they
// would all-gather. A phase recomputes each slice from its inputs: what
// earlier phases computed for a slice is not kept, so one slice's values
// are live at a time. Each batch normalisation adds three phases (its
// mean, its variance about the mean, and the two sums of its gradient);
// the last phase is the ordinary microbatched step. Stats.Phases counts
// the phases.
func SplitExact(f *ir.Func, n int, opts Options) (Stats, error) {
	st, err := SplitWith(f, n, opts)
	var wb *WholeBatchError
	if err == nil || !errors.As(err, &wb) {
		return st, err
	}
	// The phases are cut at the collectives: a step that has its own
	// (one rank's of a parallel step) would have them taken for its
	// slices' sums.
	for _, op := range f.Body {
		if ir.IsCollective(op.Kind) || ir.IsPointToPoint(op.Kind) {
			return Stats{}, fmt.Errorf("%s: microbatch{exact-bn}: @%s already exchanges tensors between ranks (%s); split the one-device step, then partition it", loc(op), f.Name, op.Kind)
		}
	}
	g := f.Clone()
	if !opts.PerSliceBN {
		if err := DecomposeBatchNorm(g); err != nil {
			return Stats{}, fmt.Errorf("microbatch{exact-bn}: %v", err)
		}
	}
	st, err = split(g, n, n, Options{Trace: opts.Trace, PerSliceBN: opts.PerSliceBN})
	if err != nil {
		return st, err
	}
	whole := map[*ir.Value]*ir.Value{} // a rank's batch argument → the whole argument
	for i, a := range g.Args {
		if !a.Type.Equal(f.Args[i].Type) {
			whole[a] = f.Args[i]
		}
	}
	q := &sequencer{g: g, n: int64(n), whole: whole}
	body, err := q.sequence()
	if err != nil {
		return st, err
	}
	for i, a := range g.Args {
		if w := whole[a]; w != nil {
			g.Args[i] = w
		}
	}
	g.Body = body
	passes.RemoveDeadOps(g)
	*f = *g
	st.Phases, st.Kept = q.phases, q.maxKept
	return st, nil
}

// sequencer runs the SPMD step g of n ranks, one per slice, on one
// device, in phases separated by the all-reduces and all-gathers.
type sequencer struct {
	g      *ir.Func
	n      int64
	whole  map[*ir.Value]*ir.Value // the rank's batch arguments → whole ones
	phases int

	kind     map[*ir.Op]int            // 0 whole, 1 per slice, 2 collective, 3 after the phases
	body     []*ir.Op                  // what the phases emitted so far
	index    map[*ir.Op]int            // where each copied op lies in body
	computed map[*ir.Value]bool        // values an earlier phase computed per slice
	kept     map[*ir.Value][]*ir.Value // per slice, what the last phase kept for this one
	maxKept  int64                     // the most bytes kept into and out of one phase
}

func (q *sequencer) sequence() ([]*ir.Op, error) {
	g := q.g
	perSlice := map[*ir.Value]bool{} // values that differ between the ranks
	level := map[*ir.Value]int{}     // the deepest collective a value waits for
	depth := map[*ir.Op]int{}        // a collective's phase
	late := map[*ir.Value]bool{}     // what in-place updates write, and what reads it
	for a := range q.whole {
		perSlice[a] = true
	}
	kind := map[*ir.Op]int{} // 0 whole, 1 per slice, 2 collective, 3 after the phases
	for _, op := range g.Body {
		// A random op drawing a rank's numbers differs between the ranks
		// whatever it reads.
		lv, per, after := 0, op.Attrs.Int("rank_offset", 0) != 0, len(op.Def().Writes) > 0
		for _, v := range op.Operands {
			lv = max(lv, level[v])
			per = per || perSlice[v]
			after = after || late[v]
		}
		switch {
		case op.Kind == "reduce_scatter" && !per:
			// A rank's rows of a tensor every rank holds whole: the
			// slice's rows.
			kind[op] = 1
		case ir.IsCollective(op.Kind):
			if err := q.checkGroup(op); err != nil {
				return nil, err
			}
			depth[op] = lv + 1
			q.phases = max(q.phases, lv+1)
			lv++
			kind[op] = 2
		case after && per:
			return nil, fmt.Errorf("%s: microbatch{exact-bn}: %s writes in place over a slice's value", loc(op), op.Kind)
		case after:
			kind[op] = 3
		case per:
			kind[op] = 1
		}
		for _, r := range op.Results {
			level[r] = lv
			perSlice[r] = kind[op] == 1
			late[r] = kind[op] == 3
		}
	}
	q.index, q.computed = map[*ir.Op]int{}, map[*ir.Value]bool{}
	done := map[*ir.Op]bool{}
	// emitWhole adds the ops that run once and wait for fewer than p phases.
	emitWhole := func(p int) {
		for _, op := range g.Body {
			if kind[op] != 0 || done[op] {
				continue
			}
			lv := 0
			for _, v := range op.Operands {
				lv = max(lv, level[v])
			}
			if lv < p {
				done[op] = true
				q.body = append(q.body, op)
			}
		}
	}
	groups := make([][]*ir.Op, q.phases+2) // the collectives of each phase
	for _, op := range g.Body {
		if kind[op] == 2 {
			groups[depth[op]] = append(groups[depth[op]], op)
		}
	}
	q.kind, q.kept = kind, map[*ir.Value][]*ir.Value{}
	for p := 1; p <= q.phases; p++ {
		emitWhole(p)
		if err := q.phase(groups[p], groups[p+1]); err != nil {
			return nil, err
		}
	}
	emitWhole(q.phases + 1)
	for _, op := range g.Body {
		if kind[op] == 3 {
			q.body = append(q.body, op)
		}
	}
	return q.body, nil
}

// checkGroup accepts the collectives Shard and SyncBatchNorm make: sums
// and joins over all n ranks.
func (q *sequencer) checkGroup(op *ir.Op) error {
	ok := op.Attrs.Int("size", 0) == q.n && op.Attrs.Int("stride", 1) == 1
	switch op.Kind {
	case "all_reduce", "all_gather":
	default:
		ok = false
	}
	if !ok {
		return fmt.Errorf("%s: microbatch{exact-bn}: %s %s is not a fold or join over the %d slices", loc(op), op.Kind, op.Results[0].Ref(), q.n)
	}
	return nil
}

// cone is what computing colls takes: the per-slice ops to copy (those
// with a result that is needed and not in have), and every value needed,
// with its count of readers among the ops and colls.
func (q *sequencer) cone(colls []*ir.Op, have map[*ir.Value][]*ir.Value) (map[*ir.Op]bool, map[*ir.Value]int) {
	need := map[*ir.Value]int{}
	for _, c := range colls {
		need[c.Operands[0]]++
	}
	ops := map[*ir.Op]bool{}
	for i := len(q.g.Body) - 1; i >= 0; i-- {
		op := q.g.Body[i]
		if q.kind[op] != 1 || !slices.ContainsFunc(op.Results, func(r *ir.Value) bool { return need[r] > 0 && have[r] == nil }) {
			continue
		}
		ops[op] = true
		for _, v := range op.Operands {
			need[v]++
		}
	}
	return ops, need
}

// phase computes the collectives colls, whose operands wait only for
// earlier phases: slice after slice, the per-slice ops they read are
// copied (starting from the values the last phase kept) and their
// results summed or gathered. Of what it computed or kept, it keeps for
// the next phase, whose collectives are next, the values that phase
// reads and would otherwise compute again: the frontier between the two,
// one value of the whole batch each, in place of recomputing from the
// inputs.
func (q *sequencer) phase(colls, next []*ir.Op) error {
	g := q.g
	cone, need := q.cone(colls, q.kept)
	made := map[*ir.Value][]*ir.Value{} // this phase's per-slice values
	absorbed := map[*ir.Value]bool{}    // values an accumulating gemm wrote over its running sum
	sums := make([]*ir.Value, len(colls))
	parts := make([][]*ir.Value, len(colls))
	for k := int64(0); k < q.n; k++ {
		m := map[*ir.Value]*ir.Value{}
		for v, copies := range q.kept {
			m[v] = copies[k]
		}
		for _, a := range g.Args {
			w := q.whole[a]
			if w == nil || need[a] == 0 {
				continue
			}
			size := a.Type.Shape[0]
			sl, err := g.NewOp("slice", []*ir.Value{w}, ir.Attrs{
				"starts": ir.IntsAttr(k * size), "ends": ir.IntsAttr((k + 1) * size), "axes": ir.IntsAttr(0),
			}, ir.Location{}, fmt.Sprintf("%s.mb%d", w.Name, k))
			if err != nil {
				return err
			}
			q.emit(q.recomputed(sl, a))
			m[a] = sl.Results[0]
			made[a] = append(made[a], sl.Results[0])
		}
		for _, op := range g.Body {
			if !cone[op] {
				continue
			}
			q.emit(q.recomputed(q.copy(op, m, k), op.Results...))
			for _, r := range op.Results {
				made[r] = append(made[r], m[r])
			}
		}
		for i, c := range colls {
			v := c.Operands[0]
			if w, ok := m[v]; ok {
				v = w
			}
			if c.Kind == "all_gather" {
				parts[i] = append(parts[i], v)
				continue
			}
			if sums[i] == nil {
				sums[i] = v
				continue
			}
			name := c.Results[0].Name + ".acc"
			if acc := accumulateInto(g, v.Def, sums[i], need[c.Operands[0]] > 1, name); acc != nil && q.index[v.Def] == len(q.body)-1 && c.Attrs.String("op", "sum") == "sum" {
				q.body[len(q.body)-1] = acc
				sums[i] = acc.Results[0]
				absorbed[c.Operands[0]] = true
				continue
			}
			fold := map[string]string{"sum": "add", "max": "max", "min": "min"}[c.Attrs.String("op", "sum")]
			add, err := g.NewOp(fold, []*ir.Value{sums[i], v}, nil, c.Loc, name)
			if err != nil {
				return fmt.Errorf("%s: microbatch{exact-bn}: folding %s: %v", loc(c), c.Results[0].Ref(), err)
			}
			q.emit(add)
			sums[i] = add.Results[0]
		}
	}
	for v := range need {
		q.computed[v] = true
	}
	for i, c := range colls {
		v := sums[i]
		if c.Kind == "all_gather" {
			join, err := g.NewOp("concat", parts[i], ir.Attrs{"axis": c.Attrs["axis"]}, c.Loc, c.Results[0].Name)
			if err != nil {
				return fmt.Errorf("%s: microbatch{exact-bn}: joining %s: %v", loc(c), c.Results[0].Ref(), err)
			}
			q.emit(join)
			v = join.Results[0]
		}
		g.ReplaceUses(c.Results[0], v)
		for j := range g.Results {
			if g.Results[j].Value == c.Results[0] {
				g.Results[j].Value = v
			}
		}
	}
	have := map[*ir.Value][]*ir.Value{}
	for v, copies := range q.kept {
		have[v] = copies
	}
	for v, copies := range made {
		if !absorbed[v] && q.whole[v] == nil { // a batch argument is sliced again, not kept
			have[v] = copies
		}
	}
	_, reads := q.cone(next, have)
	in := q.keptBytes()
	q.kept = map[*ir.Value][]*ir.Value{}
	for v := range reads {
		if have[v] != nil {
			q.kept[v] = have[v]
		}
	}
	q.maxKept = max(q.maxKept, in+q.keptBytes())
	return nil
}

// recomputed marks op, the copy that computes vs for a slice, as a
// recomputation when an earlier phase computed one of them: CSE keeps it.
func (q *sequencer) recomputed(op *ir.Op, vs ...*ir.Value) *ir.Op {
	if slices.ContainsFunc(vs, func(v *ir.Value) bool { return q.computed[v] }) {
		if op.Attrs == nil {
			op.Attrs = ir.Attrs{}
		}
		op.Attrs["recomputed"] = ir.BoolAttr(true)
	}
	return op
}

// keptBytes is the size of what the last phase kept, over all slices.
func (q *sequencer) keptBytes() int64 {
	var b int64
	for v := range q.kept {
		b += v.Type.SizeBytes() * q.n
	}
	return b
}

func (q *sequencer) emit(op *ir.Op) {
	q.index[op] = len(q.body)
	q.body = append(q.body, op)
}

// copy is op for slice k, reading m's values (and the rest as they are);
// a rank's rows of a tensor every rank holds whole (a reduce_scatter of
// identical tensors) are the slice's rows of it.
func (q *sequencer) copy(op *ir.Op, m map[*ir.Value]*ir.Value, k int64) *ir.Op {
	c := &ir.Op{Kind: op.Kind, Operands: slices.Clone(op.Operands), Attrs: op.Attrs.Clone(), Loc: op.Loc, Pos: op.Pos}
	if c.Attrs == nil {
		c.Attrs = ir.Attrs{}
	}
	for i, v := range c.Operands {
		if w, ok := m[v]; ok {
			c.Operands[i] = w
		}
	}
	if per := c.Attrs.Int("rank_offset", 0); per != 0 {
		// A random op of rank k: slice k's numbers, at rank k's offset.
		c.Attrs["offset"] = ir.IntAttr(ir.RandomOffset(op.Attr(), k))
		for _, a := range []string{"rank_offset", "rank_size", "rank_stride"} {
			delete(c.Attrs, a)
		}
	}
	if op.Kind == "reduce_scatter" {
		ax := op.Attrs.Int("axis", 0)
		size := op.Results[0].Type.Shape[ax]
		c.Kind = "slice"
		c.Attrs = ir.Attrs{"starts": ir.IntsAttr(k * size), "ends": ir.IntsAttr((k + 1) * size), "axes": ir.IntsAttr(ax)}
	}
	for i, r := range op.Results {
		base := strings.TrimSuffix(r.Name, ".mb0") // Shard's name for the rank's copy
		nr := &ir.Value{Name: q.g.UniqueName(fmt.Sprintf("%s.mb%d", base, k)), Type: r.Type, Def: c, Index: i, Offset: ir.NoOffset}
		c.Results = append(c.Results, nr)
		m[r] = nr
	}
	return c
}
