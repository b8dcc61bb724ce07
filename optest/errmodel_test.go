package optest

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// The error model of elementwise ops (modelScalar), by running error
// analysis of the op's scalar expression. The interpreter evaluates the
// expression in float64 and rounds the result once to its dtype; compiled
// code evaluates every node in the compute precision p (f32 for f32, f16
// and bf16 tensors, f64 for f64), whose unit roundoff is u (2^-24 or
// 2^-53). Operands are exact (they are the stored values). Each node of
// value v gets an absolute error bound e of its compiled evaluation:
//
//   - a constant: u·|v| (it is rounded to p);
//   - add, sub: ea + eb + u·|v|; mul: |b|·ea + |a|·eb + ea·eb + u·|v|;
//     div: (ea + |v|·eb) / (|b| - eb) + u·|v|;
//   - max, min: max(ea, eb); neg, abs: ea (exact);
//   - sqrt: ea / (2·sqrt(x - ea)) + u·|v| (correctly rounded);
//   - a C library function f (exp, log, tanh, erf, expm1, log1p, pow):
//     sup|f'| over [x - ea, x + ea] times ea, plus L·u·|v|, with L = 4 in
//     f32 (glibc's f32 functions are within 2 ulps, an ulp being at most
//     2·u·|v|) and 16 in f64 (8 ulps); pow adds (|b·ln a| + |b|)·u·|v|,
//     since Go's math.Pow, the f64 reference, raises to the integer part
//     of b by repeated squaring (a relative error growing with b) and to
//     the rest by e^(b·ln a) (the rounding of b·ln a amplified);
//   - a comparison whose operands' intervals overlap may go either way:
//     a select on it is bounded by both branches;
//   - every node adds the smallest subnormal of p (gradual underflow).
//
// The compiled result c and the interpreter's r (both rounded to the
// result dtype, of unit roundoff uo) must satisfy |c - r| <= e + 2·uo·|r|.
// In f64 the interpreter rounds as often as compiled code, so its own
// error is as large: the bound is 2·e + 2·uo·|r|.
// Where a node overflows p's range the model gives no bound, and c must
// equal r exactly (NaN matching NaN).

// bound is the analysis of one node at one element.
type bound struct {
	v, e   float64 // value (float64) and error bound of a Float node
	i      int64   // value of an Int or Bool node
	unsure bool    // a Bool node that rounding could flip
	flip   *bound  // for a Select on an unsure condition: the other branch
	nobnd  bool    // outside the model (overflow): compare exactly
}

// precision describes the compute format of compiled code.
type precision struct {
	u, max, tiny float64
	libm         float64 // a library function's error, in units of u·|v|
	ref          float64 // how many evaluations the bound covers (1 in f32: the reference is exact)
}

var (
	f32 = precision{u: 0x1p-24, max: math.MaxFloat32, tiny: 0x1p-149, libm: 4, ref: 1}
	f64 = precision{u: 0x1p-53, max: math.MaxFloat64, tiny: 0x1p-1074, libm: 16, ref: 2}
)

// analyze bounds the compiled evaluation of t at one element whose
// operand values are xs (integers as float64, bools 0 or 1).
func analyze(t *scalar.Typed, xs []float64, p precision) bound {
	var b bound
	switch t.Node {
	case scalar.Operand:
		x := xs[t.Index]
		if t.Kind == scalar.Float {
			return bound{v: x, nobnd: math.IsInf(x, 0) || math.IsNaN(x)}
		}
		return bound{i: int64(x), v: x}
	case scalar.Const:
		switch t.Kind {
		case scalar.Float:
			return bound{v: t.Value, e: p.u * math.Abs(t.Value)}
		case scalar.Bool:
			if t.Value != 0 {
				return bound{i: 1, v: 1}
			}
			return bound{}
		}
		i := scalar.SaturatingInt(t.Value)
		return bound{i: i, v: float64(i)}
	case scalar.Convert:
		a := analyze(t.Args[0], xs, p)
		switch t.To {
		case scalar.Float:
			if t.Args[0].Kind == scalar.Float {
				return a
			}
			return bound{v: float64(a.i), e: p.u * math.Abs(float64(a.i))}
		case scalar.Int:
			if t.Args[0].Kind == scalar.Float {
				i := scalar.SaturatingInt(a.v)
				return bound{i: i, v: float64(i), nobnd: a.nobnd || a.e != 0}
			}
			return a
		}
		v := a.v != 0
		if t.Args[0].Kind != scalar.Float {
			v = a.i != 0
		}
		r := bound{unsure: t.Args[0].Kind == scalar.Float && math.Abs(a.v) <= a.e, nobnd: a.nobnd}
		if v {
			r.i, r.v = 1, 1
		}
		return r
	case scalar.Select:
		c := analyze(t.Args[0], xs, p)
		a, bb := analyze(t.Args[1], xs, p), analyze(t.Args[2], xs, p)
		pick, other := bb, a
		if c.i != 0 {
			pick, other = a, bb
		}
		pick.nobnd = pick.nobnd || c.nobnd
		if c.unsure {
			o := other
			pick.flip = &o
		}
		return pick
	}
	args := make([]bound, len(t.Args))
	for i, a := range t.Args {
		args[i] = analyze(a, xs, p)
		if t.ArgKind == scalar.Float && t.Args[i].Kind != scalar.Float {
			args[i] = bound{v: float64(args[i].i), e: p.u * math.Abs(float64(args[i].i))}
		}
		if args[i].flip != nil {
			// A select below that may take the other branch: widen the
			// error to cover it.
			o := args[i].flip
			args[i].e = math.Max(args[i].e, math.Abs(o.v-args[i].v)+o.e)
			args[i].nobnd = args[i].nobnd || o.nobnd
			args[i].flip = nil
		}
		b.nobnd = b.nobnd || args[i].nobnd
	}
	if t.ArgKind != scalar.Float {
		// Integer and bool arithmetic is exact in both.
		vals := make([]int64, len(args))
		for i, a := range args {
			vals[i] = a.i
		}
		if len(vals) == 1 {
			switch t.Prim {
			case scalar.Neg:
				b.i = -vals[0]
			case scalar.Abs:
				b.i = max(vals[0], -vals[0])
			case scalar.Not:
				b.i = 1 - vals[0]
			}
		} else {
			b.i = interp.IntBinary(t.Prim)(vals[0], vals[1])
		}
		b.v = float64(b.i)
		return b
	}
	x := args[0]
	if t.Prim.IsCompare() {
		y := args[1]
		if cmpFloat(t.Prim, x.v, y.v) {
			b.i, b.v = 1, 1
		}
		b.unsure = math.Abs(x.v-y.v) <= x.e+y.e && (x.e > 0 || y.e > 0)
		return b
	}
	switch t.Prim {
	case scalar.Neg:
		b.v, b.e = -x.v, x.e
	case scalar.Abs:
		b.v, b.e = math.Abs(x.v), x.e
	case scalar.Sqrt:
		b.v = math.Sqrt(x.v)
		b.e = x.e/(2*math.Sqrt(math.Max(x.v-x.e, 0))) + p.u*b.v
	case scalar.Exp, scalar.Expm1:
		b.v = math.Exp(x.v)
		if t.Prim == scalar.Expm1 {
			b.v = math.Expm1(x.v)
		}
		b.e = math.Exp(x.v+x.e)*x.e + p.libm*p.u*math.Abs(b.v)
	case scalar.Log, scalar.Log1p:
		arg := x.v
		if t.Prim == scalar.Log1p {
			arg = 1 + x.v
		}
		b.v = math.Log(arg)
		if t.Prim == scalar.Log1p {
			b.v = math.Log1p(x.v)
		}
		b.e = x.e/math.Max(arg-x.e, 0) + p.libm*p.u*math.Abs(b.v)
	case scalar.Tanh:
		b.v = math.Tanh(x.v)
		b.e = x.e + p.libm*p.u*math.Abs(b.v)
	case scalar.Sin, scalar.Cos:
		// |sin'| and |cos'| are at most 1; libm's error is a few ulps of
		// the result's scale, 1, even near a root.
		b.v = math.Sin(x.v)
		if t.Prim == scalar.Cos {
			b.v = math.Cos(x.v)
		}
		b.e = x.e + p.libm*p.u
	case scalar.Erf:
		b.v = math.Erf(x.v)
		b.e = 2/math.SqrtPi*x.e + p.libm*p.u*math.Abs(b.v)
	case scalar.Tan:
		// As sin and cos, tan is accurate to a few ulps of the scale 1
		// of sin and cos, not of tan near its zeros (Go's and glibc's
		// disagree by 30 ulps of tan(1e30)): through tan = sin/cos that is
		// L·u·(1 + |tan|)/|cos|, 1/|cos| = sqrt(1 + tan²).
		b.v = math.Tan(x.v)
		b.e = slope(t.Prim, x.v, x.e)*x.e + p.libm*p.u*(1+math.Abs(b.v))*math.Sqrt(1+b.v*b.v)
	case scalar.Asin, scalar.Acos, scalar.Atan, scalar.Sinh, scalar.Cosh, scalar.Asinh, scalar.Acosh, scalar.Atanh:
		b.v = interp.FloatUnary(t.Prim)(x.v)
		b.e = slope(t.Prim, x.v, x.e)*x.e + p.libm*p.u*math.Abs(b.v)
	case scalar.Add, scalar.Sub:
		y := args[1]
		b.v = interp.FloatBinary(t.Prim)(x.v, y.v)
		b.e = x.e + y.e + p.u*math.Abs(b.v)
	case scalar.Mul:
		y := args[1]
		b.v = x.v * y.v
		b.e = math.Abs(y.v)*x.e + math.Abs(x.v)*y.e + x.e*y.e + p.u*math.Abs(b.v)
	case scalar.Div:
		y := args[1]
		b.v = x.v / y.v
		b.e = (x.e+math.Abs(b.v)*y.e)/(math.Abs(y.v)-y.e) + p.u*math.Abs(b.v)
		if math.Abs(y.v) <= y.e {
			b.e = math.Inf(1)
		}
	case scalar.Max, scalar.Min:
		y := args[1]
		b.v = interp.FloatBinary(t.Prim)(x.v, y.v)
		b.e = math.Max(x.e, y.e)
	case scalar.Pow:
		y := args[1]
		b.v = math.Pow(x.v, y.v)
		da := math.Abs(y.v * math.Pow(x.v, y.v-1))
		db := math.Abs(math.Log(math.Abs(x.v)) * b.v)
		b.e = (first(da, x.e)+first(db, y.e))*(1+1e-3) + (p.libm+math.Abs(y.v*math.Log(math.Abs(x.v)))+math.Abs(y.v))*p.u*math.Abs(b.v)
		if x.e > 0 || y.e > 0 {
			// pow's derivative varies fast; outside first order, give up.
			b.e *= 2
		}
	default:
		b.nobnd = true
	}
	b.e += p.tiny
	if math.IsNaN(b.v) || math.IsInf(b.v, 0) || math.Abs(b.v)+b.e > p.max || math.IsNaN(b.e) || math.IsInf(b.e, 0) {
		b.nobnd = true
	}
	return b
}

func cmpFloat(p scalar.Prim, a, b float64) bool {
	switch p {
	case scalar.Eq:
		return a == b
	case scalar.Ne:
		return a != b
	case scalar.Lt:
		return a < b
	case scalar.Le:
		return a <= b
	case scalar.Gt:
		return a > b
	}
	return a >= b
}

// first is the first-order error d·e of an exact (e = 0) or inexact input.
func first(d, e float64) float64 {
	if e == 0 {
		return 0
	}
	return d * e
}

// slope is sup |f'| over [x - e, x + e] for the trigonometric and
// hyperbolic primitives (+Inf where the interval reaches a pole or the
// edge of the domain, which leaves the element unbounded).
func slope(p scalar.Prim, x, e float64) float64 {
	far := math.Abs(x) + e // the end farthest from 0
	near := math.Max(math.Abs(x)-e, 0)
	inv := func(v float64) float64 {
		if v <= 0 {
			return math.Inf(1)
		}
		return 1 / v
	}
	switch p {
	case scalar.Tan:
		if math.Floor((x-e)/math.Pi+0.5) != math.Floor((x+e)/math.Pi+0.5) {
			return math.Inf(1) // a pole at π/2 + kπ lies inside
		}
		return 1 + math.Max(math.Pow(math.Tan(x-e), 2), math.Pow(math.Tan(x+e), 2))
	case scalar.Asin, scalar.Acos:
		return inv(math.Sqrt(math.Max(1-far*far, 0)))
	case scalar.Atan, scalar.Asinh:
		return inv(math.Sqrt(1 + near*near))
	case scalar.Sinh, scalar.Cosh:
		return math.Cosh(far)
	case scalar.Acosh:
		return inv(math.Sqrt(math.Max(x-e, 0)*math.Max(x-e, 0) - 1))
	case scalar.Atanh:
		return inv(1 - far*far)
	}
	panic("slope of " + p.String())
}
