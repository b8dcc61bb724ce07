package ir

import "fmt"

// Linear algebra and reductions.

func init() {
	Register(&OpDef{
		Name: "matmul", Summary: "NumPy matmul: batched, broadcasting", MinOperands: 2, MaxOperands: 2,
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			s, _, err := MatmulShape(in[0], in[1])
			if err != nil {
				return nil, err
			}
			return []Type{{DType: in[0].DType, Shape: s}}, nil
		},
		FLOPs: func(in, out []Type, _ AttrValues) int64 {
			_, k, _ := MatmulShape(in[0], in[1])
			return 2 * out[0].NumElements() * k
		},
		Fusion:      OutFusable,
		Contraction: true,
	})
	for _, name := range []string{"reduce_sum", "reduce_mean", "reduce_max"} {
		Register(&OpDef{
			Name: name, Summary: "reduce over axes (all axes when absent)", MinOperands: 1, MaxOperands: 1,
			Attrs: []AttrSpec{{Name: "axes", Kind: AttrList}, {Name: "keepdims", Kind: AttrBool}},
			Infer: func(in []Type, a AttrValues) ([]Type, error) {
				axes, err := ReduceAxes(a, in[0].Rank())
				if err != nil {
					return nil, err
				}
				return []Type{{DType: in[0].DType, Shape: ReducedShape(in[0].Shape, axes, a.Bool("keepdims"))}}, nil
			},
			FLOPs:  inputFLOPs,
			Fusion: Reduction,
		})
	}
}

// MatmulShape returns the result shape of a NumPy matmul and its
// contraction length.
func MatmulShape(a, b Type) (Shape, int64, error) {
	if a.DType != b.DType {
		return nil, 0, fmt.Errorf("operand dtypes differ: %s and %s", a.DType, b.DType)
	}
	if a.Rank() == 0 || b.Rank() == 0 {
		return nil, 0, fmt.Errorf("matmul operands must have rank >= 1, got %s and %s", a, b)
	}
	as, bs := a.Shape, b.Shape
	if len(as) == 1 {
		as = Shape{1, as[0]}
	}
	if len(bs) == 1 {
		bs = Shape{bs[0], 1}
	}
	k := as[len(as)-1]
	if bs[len(bs)-2] != k {
		return nil, 0, fmt.Errorf("matmul contraction mismatch: %s and %s", a, b)
	}
	batch, err := BroadcastShapes(as[:len(as)-2], bs[:len(bs)-2])
	if err != nil {
		return nil, 0, err
	}
	out := append(batch.Clone(), as[len(as)-2], bs[len(bs)-1])
	if a.Rank() == 1 {
		out = append(out[:len(out)-2], out[len(out)-1])
	}
	if b.Rank() == 1 {
		out = out[:len(out)-1]
	}
	return out, k, nil
}

// ReduceAxes returns the sorted, normalized "axes" attribute (all axes
// when absent).
func ReduceAxes(a AttrValues, rank int) ([]int, error) {
	if !a.Has("axes") {
		all := make([]int, rank)
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	ints := a.Ints("axes")
	seen := make([]bool, rank)
	for _, x := range ints {
		ax, err := NormalizeAxis(x, rank)
		if err != nil {
			return nil, err
		}
		if seen[ax] {
			return nil, fmt.Errorf("axis %d repeated", x)
		}
		seen[ax] = true
	}
	var out []int
	for i, s := range seen {
		if s {
			out = append(out, i)
		}
	}
	return out, nil
}

// ReducedShape removes (or, with keep, sets to 1) the given axes.
func ReducedShape(s Shape, axes []int, keep bool) Shape {
	out := Shape{}
	j := 0
	for i, d := range s {
		if j < len(axes) && axes[j] == i {
			j++
			if keep {
				out = append(out, 1)
			}
			continue
		}
		out = append(out, d)
	}
	return out
}

func init() {
	Register(&OpDef{
		Name: "gemm", Summary: "alpha * op(A) @ op(B) + beta * C, op transposing when trans_a/trans_b", MinOperands: 2, MaxOperands: 3,
		Attrs: []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: FloatAttr(1)}, {Name: "beta", Kind: AttrFloat, Default: FloatAttr(1)},
			{Name: "trans_a", Kind: AttrBool}, {Name: "trans_b", Kind: AttrBool}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			m, n, _, err := GemmDims(in[0], in[1], a)
			if err != nil {
				return nil, err
			}
			out := Shape{m, n}
			if len(in) == 3 {
				if b, err := BroadcastShapes(in[2].Shape, out); err != nil || !b.Equal(out) || in[2].DType != in[0].DType {
					return nil, fmt.Errorf("C %s does not broadcast to [%d,%d]", in[2], m, n)
				}
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs: func(in, _ []Type, a AttrValues) int64 {
			m, n, k, _ := GemmDims(in[0], in[1], a)
			if len(in) == 3 {
				return 2*m*n*k + m*n // and beta·C added
			}
			return 2 * m * n * k
		},
		Fusion:          OutFusable,
		Contraction:     true,
		InPlace:         true,
		InPlaceOperands: []int{2},
	})
}

// GemmDims returns M, N and K of a gemm.
func GemmDims(a, b Type, at AttrValues) (m, n, k int64, err error) {
	if a.Rank() != 2 || b.Rank() != 2 || a.DType != b.DType {
		return 0, 0, 0, fmt.Errorf("gemm needs two matrices of one dtype, got %s and %s", a, b)
	}
	m, k = a.Shape[0], a.Shape[1]
	if at.Bool("trans_a") {
		m, k = k, m
	}
	kb, n := b.Shape[0], b.Shape[1]
	if at.Bool("trans_b") {
		kb, n = n, kb
	}
	if k != kb {
		return 0, 0, 0, fmt.Errorf("gemm contraction mismatch: %s and %s", a, b)
	}
	return m, n, k, nil
}
