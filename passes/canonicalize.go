package passes

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

// foldLimit is the largest result (in elements) constant folding creates.
const foldLimit = 1 << 16

func init() {
	MustRegister(&Pass{
		Name:    "canonicalize",
		Summary: "fold constants, remove identities (x+0, x*1, no-op reshapes and transposes) and dead ops",
		Run: func(ctx *Context, m *ir.Module) error {
			for _, f := range m.Funcs {
				folded, simplified := canonicalize(f)
				ctx.AddStat("ops-folded", int64(folded))
				ctx.AddStat("ops-simplified", int64(simplified))
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

// constOf returns the dense value of v when a constant op defines it.
func constOf(v *ir.Value) *ir.Dense {
	if v.Def != nil && v.Def.Kind == "constant" {
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
		perm := op.Attrs.Ints("perm", nil)
		if inner := a[0].Def; inner != nil && inner.Kind == "transpose" {
			p1 := inner.Attrs.Ints("perm", nil)
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
		if isSplatOf(a[1], 0) {
			return same(a[0])
		}
		if isSplatOf(a[0], 0) {
			return same(a[1])
		}
	case "sub":
		if isSplatOf(a[1], 0) {
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

var unaryFolds = map[string]func(float64) float64{
	"neg":        func(x float64) float64 { return -x },
	"abs":        math.Abs,
	"exp":        math.Exp,
	"log":        math.Log,
	"sqrt":       math.Sqrt,
	"reciprocal": func(x float64) float64 { return 1 / x },
	"tanh":       math.Tanh,
	"sigmoid":    func(x float64) float64 { return 1 / (1 + math.Exp(-x)) },
	"relu":       func(x float64) float64 { return math.Max(x, 0) },
	"identity":   func(x float64) float64 { return x },
}

var binaryFolds = map[string]struct {
	f func(a, b float64) float64
	i func(a, b int64) (int64, bool)
}{
	"add": {func(a, b float64) float64 { return a + b }, func(a, b int64) (int64, bool) { return a + b, true }},
	"sub": {func(a, b float64) float64 { return a - b }, func(a, b int64) (int64, bool) { return a - b, true }},
	"mul": {func(a, b float64) float64 { return a * b }, func(a, b int64) (int64, bool) { return a * b, true }},
	"div": {func(a, b float64) float64 { return a / b }, func(a, b int64) (int64, bool) {
		if b == 0 {
			return 0, false
		}
		return a / b, true
	}},
	"max": {math.Max, func(a, b int64) (int64, bool) { return max(a, b), true }},
	"min": {math.Min, func(a, b int64) (int64, bool) { return min(a, b), true }},
}

// foldOp turns op into a constant when all its operands are constants and
// the result is small; it reports whether it did.
func foldOp(op *ir.Op) bool {
	if len(op.Results) != 1 || op.Kind == "constant" || len(op.Operands) == 0 {
		return false
	}
	in := make([]*ir.Dense, len(op.Operands))
	for i, v := range op.Operands {
		if in[i] = constOf(v); in[i] == nil {
			return false
		}
	}
	t := op.Results[0].Type
	n := t.NumElements()
	if n > foldLimit {
		return false
	}
	out := &ir.Dense{Type: t}
	isFloat := t.DType.IsFloat()
	put := func(x float64) {
		if isFloat {
			out.Floats = append(out.Floats, ir.RoundTo(t.DType, x))
		} else {
			out.Ints = append(out.Ints, int64(ir.RoundTo(t.DType, x)))
		}
	}
	switch {
	case unaryFolds[op.Kind] != nil:
		fn := unaryFolds[op.Kind]
		for i := int64(0); i < n; i++ {
			if isFloat {
				put(fn(in[0].Float(i)))
			} else if op.Kind == "neg" || op.Kind == "abs" || op.Kind == "identity" {
				x := in[0].Int(i)
				if op.Kind == "neg" || op.Kind == "abs" && x < 0 {
					x = -x
				}
				out.Ints = append(out.Ints, x)
			} else {
				return false
			}
		}
	case binaryFolds[op.Kind].f != nil:
		fns := binaryFolds[op.Kind]
		ia := broadcastIndex(op.Operands[0].Type.Shape, t.Shape)
		ib := broadcastIndex(op.Operands[1].Type.Shape, t.Shape)
		for i := int64(0); i < n; i++ {
			if isFloat {
				put(fns.f(in[0].Float(ia(i)), in[1].Float(ib(i))))
				continue
			}
			x, ok := fns.i(in[0].Int(ia(i)), in[1].Int(ib(i)))
			if !ok {
				return false
			}
			out.Ints = append(out.Ints, int64(ir.RoundTo(t.DType, float64(x))))
			if t.DType == ir.I64 {
				out.Ints[len(out.Ints)-1] = x
			}
		}
	case op.Kind == "cast":
		for i := int64(0); i < n; i++ {
			put(in[0].Float(i))
		}
	case op.Kind == "reshape":
		for i := int64(0); i < n; i++ {
			if isFloat {
				out.Floats = append(out.Floats, in[0].Float(i))
			} else {
				out.Ints = append(out.Ints, in[0].Int(i))
			}
		}
	case op.Kind == "transpose":
		src := transposeIndex(op.Operands[0].Type.Shape, op.Attrs.Ints("perm", nil))
		for i := int64(0); i < n; i++ {
			if isFloat {
				out.Floats = append(out.Floats, in[0].Float(src(i)))
			} else {
				out.Ints = append(out.Ints, in[0].Int(src(i)))
			}
		}
	default:
		return false
	}
	op.Kind = "constant"
	op.Operands = nil
	op.Attrs = ir.Attrs{"value": ir.DenseAttr(compactSplat(out))}
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

// broadcastIndex maps a flat index of shape out to the flat index of the
// broadcast operand of shape in.
func broadcastIndex(in, out ir.Shape) func(int64) int64 {
	strides := make([]int64, len(out))
	s := int64(1)
	for i := len(in) - 1; i >= 0; i-- {
		j := i + len(out) - len(in)
		if in[i] != 1 {
			strides[j] = s
		}
		s *= in[i]
	}
	return func(flat int64) int64 {
		idx := int64(0)
		for d := len(out) - 1; d >= 0; d-- {
			idx += (flat % out[d]) * strides[d]
			flat /= out[d]
		}
		return idx
	}
}

// transposeIndex maps a flat index of the transposed result to the flat
// index of the source of shape in.
func transposeIndex(in ir.Shape, perm []int64) func(int64) int64 {
	strides := make([]int64, len(in))
	s := int64(1)
	for i := len(in) - 1; i >= 0; i-- {
		strides[i] = s
		s *= in[i]
	}
	outShape := make([]int64, len(perm))
	outStride := make([]int64, len(perm))
	for i, p := range perm {
		outShape[i] = in[p]
		outStride[i] = strides[p]
	}
	return func(flat int64) int64 {
		idx := int64(0)
		for d := len(outShape) - 1; d >= 0; d-- {
			idx += (flat % outShape[d]) * outStride[d]
			flat /= outShape[d]
		}
		return idx
	}
}
