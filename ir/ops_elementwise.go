package ir

import "fmt"

// Elementwise and broadcasting ops.

func init() {
	for _, u := range []struct{ name, summary string }{
		{"relu", "max(x, 0)"},
		{"neg", "-x"},
		{"abs", "|x|"},
		{"exp", "e^x"},
		{"log", "natural logarithm"},
		{"sqrt", "square root"},
		{"reciprocal", "1/x"},
		{"tanh", "hyperbolic tangent"},
		{"sigmoid", "1/(1+e^-x)"},
		{"identity", "x, copied"},
		{"erf", "the error function"},
		{"silu", "x * sigmoid(x)"},
		{"hard_swish", "x * relu6(x + 3) / 6"},
		{"sign", "-1, 0 or 1"},
	} {
		registerUnary(u.name, u.summary, nil)
	}
	registerUnary("gelu", "x * Phi(x); approximate = \"none\" (erf) or \"tanh\"", []AttrSpec{{Name: "approximate", Kind: AttrString}})
	registerUnary("hard_sigmoid", "max(0, min(1, alpha*x + beta)); alpha 0.2, beta 0.5 by default", []AttrSpec{{Name: "alpha", Kind: AttrFloat}, {Name: "beta", Kind: AttrFloat}})
	// Gradients of unary ops: (dy, s) -> dy * f'(x), where s is the
	// forward output y for relu, sigmoid and tanh and the input x otherwise.
	for _, g := range []struct {
		name  string
		attrs []AttrSpec
	}{
		{"relu_grad", nil}, {"sigmoid_grad", nil}, {"tanh_grad", nil}, {"erf_grad", nil}, {"silu_grad", nil},
		{"hard_swish_grad", nil},
		{"gelu_grad", []AttrSpec{{Name: "approximate", Kind: AttrString}}},
		{"hard_sigmoid_grad", []AttrSpec{{Name: "alpha", Kind: AttrFloat}, {Name: "beta", Kind: AttrFloat}}},
	} {
		Register(&OpDef{
			Name: g.name, Summary: "dy * f'(x) of the forward op", MinOperands: 2, MaxOperands: 2, Attrs: g.attrs,
			Infer: func(in []Type, _ Attrs) ([]Type, error) {
				if !in[0].Equal(in[1]) {
					return nil, fmt.Errorf("dy %s and saved value %s differ", in[0], in[1])
				}
				return []Type{in[0]}, floatOperand(in[0])
			},
			FLOPs:   func(in, _ []Type, _ Attrs) int64 { return 2 * in[0].NumElements() },
			Fusion:  Elementwise,
			InPlace: true,
		})
	}
	for _, b := range []struct {
		name, summary string
		commutative   bool
	}{
		{"add", "a + b", true},
		{"sub", "a - b", false},
		{"mul", "a * b", true},
		{"div", "a / b", false},
		{"max", "elementwise maximum", true},
		{"min", "elementwise minimum", true},
		{"pow", "a ^ b", false},
	} {
		registerBinary(b.name, b.summary, b.commutative)
	}
	for _, name := range []string{"eq", "ne", "lt", "le", "gt", "ge"} {
		Register(&OpDef{
			Name: name, Summary: "comparison, broadcasting, giving bool", MinOperands: 2, MaxOperands: 2,
			Infer: func(in []Type, _ Attrs) ([]Type, error) {
				if err := sameDType(in...); err != nil {
					return nil, err
				}
				s, err := BroadcastShapes(in[0].Shape, in[1].Shape)
				return []Type{{DType: Bool, Shape: s}}, err
			},
			Fusion:      Broadcast,
			Commutative: name == "eq" || name == "ne",
		})
	}
	Register(&OpDef{
		Name: "where", Summary: "cond ? a : b, broadcasting", MinOperands: 3, MaxOperands: 3,
		Infer: func(in []Type, _ Attrs) ([]Type, error) {
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
	})
	Register(&OpDef{
		Name: "constant", Summary: "a constant tensor", MaxOperands: 0,
		Attrs:  []AttrSpec{{Name: "value", Kind: AttrDense, Required: true}},
		Infer:  func(_ []Type, a Attrs) ([]Type, error) { return []Type{a["value"].Dense.Type}, nil },
		FLOPs:  zeroFLOPs,
		Fusion: Elementwise,
	})
	Register(&OpDef{
		Name: "cast", Summary: "convert to another dtype", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "to", Kind: AttrType, Required: true}},
		Infer: func(in []Type, a Attrs) ([]Type, error) {
			return []Type{{DType: a["to"].DType, Shape: in[0].Shape}}, nil
		},
		FLOPs:  zeroFLOPs,
		Fusion: Elementwise,
	})
}

func registerUnary(name, summary string, attrs []AttrSpec) {
	Register(&OpDef{
		Name: name, Summary: summary, MinOperands: 1, MaxOperands: 1, Attrs: attrs,
		Infer: func(in []Type, _ Attrs) ([]Type, error) {
			if !in[0].DType.IsFloat() && name != "identity" && name != "neg" && name != "abs" && name != "sign" {
				return nil, fmt.Errorf("%s needs a floating-point operand, got %s", name, in[0])
			}
			return []Type{in[0]}, nil
		},
		Fusion:  Elementwise,
		InPlace: true,
	})
}

func registerBinary(name, summary string, commutative bool) {
	Register(&OpDef{
		Name: name, Summary: summary, MinOperands: 2, MaxOperands: 2,
		Infer: func(in []Type, _ Attrs) ([]Type, error) {
			if err := sameDType(in...); err != nil {
				return nil, err
			}
			s, err := BroadcastShapes(in[0].Shape, in[1].Shape)
			if err != nil {
				return nil, err
			}
			return []Type{{DType: in[0].DType, Shape: s}}, nil
		},
		Fusion:      Broadcast,
		InPlace:     true,
		Commutative: commutative,
	})
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
	})
}
