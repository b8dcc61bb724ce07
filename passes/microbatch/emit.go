package microbatch

import (
	"fmt"
	"slices"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

// substitution is operand i of a whole or late op, to be read from v.
type substitution struct {
	op *ir.Op
	i  int
	v  *ir.Value
}

// cutKey is a whole value cut for slice k.
type cutKey struct {
	v *ir.Value
	c cut
	k int64
}

// emit builds the split step from the plans, and replaces f's body,
// results and batch arguments with it.
func (s *splitter) emit() error {
	f := s.f
	s.combined, s.needed, s.cuts = map[*ir.Value]*ir.Value{}, map[*ir.Value]bool{}, map[cutKey]*ir.Value{}
	for _, op := range f.Body {
		if s.plans[op].state == partial {
			continue // linear in its parts: reads them as they are
		}
		for _, v := range op.Operands {
			if s.info[v].state == partial {
				s.needed[v] = true
			}
		}
	}
	for _, r := range f.Results {
		switch s.info[r.Value].state {
		case partial:
			s.needed[r.Value] = true
		case local:
			return fmt.Errorf("%s: microbatch: result %s is each slice's own (statistics of its part of the batch), which cannot be returned for the whole batch", loc(r.Value.Def), r.Value.Ref())
		}
	}
	shardArgs := map[*ir.Value]*ir.Value{} // with ranks: each batch argument as one rank holds it
	if s.ranks > 0 {
		for _, a := range s.args {
			info := *a.Arg
			info.Attrs = a.Arg.Attrs.Clone()
			if info.Attrs == nil {
				info.Attrs = ir.Attrs{}
			}
			info.Attrs["shard"] = ir.IntAttr(0) // the rank's part of dimension 0
			na := &ir.Value{Name: a.Name, Type: a.Type, Index: a.Index, Offset: ir.NoOffset, Arg: &info}
			na.Type.Shape = append(ir.Shape{s.batch / s.ranks}, a.Type.Shape[1:]...)
			shardArgs[a] = na
		}
	}
	var results []*ir.Value
	var err error
	if s.inOrder() {
		results, err = s.emitInOrder(shardArgs)
	} else {
		results, err = s.emitSequential(shardArgs)
	}
	if err != nil {
		return err
	}
	for i, r := range f.Results {
		if !results[i].Type.Equal(r.Value.Type) {
			return fmt.Errorf("%s: microbatch: result %s comes out as %s across the slices, not %s", loc(r.Value.Def), r.Value.Ref(), results[i].Type, r.Value.Type)
		}
	}
	// f itself changes only once nothing can fail: the caller may keep it.
	for _, sb := range s.subst {
		sb.op.Operands[sb.i] = sb.v
	}
	for i := range f.Results {
		f.Results[i].Value = results[i]
	}
	for i, a := range f.Args {
		if na := shardArgs[a]; na != nil {
			f.Args[i] = na
		}
	}
	f.Body = s.body
	passes.RemoveDeadOps(f)
	return nil
}

// emitSequential runs the whole ops, then the slices one after another
// (on ranks, this rank's), folding the parts that are needed into running
// sums as each slice makes them, then the late ops on the folded values.
func (s *splitter) emitSequential(shardArgs map[*ir.Value]*ir.Value) ([]*ir.Value, error) {
	f := s.f
	var after []*ir.Op
	for _, op := range f.Body {
		switch s.plans[op].state {
		case whole:
			s.body = append(s.body, op)
		case late:
			after = append(after, op)
		}
	}
	used := map[*ir.Value]bool{}
	for _, op := range f.Body {
		for _, v := range op.Operands {
			used[v] = true
		}
	}
	parts := map[*ir.Value][]*ir.Value{} // sliced results, per slice
	var order []*ir.Value                // folded values, as their folds begin
	for k := int64(0); k < s.per; k++ {
		m := map[*ir.Value]*ir.Value{}
		for _, a := range s.args {
			v, err := s.sliceArg(a, shardArgs[a], k)
			if err != nil {
				return nil, err
			}
			m[a] = v
		}
		for _, op := range f.Body {
			if st := s.plans[op].state; st != sliced && st != partial {
				continue
			}
			res, err := s.copyOp(op, m, k)
			if err != nil {
				return nil, err
			}
			for i, r := range op.Results {
				v := res[i]
				m[r] = v
				if s.info[r].state == sliced && f.IsResult(r) {
					parts[r] = append(parts[r], v)
				}
				if !s.needed[r] {
					continue
				}
				if s.combined[r] == nil {
					s.combined[r] = v
					order = append(order, r)
					continue
				}
				if err := s.fold(r, v, k, used[r]); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, r := range order {
		if s.ranks > 0 {
			// The rank's folds over its slices, folded over the ranks.
			ar, err := s.allReduce(r, s.combined[r])
			if err != nil {
				return nil, err
			}
			s.combined[r] = ar
		}
		if err := s.average(r); err != nil {
			return nil, err
		}
	}
	for _, op := range after {
		for i, v := range op.Operands {
			if w, ok := s.combined[v]; ok {
				s.subst = append(s.subst, substitution{op, i, w})
			}
		}
		s.body = append(s.body, op)
	}
	results := make([]*ir.Value, len(f.Results))
	for i, r := range f.Results {
		v := r.Value
		switch s.info[v].state {
		case partial:
			results[i] = s.combined[v]
		case sliced:
			j, err := s.join(v, parts[v])
			if err != nil {
				return nil, err
			}
			results[i] = j
		default:
			results[i] = v
		}
	}
	return results, nil
}

// emitInOrder runs the step of one rank that holds one slice, op after
// op as the whole step orders them: a value folded over the batch is
// all-reduced where something first needs it whole.
func (s *splitter) emitInOrder(shardArgs map[*ir.Value]*ir.Value) ([]*ir.Value, error) {
	f := s.f
	m := map[*ir.Value]*ir.Value{}
	for _, a := range s.args {
		m[a] = shardArgs[a]
	}
	// Whole values the rank's copies read in its rows are cut where they
	// are made (before an in-place update can overwrite what they read).
	early := s.earlyCuts()
	cutEarly := func(at *ir.Op) error {
		for _, key := range early[at] {
			if _, err := s.cutWhole(key.v, key.c, 0); err != nil {
				return fmt.Errorf("%s: parallel: cutting %s for a rank: %v", loc(key.v.Def), key.v.Ref(), err)
			}
		}
		return nil
	}
	if err := cutEarly(nil); err != nil {
		return nil, err
	}
	// In-place updates run once the rank's backward is done (as DDP's
	// optimizer step does), so that the all-reduces of their gradients
	// overlap the rest of the backward instead of each holding up its
	// update.
	var updates []*ir.Op
	for _, op := range f.Body {
		if d := op.Def(); d != nil && len(d.Writes) > 0 {
			updates = append(updates, op)
			for i, v := range op.Operands {
				if s.info[v].state == partial {
					w, err := s.materialize(v, m)
					if err != nil {
						return nil, err
					}
					s.subst = append(s.subst, substitution{op, i, w})
				}
			}
			continue
		}
		switch s.plans[op].state {
		case sliced, partial:
			res, err := s.copyOp(op, m, 0)
			if err != nil {
				return nil, err
			}
			for i, r := range op.Results {
				m[r] = res[i]
				if s.needed[r] {
					// All-reduced once made, as DDP does: the exchange
					// overlaps what comes next.
					if _, err := s.materialize(r, m); err != nil {
						return nil, err
					}
				}
			}
			continue
		default:
			for i, v := range op.Operands {
				if s.info[v].state == partial {
					w, err := s.materialize(v, m)
					if err != nil {
						return nil, err
					}
					s.subst = append(s.subst, substitution{op, i, w})
				}
			}
			s.body = append(s.body, op)
		}
		if err := cutEarly(op); err != nil {
			return nil, err
		}
	}
	s.body = append(s.body, updates...)
	results := make([]*ir.Value, len(f.Results))
	for i, r := range f.Results {
		v := r.Value
		switch s.info[v].state {
		case partial:
			w, err := s.materialize(v, m)
			if err != nil {
				return nil, err
			}
			results[i] = w
		case sliced:
			j, err := s.join(v, []*ir.Value{m[v]})
			if err != nil {
				return nil, err
			}
			results[i] = j
		default:
			results[i] = v
		}
	}
	return results, nil
}

// materialize is the whole value of v, a fold over the batch, on every
// rank: its parts all-reduced, once.
func (s *splitter) materialize(v *ir.Value, m map[*ir.Value]*ir.Value) (*ir.Value, error) {
	if w := s.combined[v]; w != nil {
		return w, nil
	}
	w, err := s.allReduce(v, m[v])
	if err != nil {
		return nil, err
	}
	s.combined[v] = w
	if err := s.average(v); err != nil {
		return nil, err
	}
	return s.combined[v], nil
}

// average turns the sum of the n parts of r, an average over the batch
// each part took over its rows, into the whole batch's average.
func (s *splitter) average(r *ir.Value) error {
	if s.info[r].fold != ir.Averaged {
		return nil
	}
	inv, err := s.invN(r.Type.DType)
	if err != nil {
		return err
	}
	op, err := s.f.NewOp("mul", []*ir.Value{s.combined[r], inv}, nil, defLoc(r), r.Name+".mean")
	if err != nil {
		return fmt.Errorf("%s: microbatch: averaging %s over the slices: %v", loc(r.Def), r.Ref(), err)
	}
	s.body = append(s.body, op)
	s.combined[r] = op.Results[0]
	return nil
}

// allReduce folds part, the rank's part of r, over the ranks.
func (s *splitter) allReduce(r, part *ir.Value) (*ir.Value, error) {
	attrs := ir.Attrs{"size": ir.IntAttr(s.ranks)}
	switch s.info[r].fold {
	case ir.Maximum:
		attrs["op"] = ir.StringAttr("max")
	case ir.Minimum:
		attrs["op"] = ir.StringAttr("min")
	}
	ar, err := s.f.NewOp("all_reduce", []*ir.Value{part}, attrs, defLoc(r), r.Name+".allreduce")
	if err != nil {
		return nil, fmt.Errorf("%s: parallel: all-reducing %s: %v", loc(r.Def), r.Ref(), err)
	}
	s.body = append(s.body, ar)
	return ar.Results[0], nil
}

// fold joins slice k's part v of r to its running fold.
func (s *splitter) fold(r, v *ir.Value, k int64, used bool) error {
	sum := s.combined[r]
	if f := s.info[r].fold; (f == ir.Summed || f == ir.Averaged) && len(s.body) > 0 && s.body[len(s.body)-1] == v.Def {
		if acc := accumulateInto(s.f, v.Def, sum, used, r.Name+".acc"); acc != nil {
			// The product adds the running sum as it stores, over the
			// sum's buffer: no second gradient-sized buffer.
			s.body[len(s.body)-1] = acc
			s.record(acc, Origin{r.Def, k})
			s.combined[r] = acc.Results[0]
			return nil
		}
	}
	kind := map[ir.LoopKind]string{ir.Summed: "add", ir.Averaged: "add", ir.Maximum: "max", ir.Minimum: "min"}[s.info[r].fold]
	op, err := s.f.NewOp(kind, []*ir.Value{sum, v}, nil, r.Def.Loc, r.Name+".acc")
	if err != nil {
		return fmt.Errorf("%s: microbatch: folding %s over the slices: %v", loc(r.Def), r.Ref(), err)
	}
	s.body = append(s.body, op)
	s.record(op, Origin{r.Def, k})
	s.combined[r] = op.Results[0]
	return nil
}

// join puts the slices' rows of v back together: along the cut, and on
// ranks gathered from all of them.
func (s *splitter) join(v *ir.Value, ps []*ir.Value) (*ir.Value, error) {
	c := s.info[v].cut
	if c.outer != 1 && (len(ps) > 1 || s.ranks > 0) {
		return nil, fmt.Errorf("%s: microbatch: result %s holds the batch's rows inside dimension %d (under %d other rows each), which joining the slices cannot reassemble", loc(v.Def), v.Ref(), c.dim, c.outer)
	}
	out := ps[0]
	if len(ps) > 1 {
		op, err := s.f.NewOp("concat", ps, ir.Attrs{"axis": ir.IntAttr(int64(c.dim))}, v.Def.Loc, v.Name+".join")
		if err != nil {
			return nil, err
		}
		s.body = append(s.body, op)
		out = op.Results[0]
	}
	if s.ranks > 0 {
		op, err := s.f.NewOp("all_gather", []*ir.Value{out}, ir.Attrs{"axis": ir.IntAttr(int64(c.dim)), "size": ir.IntAttr(s.ranks)}, v.Def.Loc, v.Name+".gathered")
		if err != nil {
			return nil, err
		}
		s.body = append(s.body, op)
		out = op.Results[0]
	}
	return out, nil
}

// sliceArg is slice k of the batch argument a (on ranks, of the rank's
// part, ra).
func (s *splitter) sliceArg(a, ra *ir.Value, k int64) (*ir.Value, error) {
	src := a
	if s.ranks > 0 {
		src = ra
		if s.per == 1 {
			return ra, nil
		}
	}
	size := s.batch / s.n
	op, err := s.f.NewOp("slice", []*ir.Value{src}, ir.Attrs{
		"starts": ir.IntsAttr(k * size), "ends": ir.IntsAttr((k + 1) * size), "axes": ir.IntsAttr(0),
	}, ir.Location{}, fmt.Sprintf("%s.mb%d", a.Name, k))
	if err != nil {
		return nil, err
	}
	s.body = append(s.body, op)
	s.record(op, Origin{Slice: k})
	return op.Results[0], nil
}

// partShape is the shape of slice's part of a value of shape w cut at c.
func (s *splitter) partShape(w ir.Shape, c cut) ir.Shape {
	p := w.Clone()
	p[c.dim] /= s.n
	return p
}

// copyOp emits op's copy for slice k, reading the slice's values in m,
// and returns the copy's results.
func (s *splitter) copyOp(op *ir.Op, m map[*ir.Value]*ir.Value, k int64) ([]*ir.Value, error) {
	p := s.plans[op]
	d := op.Def()
	operands := slices.Clone(op.Operands)
	for j, v := range op.Operands {
		switch s.info[v].state {
		case sliced, local:
			operands[j] = m[v]
			continue
		case partial:
			if p.state == partial {
				operands[j] = m[v]
				continue
			}
			w, err := s.materialize(v, m) // in order on ranks only: classify refused the rest
			if err != nil {
				return nil, err
			}
			v = w // whole now, on every rank
		}
		operands[j] = v
		if p.axes.Flat && p.state == sliced {
			// A promoted view of a whole value: its rows of the operand.
			oc, ok := flatCut(p.cut, op.Results[0].Type.Shape, v.Type.Shape, s.batch)
			if !ok {
				return nil, fmt.Errorf("%s: microbatch: %s does not hold the batch's rows in one dimension", loc(op), v.Ref())
			}
			w, err := s.cutWhole(v, oc, k)
			if err != nil {
				return nil, fmt.Errorf("%s: microbatch: cutting %s for a slice: %v", loc(op), v.Ref(), err)
			}
			operands[j] = w
			continue
		}
		if p.loop < 0 {
			continue
		}
		for e, x := range p.axes.Operands[j] {
			if x.Loop == p.loop {
				w, err := s.cutWhole(v, cut{dim: e, outer: p.cut.outer, inner: p.cut.inner}, k)
				if err != nil {
					return nil, fmt.Errorf("%s: microbatch: cutting %s for a slice: %v", loc(op), v.Ref(), err)
				}
				operands[j] = w
				break
			}
		}
	}
	want := make([]ir.Type, len(op.Results))
	for i, r := range op.Results {
		want[i] = r.Type
		if vi := s.info[r]; vi.state == sliced {
			want[i].Shape = s.partShape(r.Type.Shape, vi.cut)
		}
	}
	attrs := op.Attrs.Clone()
	if attrs == nil {
		attrs = ir.Attrs{}
	}
	if d.ShapeAttr != "" && len(want) > 0 {
		attrs[d.ShapeAttr] = ir.IntsAttr(want[0].Shape...)
	}
	if p.loop >= 0 && ir.DrawsRandom(op) {
		res, ok, err := s.randomCopy(op, operands, attrs, want, k)
		if ok || err != nil {
			return res, err
		}
	}
	c, err := s.build(op, operands, attrs, want, k)
	if err != nil {
		return nil, err
	}
	return slices.Clone(c.Results), nil
}

// build emits op's copy with the given operands and attributes, whose
// results must have the types want.
func (s *splitter) build(op *ir.Op, operands []*ir.Value, attrs ir.Attrs, want []ir.Type, k int64) (*ir.Op, error) {
	got, err := op.Def().InferTypes(types(operands), attrs)
	if err == nil {
		for i := range got {
			if i >= len(want) || !got[i].Equal(want[i]) {
				err = fmt.Errorf("result %d comes out %s, not %s", i, got[i], want[i])
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: microbatch: the copy of %s (%s) for a slice does not fit its record's axes: %v", loc(op), op.Results[0].Ref(), op.Kind, err)
	}
	c := &ir.Op{Kind: op.Kind, Operands: operands, Attrs: attrs, Loc: op.Loc, Pos: op.Pos}
	for i, t := range got {
		name := s.f.UniqueName(fmt.Sprintf("%s.mb%d", op.Results[i].Name, k))
		c.Results = append(c.Results, &ir.Value{Name: name, Type: t, Def: c, Index: i, Offset: ir.NoOffset})
	}
	s.body = append(s.body, c)
	s.record(c, Origin{op, k})
	return c, nil
}

// invN is the constant 1/n of dtype d, made once before the slices.
func (s *splitter) invN(d ir.DType) (*ir.Value, error) {
	if s.inv != nil && s.invType == d {
		return s.inv, nil
	}
	t := ir.Type{DType: d, Shape: ir.Shape{}}
	c, err := s.f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: t, Floats: []float64{ir.RoundTo(d, 1/float64(s.n))}})}, ir.Location{}, "inv_n")
	if err != nil {
		return nil, err
	}
	s.body = append([]*ir.Op{c}, s.body...)
	s.inv, s.invType = c.Results[0], d
	return s.inv, nil
}

// cutWhole is slice k's part of v, a whole value of the step, cut at c:
// its producer copied for the slice when that splits along the cut (a
// loss seed expanded to the batch's shape), else v's rows sliced (on
// ranks, first taken by a reduce_scatter by max over the ranks'
// identical copies: exact).
func (s *splitter) cutWhole(v *ir.Value, c cut, k int64) (*ir.Value, error) {
	key := cutKey{v, c, k}
	if w := s.cuts[key]; w != nil {
		return w, nil
	}
	w, ok, err := s.reemit(v, c, k)
	if err != nil {
		return nil, err
	}
	if !ok {
		w, err = s.rows(v, c, k)
		if err != nil {
			return nil, err
		}
	}
	s.cuts[key] = w
	return w, nil
}

// reemit copies v's producer for slice k when it is whole and pure and
// its axes cut along c: the slices' copies do the whole op's work between
// them (a loss seed expanded to the batch's shape, and what the backward
// computes from it before it meets the batch's data).
func (s *splitter) reemit(v *ir.Value, c cut, k int64) (*ir.Value, bool, error) {
	cuts, ok := s.reemitCuts(v, c)
	if !ok {
		return nil, false, nil
	}
	p := v.Def
	d := p.Def()
	operands := slices.Clone(p.Operands)
	for j, w := range operands {
		if x := s.combined[w]; x != nil && s.info[w].state == partial {
			operands[j] = x // all-reduced where p runs in order
		}
	}
	for _, oc := range cuts {
		w, err := s.cutWhole(operands[oc.j], oc.c, k)
		if err != nil {
			return nil, false, err
		}
		operands[oc.j] = w
	}
	want := make([]ir.Type, len(p.Results))
	for i, r := range p.Results {
		want[i] = r.Type
		want[i].Shape = r.Type.Shape.Clone()
	}
	if ax, ok := ir.OpAxes(p); ok && !ax.Flat {
		l := ax.Results[v.Index][c.dim].Loop
		for i := range p.Results {
			for dim, x := range ax.Results[i] {
				if x.Loop == l {
					want[i].Shape[dim] /= s.n
				}
			}
		}
	} else {
		want[0].Shape = s.partShape(v.Type.Shape, c)
	}
	attrs := p.Attrs.Clone()
	if attrs == nil {
		attrs = ir.Attrs{}
	}
	if d.ShapeAttr != "" {
		attrs[d.ShapeAttr] = ir.IntsAttr(want[0].Shape...)
	}
	cp, err := s.build(p, operands, attrs, want, k)
	if err != nil {
		return nil, false, err
	}
	return cp.Results[v.Index], true, nil
}

// reemitCuts says whether v's producer can be copied for a slice cut at
// c (reemit), and how each of its operands it reads along the cut must
// be cut: the producer is whole and pure; a view that keeps the
// row-major order holds the batch's digits within one dimension of its
// operand; otherwise the loop that indexes the cut dimension is not
// mixed, read through no arithmetic, and indexed by every result.
func (s *splitter) reemitCuts(v *ir.Value, c cut) ([]operandCut, bool) {
	p := v.Def
	if p == nil || s.plans[p].state != whole {
		return nil, false
	}
	d := p.Def()
	if d == nil || d.Impure || ir.DrawsRandom(p) {
		return nil, false
	}
	ax, ok := ir.OpAxes(p)
	if !ok {
		return nil, false
	}
	if ax.Flat {
		oc, ok := flatCut(c, v.Type.Shape, p.Operands[0].Type.Shape, s.batch)
		return []operandCut{{0, oc}}, ok
	}
	l := ax.Results[v.Index][c.dim].Loop
	if l < 0 || ax.Loops[l].Kind == ir.Mixed {
		return nil, false
	}
	for _, maps := range [][][]ir.Index{ax.Operands, ax.Results} {
		for _, mp := range maps {
			for _, x := range mp {
				if x.Loop < 0 && x.Reads(l) {
					return nil, false
				}
			}
		}
	}
	for _, mp := range ax.Results {
		if !slices.ContainsFunc(mp, func(x ir.Index) bool { return x.Loop == l }) {
			return nil, false // a result that folds the loop
		}
	}
	var cuts []operandCut
	for j, mp := range ax.Operands {
		for e, x := range mp {
			if x.Loop == l {
				cuts = append(cuts, operandCut{j, cut{dim: e, outer: c.outer, inner: c.inner}})
				break
			}
		}
	}
	return cuts, true
}

// operandCut is operand j of an op, cut at c.
type operandCut struct {
	j int
	c cut
}

// earlyCuts lists, by the op that makes each (nil: an argument), the
// whole values that the copies of the ranks' ops will read cut, with
// their cuts: the one slice of an in-order step cuts them where they are
// made.
func (s *splitter) earlyCuts() map[*ir.Op][]cutKey {
	early := map[*ir.Op][]cutKey{}
	seen := map[cutKey]bool{}
	var demand func(v *ir.Value, c cut)
	demand = func(v *ir.Value, c cut) {
		key := cutKey{v, c, 0}
		if seen[key] {
			return
		}
		seen[key] = true
		if cuts, ok := s.reemitCuts(v, c); ok {
			for _, oc := range cuts {
				demand(v.Def.Operands[oc.j], oc.c)
			}
		}
		early[v.Def] = append(early[v.Def], key)
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
	return early
}

// rows is slice k's rows of v, a tensor of the whole batch's rows (every
// rank's identical copy), cut at c.
func (s *splitter) rows(v *ir.Value, c cut, k int64) (*ir.Value, error) {
	if s.ranks > 0 {
		if c.outer != 1 {
			return nil, fmt.Errorf("the batch's rows of %s are not one block of dimension %d", v.Ref(), c.dim)
		}
		key := cutKey{v, c, -1}
		rv := s.cuts[key]
		if rv == nil {
			rs, err := s.f.NewOp("reduce_scatter", []*ir.Value{v}, ir.Attrs{"size": ir.IntAttr(s.ranks), "axis": ir.IntAttr(int64(c.dim)), "op": ir.StringAttr("max")}, defLoc(v), v.Name+".rows")
			if err != nil {
				return nil, err
			}
			s.body = append(s.body, rs)
			rv = rs.Results[0]
			s.cuts[key] = rv
		}
		if s.per == 1 {
			return rv, nil
		}
		v = rv
	}
	return s.sliceRows(v, c, k)
}

// sliceRows slices slice k's rows out of v (of the slices this function
// runs) along c: one slice op when they are a block, else through a
// reshape that puts the batch's digits in a dimension of their own.
func (s *splitter) sliceRows(v *ir.Value, c cut, k int64) (*ir.Value, error) {
	sh := v.Type.Shape
	block := sh[c.dim] / c.outer / s.per // the slice's rows, times inner
	emit := func(kind string, in *ir.Value, attrs ir.Attrs, name string) (*ir.Value, error) {
		op, err := s.f.NewOp(kind, []*ir.Value{in}, attrs, defLoc(v), name)
		if err != nil {
			return nil, err
		}
		s.body = append(s.body, op)
		s.record(op, Origin{v.Def, k})
		return op.Results[0], nil
	}
	name := fmt.Sprintf("%s.mb%d", v.Name, k)
	if c.outer == 1 {
		return emit("slice", v, ir.Attrs{"starts": ir.IntsAttr(k * block), "ends": ir.IntsAttr((k + 1) * block), "axes": ir.IntsAttr(int64(c.dim))}, name)
	}
	split := append(append(sh[:c.dim:c.dim], c.outer, sh[c.dim]/c.outer), sh[c.dim+1:]...)
	r, err := emit("reshape", v, ir.Attrs{"shape": ir.IntsAttr(split...)}, name+".digits")
	if err != nil {
		return nil, err
	}
	r, err = emit("slice", r, ir.Attrs{"starts": ir.IntsAttr(k * block), "ends": ir.IntsAttr((k + 1) * block), "axes": ir.IntsAttr(int64(c.dim + 1))}, name+".part")
	if err != nil {
		return nil, err
	}
	back := sh.Clone()
	back[c.dim] = c.outer * block
	return emit("reshape", r, ir.Attrs{"shape": ir.IntsAttr(back...)}, name)
}

// randomCopy is the copy for slice k of op, which draws from the
// counter-based generator, drawing what the whole op draws for the
// slice's elements: at an offset when they are a run of the whole's
// (one device), else the whole tensor's numbers drawn (a dropout of
// ones) and the slice's rows of them taken, which multiply the slice's
// operand. ok is false when op's copy draws as it is.
func (s *splitter) randomCopy(op *ir.Op, operands []*ir.Value, attrs ir.Attrs, want []ir.Type, k int64) ([]*ir.Value, bool, error) {
	p := s.plans[op]
	r0 := op.Results[0]
	c := s.info[r0].cut
	before := prod(r0.Type.Shape[:c.dim])
	run := before == 1 && c.outer == 1
	local := prod(want[0].Shape)
	switch {
	case run:
		// The slice's numbers are a run of the whole's: at its offset,
		// and on ranks past the rows of the ranks before it (unless
		// every rank may draw as rank 0, allowed by name).
		attrs["offset"] = ir.IntAttr(op.Attr().Int("offset") + k*local)
		if s.ranks > 0 && !s.opts.PerRankDropout {
			attrs["rank_offset"] = ir.IntAttr(s.per * local)
			attrs["rank_size"] = ir.IntAttr(s.ranks)
		}
		return nil, false, nil
	case s.ranks > 0 && s.opts.PerRankDropout:
		return nil, false, fmt.Errorf("%s: microbatch: %s (%s) draws numbers for rows that are not a run of its result", loc(op), r0.Ref(), op.Kind)
	}
	if len(op.Operands) != 1 || p.axes.Operands[0][c.dim].Loop != p.loop {
		return nil, false, fmt.Errorf("%s: microbatch: %s (%s) cannot draw the whole batch's numbers for a slice", loc(op), r0.Ref(), op.Kind)
	}
	for i := 1; i < len(op.Results); i++ {
		if s.read(op.Results[i]) {
			return nil, false, fmt.Errorf("%s: microbatch: the mask %s of %s is read, which a slice drawing the whole batch's mask does not make", loc(op), op.Results[i].Ref(), op.Kind)
		}
	}
	x := op.Operands[0]
	emit := func(kind string, in []*ir.Value, a ir.Attrs, name string) (*ir.Value, error) {
		o, err := s.f.NewOp(kind, in, a, op.Loc, name)
		if err != nil {
			return nil, err
		}
		s.body = append(s.body, o)
		s.record(o, Origin{op, k})
		return o.Results[0], nil
	}
	name := fmt.Sprintf("%s.mb%d.mask", r0.Name, k)
	one, err := emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: ir.Type{DType: x.Type.DType, Shape: ir.Shape{}}, Floats: []float64{1}})}, name+".one")
	if err != nil {
		return nil, false, err
	}
	ones, err := emit("expand", []*ir.Value{one}, ir.Attrs{"shape": ir.IntsAttr(x.Type.Shape...)}, name+".ones")
	if err != nil {
		return nil, false, err
	}
	wa := op.Attrs.Clone()
	scale, err := emit(op.Kind, []*ir.Value{ones}, wa, name+".whole")
	if err != nil {
		return nil, false, err
	}
	part, err := s.rows(scale, c, k)
	if err != nil {
		return nil, false, fmt.Errorf("%s: microbatch: the slice's mask of %s: %v", loc(op), r0.Ref(), err)
	}
	y, err := emit("mul", []*ir.Value{operands[0], part}, nil, fmt.Sprintf("%s.mb%d", r0.Name, k))
	if err != nil {
		return nil, false, err
	}
	res := make([]*ir.Value, len(op.Results))
	res[0] = y
	return res, true, nil
}

// read reports whether some op of the whole step reads v.
func (s *splitter) read(v *ir.Value) bool {
	for _, op := range s.f.Body {
		if slices.Contains(op.Operands, v) {
			return true
		}
	}
	return s.f.IsResult(v)
}

func (s *splitter) record(op *ir.Op, o Origin) {
	if s.opts.Trace != nil {
		s.opts.Trace[op] = o
	}
}

// defLoc is the location of v's producer (none for an argument).
func defLoc(v *ir.Value) ir.Location {
	if v.Def == nil {
		return ir.Location{}
	}
	return v.Def.Loc
}
