package interp

import (
	"fmt"
	"math"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// Every op whose record has a Scalar runs through elementwise: the
// interpreter has no semantics of its own for them.
func init() {
	for _, name := range ir.OpNames() {
		if d := ir.Lookup(name); d.Scalar != nil && kernels[name] == nil {
			kernels[name] = elementwise
		}
	}
}

// blockSize is how many elements elementwise evaluates at a time.
const blockSize = 4096

// elementwise evaluates the op's scalar expression at every element of
// its result: floats in float64 (the result is rounded to its dtype when
// stored), integers in int64.
func elementwise(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
	d := op.Def()
	types := make([]ir.Type, len(in))
	kinds := make([]scalar.Kind, len(in))
	for i, x := range in {
		types[i], kinds[i] = x.Type, ir.KindOf(x.Type.DType)
	}
	t, err := scalar.Resolve(d.Scalar(op.Attr(), types, out[0]), kinds, ir.KindOf(out[0].DType))
	if err != nil {
		return nil, fmt.Errorf("its scalar semantics: %v", err)
	}
	y := New(out[0])
	n := out[0].NumElements()
	// src[i] maps an element of the result to one of operand i.
	src := make([]func(lo, hi int64) column, len(in))
	for i, x := range in {
		src[i] = gatherer(x, out[0].Shape)
	}
	for lo := int64(0); lo < n; lo += blockSize {
		hi := min(n, lo+blockSize)
		ops := make([]column, len(in))
		for i := range in {
			ops[i] = src[i](lo, hi)
		}
		v := evalScalar(t, ops, int(hi-lo))
		if y.F != nil {
			copy(y.F[lo:hi], v.asFloat(t.Kind, int(hi-lo)))
		} else {
			copy(y.I[lo:hi], v.asInt(t.Kind, ir.KindOf(out[0].DType), int(hi-lo)))
		}
	}
	return []*Tensor{y}, nil
}

// column is a block of scalar values: f for Float, i for Int, Uint (its
// bits) and Bool (0 or 1). A constant has one element, repeated.
type column struct {
	f     []float64
	i     []int64
	splat bool
}

func (c column) fAt(j int) float64 {
	if c.splat {
		return c.f[0]
	}
	return c.f[j]
}

func (c column) iAt(j int) int64 {
	if c.splat {
		return c.i[0]
	}
	return c.i[j]
}

// gatherer returns the values of x, broadcast to shape out, for the
// result elements [lo, hi).
func gatherer(x *Tensor, out ir.Shape) func(lo, hi int64) column {
	if x.Type.Shape.Equal(out) {
		return func(lo, hi int64) column { return column{f: sub(x.F, lo, hi), i: sub(x.I, lo, hi)} }
	}
	if x.Len() == 1 {
		return func(int64, int64) column { return column{f: sub(x.F, 0, 1), i: sub(x.I, 0, 1), splat: true} }
	}
	st := broadcastStrides(x.Type.Shape, out)
	return func(lo, hi int64) column {
		idx := unflatten(out, lo)
		pos := int64(0)
		for d := range idx {
			pos += idx[d] * st[d]
		}
		o := &odometer{shape: out, idx: idx, st: [][]int64{st}, pos: []int64{pos}}
		var c column
		if x.F != nil {
			c.f = make([]float64, hi-lo)
		} else {
			c.i = make([]int64, hi-lo)
		}
		for j := range hi - lo {
			if c.f != nil {
				c.f[j] = x.F[o.pos[0]]
			} else {
				c.i[j] = x.I[o.pos[0]]
			}
			o.next()
		}
		return c
	}
}

func sub[T any](s []T, lo, hi int64) []T {
	if s == nil {
		return nil
	}
	return s[lo:hi]
}

// asFloat returns c's values as floats (c has kind k).
func (c column) asFloat(k scalar.Kind, n int) []float64 {
	if k == scalar.Float {
		return expand(c.f, c.splat, n)
	}
	out := make([]float64, n)
	for j := range out {
		if k == scalar.Uint {
			out[j] = float64(uint64(c.iAt(j)))
		} else {
			out[j] = float64(c.iAt(j))
		}
	}
	return out
}

// asInt returns c's values (of kind k) as the int64 elements of kind to
// (Int, Uint or Bool): floats saturate at to's range, integers keep
// their bits.
func (c column) asInt(k, to scalar.Kind, n int) []int64 {
	if k != scalar.Float {
		return expand(c.i, c.splat, n)
	}
	out := make([]int64, n)
	for j := range out {
		if to == scalar.Uint {
			out[j] = scalar.SaturatingUint(c.fAt(j))
		} else {
			out[j] = scalar.SaturatingInt(c.fAt(j))
		}
	}
	return out
}

func expand[T any](s []T, splat bool, n int) []T {
	if !splat {
		return s
	}
	out := make([]T, n)
	for j := range out {
		out[j] = s[0]
	}
	return out
}

// convertColumn converts c from kind from to kind to.
func convertColumn(c column, from, to scalar.Kind, n int) column {
	if from == to {
		return c
	}
	switch to {
	case scalar.Float:
		return column{f: c.asFloat(from, n)}
	case scalar.Int, scalar.Uint:
		if from != scalar.Float {
			return c
		}
		return column{i: c.asInt(from, to, n)}
	}
	out := make([]int64, n)
	for j := range out {
		if from == scalar.Float {
			if c.fAt(j) != 0 {
				out[j] = 1
			}
		} else if c.iAt(j) != 0 {
			out[j] = 1
		}
	}
	return column{i: out}
}

// evalScalar evaluates t over a block of n elements of the operands.
func evalScalar(t *scalar.Typed, ops []column, n int) column {
	switch t.Node {
	case scalar.Operand:
		return ops[t.Index]
	case scalar.Const:
		switch t.Kind {
		case scalar.Float:
			return column{f: []float64{t.Value}, splat: true}
		case scalar.Bool:
			b := int64(0)
			if t.Value != 0 {
				b = 1
			}
			return column{i: []int64{b}, splat: true}
		}
		if t.Kind == scalar.Uint {
			return column{i: []int64{scalar.SaturatingUint(t.Value)}, splat: true}
		}
		return column{i: []int64{scalar.SaturatingInt(t.Value)}, splat: true}
	case scalar.Convert:
		a := t.Args[0]
		return convertColumn(evalScalar(a, ops, n), a.Kind, t.To, n)
	case scalar.Select:
		cnd := evalScalar(t.Args[0], ops, n)
		a := convertColumn(evalScalar(t.Args[1], ops, n), t.Args[1].Kind, t.Kind, n)
		b := convertColumn(evalScalar(t.Args[2], ops, n), t.Args[2].Kind, t.Kind, n)
		var out column
		if t.Kind == scalar.Float {
			out.f = make([]float64, n)
		} else {
			out.i = make([]int64, n)
		}
		for j := 0; j < n; j++ {
			pick := b
			if cnd.iAt(j) != 0 {
				pick = a
			}
			if out.f != nil {
				out.f[j] = pick.fAt(j)
			} else {
				out.i[j] = pick.iAt(j)
			}
		}
		return out
	}
	args := make([]column, len(t.Args))
	for i, a := range t.Args {
		args[i] = convertColumn(evalScalar(a, ops, n), a.Kind, t.ArgKind, n)
	}
	switch t.ArgKind {
	case scalar.Float:
		return applyFloat(t.Prim, args, n)
	case scalar.Uint:
		return applyInt(t.Prim, args, n, true)
	}
	return applyInt(t.Prim, args, n, false)
}

func applyFloat(p scalar.Prim, args []column, n int) column {
	if p.Arity() == 1 {
		f := FloatUnary(p)
		out := make([]float64, n)
		for j := range out {
			out[j] = f(args[0].fAt(j))
		}
		return column{f: out}
	}
	a, b := args[0], args[1]
	if p.IsCompare() {
		cmp := FloatCompare(p)
		out := make([]int64, n)
		for j := range out {
			if cmp(a.fAt(j), b.fAt(j)) {
				out[j] = 1
			}
		}
		return column{i: out}
	}
	f := FloatBinary(p)
	out := make([]float64, n)
	for j := range out {
		out[j] = f(a.fAt(j), b.fAt(j))
	}
	return column{f: out}
}

// applyInt applies p to Int columns, or Uint ones when unsigned.
func applyInt(p scalar.Prim, args []column, n int, unsigned bool) column {
	out := make([]int64, n)
	if p.Arity() == 1 {
		f := IntUnary(p)
		if unsigned && p == scalar.Abs {
			f = func(x int64) int64 { return x }
		}
		for j := range out {
			out[j] = f(args[0].iAt(j))
		}
		return column{i: out}
	}
	f := IntBinary(p)
	if unsigned {
		f = UintBinary(p)
	}
	for j := range out {
		out[j] = f(args[0].iAt(j), args[1].iAt(j))
	}
	return column{i: out}
}

// FloatUnary is the float64 meaning of a unary primitive.
func FloatUnary(p scalar.Prim) func(float64) float64 {
	switch p {
	case scalar.Neg:
		return func(x float64) float64 { return -x }
	case scalar.Abs:
		return math.Abs
	case scalar.Exp:
		return expF64
	case scalar.Expm1:
		return math.Expm1
	case scalar.Log:
		return logF64
	case scalar.Log1p:
		return math.Log1p
	case scalar.Sqrt:
		return math.Sqrt
	case scalar.Tanh:
		return math.Tanh
	case scalar.Erf:
		return math.Erf
	case scalar.Floor:
		return math.Floor
	case scalar.Ceil:
		return math.Ceil
	case scalar.Round:
		return math.RoundToEven
	case scalar.Sin:
		return math.Sin
	case scalar.Tan:
		return math.Tan
	case scalar.Asin:
		return math.Asin
	case scalar.Acos:
		return math.Acos
	case scalar.Atan:
		return math.Atan
	case scalar.Sinh:
		return math.Sinh
	case scalar.Cosh:
		return math.Cosh
	case scalar.Asinh:
		return math.Asinh
	case scalar.Acosh:
		return math.Acosh
	case scalar.Atanh:
		return math.Atanh
	case scalar.Cos:
		return math.Cos
	}
	panic("interp: no float form of " + p.String())
}

// FloatBinary is the float64 meaning of a binary arithmetic primitive.
func FloatBinary(p scalar.Prim) func(a, b float64) float64 {
	switch p {
	case scalar.Add:
		return func(a, b float64) float64 { return a + b }
	case scalar.Sub:
		return func(a, b float64) float64 { return a - b }
	case scalar.Mul:
		return func(a, b float64) float64 { return a * b }
	case scalar.Div:
		return func(a, b float64) float64 { return a / b }
	case scalar.Rem:
		return math.Mod
	case scalar.Pow:
		return powF64
	case scalar.Max:
		return func(a, b float64) float64 {
			if a != a || a > b {
				return a
			}
			return b
		}
	case scalar.Min:
		return func(a, b float64) float64 {
			if a != a || a < b {
				return a
			}
			return b
		}
	}
	panic("interp: no float form of " + p.String())
}

// FloatCompare is the meaning of a comparison on float64 (NaN compares
// false except under Ne).
func FloatCompare(p scalar.Prim) func(a, b float64) bool {
	switch p {
	case scalar.Eq:
		return func(a, b float64) bool { return a == b }
	case scalar.Ne:
		return func(a, b float64) bool { return a != b }
	case scalar.Lt:
		return func(a, b float64) bool { return a < b }
	case scalar.Le:
		return func(a, b float64) bool { return a <= b }
	case scalar.Gt:
		return func(a, b float64) bool { return a > b }
	}
	return func(a, b float64) bool { return a >= b }
}

// IntUnary is the int64 meaning of a unary primitive.
func IntUnary(p scalar.Prim) func(int64) int64 {
	switch p {
	case scalar.Neg:
		return func(x int64) int64 { return -x }
	case scalar.Abs:
		return func(x int64) int64 {
			if x < 0 {
				return -x
			}
			return x
		}
	case scalar.Not:
		return func(x int64) int64 { return 1 - x }
	}
	panic("interp: no integer form of " + p.String())
}

// IntBinary is the int64 meaning of a binary primitive (comparisons give
// 0 or 1).
func IntBinary(p scalar.Prim) func(a, b int64) int64 {
	b2i := func(c bool) int64 {
		if c {
			return 1
		}
		return 0
	}
	switch p {
	case scalar.Add:
		return func(a, b int64) int64 { return a + b }
	case scalar.Sub:
		return func(a, b int64) int64 { return a - b }
	case scalar.Mul:
		return func(a, b int64) int64 { return a * b }
	case scalar.Div:
		return func(a, b int64) int64 {
			if b == 0 {
				return 0
			}
			return a / b // Go defines MinInt64 / -1 as MinInt64
		}
	case scalar.Rem:
		return func(a, b int64) int64 {
			if b == 0 {
				return 0
			}
			return a % b
		}
	case scalar.Pow:
		return IntPow
	case scalar.Max:
		return func(a, b int64) int64 { return max(a, b) }
	case scalar.Min:
		return func(a, b int64) int64 { return min(a, b) }
	case scalar.And:
		return func(a, b int64) int64 { return a & b }
	case scalar.Or:
		return func(a, b int64) int64 { return a | b }
	case scalar.Xor:
		return func(a, b int64) int64 { return a ^ b }
	case scalar.Shr:
		return func(a, b int64) int64 { return int64(uint64(a) >> uint64(b&63)) }
	case scalar.Eq:
		return func(a, b int64) int64 { return b2i(a == b) }
	case scalar.Ne:
		return func(a, b int64) int64 { return b2i(a != b) }
	case scalar.Lt:
		return func(a, b int64) int64 { return b2i(a < b) }
	case scalar.Le:
		return func(a, b int64) int64 { return b2i(a <= b) }
	case scalar.Gt:
		return func(a, b int64) int64 { return b2i(a > b) }
	case scalar.Ge:
		return func(a, b int64) int64 { return b2i(a >= b) }
	}
	panic("interp: no integer form of " + p.String())
}

// IntPow is a^b in int64 as scalar.Pow defines it: by squaring, wrapping
// on overflow as multiplication does; for b < 0, 1/a^-b truncated toward
// zero (1 for a = 1, ±1 for a = -1, 0 otherwise, and 0 for a = 0).
func IntPow(a, b int64) int64 {
	if b < 0 {
		switch {
		case a == 1:
			return 1
		case a == -1 && b%2 != 0:
			return -1
		case a == -1:
			return 1
		}
		return 0
	}
	r := int64(1)
	for ; b > 0; b >>= 1 {
		if b&1 != 0 {
			r *= a
		}
		a *= a
	}
	return r
}

// UintBinary is the uint64 meaning of a binary primitive on the bits of
// its operands (comparisons give 0 or 1): where it differs from
// IntBinary (division, remainder, ordering, max and min, a power's
// exponent) it reads them unsigned.
func UintBinary(p scalar.Prim) func(a, b int64) int64 {
	b2i := func(c bool) int64 {
		if c {
			return 1
		}
		return 0
	}
	u := func(f func(a, b uint64) uint64) func(a, b int64) int64 {
		return func(a, b int64) int64 { return int64(f(uint64(a), uint64(b))) }
	}
	switch p {
	case scalar.Div:
		return u(func(a, b uint64) uint64 {
			if b == 0 {
				return 0
			}
			return a / b
		})
	case scalar.Rem:
		return u(func(a, b uint64) uint64 {
			if b == 0 {
				return 0
			}
			return a % b
		})
	case scalar.Pow:
		return u(func(a, b uint64) uint64 {
			r := uint64(1)
			for ; b > 0; b >>= 1 {
				if b&1 != 0 {
					r *= a
				}
				a *= a
			}
			return r
		})
	case scalar.Max:
		return u(func(a, b uint64) uint64 { return max(a, b) })
	case scalar.Min:
		return u(func(a, b uint64) uint64 { return min(a, b) })
	case scalar.Lt:
		return func(a, b int64) int64 { return b2i(uint64(a) < uint64(b)) }
	case scalar.Le:
		return func(a, b int64) int64 { return b2i(uint64(a) <= uint64(b)) }
	case scalar.Gt:
		return func(a, b int64) int64 { return b2i(uint64(a) > uint64(b)) }
	case scalar.Ge:
		return func(a, b int64) int64 { return b2i(uint64(a) >= uint64(b)) }
	}
	return IntBinary(p)
}
