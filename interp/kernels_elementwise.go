package interp

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

// kernel computes an op's results from its operands. out holds the
// result types the verifier checked.
type kernel func(op *ir.Op, in []*Tensor, out []ir.Type, rt *runtime) ([]*Tensor, error)

var kernels = map[string]kernel{}

func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

const invSqrt2 = 0.7071067811865476
const sqrt2OverPi = 0.7978845608028654

func gelu(x float64, tanhForm bool) float64 {
	if tanhForm {
		return 0.5 * x * (1 + math.Tanh(sqrt2OverPi*(x+0.044715*x*x*x)))
	}
	return 0.5 * x * (1 + math.Erf(x*invSqrt2))
}

func geluGrad(x float64, tanhForm bool) float64 {
	if tanhForm {
		u := sqrt2OverPi * (x + 0.044715*x*x*x)
		t := math.Tanh(u)
		return 0.5*(1+t) + 0.5*x*(1-t*t)*sqrt2OverPi*(1+3*0.044715*x*x)
	}
	return 0.5*(1+math.Erf(x*invSqrt2)) + x*math.Exp(-0.5*x*x)/math.Sqrt(2*math.Pi)
}

func hardSigmoid(x, alpha, beta float64) float64 { return math.Max(0, math.Min(1, alpha*x+beta)) }

// unaryFn returns the elementwise function of a unary op.
func unaryFn(op *ir.Op) func(float64) float64 {
	a := op.Attrs
	switch op.Kind {
	case "relu":
		return func(x float64) float64 {
			if x > 0 {
				return x
			}
			return 0
		}
	case "neg":
		return func(x float64) float64 { return -x }
	case "abs":
		return math.Abs
	case "sign":
		return func(x float64) float64 {
			switch {
			case x > 0:
				return 1
			case x < 0:
				return -1
			}
			return x
		}
	case "exp":
		return math.Exp
	case "log":
		return math.Log
	case "sqrt":
		return math.Sqrt
	case "reciprocal":
		return func(x float64) float64 { return 1 / x }
	case "tanh":
		return math.Tanh
	case "sigmoid":
		return sigmoid
	case "identity":
		return func(x float64) float64 { return x }
	case "erf":
		return math.Erf
	case "silu":
		return func(x float64) float64 { return x * sigmoid(x) }
	case "hard_swish":
		return func(x float64) float64 { return x * math.Max(0, math.Min(6, x+3)) / 6 }
	case "gelu":
		t := a.String("approximate", "none") == "tanh"
		return func(x float64) float64 { return gelu(x, t) }
	case "hard_sigmoid":
		al, be := a.Float("alpha", 0.2), a.Float("beta", 0.5)
		return func(x float64) float64 { return hardSigmoid(x, al, be) }
	}
	return nil
}

// unaryGradFn returns f'(s) for the *_grad ops, where s is the saved
// value the op receives.
func unaryGradFn(op *ir.Op) func(s float64) float64 {
	a := op.Attrs
	switch op.Kind {
	case "relu_grad":
		return func(y float64) float64 {
			if y > 0 {
				return 1
			}
			return 0
		}
	case "sigmoid_grad":
		return func(y float64) float64 { return y * (1 - y) }
	case "tanh_grad":
		return func(y float64) float64 { return 1 - y*y }
	case "erf_grad":
		return func(x float64) float64 { return 2 / math.Sqrt(math.Pi) * math.Exp(-x*x) }
	case "silu_grad":
		return func(x float64) float64 { s := sigmoid(x); return s * (1 + x*(1-s)) }
	case "hard_swish_grad":
		return func(x float64) float64 {
			switch {
			case x < -3:
				return 0
			case x > 3:
				return 1
			}
			return (2*x + 3) / 6
		}
	case "gelu_grad":
		t := a.String("approximate", "none") == "tanh"
		return func(x float64) float64 { return geluGrad(x, t) }
	case "hard_sigmoid_grad":
		al, be := a.Float("alpha", 0.2), a.Float("beta", 0.5)
		return func(x float64) float64 {
			if v := al*x + be; v > 0 && v < 1 {
				return al
			}
			return 0
		}
	}
	return nil
}

func init() {
	for _, name := range []string{"relu", "neg", "abs", "sign", "exp", "log", "sqrt", "reciprocal", "tanh", "sigmoid",
		"identity", "erf", "silu", "hard_swish", "gelu", "hard_sigmoid"} {
		kernels[name] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
			x := in[0]
			y := New(out[0])
			if !x.Type.DType.IsFloat() {
				for i, v := range x.I {
					switch op.Kind {
					case "neg":
						y.I[i] = -v
					case "abs":
						y.I[i] = max(v, -v)
					case "sign":
						y.I[i] = int64(unaryFn(op)(float64(v)))
					default:
						y.I[i] = v
					}
				}
				return []*Tensor{y}, nil
			}
			fn := unaryFn(op)
			for i, v := range x.F {
				y.F[i] = fn(v)
			}
			return []*Tensor{y}, nil
		}
	}
	for _, name := range []string{"relu_grad", "sigmoid_grad", "tanh_grad", "erf_grad", "silu_grad", "hard_swish_grad", "gelu_grad", "hard_sigmoid_grad"} {
		kernels[name] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
			fn := unaryGradFn(op)
			y := New(out[0])
			for i, dy := range in[0].F {
				y.F[i] = dy * fn(in[1].F[i])
			}
			return []*Tensor{y}, nil
		}
	}
	binary := map[string]func(a, b float64) float64{
		"add": func(a, b float64) float64 { return a + b },
		"sub": func(a, b float64) float64 { return a - b },
		"mul": func(a, b float64) float64 { return a * b },
		"div": func(a, b float64) float64 { return a / b },
		"max": func(a, b float64) float64 {
			if a != a || a > b {
				return a
			}
			return b
		},
		"min": func(a, b float64) float64 {
			if a != a || a < b {
				return a
			}
			return b
		},
		"pow": math.Pow,
	}
	intBinary := map[string]func(a, b int64) int64{
		"add": func(a, b int64) int64 { return a + b },
		"sub": func(a, b int64) int64 { return a - b },
		"mul": func(a, b int64) int64 { return a * b },
		"div": func(a, b int64) int64 {
			if b == 0 {
				return 0
			}
			return a / b
		},
		"max": func(a, b int64) int64 { return max(a, b) },
		"min": func(a, b int64) int64 { return min(a, b) },
		"pow": func(a, b int64) int64 { return int64(math.Pow(float64(a), float64(b))) },
	}
	for name, fn := range binary {
		ifn := intBinary[name]
		kernels[name] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
			y := New(out[0])
			a, b := in[0], in[1]
			if out[0].DType.IsFloat() {
				eachBroadcast(out[0].Shape, a.Type.Shape, b.Type.Shape, func(i, ia, ib int64) { y.F[i] = fn(a.F[ia], b.F[ib]) })
			} else {
				eachBroadcast(out[0].Shape, a.Type.Shape, b.Type.Shape, func(i, ia, ib int64) { y.I[i] = ifn(a.I[ia], b.I[ib]) })
			}
			return []*Tensor{y}, nil
		}
	}
	compare := map[string]func(a, b float64) bool{
		"eq": func(a, b float64) bool { return a == b },
		"ne": func(a, b float64) bool { return a != b },
		"lt": func(a, b float64) bool { return a < b },
		"le": func(a, b float64) bool { return a <= b },
		"gt": func(a, b float64) bool { return a > b },
		"ge": func(a, b float64) bool { return a >= b },
	}
	for name, fn := range compare {
		kernels[name] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
			y := New(out[0])
			a, b := in[0], in[1]
			eachBroadcast(out[0].Shape, a.Type.Shape, b.Type.Shape, func(i, ia, ib int64) {
				if fn(a.At(int(ia)), b.At(int(ib))) {
					y.I[i] = 1
				}
			})
			return []*Tensor{y}, nil
		}
	}
	kernels["where"] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := New(out[0])
		c, a, b := in[0], in[1], in[2]
		o := newOdometer(out[0].Shape, broadcastStrides(c.Type.Shape, out[0].Shape),
			broadcastStrides(a.Type.Shape, out[0].Shape), broadcastStrides(b.Type.Shape, out[0].Shape))
		n := out[0].NumElements()
		for i := int64(0); i < n; i++ {
			src, at := b, o.pos[2]
			if c.I[o.pos[0]] != 0 {
				src, at = a, o.pos[1]
			}
			if y.F != nil {
				y.F[i] = src.F[at]
			} else {
				y.I[i] = src.I[at]
			}
			o.next()
		}
		return []*Tensor{y}, nil
	}
	kernels["constant"] = func(op *ir.Op, _ []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
		return []*Tensor{FromDense(op.Attrs["value"].Dense)}, nil
	}
	kernels["cast"] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := New(out[0])
		n := in[0].Len()
		for i := 0; i < n; i++ {
			v := in[0].At(i)
			if y.F != nil {
				y.F[i] = v
			} else {
				if out[0].DType == ir.Bool {
					if v != 0 {
						y.I[i] = 1
					}
					continue
				}
				if math.IsNaN(v) || math.IsInf(v, 0) {
					v = 0
				}
				if in[0].F == nil {
					y.I[i] = in[0].I[i]
				} else {
					y.I[i] = int64(math.Trunc(v))
				}
				switch out[0].DType {
				case ir.I32:
					y.I[i] = int64(int32(y.I[i]))
				case ir.I8:
					y.I[i] = int64(int8(y.I[i]))
				}
			}
		}
		return []*Tensor{y}, nil
	}
}

// eachBroadcast calls fn for every element i of out with the flat indices
// of the two broadcast operands.
func eachBroadcast(out, a, b ir.Shape, fn func(i, ia, ib int64)) {
	n, _ := out.NumElements()
	switch {
	case a.Equal(out) && b.Equal(out):
		for i := int64(0); i < n; i++ {
			fn(i, i, i)
		}
		return
	case a.Equal(out) && isScalarShape(b):
		for i := int64(0); i < n; i++ {
			fn(i, i, 0)
		}
		return
	}
	o := newOdometer(out, broadcastStrides(a, out), broadcastStrides(b, out))
	for i := int64(0); i < n; i++ {
		fn(i, o.pos[0], o.pos[1])
		o.next()
	}
}

func isScalarShape(s ir.Shape) bool {
	n, _ := s.NumElements()
	return n == 1
}
