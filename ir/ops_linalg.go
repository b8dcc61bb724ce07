package ir

import "fmt"

// Linear algebra and reductions.

func init() {
	Register(&OpDef{
		Name: "matmul", Summary: "NumPy matmul: batched, broadcasting", MinOperands: 2, MaxOperands: 2,
		Attrs: []AttrSpec{ResultDTypeAttr},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			d, err := ResultDTypeOf(a, in...)
			if err != nil {
				return nil, err
			}
			s, _, err := MatmulShape(in[0], in[1])
			if err != nil {
				return nil, err
			}
			return []Type{{DType: d, Shape: s}}, nil
		},
		FLOPs: func(in, out []Type, _ AttrValues) int64 {
			_, k, _ := MatmulShape(in[0], in[1])
			return 2 * out[0].NumElements() * k
		},
		Fusion:      OutFusable,
		Contraction: true,
		Axes:        matmulAxes,
		Linear:      linearIn([]int{0}, []int{1}),
	})
	for _, name := range []string{"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"} {
		Register(&OpDef{
			Name: name, Summary: "reduce over axes (all axes when absent)", MinOperands: 1, MaxOperands: 1,
			Attrs: []AttrSpec{{Name: "axes", Kind: AttrList}, {Name: "keepdims", Kind: AttrBool}, ResultDTypeAttr},
			Infer: func(in []Type, a AttrValues) ([]Type, error) {
				axes, err := ReduceAxes(a, in[0].Rank())
				if err != nil {
					return nil, err
				}
				d, err := ResultDTypeOf(a, in[0])
				return []Type{{DType: d, Shape: ReducedShape(in[0].Shape, axes, a.Bool("keepdims"))}}, err
			},
			FLOPs:  inputFLOPs,
			Fusion: Reduction,
			Axes: func(in, out []Type, a AttrValues) Axes {
				axes, _ := ReduceAxes(a, in[0].Rank())
				fold := map[string]LoopKind{"reduce_sum": Summed, "reduce_mean": Averaged, "reduce_max": Maximum, "reduce_min": Minimum}[name]
				x := Axes{Loops: parallelLoops(in[0].Shape), Operands: [][]Index{identity(0, in[0].Rank())}}
				res := []Index{}
				for d := range x.Loops {
					switch {
					case !isIn(axes, d):
						res = append(res, At(d))
					case a.Bool("keepdims"):
						res = append(res, Fixed)
					}
					if isIn(axes, d) {
						x.Loops[d].Kind = fold
					}
				}
				x.Results = [][]Index{res}
				return x
			},
			Linear: func(AttrValues, int) [][]int {
				if name == "reduce_max" || name == "reduce_min" {
					return nil
				}
				return [][]int{{0}}
			},
		})
	}
}

// matmulAxes is matmul's: one parallel loop per result dimension (the
// broadcast batch dimensions, then M and N where the operands have them)
// and the contraction K, summed, last.
func matmulAxes(in, out []Type, _ AttrValues) Axes {
	a, b, r := in[0].Shape, in[1].Shape, out[0].Rank()
	k := a[len(a)-1]
	x := Axes{Loops: append(parallelLoops(out[0].Shape), Loop{Summed, k}), Results: [][]Index{identity(0, r)}}
	batch := r
	if len(a) > 1 {
		batch--
	}
	if len(b) > 1 {
		batch--
	}
	K := r
	// The operands' batch dimensions broadcast (from the right) to the
	// result's first batch ones.
	side := func(s Shape, inner []Index) []Index {
		nb := len(s) - len(inner)
		m := broadcastTo(s[:nb], out[0].Shape[:batch])
		return append(m, inner...)
	}
	switch {
	case len(a) == 1:
		x.Operands = append(x.Operands, []Index{At(K)})
	default:
		x.Operands = append(x.Operands, side(a, []Index{At(batch), At(K)}))
	}
	nLoop := batch
	if len(a) > 1 {
		nLoop++
	}
	switch {
	case len(b) == 1:
		x.Operands = append(x.Operands, []Index{At(K)})
	default:
		x.Operands = append(x.Operands, side(b, []Index{At(K), At(nLoop)}))
	}
	return x
}

// MatmulShape returns the result shape of a NumPy matmul and its
// contraction length.
func MatmulShape(a, b Type) (Shape, int64, error) {
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
			{Name: "trans_a", Kind: AttrBool}, {Name: "trans_b", Kind: AttrBool}, ResultDTypeAttr},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			d, err := ResultDTypeOf(a, in[0], in[1])
			if err != nil {
				return nil, err
			}
			m, n, _, err := GemmDims(in[0], in[1], a)
			if err != nil {
				return nil, err
			}
			out := Shape{m, n}
			if len(in) == 3 {
				if b, err := BroadcastShapes(in[2].Shape, out); err != nil || !b.Equal(out) || in[2].DType != d {
					return nil, fmt.Errorf("C %s does not broadcast to %s", in[2], Type{DType: d, Shape: out})
				}
			}
			return []Type{{DType: d, Shape: out}}, nil
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
		// Loops [M, N, K].
		Axes: func(in, out []Type, a AttrValues) Axes {
			m, n, k, _ := GemmDims(in[0], in[1], a)
			x := Axes{Loops: []Loop{{Parallel, m}, {Parallel, n}, {Summed, k}}, Results: [][]Index{identity(0, 2)}}
			A, B := []Index{At(0), At(2)}, []Index{At(2), At(1)}
			if a.Bool("trans_a") {
				A[0], A[1] = A[1], A[0]
			}
			if a.Bool("trans_b") {
				B[0], B[1] = B[1], B[0]
			}
			x.Operands = [][]Index{A, B}
			if len(in) == 3 {
				// beta·C is added once, not per part of K.
				x.Operands = append(x.Operands, broadcastTo(in[2].Shape, out[0].Shape))
				x.Loops[2].Kind = Mixed
			}
			return x
		},
		Linear: func(_ AttrValues, n int) [][]int {
			if n == 3 {
				return [][]int{{0, 2}, {1, 2}} // alpha·A·B + beta·C
			}
			return [][]int{{0}, {1}}
		},
	})
}

// GemmDims returns M, N and K of a gemm.
func GemmDims(a, b Type, at AttrValues) (m, n, k int64, err error) {
	if a.Rank() != 2 || b.Rank() != 2 {
		return 0, 0, 0, fmt.Errorf("gemm needs two matrices, got %s and %s", a, b)
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

// ResultDTypeAttr is the optional attribute that sets the result dtype
// of a contraction (matmul, gemm, a convolution and its gradients), a
// reduction (reduce_*, sum_to), a loss (softmax_cross_entropy and its
// gradient) or a binary arithmetic op (add, mul, ...). With it, the
// operands are floats of any dtypes: each element is read into the
// kernel's compute precision (f32 at least; f64 for a result in f64, and
// for an elementwise op also where an operand is f64) and each result is
// rounded once, to result_dtype. Mixed precision
// makes a weight gradient in f32 from bf16 operands, and a first layer's
// bf16 activation from its f32 input, without a full-size cast copy of
// either. Without it, those operands share one dtype, which the result
// has.
var ResultDTypeAttr = AttrSpec{Name: "result_dtype", Kind: AttrType}

// ResultDTypeOf is the result dtype of an op that takes result_dtype,
// with operands in (those whose dtype the result follows: not a gemm's
// C).
func ResultDTypeOf(a AttrValues, in ...Type) (DType, error) {
	if !a.Has("result_dtype") {
		if err := sameDType(in...); err != nil {
			return 0, err
		}
		return in[0].DType, nil
	}
	d := a.DType("result_dtype")
	if !d.IsFloat() {
		return 0, fmt.Errorf("result_dtype must be a float type, not %s", d)
	}
	for _, t := range in {
		if !t.DType.IsFloat() {
			return 0, fmt.Errorf("with result_dtype, operands must be floats, not %s", t.DType)
		}
	}
	return d, nil
}
