package parallel

import (
	"fmt"
	"slices"

	"github.com/kiln-compiler/kiln/ir"
)

// shardState applies ZeRO stage zero (1, 2 or 3) to the data-parallel step
// f of n ranks: every parameter that an optimizer update writes, and the
// optimizer state it writes beside it, is held by each rank as its part
// of its first dimension that n divides (the arguments carry shard = d); the update reads the
// rank's part of the gradient, which a reduce_scatter makes in place of
// the all_reduce; and the parameter's other readers read it all-gathered.
// With zero = 2 one gather before the first reader serves all of them;
// with zero = 3 the forward and the backward (the readers that depend on
// the loss seed) each gather it just before their first read, so the
// whole parameter is not live between them. With zero = 1 the gradients
// stay whole until the backward ends: the reduce_scatters and the updates
// move after it. Parameters with no dimension
// that n divides stay whole, updated alike on every rank. It returns how
// many parameters it sharded.
func shardState(f *ir.Func, n, stride int64, zero int) (int, error) {
	bwd := backwardOps(f)
	producer := map[*ir.Value]*ir.Op{}
	for _, op := range f.Body {
		for _, r := range op.Results {
			producer[r] = op
		}
	}
	isResult := map[*ir.Value]bool{}
	for _, r := range f.Results {
		isResult[r.Value] = true
	}
	sharded := 0
	var gathers []gather
	moved := map[*ir.Op]bool{} // the reduce_scatters made
	for _, upd := range f.Body {
		d := upd.Def()
		if d == nil || len(d.Writes) == 0 || d.Writes[0] != 0 || len(upd.Operands) < 2 {
			continue
		}
		p, g := upd.Operands[0], upd.Operands[1]
		if p.Arg == nil || p.Arg.Kind != ir.ArgParam {
			continue
		}
		dim := slices.IndexFunc(p.Type.Shape, func(e int64) bool { return e%n == 0 })
		if dim < 0 {
			continue
		}
		ar := producer[g]
		if ar == nil || ar.Kind != "all_reduce" || ar.Attr().Int("size") != n || ar.Attr().Int("stride") != stride || isResult[g] || uses(f, g) > 1 {
			continue // the whole gradient is needed elsewhere: keep it
		}
		// The rank's part of the gradient, summed over the ranks.
		rs, err := f.NewOp("reduce_scatter", ar.Operands, withAxis(groupAttrs(n, stride), dim), ar.Loc, g.Name+".part")
		if err != nil {
			return sharded, err
		}
		f.Body[slices.Index(f.Body, ar)] = rs
		moved[rs] = true
		upd.Operands[1] = rs.Results[0]
		// The parameter and the state the update writes, held in parts.
		parts := map[*ir.Value]*ir.Value{}
		for _, k := range d.Writes {
			a := upd.Operands[k]
			if a.Arg == nil || !a.Type.Equal(p.Type) {
				return sharded, fmt.Errorf("%s updates %s, which is not an argument shaped like %s", upd.Kind, a.Ref(), p.Ref())
			}
			part := shardArg(f, a, ir.ShardLevel{Dim: int64(dim), Size: n, Stride: stride})
			parts[a] = part
			upd.Operands[k] = part
		}
		// The parameter's other readers read it gathered.
		gathers = append(gathers, gather{whole: p, part: parts[p], dim: dim})
		sharded++
	}
	for _, gt := range gathers {
		if err := gt.place(f, n, stride, zero, bwd); err != nil {
			return sharded, err
		}
	}
	if zero == 1 {
		stage1(f, moved)
	}
	return sharded, nil
}

// stage1 moves the reduce_scatters in moved, and the updates that read
// them, after everything else, in their order: ZeRO-1 keeps every whole
// gradient until the backward ends, then reduces them and steps.
func stage1(f *ir.Func, moved map[*ir.Op]bool) {
	reads := func(op *ir.Op) bool {
		for _, x := range op.Operands {
			if x.Def != nil && moved[x.Def] {
				return true
			}
		}
		return false
	}
	var rest, scatters, updates []*ir.Op
	for _, op := range f.Body {
		switch {
		case moved[op]:
			scatters = append(scatters, op)
		case reads(op):
			updates = append(updates, op)
		default:
			rest = append(rest, op)
		}
	}
	// An argument the moved updates read (the step count) is overwritten
	// after them.
	var writes []*ir.Op
	rest = slices.DeleteFunc(rest, func(op *ir.Op) bool {
		for _, u := range updates {
			for _, x := range u.Operands {
				if x.Arg != nil && ir.Overwrites(op, x) && !slices.Contains(u.Def().Writes, slices.Index(u.Operands, x)) {
					writes = append(writes, op)
					return true
				}
			}
		}
		return false
	})
	f.Body = append(append(append(rest, scatters...), updates...), writes...)
}

// gather replaces the readers of a sharded parameter's whole value.
type gather struct {
	whole, part *ir.Value
	dim         int
}

func (gt gather) place(f *ir.Func, n, stride int64, zero int, bwd map[*ir.Op]bool) error {
	var readers []int
	for i, op := range f.Body {
		if slices.Contains(op.Operands, gt.whole) {
			readers = append(readers, i)
		}
	}
	if len(readers) == 0 {
		return nil
	}
	// Groups of readers that share one gather: all of them (zero = 2), or
	// the forward's and the backward's (zero = 3).
	groups := [][]int{readers}
	if zero == 3 {
		var fwd, back []int
		for _, i := range readers {
			if bwd[f.Body[i]] {
				back = append(back, i)
			} else {
				fwd = append(fwd, i)
			}
		}
		groups = nil
		for _, g := range [][]int{fwd, back} {
			if len(g) > 0 {
				groups = append(groups, g)
			}
		}
	}
	// Operands are replaced by index first, then each gather goes before
	// its group's first reader, found again by op: a gather shifts the ops
	// after it, and with microbatches the forward's and the backward's
	// readers interleave.
	type insert struct{ before, gather *ir.Op }
	var inserts []insert
	for _, grp := range groups {
		first := f.Body[grp[0]]
		op, err := f.NewOp("all_gather", []*ir.Value{gt.part}, withAxis(groupAttrs(n, stride), gt.dim), first.Loc, gt.whole.Name+".gathered")
		if err != nil {
			return err
		}
		for _, i := range grp {
			for k, x := range f.Body[i].Operands {
				if x == gt.whole {
					f.Body[i].Operands[k] = op.Results[0]
				}
			}
		}
		inserts = append(inserts, insert{first, op})
	}
	for _, in := range inserts {
		f.Body = slices.Insert(f.Body, slices.Index(f.Body, in.before), in.gather)
	}
	return nil
}

// shardArg replaces argument a of f with the rank's part under one more
// level of cuts.
func shardArg(f *ir.Func, a *ir.Value, l ir.ShardLevel) *ir.Value {
	info := *a.Arg
	info.Attrs = a.Arg.Attrs.Clone()
	part := &ir.Value{Name: a.Name, Type: a.Type, Index: a.Index, Offset: ir.NoOffset, Arg: &info}
	ir.AddShardLevel(f, part, l) // an initial value stays whole: the runner cuts it
	part.Type.Shape = append(ir.Shape(nil), a.Type.Shape...)
	part.Type.Shape[l.Dim] /= l.Size
	f.Args[a.Index] = part
	return part
}

func uses(f *ir.Func, v *ir.Value) int {
	n := 0
	for _, op := range f.Body {
		for _, x := range op.Operands {
			if x == v {
				n++
			}
		}
	}
	return n
}

// backwardOps is the backward of a training step: the ops that depend on
// the loss seed.
func backwardOps(f *ir.Func) map[*ir.Op]bool {
	bwd := map[*ir.Op]bool{}
	fromSeed := map[*ir.Value]bool{}
	for _, op := range f.Body {
		dep := ir.IsConstant(op) && op.Attrs["role"].Str == ir.RoleLossSeed
		for _, x := range op.Operands {
			dep = dep || fromSeed[x]
		}
		if dep {
			bwd[op] = true
			for _, r := range op.Results {
				fromSeed[r] = true
			}
		}
	}
	return bwd
}

// groupAttrs names the group of n ranks, stride apart (the stride only
// when it is not 1, its default).
func groupAttrs(n, stride int64) ir.Attrs {
	a := ir.Attrs{"size": ir.IntAttr(n)}
	if stride != 1 {
		a["stride"] = ir.IntAttr(stride)
	}
	return a
}

func withAxis(a ir.Attrs, axis int) ir.Attrs {
	a["axis"] = ir.IntAttr(int64(axis))
	return a
}
