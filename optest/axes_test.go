package optest

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

// TestEveryOpDeclaresAxes: every op says how its results relate to its
// operands dimension by dimension, except those no split may cross: in-
// place updates, fused kernels and exchanges between ranks (impure ops).
func TestEveryOpDeclaresAxes(t *testing.T) {
	for _, name := range ir.OpNames() {
		d := ir.Lookup(name)
		if d.Axes == nil && len(d.Writes) == 0 && !d.HasRegion && !d.Impure {
			t.Errorf("op %s declares no axes", name)
		}
	}
}

// axesInstances are the instances whose op declares axes, with the op's
// operands all arguments of the function combine builds.
func axesInstances(t *testing.T) []use {
	var out []use
	for _, in := range allInstances() {
		d := ir.Lookup(in.op)
		if d.Axes == nil || in.op == "swap_in" {
			continue
		}
		_, uses, err := combine("one", []instance{in})
		require.NoError(t, err)
		out = append(out, uses[0])
	}
	return out
}

// TestAxesFitShapes: each index map has an entry per dimension, and a
// dimension a loop indexes has the loop's extent.
func TestAxesFitShapes(t *testing.T) {
	for _, u := range axesInstances(t) {
		ax, _ := ir.OpAxes(u.op)
		if ax.Flat {
			continue
		}
		check := func(what string, maps [][]ir.Index, vs []*ir.Value) {
			require.Len(t, maps, len(vs), "%s: %s maps", u.inst, what)
			for j, v := range vs {
				require.Len(t, maps[j], v.Type.Rank(), "%s: %s %d", u.inst, what, j)
				for e, x := range maps[j] {
					if x.Loop >= 0 {
						require.Less(t, x.Loop, len(ax.Loops), "%s: %s %d dimension %d", u.inst, what, j, e)
						require.Equal(t, ax.Loops[x.Loop].Extent, v.Type.Shape[e], "%s: %s %d dimension %d has loop %d's extent", u.inst, what, j, e, x.Loop)
					}
				}
			}
		}
		check("operand", ax.Operands, u.op.Operands)
		check("result", ax.Results, u.op.Results)
	}
}

// TestAxesAgreeWithLoopNests lowers every instance to its loop nest and
// traces, for each element of each result, the operand elements it is
// computed from. Where a result dimension and an operand dimension are
// the same loop's (of any kind but mixed), the two indices must agree:
// that is what lets a pass compute a part of the loop from the same part
// of the operands. A view that keeps the row-major order (Flat) reads
// the same element of its operand.
func TestAxesAgreeWithLoopNests(t *testing.T) {
	for _, u := range axesInstances(t) {
		t.Run(u.inst.String(), func(t *testing.T) {
			f, uses, err := combine("one", []instance{u.inst})
			require.NoError(t, err)
			op := uses[0].op
			args := inputs(f, uses, false, 1)
			m := &ir.Module{Funcs: []*ir.Func{f}}
			pipe, err := passes.ParsePipeline("assign", nil)
			require.NoError(t, err)
			require.NoError(t, (&passes.Manager{}).Run(m, pipe))
			prog, err := loops.Lower(f)
			require.NoError(t, err)
			tr := &tracer{prog: prog}
			got, err := trace(prog, args)
			require.NoError(t, err)
			for a := range f.Args {
				tr.base = append(tr.base, 0)
				if a > 0 {
					tr.base[a] = tr.base[a-1] + int32(f.Args[a-1].Type.NumElements())
				}
			}
			ax, _ := ir.OpAxes(op)
			operand := func(a int) int { return slices.Index(op.Operands, f.Args[a]) }
			bad := 0
			for i, r := range op.Results {
				for e, v := range got[uses[0].results[i]] {
					idx := unflat(int64(e), r.Type.Shape)
					for _, k := range v.d {
						a, o := tr.element(k)
						j := operand(a)
						if j < 0 {
							continue
						}
						if msg := disagreement(ax, i, idx, j, o, op.Operands[j].Type.Shape, int64(e)); msg != "" && bad < 5 {
							bad++
							t.Errorf("result %d%v reads operand %d%v: %s", i, idx, j, o, msg)
						}
					}
				}
			}
		})
	}
}

// disagreement says how result i at idx (flat index e) reading operand j
// (of shape s) at o breaks ax, or "".
func disagreement(ax ir.Axes, i int, idx []int64, j int, o []int64, s ir.Shape, e int64) string {
	if ax.Flat {
		if f := flatIndex(o, s); f != e {
			return fmt.Sprintf("a flat view reads element %d for element %d", f, e)
		}
		return ""
	}
	for d, x := range ax.Results[i] {
		if x.Loop < 0 || ax.Loops[x.Loop].Kind == ir.Mixed {
			continue
		}
		for e, y := range ax.Operands[j] {
			if y.Loop == x.Loop && o[e] != idx[d] {
				return fmt.Sprintf("loop %d (%s) indexes result dimension %d and operand dimension %d, which differ", x.Loop, ax.Loops[x.Loop].Kind, d, e)
			}
		}
	}
	return ""
}

// flatIndex is the row-major index of idx in shape s.
func flatIndex(idx []int64, s ir.Shape) int64 {
	f := int64(0)
	for d, i := range idx {
		f = f*s[d] + i
	}
	return f
}

// TestAxesRestrictions checks each op's claims about its loops with the
// interpreter: for each loop that is not mixed, split in two parts, the
// op computed on the operands cut to a part gives the whole result cut
// to the part (results that index the loop), or results that combine
// over the parts into the whole one as the loop's kind says (the others).
func TestAxesRestrictions(t *testing.T) {
	checked := 0
	for _, u := range axesInstances(t) {
		ax, _ := ir.OpAxes(u.op)
		if ax.Flat {
			continue
		}
		f, uses, err := combine("one", []instance{u.inst})
		require.NoError(t, err)
		op := uses[0].op
		args := inputs(f, uses, false, 3)
		whole, err := interp.EvalOp(op, args)
		require.NoError(t, err, u.inst)
		for l, loop := range ax.Loops {
			if loop.Kind == ir.Mixed || loop.Extent < 2 || readsThrough(ax, l) {
				continue
			}
			h := loop.Extent / 2
			parts := [][2]int64{{0, h}, {h, loop.Extent}}
			var outs [][]*interp.Tensor
			skip := false
			for _, p := range parts {
				r, ok, err := restricted(op, ax, l, p, args)
				require.NoError(t, err, "%s loop %d part %v", u.inst, l, p)
				if !ok {
					skip = true
					break
				}
				outs = append(outs, r)
			}
			if skip {
				continue
			}
			checked++
			for i := range op.Results {
				indexed := slices.ContainsFunc(ax.Results[i], func(x ir.Index) bool { return x.Loop == l })
				if indexed {
					for k, p := range parts {
						want := cut(whole[i], ax.Results[i], l, p)
						require.True(t, sameBits(want, outs[k][i]), "%s: loop %d (%s) part %v of result %d:\n got %v\nwant %v", u.inst, l, loop.Kind, p, i, outs[k][i], want)
					}
					continue
				}
				if !loop.Kind.Folds() {
					continue // each part's own (PerPart semantics only)
				}
				msg := folded(loop.Kind, whole[i], outs[0][i], outs[1][i], parts, loop.Extent)
				require.Empty(t, msg, "%s: loop %d (%s), result %d", u.inst, l, loop.Kind, i)
			}
		}
	}
	t.Logf("%d loops of %d instances checked", checked, len(axesInstances(t)))
}

// readsThrough reports whether some dimension's index is computed from
// loop l (a pass refuses to split such a loop, so nothing is claimed).
func readsThrough(ax ir.Axes, l int) bool {
	for _, maps := range [][][]ir.Index{ax.Operands, ax.Results} {
		for _, m := range maps {
			for _, x := range m {
				if x.Loop < 0 && x.Reads(l) {
					return true
				}
			}
		}
	}
	return false
}

// restricted runs op on its operands cut to part p of loop l, as a pass
// splitting the loop would: shape attributes set to the part's result,
// a random op's offset moved to the part's first element (false when the
// part's elements are not a run of the whole's).
func restricted(op *ir.Op, ax ir.Axes, l int, p [2]int64, args []*interp.Tensor) ([]*interp.Tensor, bool, error) {
	d := op.Def()
	in := make([]*interp.Tensor, len(op.Operands))
	types := make([]ir.Type, len(op.Operands))
	for j := range op.Operands {
		in[j] = cut(args[j], ax.Operands[j], l, p)
		types[j] = in[j].Type
	}
	attrs := op.Attrs.Clone()
	if attrs == nil {
		attrs = ir.Attrs{}
	}
	want := make([]ir.Type, len(op.Results))
	for i, r := range op.Results {
		want[i] = r.Type
		want[i].Shape = r.Type.Shape.Clone()
		for dim, x := range ax.Results[i] {
			if x.Loop == l {
				want[i].Shape[dim] = p[1] - p[0]
			}
		}
	}
	if d.ShapeAttr != "" {
		attrs[d.ShapeAttr] = ir.IntsAttr(want[0].Shape...)
	}
	if ir.DrawsRandom(op) {
		s := op.Results[0].Type.Shape
		dim := slices.IndexFunc(ax.Results[0], func(x ir.Index) bool { return x.Loop == l })
		before, _ := s[:dim].NumElements()
		if before != 1 {
			return nil, false, nil
		}
		inner, _ := s[dim+1:].NumElements()
		attrs["offset"] = ir.IntAttr(op.Attr().Int("offset") + p[0]*inner)
	}
	got, err := d.InferTypes(types, attrs)
	if err != nil {
		return nil, false, err
	}
	for i := range got {
		if !got[i].Equal(want[i]) {
			return nil, false, fmt.Errorf("result %d of the part is %s, not %s", i, got[i], want[i])
		}
	}
	c := &ir.Op{Kind: op.Kind, Attrs: attrs}
	for j, t := range types {
		c.Operands = append(c.Operands, &ir.Value{Name: fmt.Sprint("x", j), Type: t, Offset: ir.NoOffset})
	}
	for i, t := range want {
		c.Results = append(c.Results, &ir.Value{Name: fmt.Sprint("y", i), Type: t, Def: c, Index: i, Offset: ir.NoOffset})
	}
	out, err := interp.EvalOp(c, in)
	return out, true, err
}

// cut is x with every dimension that loop l indexes cut to part p.
func cut(x *interp.Tensor, m []ir.Index, l int, p [2]int64) *interp.Tensor {
	s := x.Type.Shape.Clone()
	for d, i := range m {
		if i.Loop == l {
			s[d] = p[1] - p[0]
		}
	}
	out := interp.New(ir.Type{DType: x.Type.DType, Shape: s})
	for e := 0; e < out.Len(); e++ {
		idx := unflat(int64(e), s)
		src := int64(0)
		for d, i := range m {
			v := idx[d]
			if i.Loop == l {
				v += p[0]
			}
			src = src*x.Type.Shape[d] + v
		}
		if out.F != nil {
			out.F[e] = x.F[src]
		} else {
			out.I[e] = x.I[src]
		}
	}
	return out
}

// sameBits compares two tensors element for element (NaN equals NaN).
func sameBits(a, b *interp.Tensor) bool {
	if !a.Type.Equal(b.Type) {
		return false
	}
	for i := range a.F {
		if a.F[i] != b.F[i] && !(math.IsNaN(a.F[i]) && math.IsNaN(b.F[i])) {
			return false
		}
	}
	return slices.Equal(a.I, b.I)
}

// folded says how the parts' results a and b fail to combine into whole
// by kind, or "". Sums are compared within 8 units of roundoff of the
// result dtype times the magnitudes involved: each part and the whole
// are rounded once to the dtype from the interpreter's float64.
func folded(kind ir.LoopKind, whole, a, b *interp.Tensor, parts [][2]int64, n int64) string {
	u := unitRoundoff(whole.Type.DType)
	for e := 0; e < whole.Len(); e++ {
		w, x, y := whole.At(e), a.At(e), b.At(e)
		var got, mag float64
		switch kind {
		case ir.Summed:
			got, mag = x+y, math.Abs(x)+math.Abs(y)
		case ir.Averaged:
			sx, sy := float64(parts[0][1]-parts[0][0])/float64(n), float64(parts[1][1]-parts[1][0])/float64(n)
			got, mag = sx*x+sy*y, math.Abs(sx*x)+math.Abs(sy*y)
		case ir.Maximum:
			got = math.Max(x, y)
		case ir.Minimum:
			got = math.Min(x, y)
		}
		if math.Abs(got-w) > 8*u*(mag+math.Abs(w)) {
			return fmt.Sprintf("element %d: the parts give %v, the whole %v", e, got, w)
		}
	}
	return ""
}

// TestLinearityClaims checks every group of operands in which an op
// says it is linear (its record's Linear, or what LinearIn derives from
// its scalar expression): op(a + b) equals op(a) + op(b), the other
// operands held fixed, within 8·k·u of the norms involved: u is the
// coarsest unit roundoff of the dtypes involved, k the terms summed into
// one element (each side rounds a+b, and its sums once per term).
func TestLinearityClaims(t *testing.T) {
	checked := 0
	for _, in := range allInstances() {
		f, uses, err := combine("one", []instance{in})
		require.NoError(t, err)
		op := uses[0].op
		if in.op == "swap_in" || len(op.Def().Writes) > 0 {
			continue
		}
		for mask := 1; mask < 1<<len(op.Operands); mask++ {
			var group []int
			for j := range op.Operands {
				if mask&(1<<j) != 0 {
					group = append(group, j)
				}
			}
			if !ir.LinearIn(op, group) {
				continue
			}
			checked++
			a, b := inputs(f, uses, false, 5), inputs(f, uses, false, 6)
			sum := interp.CloneAll(a)
			for _, j := range group {
				for e := range sum[j].F {
					sum[j].F[e] += b[j].F[e]
				}
				sum[j] = sum[j].Round()
			}
			for j := range b {
				if !slices.Contains(group, j) {
					b[j] = a[j]
				}
			}
			ya, err := interp.EvalOp(op, a)
			require.NoError(t, err, in)
			yb, err := interp.EvalOp(op, b)
			require.NoError(t, err, in)
			ys, err := interp.EvalOp(op, sum)
			require.NoError(t, err, in)
			u := unitRoundoff(op.Results[0].Type.DType)
			for _, j := range group {
				u = max(u, unitRoundoff(op.Operands[j].Type.DType))
			}
			tol := 8 * u * float64(max(in.k, 1))
			var diff, norm float64
			for e := range ys[0].F {
				if math.IsNaN(ya[0].F[e]) || math.IsNaN(yb[0].F[e]) {
					// Outside the op's domain (acos_grad of |x| > 1): NaN
					// for every other operand, which is linear enough.
					require.True(t, math.IsNaN(ys[0].F[e]), "%s: element %d is NaN in one term but not in the sum", in, e)
					continue
				}
				d := ys[0].F[e] - ya[0].F[e] - yb[0].F[e]
				diff += d * d
				norm += ya[0].F[e]*ya[0].F[e] + yb[0].F[e]*yb[0].F[e]
			}
			require.LessOrEqual(t, math.Sqrt(diff), tol*math.Sqrt(norm)+1e-300, "%s is not linear in operands %v", in, group)
		}
	}
	t.Logf("%d linear groups checked", checked)
}
