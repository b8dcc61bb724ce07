package ir

import "fmt"

// lerp_gather is linear interpolation along one axis (ONNX Resize's
// linear mode, one axis at a time): for each output position k along
// axis, y = x[lo[k]] + w[k] * (x[hi[k]] - x[lo[k]]). Its gradient,
// lerp_gather_grad, scatter-adds dy·(1 − w) at lo and dy·w at hi in one
// op, so the backward holds no full-size gradient per gather.

// checkLerp checks lerp_gather's lo, hi and w against data of shape s
// and returns the result shape.
func checkLerp(s Shape, dt DType, lo, hi, w Type, axis int64) (Shape, error) {
	ax, err := NormalizeAxis(axis, len(s))
	if err != nil {
		return nil, err
	}
	if !lo.DType.IsInt() || !hi.DType.IsInt() || lo.Rank() != 1 || !hi.Shape.Equal(lo.Shape) {
		return nil, fmt.Errorf("lo and hi must be integer vectors of one length, got %s and %s", lo, hi)
	}
	if w.DType != dt || !w.Shape.Equal(lo.Shape) {
		return nil, fmt.Errorf("w must be a %s vector of %d weights, got %s", dt, lo.Shape[0], w)
	}
	out := append(Shape{}, s...)
	out[ax] = lo.Shape[0]
	return out, nil
}

func init() {
	Register(&OpDef{
		Name: "lerp_gather", Summary: "linear interpolation along axis: y = x[lo] + w * (x[hi] - x[lo]) (x, lo, hi, w)",
		MinOperands: 4, MaxOperands: 4,
		Attrs:   []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(0)}},
		Indices: func(in []Type, a AttrValues) []IndexOperand { return lerpIndices(in[0].Shape, a) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if err := floatOperand(in[0]); err != nil {
				return nil, err
			}
			s, err := checkLerp(in[0].Shape, in[0].DType, in[1], in[2], in[3], a.Int("axis"))
			return []Type{{DType: in[0].DType, Shape: s}}, err
		},
		FLOPs: func(_, out []Type, _ AttrValues) int64 { return 3 * out[0].NumElements() }, Fusion: Injective,
		// Loops over the result; lo and hi choose x's positions along the
		// axis, and lo, hi and w follow the axis's loop.
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), in[0].Rank())
			xm := identity(0, in[0].Rank())
			xm[ax] = Fixed
			k := []Index{At(ax)}
			return Axes{Loops: parallelLoops(out[0].Shape), Operands: [][]Index{xm, k, k, k}, Results: [][]Index{identity(0, out[0].Rank())}}
		},
		Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "lerp_gather_grad", Summary: "scatter-add dy * (1 - w) at lo and dy * w at hi into zeros of data_shape along axis (dy, lo, hi, w)",
		MinOperands: 4, MaxOperands: 4,
		Attrs:   []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(0)}, {Name: "data_shape", Kind: AttrList, Required: true}},
		Indices: func(_ []Type, a AttrValues) []IndexOperand { return lerpIndices(a.Ints("data_shape"), a) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if err := floatOperand(in[0]); err != nil {
				return nil, err
			}
			ds := Shape(a.Ints("data_shape"))
			for _, d := range ds {
				if d < 0 {
					return nil, fmt.Errorf("data_shape %v has a negative extent", ds)
				}
			}
			s, err := checkLerp(ds, in[0].DType, in[1], in[2], in[3], a.Int("axis"))
			if err != nil {
				return nil, err
			}
			if !s.Equal(in[0].Shape) {
				return nil, fmt.Errorf("dy %s does not match the interpolation's result %s", in[0], s)
			}
			return []Type{{DType: in[0].DType, Shape: ds}}, nil
		},
		FLOPs: func(in, _ []Type, _ AttrValues) int64 { return 3 * in[0].NumElements() }, Fusion: Reduction, // of dy: it absorbs the ops that make dy
		// Loops over dy: the axis's loop is summed into the positions lo
		// and hi hold.
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), in[0].Rank())
			res := identity(0, out[0].Rank())
			res[ax] = Fixed
			k := []Index{At(ax)}
			x := Axes{Loops: parallelLoops(in[0].Shape), Operands: [][]Index{identity(0, in[0].Rank()), k, k, k}, Results: [][]Index{res}}
			x.Loops[ax].Kind = Summed
			return x
		},
		Linear: linearIn([]int{0}), ShapeAttr: "data_shape",
	})
}

// lerpIndices says that lo and hi (operands 1 and 2) index axis "axis"
// of data from 0.
func lerpIndices(data []int64, a AttrValues) []IndexOperand {
	ax, err := NormalizeAxis(a.Int("axis"), len(data))
	if err != nil {
		return nil
	}
	return []IndexOperand{{Operand: 1, Bound: data[ax]}, {Operand: 2, Bound: data[ax]}}
}
