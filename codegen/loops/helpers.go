package loops

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// Tensor is a value as lowerings read it: its type and an accessor from a
// full index to the element. Buf is set when the value is in memory.
type Tensor struct {
	Type ir.Type
	At   func(idx []Expr) Expr
	Buf  *Buffer
}

// FromBuffer reads a tensor straight from memory.
func FromBuffer(b *Buffer) Tensor {
	return Tensor{Type: b.Type, Buf: b, At: func(idx []Expr) Expr { return loadAt(b, idx) }}
}

// loadAt reads b at idx, merging the axes that a reshape's index
// arithmetic split (see mergedSplit): a computed tensor read through a
// view gets each component of its own index as a division and remainder
// of the view's flat index, which an offset computed from them would
// repeat per element and hide from the vectoriser; merged, the offset is
// the flat index again, linear in the loop variables.
func loadAt(b *Buffer, idx []Expr) *Load {
	shape := b.Type.Shape
	if len(idx) != len(shape) {
		return &Load{Buf: b, Index: idx}
	}
	merged := false
	for k := len(idx) - 2; k >= 0; k-- {
		y, ok := mergedSplit(idx[k], idx[k+1], shape[k+1])
		if !ok {
			continue
		}
		if !merged {
			idx, shape, merged = append([]Expr(nil), idx...), append(ir.Shape(nil), shape...), true
		}
		idx = append(append(idx[:k:k], y), idx[k+2:]...)
		shape = append(append(shape[:k:k], shape[k]*shape[k+1]), shape[k+2:]...)
	}
	if !merged {
		return &Load{Buf: b, Index: idx}
	}
	return &Load{Buf: alias(b, shape), Index: idx}
}

// mergedSplit reports whether p and q, consecutive components of an
// index whose second axis has extent d, are y/d and x%d where y is x or
// x%m for a multiple m of d, and returns y. Then p·d + q = y, since
// (y/d)·d + y%d = y under truncating division and y%d = x%d (y ≡ x mod
// d, both of x's sign): the two axes address memory as one of stride
// q's, indexed by y, whatever the values.
func mergedSplit(p, q Expr, d int64) (Expr, bool) {
	pd, ok := p.(*Binary)
	if d <= 0 || !ok || pd.Op != scalar.Div || !isInt(pd.B, d) {
		return nil, false
	}
	qr, ok := q.(*Binary)
	if !ok || qr.Op != scalar.Rem || !isInt(qr.B, d) {
		return nil, false
	}
	y := pd.A
	if y == qr.A {
		return y, true
	}
	if yr, ok := y.(*Binary); ok && yr.Op == scalar.Rem && yr.A == qr.A {
		if m, ok := yr.B.(Int); ok && m.V != 0 && m.V%d == 0 {
			return y, true
		}
	}
	return nil, false
}

func isInt(e Expr, v int64) bool {
	i, ok := e.(Int)
	return ok && i.V == v
}

// alias is b seen with another shape (same bytes, row-major).
func alias(b *Buffer, s ir.Shape) *Buffer {
	c := *b
	c.Type = ir.Type{DType: b.Type.DType, Shape: s}
	return &c
}

// view reads t as if reshaped to s: through an alias when t is in memory,
// by index arithmetic otherwise.
func view(t Tensor, s ir.Shape) Tensor {
	if t.Buf != nil {
		return FromBuffer(alias(t.Buf, s))
	}
	from := t.Type.Shape
	return Tensor{Type: ir.Type{DType: t.Type.DType, Shape: s}, At: func(idx []Expr) Expr {
		return t.At(unflatten(flatten(idx, s), from))
	}}
}

func exprs(vs []*Var) []Expr {
	out := make([]Expr, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return out
}

func ints(vs ...int64) []Expr {
	out := make([]Expr, len(vs))
	for i, v := range vs {
		out[i] = Int{v}
	}
	return out
}

// fconst is a float constant of kind k (rounded to f32 for F32).
func fconst(k Kind, v float64) Expr {
	if k == F32 {
		v = float64(float32(v))
	}
	return Float{V: v, K: k}
}

// like is the constant v in x's kind.
func like(x Expr, v float64) Expr {
	switch x.Kind() {
	case I64:
		return Int{int64(v)}
	case U64:
		return conv(Int{scalar.SaturatingUint(v)}, U64)
	case Bool:
		return BoolConst{v != 0}
	}
	return fconst(x.Kind(), v)
}

// conv converts e to kind k (no-op when it already is).
func conv(e Expr, k Kind) Expr {
	if e.Kind() == k {
		return e
	}
	if f, ok := e.(Float); ok && k.IsFloat() {
		return fconst(k, f.V)
	}
	if i, ok := e.(Int); ok && k.IsFloat() {
		return fconst(k, float64(i.V))
	}
	return &Convert{To: k, X: e}
}

// wider is the kind two operands meet in.
func wider(a, b Kind) Kind {
	switch {
	case a == F64 || b == F64:
		return F64
	case a == F32 || b == F32:
		return F32
	case a == U64 || b == U64:
		return U64
	case a == I64 || b == I64:
		return I64
	}
	return Bool
}

func bin(op scalar.Prim, a, b Expr) Expr {
	k := wider(a.Kind(), b.Kind())
	a, b = conv(a, k), conv(b, k)
	if ia, ok := a.(Int); ok {
		if ib, ok := b.(Int); ok {
			switch op {
			case scalar.Add:
				return Int{ia.V + ib.V}
			case scalar.Mul:
				return Int{ia.V * ib.V}
			case scalar.Sub:
				return Int{ia.V - ib.V}
			}
		}
	}
	if ib, ok := b.(Int); ok {
		switch {
		case (op == scalar.Add || op == scalar.Sub) && ib.V == 0, (op == scalar.Mul || op == scalar.Div) && ib.V == 1:
			return a
		}
	}
	if ia, ok := a.(Int); ok {
		switch {
		case op == scalar.Add && ia.V == 0, op == scalar.Mul && ia.V == 1:
			return b
		case op == scalar.Mul && ia.V == 0:
			return a
		}
	}
	return &Binary{Op: op, A: a, B: b}
}

func add(a, b Expr) Expr             { return bin(scalar.Add, a, b) }
func sub(a, b Expr) Expr             { return bin(scalar.Sub, a, b) }
func mul(a, b Expr) Expr             { return bin(scalar.Mul, a, b) }
func div(a, b Expr) Expr             { return bin(scalar.Div, a, b) }
func rem(a, b Expr) Expr             { return bin(scalar.Rem, a, b) }
func maxE(a, b Expr) Expr            { return bin(scalar.Max, a, b) }
func minE(a, b Expr) Expr            { return bin(scalar.Min, a, b) }
func un(fn scalar.Prim, x Expr) Expr { return &Unary{Fn: fn, X: x} }

func cmp(pred scalar.Prim, a, b Expr) Expr {
	k := wider(a.Kind(), b.Kind())
	if k == Bool {
		k = I64
	}
	return &Compare{Pred: pred, A: conv(a, k), B: conv(b, k)}
}

func and(a, b Expr) Expr {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	return &Binary{Op: scalar.And, A: a, B: b}
}

func sel(c, a, b Expr) Expr {
	k := wider(a.Kind(), b.Kind())
	return &Select{C: c, A: conv(a, k), B: conv(b, k)}
}

// clamp keeps an index expression in [0, n-1].
func clamp(i Expr, n int64) Expr {
	if c, ok := i.(Int); ok {
		return Int{min(max(c.V, 0), n-1)}
	}
	return minE(maxE(i, Int{0}), Int{n - 1})
}

// checkedIndex is i clamped into [0, n-1], recording a run error where
// it was outside.
func checkedIndex(i Expr, n int64) Expr {
	return &Checked{Cond: inRange(i, n), X: clamp(i, n)}
}

// indexInto is the index j into a dimension of d entries, counted from
// the end where it is below 0 and negative allows that, checked and
// clamped into [0, d-1].
func indexInto(j Expr, d int64, negative bool) Expr {
	if negative {
		j = sel(cmp(scalar.Lt, j, Int{0}), add(j, Int{d}), j)
	}
	return checkedIndex(j, d)
}

// inRange is 0 <= i < n.
func inRange(i Expr, n int64) Expr {
	return and(cmp(scalar.Ge, i, Int{0}), cmp(scalar.Lt, i, Int{n}))
}

func flatten(idx []Expr, s ir.Shape) Expr {
	st := s.Strides()
	var f Expr = Int{0}
	for i, x := range idx {
		f = add(f, mul(x, Int{st[i]}))
	}
	return f
}

func unflatten(flat Expr, s ir.Shape) []Expr {
	st := s.Strides()
	out := make([]Expr, len(s))
	for i := range s {
		var x Expr = flat
		if i > 0 {
			x = rem(x, Int{st[i-1]})
		}
		out[i] = div(x, Int{st[i]})
	}
	return out
}

// bcast maps an index of shape to to the index of a NumPy-broadcast
// operand of shape from.
func bcast(idx []Expr, from, to ir.Shape) []Expr {
	off := len(to) - len(from)
	out := make([]Expr, len(from))
	for i := range from {
		if from[i] == 1 && to[i+off] != 1 {
			out[i] = Int{0}
		} else {
			out[i] = idx[i+off]
		}
	}
	return out
}

func sigmoidE(x Expr) Expr {
	return div(like(x, 1), add(like(x, 1), un(scalar.Exp, un(scalar.Neg, x))))
}

func numElements(s ir.Shape) int64 {
	n, _ := s.NumElements()
	return n
}

var negInf = math.Inf(-1)

// demote recomputes an F64 elementwise expression in kind k (F32 for f32
// tensors): double-precision statistics are read once and converted, the
// per-element arithmetic runs in k. Reductions keep their accumulator.
func demote(e Expr, k Kind) Expr {
	if k != F32 || e.Kind() != F64 {
		return e
	}
	switch x := e.(type) {
	case Float:
		return fconst(F32, x.V)
	case *Convert:
		if x.X.Kind() == F32 {
			return x.X
		}
	case *Unary:
		return &Unary{Fn: x.Fn, X: demote(x.X, k)}
	case *Binary:
		return bin(x.Op, demote(x.A, k), demote(x.B, k))
	case *Select:
		return &Select{C: x.C, A: demote(x.A, k), B: demote(x.B, k)}
	}
	return &Convert{To: F32, X: e}
}
