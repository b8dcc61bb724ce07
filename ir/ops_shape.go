package ir

import "fmt"

// Shape ops: views and data movement.

func init() {
	Register(&OpDef{
		Name: "reshape", Summary: "same elements, new shape (a view)", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "shape", Kind: AttrList, Required: true}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			shape := Shape(a.Ints("shape"))
			n, ok := shape.NumElements()
			if !ok {
				return nil, fmt.Errorf("reshape target %s is not a valid shape", shape)
			}
			if n != in[0].NumElements() {
				return nil, fmt.Errorf("cannot reshape %s (%d elements) to %s (%d elements)", in[0], in[0].NumElements(), shape, n)
			}
			return []Type{{DType: in[0].DType, Shape: shape}}, nil
		},
		FLOPs:  zeroFLOPs,
		Fusion: Injective,
		View:   true,
		Axes:   flatAxes, Linear: linearIn([]int{0}), ShapeAttr: "shape",
	})
	Register(&OpDef{
		Name: "transpose", Summary: "permute dimensions", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "perm", Kind: AttrList, Required: true}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			perm := a.Ints("perm")
			if err := CheckPermutation(perm, in[0].Rank()); err != nil {
				return nil, err
			}
			out := make(Shape, len(perm))
			for i, p := range perm {
				out[i] = in[0].Shape[p]
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs:  zeroFLOPs,
		Fusion: Injective,
		Axes: func(in, _ []Type, a AttrValues) Axes {
			perm := a.Ints("perm")
			res := make([]Index, len(perm))
			for i, p := range perm {
				res[i] = At(int(p))
			}
			return Axes{Loops: parallelLoops(in[0].Shape), Operands: [][]Index{identity(0, in[0].Rank())}, Results: [][]Index{res}}
		},
		Linear: linearIn([]int{0}),
	})
}

// CheckPermutation reports whether perm is a permutation of 0..rank-1.
func CheckPermutation(perm []int64, rank int) error {
	if len(perm) != rank {
		return fmt.Errorf("permutation %v has %d entries for rank %d", perm, len(perm), rank)
	}
	seen := make([]bool, rank)
	for _, p := range perm {
		if p < 0 || p >= int64(rank) || seen[p] {
			return fmt.Errorf("%v is not a permutation of 0..%d", perm, rank-1)
		}
		seen[p] = true
	}
	return nil
}

// NormalizeAxis maps a possibly negative axis into [0, rank).
func NormalizeAxis(axis int64, rank int) (int, error) {
	if axis < -int64(rank) || axis >= int64(rank) {
		return 0, fmt.Errorf("axis %d is out of range for rank %d", axis, rank)
	}
	if axis < 0 {
		axis += int64(rank)
	}
	return int(axis), nil
}

func init() {
	Register(&OpDef{
		Name: "flatten", Summary: "reshape to [prod(dims before axis), prod(dims from axis)] (a view)", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(1)}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			axis := a.Int("axis")
			if axis < 0 {
				axis += int64(in[0].Rank())
			}
			if axis < 0 || axis > int64(in[0].Rank()) {
				return nil, fmt.Errorf("axis %d is out of range for rank %d", a.Int("axis"), in[0].Rank())
			}
			outer, _ := in[0].Shape[:axis].NumElements()
			inner, _ := in[0].Shape[axis:].NumElements()
			return []Type{{DType: in[0].DType, Shape: Shape{outer, inner}}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective, View: true,
		Axes: flatAxes, Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "squeeze", Summary: "remove size-1 dimensions (all when axes is absent; a view)", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "axes", Kind: AttrList}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			out := Shape{}
			drop := map[int]bool{}
			if a.Has("axes") {
				for _, x := range a.Ints("axes") {
					ax, err := NormalizeAxis(x, in[0].Rank())
					if err != nil {
						return nil, err
					}
					if in[0].Shape[ax] != 1 {
						return nil, fmt.Errorf("cannot squeeze axis %d of size %d", x, in[0].Shape[ax])
					}
					drop[ax] = true
				}
			} else {
				for i, d := range in[0].Shape {
					drop[i] = d == 1
				}
			}
			for i, d := range in[0].Shape {
				if !drop[i] {
					out = append(out, d)
				}
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective, View: true,
		Axes: flatAxes, Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "unsqueeze", Summary: "insert size-1 dimensions at axes of the result (a view)", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "axes", Kind: AttrList, Required: true}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			axes := a.Ints("axes")
			rank := in[0].Rank() + len(axes)
			ins := make([]bool, rank)
			for _, x := range axes {
				ax, err := NormalizeAxis(x, rank)
				if err != nil {
					return nil, err
				}
				if ins[ax] {
					return nil, fmt.Errorf("axis %d repeated", x)
				}
				ins[ax] = true
			}
			out := Shape{}
			j := 0
			for i := 0; i < rank; i++ {
				if ins[i] {
					out = append(out, 1)
				} else {
					out = append(out, in[0].Shape[j])
					j++
				}
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective, View: true,
		Axes: flatAxes, Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "expand", Summary: "broadcast to shape", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "shape", Kind: AttrList, Required: true}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			s, err := BroadcastShapes(in[0].Shape, Shape(a.Ints("shape")))
			return []Type{{DType: in[0].DType, Shape: s}}, err
		},
		FLOPs: zeroFLOPs, Fusion: Broadcast,
		Axes: broadcastAxes, Linear: linearIn([]int{0}), ShapeAttr: "shape",
	})
	Register(&OpDef{
		Name: "sum_to", Summary: "sum a broadcast tensor back down to shape (the gradient of broadcasting)", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "shape", Kind: AttrList, Required: true}, ResultDTypeAttr},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			s := Shape(a.Ints("shape"))
			if b, err := BroadcastShapes(s, in[0].Shape); err != nil || !b.Equal(in[0].Shape) {
				return nil, fmt.Errorf("%s does not broadcast to %s", s, in[0].Shape)
			}
			d, err := ResultDTypeOf(a, in[0])
			return []Type{{DType: d, Shape: s}}, err
		},
		FLOPs: inputFLOPs, Fusion: Reduction, KeepF32: true, LowOperands: []int{0},
		Axes: func(in, out []Type, _ AttrValues) Axes {
			// One loop per operand dimension: summed where the result has
			// extent 1 (or no dimension) below a larger one.
			x, s := in[0].Shape, out[0].Shape
			a := Axes{Loops: parallelLoops(x), Operands: [][]Index{identity(0, len(x))}}
			res := make([]Index, len(s))
			for d := range s {
				l := len(x) - len(s) + d
				if s[d] == x[l] {
					res[d] = At(l)
				} else {
					res[d] = Fixed
				}
			}
			for l := range x {
				if d := l - (len(x) - len(s)); d < 0 || s[d] != x[l] {
					a.Loops[l].Kind = Summed
				}
			}
			a.Results = [][]Index{res}
			return a
		},
		Linear: linearIn([]int{0}), ShapeAttr: "shape",
	})
	Register(&OpDef{
		Name: "concat", Summary: "join along axis", MinOperands: 1, MaxOperands: -1,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Required: true}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			ax, err := NormalizeAxis(a.Int("axis"), in[0].Rank())
			if err != nil {
				return nil, err
			}
			out := in[0].Shape.Clone()
			for _, t := range in[1:] {
				if t.DType != in[0].DType || t.Rank() != in[0].Rank() {
					return nil, fmt.Errorf("cannot concatenate %s and %s", in[0], t)
				}
				for i := range out {
					if i != ax && t.Shape[i] != out[i] {
						return nil, fmt.Errorf("cannot concatenate %s and %s along axis %d", in[0], t, ax)
					}
				}
				out[ax] += t.Shape[ax]
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective,
		// The axis's loop runs over the result: each operand's part of it
		// is at an offset.
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), out[0].Rank())
			x := Axes{Loops: parallelLoops(out[0].Shape), Results: [][]Index{identity(0, out[0].Rank())}}
			for range in {
				m := identity(0, out[0].Rank())
				m[ax] = Through(ax)
				x.Operands = append(x.Operands, m)
			}
			return x
		},
		Linear: func(_ AttrValues, n int) [][]int { return [][]int{allOperands(n)} },
	})
	Register(&OpDef{
		Name: "split", Summary: "cut along axis into pieces of the given sizes", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Required: true}, {Name: "sizes", Kind: AttrList, Required: true}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			ax, err := NormalizeAxis(a.Int("axis"), in[0].Rank())
			if err != nil {
				return nil, err
			}
			var out []Type
			total := int64(0)
			for _, s := range a.Ints("sizes") {
				if s < 0 {
					return nil, fmt.Errorf("split size %d is negative", s)
				}
				sh := in[0].Shape.Clone()
				sh[ax] = s
				total += s
				out = append(out, Type{DType: in[0].DType, Shape: sh})
			}
			if total != in[0].Shape[ax] || len(out) == 0 {
				return nil, fmt.Errorf("split sizes %v do not add up to %d", a.Ints("sizes"), in[0].Shape[ax])
			}
			return out, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective,
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), in[0].Rank())
			x := Axes{Loops: parallelLoops(in[0].Shape), Operands: [][]Index{identity(0, in[0].Rank())}}
			for range out {
				m := identity(0, in[0].Rank())
				m[ax] = Through(ax)
				x.Results = append(x.Results, m)
			}
			return x
		},
		Linear: linearIn([]int{0}),
	})
	sliceAttrs := []AttrSpec{{Name: "starts", Kind: AttrList, Required: true}, {Name: "ends", Kind: AttrList, Required: true},
		{Name: "axes", Kind: AttrList}, {Name: "steps", Kind: AttrList}}
	Register(&OpDef{
		Name: "slice", Summary: "ONNX Slice with static starts, ends, axes and steps (ends clamp; negative indices count from the end)",
		MinOperands: 1, MaxOperands: 1, Attrs: sliceAttrs,
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			sl, err := SliceOf(in[0].Shape, a)
			if err != nil {
				return nil, err
			}
			return []Type{{DType: in[0].DType, Shape: sl.Out}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective,
		Axes: func(in, out []Type, a AttrValues) Axes {
			return Axes{Loops: parallelLoops(out[0].Shape), Operands: [][]Index{sliceIndex(in[0].Shape, out[0].Shape, a)},
				Results: [][]Index{identity(0, out[0].Rank())}}
		},
		Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "slice_grad", Summary: "scatter dy into zeros of input_shape at the slice's positions",
		MinOperands: 1, MaxOperands: 1, Attrs: append(sliceAttrs, AttrSpec{Name: "input_shape", Kind: AttrList, Required: true}),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			xs := Shape(a.Ints("input_shape"))
			sl, err := SliceOf(xs, a)
			if err != nil {
				return nil, err
			}
			if !sl.Out.Equal(in[0].Shape) {
				return nil, fmt.Errorf("dy %s does not match the slice %s", in[0], sl.Out)
			}
			return []Type{{DType: in[0].DType, Shape: xs}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective, Grad: NoGrad,
		// Loops over the result: dy is read at the slice's positions.
		Axes: func(in, out []Type, a AttrValues) Axes {
			return Axes{Loops: parallelLoops(out[0].Shape), Operands: [][]Index{sliceIndex(out[0].Shape, in[0].Shape, a)},
				Results: [][]Index{identity(0, out[0].Rank())}}
		},
		Linear: linearIn([]int{0}), ShapeAttr: "input_shape",
	})
	Register(&OpDef{
		Name: "gather", Summary: "take entries of data along axis at integer indices (embeddings); negative = false: an index below 0 is out of range", MinOperands: 2, MaxOperands: 2,
		Attrs:   []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(0)}, negativeAttr},
		Indices: func(in []Type, a AttrValues) []IndexOperand { return axisIndices(1, in[0].Shape, a) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			s, err := GatherShape(in[0].Shape, in[1], a.Int("axis"))
			return []Type{{DType: in[0].DType, Shape: s}}, err
		},
		FLOPs: zeroFLOPs, Fusion: Injective,
		// Loops over the result: data's outer dimensions, the indices'
		// dimensions, data's inner ones; the indices choose data's axis.
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), in[0].Rank())
			k := in[1].Rank()
			data := make([]Index, in[0].Rank())
			for e := range data {
				switch {
				case e < ax:
					data[e] = At(e)
				case e == ax:
					data[e] = Fixed
				default:
					data[e] = At(e - 1 + k)
				}
			}
			return Axes{Loops: parallelLoops(out[0].Shape), Operands: [][]Index{data, identity(ax, k)}, Results: [][]Index{identity(0, out[0].Rank())}}
		},
		Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "gather_grad", Summary: "scatter-add dy into zeros of data_shape at the gathered indices", MinOperands: 2, MaxOperands: 2,
		Attrs:   []AttrSpec{{Name: "axis", Kind: AttrInt}, {Name: "data_shape", Kind: AttrList, Required: true}, ResultDTypeAttr, negativeAttr},
		Indices: func(_ []Type, a AttrValues) []IndexOperand { return axisIndices(1, a.Ints("data_shape"), a) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			ds := Shape(a.Ints("data_shape"))
			s, err := GatherShape(ds, in[1], a.Int("axis"))
			if err != nil {
				return nil, err
			}
			if !s.Equal(in[0].Shape) {
				return nil, fmt.Errorf("dy %s does not match the gather result %s", in[0], s)
			}
			d, err := ResultDTypeOf(a, in[0])
			return []Type{{DType: d, Shape: ds}}, err
		},
		FLOPs: inputFLOPs, Fusion: Opaque, // linear in dy (ScatterND uses it): autodiff has a rule
		// Loops over dy: the indices' loops are summed into the result's
		// axis, at the positions they hold.
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), out[0].Rank())
			k := in[1].Rank()
			x := Axes{Loops: parallelLoops(in[0].Shape), Operands: [][]Index{identity(0, in[0].Rank()), identity(ax, k)}}
			for l := ax; l < ax+k; l++ {
				x.Loops[l].Kind = Summed
			}
			res := make([]Index, out[0].Rank())
			for d := range res {
				switch {
				case d < ax:
					res[d] = At(d)
				case d == ax:
					res[d] = Fixed
				default:
					res[d] = At(d - 1 + k)
				}
			}
			x.Results = [][]Index{res}
			return x
		},
		Linear: linearIn([]int{0}), ShapeAttr: "data_shape",
	})
	Register(&OpDef{
		Name: "gather_elements", Summary: "ONNX GatherElements: y[i] = data[i with i[axis] replaced by indices[i]]; y has the indices' shape",
		MinOperands: 2, MaxOperands: 2,
		Attrs:   []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(0)}, negativeAttr},
		Indices: func(in []Type, a AttrValues) []IndexOperand { return axisIndices(1, in[0].Shape, a) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if err := checkElementIndices(in[0].Shape, in[1], a.Int("axis")); err != nil {
				return nil, err
			}
			return []Type{{DType: in[0].DType, Shape: in[1].Shape}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective,
		// Loops over the indices; data's dimensions other than the axis
		// are the loops' where their extents agree.
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), in[0].Rank())
			return Axes{Loops: parallelLoops(in[1].Shape), Operands: [][]Index{elementIndex(in[0].Shape, in[1].Shape, ax), identity(0, in[1].Rank())},
				Results: [][]Index{identity(0, in[1].Rank())}}
		},
		Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "gather_elements_grad", Summary: "scatter-add dy into zeros of data_shape at gather_elements' indices",
		MinOperands: 2, MaxOperands: 2,
		Attrs:   []AttrSpec{{Name: "axis", Kind: AttrInt}, {Name: "data_shape", Kind: AttrList, Required: true}, negativeAttr},
		Indices: func(_ []Type, a AttrValues) []IndexOperand { return axisIndices(1, a.Ints("data_shape"), a) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			ds := Shape(a.Ints("data_shape"))
			if err := checkElementIndices(ds, in[1], a.Int("axis")); err != nil {
				return nil, err
			}
			if !in[0].Shape.Equal(in[1].Shape) {
				return nil, fmt.Errorf("dy %s does not match the indices %s", in[0], in[1])
			}
			return []Type{{DType: in[0].DType, Shape: ds}}, nil
		},
		FLOPs: inputFLOPs, Fusion: Opaque, // linear in dy (ScatterElements uses it): autodiff has a rule
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), out[0].Rank())
			x := Axes{Loops: parallelLoops(in[1].Shape), Operands: [][]Index{identity(0, in[0].Rank()), identity(0, in[1].Rank())},
				Results: [][]Index{elementIndex(out[0].Shape, in[1].Shape, ax)}}
			x.Loops[ax].Kind = Summed
			for d, r := range x.Results[0] {
				if d != ax && r.Loop < 0 {
					x.Loops[d].Kind = Mixed // a part of the loop writes a part of a longer axis
				}
			}
			return x
		},
		Linear: linearIn([]int{0}), ShapeAttr: "data_shape",
	})
	Register(&OpDef{
		Name: "pad", Summary: "constant padding; pads = [begin of each axis..., end of each axis...], negative pads crop",
		MinOperands: 1, MaxOperands: 1, Attrs: []AttrSpec{{Name: "pads", Kind: AttrList, Required: true}, {Name: "value", Kind: AttrFloat, Default: FloatAttr(0)}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			pads := a.Ints("pads")
			r := in[0].Rank()
			if len(pads) != 2*r {
				return nil, fmt.Errorf("pad wants %d pads for rank %d, got %d", 2*r, r, len(pads))
			}
			out := in[0].Shape.Clone()
			for i := range out {
				out[i] += pads[i] + pads[i+r]
				if out[i] < 0 {
					return nil, fmt.Errorf("pads %v crop dimension %d below zero", pads, i)
				}
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Injective,
		Axes: func(in, out []Type, a AttrValues) Axes {
			pads := a.Ints("pads")
			r := in[0].Rank()
			m := identity(0, r)
			for e := range m {
				if pads[e] != 0 || pads[e+r] != 0 {
					m[e] = Through(e)
				}
			}
			return Axes{Loops: parallelLoops(out[0].Shape), Operands: [][]Index{m}, Results: [][]Index{identity(0, r)}}
		},
		// Linear only with zeros as padding.
		Linear: func(a AttrValues, _ int) [][]int {
			if a.Float("value") == 0 {
				return [][]int{{0}}
			}
			return nil
		},
	})
}

// sliceIndex maps the dimensions of a tensor of shape whole, of which a
// slice (a) of shape part is taken, to the loops over the part: a
// dimension the slice takes whole is its loop's; one it cuts is at an
// offset (or stride) from it.
func sliceIndex(whole, part Shape, a AttrValues) []Index {
	sl, _ := SliceOf(whole, a)
	m := make([]Index, len(whole))
	for e := range m {
		if sl.Start[e] == 0 && sl.Step[e] == 1 && part[e] == whole[e] {
			m[e] = At(e)
		} else {
			m[e] = Through(e)
		}
	}
	return m
}

// elementIndex maps data's dimensions to the loops over gather_elements'
// indices: the axis is chosen by the indices, a dimension of the same
// extent is its loop's, and a longer one is read at the loop's positions
// of a prefix.
func elementIndex(data, idx Shape, ax int) []Index {
	m := make([]Index, len(data))
	for e := range m {
		switch {
		case e == ax:
			m[e] = Fixed
		case data[e] == idx[e]:
			m[e] = At(e)
		default:
			m[e] = Through(e)
		}
	}
	return m
}

// allOperands lists 0..n-1.
func allOperands(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// checkElementIndices checks GatherElements' operands: integer indices of
// data's rank, no larger than data outside axis.
func checkElementIndices(data Shape, idx Type, axis int64) error {
	if !idx.DType.IsInt() {
		return fmt.Errorf("indices must be integers, got %s", idx)
	}
	ax, err := NormalizeAxis(axis, len(data))
	if err != nil {
		return err
	}
	if idx.Rank() != len(data) {
		return fmt.Errorf("indices %s must have the data's rank %d", idx, len(data))
	}
	for d, n := range idx.Shape {
		if d != ax && n > data[d] {
			return fmt.Errorf("indices %s exceed the data %s outside axis %d", idx, data, ax)
		}
	}
	return nil
}

// GatherShape is data's shape with axis replaced by the indices' shape.
func GatherShape(data Shape, idx Type, axis int64) (Shape, error) {
	if !idx.DType.IsInt() {
		return nil, fmt.Errorf("indices must be integers, got %s", idx)
	}
	ax, err := NormalizeAxis(axis, len(data))
	if err != nil {
		return nil, err
	}
	out := append(Shape{}, data[:ax]...)
	out = append(out, idx.Shape...)
	return append(out, data[ax+1:]...), nil
}

// Slice is a resolved slice: for every axis, the first index, the step
// and the count taken.
type Slice struct {
	Start, Step, Out Shape
}

// SliceOf resolves ONNX Slice semantics for a static input shape.
func SliceOf(in Shape, a AttrValues) (Slice, error) {
	r := len(in)
	sl := Slice{Start: make(Shape, r), Step: make(Shape, r), Out: in.Clone()}
	for i := range sl.Step {
		sl.Step[i] = 1
	}
	starts, ends := a.Ints("starts"), a.Ints("ends")
	axes := a.Ints("axes")
	if axes == nil {
		for i := range starts {
			axes = append(axes, int64(i))
		}
	}
	steps := a.Ints("steps")
	if steps == nil {
		for range starts {
			steps = append(steps, 1)
		}
	}
	if len(starts) != len(ends) || len(axes) != len(starts) || len(steps) != len(starts) {
		return sl, fmt.Errorf("slice starts, ends, axes and steps must have the same length")
	}
	seen := map[int]bool{}
	for i, x := range axes {
		ax, err := NormalizeAxis(x, r)
		if err != nil {
			return sl, err
		}
		if seen[ax] {
			return sl, fmt.Errorf("slice axis %d repeated", x)
		}
		seen[ax] = true
		d, st := in[ax], steps[i]
		if st == 0 {
			return sl, fmt.Errorf("slice step must not be 0")
		}
		b, e := starts[i], ends[i]
		if b < 0 {
			b += d
		}
		if e < 0 {
			e += d
		}
		if st > 0 {
			b, e = clamp(b, 0, d), clamp(e, 0, d)
			sl.Out[ax] = max(0, (e-b+st-1)/st)
		} else {
			b, e = clamp(b, 0, d-1), clamp(e, -1, d-1)
			sl.Out[ax] = max(0, (b-e-st-1)/(-st))
		}
		sl.Start[ax], sl.Step[ax] = b, st
	}
	return sl, nil
}

func clamp(x, lo, hi int64) int64 { return max(lo, min(x, hi)) }

// axisIndices says that operand k indexes axis "axis" of data (a
// gather's), negative indices counting from the end unless the op's
// "negative" is false. An axis out of range declares nothing (Infer
// refuses the op).
func axisIndices(k int, data []int64, a AttrValues) []IndexOperand {
	ax, err := NormalizeAxis(a.Int("axis"), len(data))
	if err != nil {
		return nil
	}
	return []IndexOperand{{Operand: k, Bound: data[ax], Negative: a.Bool(AttrNegative)}}
}
