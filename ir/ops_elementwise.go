package ir

import (
	"fmt"
	"math"

	"github.com/kiln-compiler/kiln/ir/scalar"
)

// Elementwise and broadcasting ops. Each one's Scalar is its meaning:
// the interpreter, constant folding and compiled code all evaluate it.

var x0, x1 = scalar.X(0), scalar.X(1)

func num(v float64) *scalar.Expr { return scalar.C(v) }

func un(p scalar.Prim, x *scalar.Expr) *scalar.Expr { return scalar.Un(p, x) }

// same is the Scalar of an op whose expression reads no attribute.
func same(e *scalar.Expr) func(AttrValues, []Type, Type) *scalar.Expr {
	return func(AttrValues, []Type, Type) *scalar.Expr { return e }
}

// derivOf is a Deriv expression that reads no attribute.
func derivOf(e *scalar.Expr) func(AttrValues) *scalar.Expr {
	return func(AttrValues) *scalar.Expr { return e }
}

// gelu's constants: 1/sqrt(2), sqrt(2/pi) and the tanh form's cubic term.
const (
	invSqrt2    = 0.7071067811865476
	sqrt2OverPi = 0.7978845608028654
	geluCubic   = 0.044715
)

func softplusOf(x *scalar.Expr) *scalar.Expr {
	return x.Max(num(0)).Add(un(scalar.Log1p, un(scalar.Exp, un(scalar.Neg, un(scalar.Abs, x)))))
}

// mishDeriv is tanh(sp) + x * sigmoid(x) * (1 - tanh(sp)^2), sp = softplus(x).
func mishDeriv(x *scalar.Expr) *scalar.Expr {
	t := un(scalar.Tanh, softplusOf(x))
	return t.Add(x.Mul(scalar.Sigmoid(x)).Mul(num(1).Sub(t.Mul(t))))
}

// beyondOne is near(x) for |x| <= 1 and far(1/x) past it, for a
// derivative whose form in x would overflow (x²) for large |x|.
func beyondOne(x, near *scalar.Expr, far func(r *scalar.Expr) *scalar.Expr) *scalar.Expr {
	return scalar.If(un(scalar.Abs, x).Gt(num(1)), far(num(1).Div(x)), near)
}

func geluTanhArg(x *scalar.Expr) *scalar.Expr {
	return num(sqrt2OverPi).Mul(x.Add(num(geluCubic).Mul(x.Mul(x.Mul(x)))))
}

func init() {
	// Unary ops. ints: the op also takes integer operands.
	for _, u := range []struct {
		name, summary, onnx string
		ints                bool
		f                   *scalar.Expr
		grad                GradKind
		deriv               *Deriv
	}{
		// relu propagates NaN, as PyTorch's does.
		{name: "relu", summary: "max(x, 0); NaN stays NaN", onnx: "Relu", f: scalar.If(x0.Lt(num(0)), num(0), x0),
			deriv: &Deriv{FromOutput: true, SignOnly: true, Expr: derivOf(scalar.If(x0.Gt(num(0)), num(1), num(0)))}},
		{name: "neg", summary: "-x", onnx: "Neg", ints: true, f: un(scalar.Neg, x0)},
		{name: "abs", summary: "|x|", onnx: "Abs", ints: true, f: un(scalar.Abs, x0)},
		{name: "exp", summary: "e^x", onnx: "Exp", f: un(scalar.Exp, x0)},
		{name: "log", summary: "natural logarithm", onnx: "Log", f: un(scalar.Log, x0)},
		{name: "sqrt", summary: "square root", onnx: "Sqrt", f: un(scalar.Sqrt, x0)},
		{name: "reciprocal", summary: "1/x", onnx: "Reciprocal", f: num(1).Div(x0)},
		{name: "tanh", summary: "hyperbolic tangent", onnx: "Tanh", f: un(scalar.Tanh, x0),
			deriv: &Deriv{FromOutput: true, Expr: derivOf(num(1).Sub(x0.Mul(x0)))}},
		{name: "sigmoid", summary: "1/(1+e^-x)", onnx: "Sigmoid", f: scalar.Sigmoid(x0),
			deriv: &Deriv{FromOutput: true, Expr: derivOf(x0.Mul(num(1).Sub(x0)))}},
		{name: "identity", summary: "x, copied", ints: true, f: x0},
		{name: "erf", summary: "the error function", onnx: "Erf", f: un(scalar.Erf, x0),
			deriv: &Deriv{Expr: derivOf(num(2 / math.Sqrt(math.Pi)).Mul(un(scalar.Exp, un(scalar.Neg, x0.Mul(x0)))))}},
		{name: "silu", summary: "x * sigmoid(x)", f: x0.Mul(scalar.Sigmoid(x0)),
			deriv: &Deriv{Expr: derivOf(scalar.Sigmoid(x0).Mul(num(1).Add(x0.Mul(num(1).Sub(scalar.Sigmoid(x0))))))}},
		{name: "hard_swish", summary: "x * relu6(x + 3) / 6", onnx: "HardSwish", f: x0.Mul(scalar.Clamp(x0.Add(num(3)), num(0), num(6)).Div(num(6))),
			deriv: &Deriv{Expr: derivOf(scalar.If(x0.Lt(num(-3)), num(0), scalar.If(x0.Gt(num(3)), num(1), num(2).Mul(x0).Add(num(3)).Div(num(6)))))}},
		{name: "sign", summary: "-1, 0 or 1 (NaN and -0 stay)", onnx: "Sign", ints: true,
			f: scalar.If(x0.Gt(num(0)), num(1), scalar.If(x0.Lt(num(0)), num(-1), x0)), grad: GradZero},
		{name: "floor", summary: "round toward -inf", onnx: "Floor", f: un(scalar.Floor, x0), grad: GradZero},
		{name: "ceil", summary: "round toward +inf", onnx: "Ceil", f: un(scalar.Ceil, x0), grad: GradZero},
		{name: "sin", summary: "sine", onnx: "Sin", f: un(scalar.Sin, x0), deriv: &Deriv{Expr: derivOf(un(scalar.Cos, x0))}},
		{name: "cos", summary: "cosine", onnx: "Cos", f: un(scalar.Cos, x0), deriv: &Deriv{Expr: derivOf(un(scalar.Neg, un(scalar.Sin, x0)))}},
		{name: "tan", summary: "tangent", onnx: "Tan", f: un(scalar.Tan, x0),
			deriv: &Deriv{FromOutput: true, Expr: derivOf(num(1).Add(x0.Mul(x0)))}},
		// The derivatives are written so that no intermediate overflows
		// or cancels: (1 - x)(1 + x) for 1 - x², and 1/x in place of x
		// past |x| = 1 where x² would overflow.
		{name: "asin", summary: "arcsine", onnx: "Asin", f: un(scalar.Asin, x0),
			deriv: &Deriv{Expr: derivOf(num(1).Div(un(scalar.Sqrt, num(1).Sub(x0).Mul(num(1).Add(x0)))))}},
		{name: "acos", summary: "arccosine", onnx: "Acos", f: un(scalar.Acos, x0),
			deriv: &Deriv{Expr: derivOf(num(-1).Div(un(scalar.Sqrt, num(1).Sub(x0).Mul(num(1).Add(x0)))))}},
		{name: "atan", summary: "arctangent", onnx: "Atan", f: un(scalar.Atan, x0),
			deriv: &Deriv{Expr: derivOf(beyondOne(x0, num(1).Div(num(1).Add(x0.Mul(x0))), func(r *scalar.Expr) *scalar.Expr {
				return r.Mul(r).Div(r.Mul(r).Add(num(1)))
			}))}},
		{name: "sinh", summary: "hyperbolic sine", onnx: "Sinh", f: un(scalar.Sinh, x0), deriv: &Deriv{Expr: derivOf(un(scalar.Cosh, x0))}},
		{name: "cosh", summary: "hyperbolic cosine", onnx: "Cosh", f: un(scalar.Cosh, x0), deriv: &Deriv{Expr: derivOf(un(scalar.Sinh, x0))}},
		{name: "asinh", summary: "inverse hyperbolic sine", onnx: "Asinh", f: un(scalar.Asinh, x0),
			deriv: &Deriv{Expr: derivOf(beyondOne(x0, num(1).Div(un(scalar.Sqrt, x0.Mul(x0).Add(num(1)))), func(r *scalar.Expr) *scalar.Expr {
				return un(scalar.Abs, r).Div(un(scalar.Sqrt, r.Mul(r).Add(num(1))))
			}))}},
		{name: "acosh", summary: "inverse hyperbolic cosine", onnx: "Acosh", f: un(scalar.Acosh, x0),
			deriv: &Deriv{Expr: derivOf(num(1).Div(un(scalar.Sqrt, x0.Sub(num(1))).Mul(un(scalar.Sqrt, x0.Add(num(1))))))}},
		{name: "atanh", summary: "inverse hyperbolic tangent", onnx: "Atanh", f: un(scalar.Atanh, x0),
			deriv: &Deriv{Expr: derivOf(beyondOne(x0, num(1).Div(num(1).Sub(x0).Mul(num(1).Add(x0))), func(r *scalar.Expr) *scalar.Expr {
				return r.Mul(r).Div(r.Sub(num(1)).Mul(r.Add(num(1))))
			}))}},
		{name: "softsign", summary: "x / (1 + |x|)", onnx: "Softsign", f: x0.Div(num(1).Add(un(scalar.Abs, x0))),
			deriv: &Deriv{Expr: derivOf(num(1).Div(num(1).Add(un(scalar.Abs, x0))).Mul(num(1).Div(num(1).Add(un(scalar.Abs, x0)))))}},
		// mish is x * tanh(softplus(x)); tanh saturates, so no overflow.
		{name: "mish", summary: "x * tanh(softplus(x))", onnx: "Mish", f: x0.Mul(un(scalar.Tanh, softplusOf(x0))),
			deriv: &Deriv{Expr: derivOf(mishDeriv(x0))}},
		// softplus is log(1 + e^x), written as max(x, 0) + log1p(e^-|x|)
		// so that it neither overflows nor loses the small tail.
		{name: "softplus", summary: "log(1 + e^x)", onnx: "Softplus",
			f:     softplusOf(x0),
			deriv: &Deriv{Expr: derivOf(scalar.Sigmoid(x0))}},
	} {
		registerUnary(&OpDef{Name: u.name, Summary: u.summary, ONNX: u.onnx, Scalar: same(u.f), Deriv: u.deriv, Grad: u.grad}, u.ints)
	}
	// round's derivative is 0 wherever it has one. A fake quantiser's
	// round (straight_through, set by the ONNX importer) passes the
	// gradient through unchanged instead when the user allows the
	// straight-through estimate (autodiff's ste approximation), as
	// PyTorch's fake quantisation trains.
	registerUnary(&OpDef{
		Name: "round", Summary: "round half to even", ONNX: "Round",
		Attrs:  []AttrSpec{{Name: AttrStraightThrough, Kind: AttrBool}},
		Scalar: same(un(scalar.Round, x0)), Grad: GradZero,
	}, false)
	registerUnary(&OpDef{
		Name: "gelu", Summary: "x * Phi(x): approximate = \"none\" (erf) or \"tanh\"", ONNX: "Gelu",
		Attrs: []AttrSpec{{Name: "approximate", Kind: AttrString, Default: StringAttr("none"), Enum: []string{"none", "tanh"}}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			if a.String("approximate") == "tanh" {
				return num(0.5).Mul(x0).Mul(num(1).Add(un(scalar.Tanh, geluTanhArg(x0))))
			}
			return num(0.5).Mul(x0).Mul(num(1).Add(un(scalar.Erf, x0.Mul(num(invSqrt2)))))
		},
		Deriv: &Deriv{Expr: func(a AttrValues) *scalar.Expr {
			if a.String("approximate") == "tanh" {
				t := un(scalar.Tanh, geluTanhArg(x0))
				inner := num(sqrt2OverPi).Mul(num(1).Add(num(3 * geluCubic).Mul(x0.Mul(x0))))
				d := num(0.5).Mul(num(1).Add(t)).Add(num(0.5).Mul(x0).Mul(num(1).Sub(t.Mul(t))).Mul(inner))
				// Past |x| = 10 the derivative is 1 or 0 to 1e-35, and the
				// formula's x³ overflows f32 (0 * inf).
				return scalar.If(un(scalar.Abs, x0).Gt(num(10)), scalar.If(x0.Gt(num(0)), num(1), num(0)), d)
			}
			cdf := num(0.5).Mul(num(1).Add(un(scalar.Erf, x0.Mul(num(invSqrt2)))))
			pdf := un(scalar.Exp, num(-0.5).Mul(x0.Mul(x0))).Div(num(math.Sqrt(2 * math.Pi)))
			return cdf.Add(x0.Mul(pdf))
		}},
	}, false)
	registerUnary(&OpDef{
		Name: "hard_sigmoid", Summary: "max(0, min(1, alpha*x + beta))", ONNX: "HardSigmoid",
		Attrs: []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: FloatAttr(0.2)}, {Name: "beta", Kind: AttrFloat, Default: FloatAttr(0.5)}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			return scalar.Clamp(num(a.Float("alpha")).Mul(x0).Add(num(a.Float("beta"))), num(0), num(1))
		},
		Deriv: &Deriv{Expr: func(a AttrValues) *scalar.Expr {
			v := num(a.Float("alpha")).Mul(x0).Add(num(a.Float("beta")))
			return scalar.If(v.Gt(num(0)).And(v.Lt(num(1))), num(a.Float("alpha")), num(0))
		}},
	}, false)
	registerUnary(&OpDef{
		Name: "elu", Summary: "x for x > 0, alpha * (e^x - 1) otherwise", ONNX: "Elu",
		Attrs: []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: FloatAttr(1)}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			return scalar.If(x0.Gt(num(0)), x0, num(a.Float("alpha")).Mul(un(scalar.Expm1, x0)))
		},
		Deriv: &Deriv{Expr: func(a AttrValues) *scalar.Expr {
			return scalar.If(x0.Gt(num(0)), num(1), num(a.Float("alpha")).Mul(un(scalar.Exp, x0)))
		}},
	}, false)

	registerUnary(&OpDef{
		Name: "clip", Summary: "min(max(x, lo), hi) (ReLU6 is clip(0, 6)); NaN stays NaN", ONNX: "",
		Attrs: []AttrSpec{{Name: "lo", Kind: AttrFloat, Default: FloatAttr(math.Inf(-1))}, {Name: "hi", Kind: AttrFloat, Default: FloatAttr(math.Inf(1))}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			return scalar.Clamp(x0, num(a.Float("lo")), num(a.Float("hi")))
		},
		// As PyTorch's hardtanh: 1 strictly inside the range, 0 outside and
		// at the bounds.
		Deriv: &Deriv{Expr: func(a AttrValues) *scalar.Expr {
			return scalar.If(x0.Gt(num(a.Float("lo"))).And(x0.Lt(num(a.Float("hi")))), num(1), num(0))
		}},
	}, false)
	registerUnary(&OpDef{
		Name: "celu", Summary: "x for x > 0, alpha * (e^(x/alpha) - 1) otherwise", ONNX: "Celu",
		Attrs: []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: FloatAttr(1)}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			return scalar.If(x0.Gt(num(0)), x0, num(a.Float("alpha")).Mul(un(scalar.Expm1, x0.Div(num(a.Float("alpha"))))))
		},
		Deriv: &Deriv{Expr: func(a AttrValues) *scalar.Expr {
			return scalar.If(x0.Gt(num(0)), num(1), un(scalar.Exp, x0.Div(num(a.Float("alpha")))))
		}},
	}, false)
	registerUnary(&OpDef{
		Name: "leaky_relu", Summary: "x for x >= 0, alpha * x otherwise; NaN stays NaN", ONNX: "LeakyRelu",
		Attrs: []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: FloatAttr(0.01)}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			return scalar.If(x0.Lt(num(0)), num(a.Float("alpha")).Mul(x0), x0)
		},
		Deriv: &Deriv{Expr: func(a AttrValues) *scalar.Expr {
			return scalar.If(x0.Gt(num(0)), num(1), num(a.Float("alpha")))
		}},
	}, false)
	registerUnary(&OpDef{
		Name: "selu", Summary: "gamma * (x for x > 0, alpha * (e^x - 1) otherwise)", ONNX: "Selu",
		Attrs: []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: FloatAttr(1.67326319217681884765625)},
			{Name: "gamma", Kind: AttrFloat, Default: FloatAttr(1.05070102214813232421875)}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			return num(a.Float("gamma")).Mul(scalar.If(x0.Gt(num(0)), x0, num(a.Float("alpha")).Mul(un(scalar.Expm1, x0))))
		},
		Deriv: &Deriv{Expr: func(a AttrValues) *scalar.Expr {
			return num(a.Float("gamma")).Mul(scalar.If(x0.Gt(num(0)), num(1), num(a.Float("alpha")).Mul(un(scalar.Exp, x0))))
		}},
	}, false)
	// mod: fmod = true is C's fmod (the sign of a); false is Python's
	// remainder (the sign of b), which ONNX allows for integers only.
	registerBinary(&OpDef{
		Name: "mod", Summary: "remainder: fmod (sign of a) or, with fmod = false, floored (sign of b; integers)", ONNX: "Mod",
		Attrs: []AttrSpec{{Name: "fmod", Kind: AttrBool}},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			r := scalar.Bin(scalar.Rem, x0, x1)
			if a.Bool("fmod") {
				return r
			}
			differ := scalar.Bin(scalar.Or, r.Lt(num(0)).And(x1.Gt(num(0))), r.Gt(num(0)).And(x1.Lt(num(0))))
			return scalar.If(differ, r.Add(x1), r)
		},
		Grad: NoGrad,
	})
	for _, l := range []struct {
		name, onnx string
		p          scalar.Prim
	}{{"and", "And", scalar.And}, {"or", "Or", scalar.Or}, {"xor", "Xor", scalar.Ne}} {
		Register(&OpDef{
			Name: l.name, Summary: "logical " + l.name + " of bools, broadcasting", MinOperands: 2, MaxOperands: 2, ONNX: l.onnx,
			Infer: func(in []Type, _ AttrValues) ([]Type, error) {
				if in[0].DType != Bool || in[1].DType != Bool {
					return nil, fmt.Errorf("%s needs bool operands, got %s and %s", l.name, in[0], in[1])
				}
				s, err := BroadcastShapes(in[0].Shape, in[1].Shape)
				return []Type{{DType: Bool, Shape: s}}, err
			},
			Fusion: Broadcast, Commutative: true, Grad: NoGrad,
			Scalar: same(scalar.Bin(l.p, x0, x1)),
		})
	}
	Register(&OpDef{
		Name: "not", Summary: "logical not of a bool", MinOperands: 1, MaxOperands: 1, ONNX: "Not",
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			if in[0].DType != Bool {
				return nil, fmt.Errorf("not needs a bool operand, got %s", in[0])
			}
			return []Type{in[0]}, nil
		},
		Fusion: Elementwise, InPlace: true, Grad: NoGrad,
		Scalar: same(un(scalar.Not, x0)),
	})

	for _, b := range []struct {
		name, summary, onnx string
		p                   scalar.Prim
		commutative         bool
	}{
		{"add", "a + b", "Add", scalar.Add, true},
		{"sub", "a - b", "Sub", scalar.Sub, false},
		{"mul", "a * b", "Mul", scalar.Mul, true},
		{"div", "a / b (integers: truncated, 0 where b is 0)", "Div", scalar.Div, false},
		{"max", "elementwise maximum (NaN wins)", "", scalar.Max, true},
		{"min", "elementwise minimum (NaN wins)", "", scalar.Min, true},
		{"pow", "a ^ b", "Pow", scalar.Pow, false},
	} {
		registerBinary(&OpDef{Name: b.name, Summary: b.summary, ONNX: b.onnx, Commutative: b.commutative,
			Scalar: same(scalar.Bin(b.p, x0, x1))})
	}
	for _, cmp := range []struct {
		name, onnx string
		p          scalar.Prim
	}{
		{"eq", "Equal", scalar.Eq}, {"ne", "", scalar.Ne}, {"lt", "Less", scalar.Lt},
		{"le", "LessOrEqual", scalar.Le}, {"gt", "Greater", scalar.Gt}, {"ge", "GreaterOrEqual", scalar.Ge},
	} {
		Register(&OpDef{
			Name: cmp.name, Summary: "comparison, broadcasting, giving bool (NaN compares false except under ne)", MinOperands: 2, MaxOperands: 2,
			Infer: func(in []Type, _ AttrValues) ([]Type, error) {
				if err := sameDType(in...); err != nil {
					return nil, err
				}
				s, err := BroadcastShapes(in[0].Shape, in[1].Shape)
				return []Type{{DType: Bool, Shape: s}}, err
			},
			Fusion:      Broadcast,
			Commutative: cmp.p == scalar.Eq || cmp.p == scalar.Ne,
			Scalar:      same(scalar.Bin(cmp.p, x0, x1)),
			Grad:        NoGrad,
			ONNX:        cmp.onnx,
		})
	}
	Register(&OpDef{
		Name: "where", Summary: "cond ? a : b, broadcasting", MinOperands: 3, MaxOperands: 3,
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			if in[0].DType != Bool {
				return nil, fmt.Errorf("condition must be bool, got %s", in[0])
			}
			if err := sameDType(in[1], in[2]); err != nil {
				return nil, err
			}
			s, err := BroadcastShapes(in[0].Shape, in[1].Shape)
			if err != nil {
				return nil, err
			}
			s, err = BroadcastShapes(s, in[2].Shape)
			return []Type{{DType: in[1].DType, Shape: s}}, err
		},
		Fusion:  Broadcast,
		InPlace: true,
		Scalar:  same(scalar.If(x0, x1, scalar.X(2))),
		ONNX:    "Where",
	})
	Register(&OpDef{
		Name: "constant", Summary: "a constant tensor", MaxOperands: 0, Constant: true,
		Attrs:  []AttrSpec{{Name: "value", Kind: AttrDense, Required: true}},
		Infer:  func(_ []Type, a AttrValues) ([]Type, error) { return []Type{a.Dense("value").Type}, nil },
		FLOPs:  zeroFLOPs,
		Fusion: Elementwise,
		Grad:   NoGrad,
		// Its value is whole: a part of it is a slice of it, not a
		// constant op of its own.
		Axes: func(_, out []Type, _ AttrValues) Axes {
			x := Axes{Loops: parallelLoops(out[0].Shape), Results: [][]Index{identity(0, out[0].Rank())}}
			for l := range x.Loops {
				x.Loops[l].Kind = Mixed
			}
			return x
		},
	})
	Register(&OpDef{
		Name: "cast", Summary: "convert to another dtype: floats to integers truncate and saturate (NaN: 0), integers to narrower ones wrap, to bool: not zero; floats to fp8 saturate at the largest finite value, or with saturate = false become NaN (e4m3) or infinite (e5m2) past it, as ONNX's Cast",
		MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "to", Kind: AttrType, Required: true}, {Name: "saturate", Kind: AttrBool, Default: BoolAttr(true)}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			return []Type{{DType: a.DType("to"), Shape: in[0].Shape}}, nil
		},
		FLOPs:  zeroFLOPs,
		Fusion: Elementwise,
		Scalar: castScalar,
	})
}

// castScalar converts an element to the cast's result dtype. Storing an
// integer into a narrower integer dtype keeps its low bits, so only
// floats need care: they saturate at the target's range.
func castScalar(a AttrValues, in []Type, out Type) *scalar.Expr {
	from, to := in[0].DType, out.DType
	switch {
	case to == Bool:
		return x0.Ne(num(0))
	case to == F8E4M3 || to == F8E5M2:
		// ONNX's Cast, from any type: with saturate, a value past the
		// largest finite one (infinities too) becomes it; without, e4m3
		// (which has no infinity) gives NaN where rounding would pass
		// 448, that is above 464 (464 itself rounds to even, 448), and
		// e5m2 overflows to infinity as rounding does.
		x := scalar.To(scalar.Float, x0)
		top := MaxFinite(to)
		switch {
		case a.Bool("saturate"):
			return scalar.Clamp(x, num(-top), num(top))
		case to == F8E4M3:
			return scalar.If(un(scalar.Abs, x).Gt(num(464)), num(math.NaN()), x)
		}
		return x
	case to.IsFloat() || !from.IsFloat() || to == U64:
		// Conversion to u64 saturates at its own range.
		return scalar.To(KindOf(to), x0)
	}
	bits := 8 * to.Size()
	lo, hi := -math.Ldexp(1, int(bits)-1), math.Ldexp(1, int(bits)-1)-1
	if to.IsUnsigned() {
		lo, hi = 0, math.Ldexp(1, int(bits))-1
	}
	return scalar.Clamp(scalar.To(scalar.Int, x0), num(lo), num(hi))
}

// KindOf is the scalar kind a dtype's elements compute in.
func KindOf(d DType) scalar.Kind {
	switch {
	case d.IsFloat():
		return scalar.Float
	case d == Bool:
		return scalar.Bool
	case d == U64:
		return scalar.Uint
	}
	return scalar.Int
}

func registerUnary(d *OpDef, ints bool) {
	d.MinOperands, d.MaxOperands = 1, 1
	d.Infer = func(in []Type, _ AttrValues) ([]Type, error) {
		if !in[0].DType.IsFloat() && !(ints && in[0].DType != Bool) {
			return nil, fmt.Errorf("%s needs a floating-point operand, got %s", d.Name, in[0])
		}
		return []Type{in[0]}, nil
	}
	d.Fusion = Elementwise
	d.InPlace = true
	Register(d)
}

func registerBinary(d *OpDef) {
	d.MinOperands, d.MaxOperands = 2, 2
	d.Attrs = append(d.Attrs, ResultDTypeAttr)
	d.Infer = func(in []Type, a AttrValues) ([]Type, error) {
		dt, err := ResultDTypeOf(a, in...)
		if err != nil {
			return nil, err
		}
		if dt == Bool {
			return nil, fmt.Errorf("%s needs numbers, got %s", d.Name, in[0])
		}
		s, err := BroadcastShapes(in[0].Shape, in[1].Shape)
		if err != nil {
			return nil, err
		}
		return []Type{{DType: dt, Shape: s}}, nil
	}
	d.Fusion = Broadcast
	d.InPlace = true
	Register(d)
}

// BroadcastShapes returns the NumPy broadcast of a and b.
func BroadcastShapes(a, b Shape) (Shape, error) {
	n := max(len(a), len(b))
	out := make(Shape, n)
	for i := 0; i < n; i++ {
		da, db := int64(1), int64(1)
		if j := len(a) - n + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db, db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, fmt.Errorf("shapes %s and %s do not broadcast", a, b)
		}
	}
	return out, nil
}

func init() {
	Register(&OpDef{
		Name: "kernel", Summary: "a fused kernel: its region computes the results", MaxOperands: -1,
		Attrs:     []AttrSpec{{Name: "name", Kind: AttrString}},
		Fusion:    Opaque,
		HasRegion: true,
		Grad:      NoGrad,
	})
}
