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
	} {
		registerUnary(u.name, u.summary)
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
	} {
		registerBinary(b.name, b.summary, b.commutative)
	}
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

func registerUnary(name, summary string) {
	Register(&OpDef{
		Name: name, Summary: summary, MinOperands: 1, MaxOperands: 1,
		Infer: func(in []Type, _ Attrs) ([]Type, error) {
			if !in[0].DType.IsFloat() && name != "identity" && name != "neg" && name != "abs" {
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
			if in[0].DType != in[1].DType {
				return nil, fmt.Errorf("operand dtypes differ: %s and %s", in[0].DType, in[1].DType)
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
