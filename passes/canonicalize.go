package passes

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// foldLimit is the largest result (in elements) constant folding creates;
// foldInputLimit the largest constant operand it reads.
const (
	foldLimit      = 1 << 16
	foldInputLimit = 1 << 20
)

func init() {
	MustRegister(&Pass{
		Name:        "canonicalize",
		Summary:     "fold constants, remove identities (x+0, x*1, no-op reshapes and transposes), recognise ops written as chains (gelu, silu, hard_swish, mish, softmax, layer_norm), merge products written in pieces (a concat of products, a sum of a product) and remove dead ops",
		Invalidates: []Property{Assigned}, // new values, and values that live longer
		Run: func(ctx *Context, m *ir.Module) error {
			for _, f := range m.Funcs {
				folded, simplified := canonicalize(f)
				ctx.AddStat("ops-folded", int64(folded))
				ctx.AddStat("ops-simplified", int64(simplified))
				ctx.AddStat("products-merged", int64(MergeProducts(f)))
				ctx.AddStat("chains-recognised", int64(RecognizeComposites(f)))
				ctx.AddStat("ops-removed", int64(RemoveDeadOps(f)))
			}
			return nil
		},
	})
}

func canonicalize(f *ir.Func) (folded, simplified int) {
	repl := map[*ir.Value]*ir.Value{}
	for _, op := range f.Body {
		for i, v := range op.Operands {
			if w, ok := repl[v]; ok {
				op.Operands[i] = w
			}
		}
		if op.Region != nil || isImpure(op) || op.Attrs["remat"].Kind != 0 {
			continue
		}
		if foldOp(op) {
			folded++
			continue
		}
		if x := simplify(op); x != nil {
			repl[op.Results[0]] = x
			simplified++
		}
	}
	for i, r := range f.Results {
		if w, ok := repl[r.Value]; ok {
			f.Results[i].Value = w
		}
	}
	return folded, simplified
}

// constOf returns the dense value of v when a constant op defines it and
// it has no role (a loss seed is kept as it is for later passes).
func constOf(v *ir.Value) *ir.Dense {
	if v.Def != nil && ir.IsConstant(v.Def) && v.Def.Attrs["role"].Kind == 0 {
		return v.Def.Attrs["value"].Dense
	}
	return nil
}

// isSplatOf reports whether v is a constant whose every element equals x.
func isSplatOf(v *ir.Value, x float64) bool {
	d := constOf(v)
	if d == nil {
		return false
	}
	for i := 0; i < d.Len(); i++ {
		if d.Float(int64(i)) != x {
			return false
		}
	}
	return true
}

// isZeroWithSign reports whether v is a constant zero that leaves x
// unchanged, -0 included: adding -0 (x + -0 = x, but -0 + +0 = +0) or
// subtracting +0 (x - +0 = x, but -0 - -0 = +0). Integers have one zero.
func isZeroWithSign(v *ir.Value, negative bool) bool {
	d := constOf(v)
	if d == nil || !isSplatOf(v, 0) {
		return false
	}
	if !d.Type.DType.IsFloat() {
		return true
	}
	for _, f := range d.Floats {
		if math.Signbit(f) != negative {
			return false
		}
	}
	return true
}

// simplify returns the value op's single result can be replaced by, or nil.
func simplify(op *ir.Op) *ir.Value {
	if len(op.Results) != 1 {
		return nil
	}
	res := op.Results[0]
	same := func(v *ir.Value) *ir.Value {
		if v.Type.Equal(res.Type) {
			return v
		}
		return nil
	}
	a := op.Operands
	switch op.Kind {
	case "identity":
		return same(a[0])
	case "cast":
		return same(a[0])
	case "reshape":
		if inner := a[0].Def; inner != nil && inner.Kind == "reshape" {
			op.Operands[0] = inner.Operands[0]
		}
		return same(op.Operands[0])
	case "transpose":
		perm := op.Attr().Ints("perm")
		if inner := a[0].Def; inner != nil && inner.Kind == "transpose" {
			p1 := inner.Attr().Ints("perm")
			composed := make([]int64, len(perm))
			for i, p := range perm {
				composed[i] = p1[p]
			}
			op.Operands[0] = inner.Operands[0]
			op.Attrs = op.Attrs.Clone()
			op.Attrs["perm"] = ir.IntsAttr(composed...)
			perm = composed
		}
		for i, p := range perm {
			if int64(i) != p {
				return nil
			}
		}
		return same(op.Operands[0])
	case "neg":
		if inner := a[0].Def; inner != nil && inner.Kind == "neg" {
			return same(inner.Operands[0])
		}
	case "add":
		if isZeroWithSign(a[1], true) {
			return same(a[0])
		}
		if isZeroWithSign(a[0], true) {
			return same(a[1])
		}
	case "sub":
		if isZeroWithSign(a[1], false) {
			return same(a[0])
		}
	case "mul":
		if isSplatOf(a[1], 1) {
			return same(a[0])
		}
		if isSplatOf(a[0], 1) {
			return same(a[1])
		}
	case "div":
		if isSplatOf(a[1], 1) {
			return same(a[0])
		}
	}
	return nil
}

// foldOp turns op into a constant when all its operands are constants
// and its results are small; it reports whether it did. The interpreter
// computes the value, so a fold always agrees with a run.
func foldOp(op *ir.Op) bool {
	if len(op.Results) != 1 || ir.IsConstant(op) || len(op.Operands) == 0 {
		return false
	}
	in := make([]*interp.Tensor, len(op.Operands))
	for i, v := range op.Operands {
		d := constOf(v)
		if d == nil || v.Type.NumElements() > foldInputLimit {
			return false
		}
		in[i] = interp.FromDense(d)
	}
	if op.Results[0].Type.NumElements() > foldLimit {
		return false
	}
	out, err := interp.EvalOp(op, in)
	if err != nil {
		return false // the run reports it, where it happens
	}
	op.Kind = "constant"
	op.Operands = nil
	op.Attrs = ir.Attrs{"value": ir.DenseAttr(compactSplat(out[0].ToDense()))}
	return true
}

// compactSplat stores a constant whose elements are all equal as a splat.
func compactSplat(d *ir.Dense) *ir.Dense {
	if d.Len() <= 1 {
		return d
	}
	for i := 1; i < d.Len(); i++ {
		if d.Float(int64(i)) != d.Float(0) || d.Type.DType.IsFloat() && math.Signbit(d.Floats[i]) != math.Signbit(d.Floats[0]) {
			return d
		}
	}
	if d.Type.DType.IsFloat() {
		return &ir.Dense{Type: d.Type, Floats: d.Floats[:1]}
	}
	return &ir.Dense{Type: d.Type, Ints: d.Ints[:1]}
}
