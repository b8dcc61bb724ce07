package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// affineIndex is c + Σ coef·var as a loop expression.
func affineIndex(c int64, terms map[*loops.Var]int64) loops.Expr {
	var x loops.Expr = loops.Int{V: c}
	for v, k := range terms {
		x = &loops.Binary{Op: scalar.Add, A: x, B: &loops.Binary{Op: scalar.Mul, A: v, B: loops.Int{V: k}}}
	}
	return x
}

// TestGemmMappingIsTheStage: random matmul stages (extents 1 to 3,
// strides from -1 to 6, zero and overlapping ones included, with and
// without a batch loop and accumulation): wherever gemm maps a stage to
// cublasGemmStridedBatchedEx, the call as cuBLAS defines it (column-major,
// op N or T, leading dimensions, batch strides) computes exactly what the
// stage computes, and writes each output element once; a loop of no
// iterations maps to nothing.
func TestGemmMappingIsTheStage(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	mapped := 0
	for trial := 0; trial < 20000; trial++ {
		M, N, K := 1+r.Int64N(3), 1+r.Int64N(3), 1+r.Int64N(3)
		m, n, k, b := &loops.Var{ID: 1}, &loops.Var{ID: 2}, &loops.Var{ID: 3}, &loops.Var{ID: 4}
		batchN := int64(1)
		var batch *loops.Var
		if r.IntN(2) == 0 {
			batch, batchN = b, 1+r.Int64N(3)
		}
		stride := func() int64 { return r.Int64N(8) - 1 }
		buf := func(name string) *loops.Buffer {
			return &loops.Buffer{Name: name, Type: ir.Type{DType: ir.F32, Shape: []int64{4096}}, Storage: loops.Arena}
		}
		A, B, C := buf("a"), buf("b"), buf("c")
		ta := map[*loops.Var]int64{m: stride(), k: stride(), b: stride()}
		tb := map[*loops.Var]int64{k: stride(), n: stride(), b: stride()}
		tc := map[*loops.Var]int64{m: stride(), n: stride(), b: stride()}
		if batch == nil {
			ta[b], tb[b], tc[b] = 0, 0, 0 // no batch loop: b appears with coefficient 0
		}
		ca, cb, cc := 20+r.Int64N(8), 20+r.Int64N(8), 20+r.Int64N(8)
		st := &loops.Stage{Vars: []*loops.Var{m, n}, Extents: []int64{M, N}, Out: C, Index: []loops.Expr{affineIndex(cc, tc)}, Accumulate: r.IntN(2) == 0,
			Matmul: &loops.Matmul{K: k, Extent: K, A: &loops.Load{Buf: A, Index: []loops.Expr{affineIndex(ca, ta)}}, B: &loops.Load{Buf: B, Index: []loops.Expr{affineIndex(cb, tb)}}}}
		g, ok := gemm(st, batch, batchN, nil)
		if batch != nil {
			_, none := gemm(st, batch, 0, nil)
			require.False(t, none, "a loop of no iterations")
		}
		if !ok {
			continue
		}
		mapped++
		av, bv := make([]float64, 4096), make([]float64, 4096)
		for i := range av {
			av[i], bv[i] = r.Float64(), r.Float64()
		}
		at := func(terms map[*loops.Var]int64, c int64, vals map[*loops.Var]int64) int64 {
			for v, s := range terms {
				c += s * vals[v]
			}
			return c
		}
		// The stage, point by point.
		want := make([]float64, 4096)
		for i := range want {
			want[i] = float64(i)
		}
		got := append([]float64(nil), want...)
		written := map[int64]bool{}
		for bi := int64(0); bi < batchN; bi++ {
			for i := int64(0); i < M; i++ {
				for j := int64(0); j < N; j++ {
					vals := map[*loops.Var]int64{m: i, n: j, b: bi}
					sum := 0.0
					for l := int64(0); l < K; l++ {
						vals[k] = l
						sum += av[at(ta, ca, vals)] * bv[at(tb, cb, vals)]
					}
					o := at(tc, cc, vals)
					if st.Accumulate {
						sum += want[o]
					}
					want[o] = sum
				}
			}
		}
		// The call, as cuBLAS defines it.
		l := g.lib
		arrays := map[*loops.Buffer][]float64{A: av, B: bv}
		x, y := arrays[g.a.Buf], arrays[g.b.Buf]
		for bi := int64(0); bi < l.Batch; bi++ {
			for j := int64(0); j < l.N; j++ {
				for i := int64(0); i < l.M; i++ {
					sum := gemmElement(g, x, y, bi, i, j)
					o := g.offC + bi*l.StrideC + i + j*l.LDC
					require.False(t, written[o], "trial %d: %s writes element %d twice", trial, l, o)
					written[o] = true
					if l.Beta != 0 {
						sum += got[o]
					}
					got[o] = sum
				}
			}
		}
		require.Equal(t, want, got, "trial %d: %s", trial, l)
	}
	require.Greater(t, mapped, 2000, "stages mapped")
}

// TestBiasEpilogueIsTheStage: random matmul stages that map to a GEMM,
// each followed by a random stage over fresh variables of the same
// extents that adds a load of a bias buffer (strides -1 to 2 along each
// variable) to a load of the product (perhaps through an alias of
// another shape, the operands in either order, times 1), stores it in
// place (or at other elements, or elsewhere): wherever biasOf takes it for cuBLASLt's bias
// epilogue, the call (the product, then bias[off + i] on row i) computes
// exactly what the two stages compute; and every stage whose bias does
// not follow the rows alone or is a constant of the kernel, or that
// stores elsewhere, is refused.
func TestBiasEpilogueIsTheStage(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	fused, refused := 0, 0
	for trial := 0; trial < 20000; trial++ {
		M, N, K := 1+r.Int64N(3), 1+r.Int64N(3), 1+r.Int64N(3)
		m, n, k := &loops.Var{ID: 1}, &loops.Var{ID: 2}, &loops.Var{ID: 3}
		p, q := &loops.Var{ID: 5}, &loops.Var{ID: 6}
		stride := func() int64 { return r.Int64N(8) - 1 }
		buf := func(name string) *loops.Buffer {
			return &loops.Buffer{Name: name, Type: ir.Type{DType: ir.F32, Shape: []int64{4096}}, Storage: loops.Arena}
		}
		A, B, C, Bias := buf("a"), buf("b"), buf("c"), buf("bias")
		Bias.Offset, B.Offset, A.Offset = 1<<20, 2<<20, 3<<20
		ta := map[*loops.Var]int64{m: stride(), k: stride()}
		tb := map[*loops.Var]int64{k: stride(), n: stride()}
		tc := map[*loops.Var]int64{m: stride(), n: stride()}
		ca, cb, cc := 20+r.Int64N(8), 20+r.Int64N(8), 20+r.Int64N(8)
		st := &loops.Stage{Vars: []*loops.Var{m, n}, Extents: []int64{M, N}, Out: C, Index: []loops.Expr{affineIndex(cc, tc)},
			Matmul: &loops.Matmul{K: k, Extent: K, A: &loops.Load{Buf: A, Index: []loops.Expr{affineIndex(ca, ta)}}, B: &loops.Load{Buf: B, Index: []loops.Expr{affineIndex(cb, tb)}}}}
		g, ok := gemm(st, nil, 1, nil)
		if !ok {
			continue
		}
		// The epilogue stage over p, q.
		epCoef := map[*loops.Var]int64{p: tc[m], q: tc[n]}
		if r.IntN(8) == 0 {
			epCoef[p], epCoef[q] = tc[n], tc[m] // another map of points to elements
		}
		outIdx := []loops.Expr{affineIndex(cc, epCoef)}
		out := C
		if r.IntN(8) == 0 {
			out = buf("elsewhere")
			out.Offset = 4 << 20
		}
		var acc loops.Expr = &loops.Load{Buf: C, Index: outIdx}
		if r.IntN(2) == 0 {
			// C under another shape, the same element.
			wide := &loops.Buffer{Name: C.Name, Type: ir.Type{DType: ir.F32, Shape: []int64{2, 2048}}, Storage: loops.Arena}
			acc = &loops.Load{Buf: wide, Index: []loops.Expr{loops.Int{V: 0}, outIdx[0]}}
		}
		constant := r.IntN(16) == 0
		if constant {
			Bias.Storage = loops.Const // a constant of the kernel: no pointer to give cuBLASLt
		}
		sb := map[*loops.Var]int64{p: r.Int64N(4) - 1, q: r.Int64N(4) - 1}
		cbias := 4 + r.Int64N(4)
		var bias loops.Expr = &loops.Load{Buf: Bias, Index: []loops.Expr{affineIndex(cbias, sb)}}
		if r.IntN(2) == 0 {
			bias = &loops.Binary{Op: scalar.Mul, A: bias, B: loops.Float{V: 1, K: loops.F32}}
		}
		sum := &loops.Binary{Op: scalar.Add, A: acc, B: bias}
		if r.IntN(2) == 0 {
			sum.A, sum.B = bias, acc
		}
		ep := &loops.Stage{Vars: []*loops.Var{p, q}, Extents: []int64{M, N}, Out: out, Index: outIdx, Value: sum}
		got, off, ok := biasOf(g, ep)
		rowVar := map[*loops.Var]*loops.Var{m: p, n: q}[g.rows]
		along := sb[rowVar] == 1 || g.lib.M == 1
		across := sb[map[*loops.Var]*loops.Var{p: q, q: p}[rowVar]] == 0 || g.lib.N == 1
		if !ok {
			refused++
			continue
		}
		require.True(t, out == C && along && across && !constant, "trial %d: fused a stage that stores elsewhere, reads the bias off the rows or from a constant", trial)
		require.Same(t, Bias, got)
		fused++
		av, bv, biasv := make([]float64, 4096), make([]float64, 4096), make([]float64, 4096)
		for i := range av {
			av[i], bv[i], biasv[i] = r.Float64(), r.Float64(), r.Float64()
		}
		at := func(terms map[*loops.Var]int64, c int64, vals map[*loops.Var]int64) int64 {
			for v, s := range terms {
				c += s * vals[v]
			}
			return c
		}
		// The two stages, point by point.
		want := make([]float64, 4096)
		for i := int64(0); i < M; i++ {
			for j := int64(0); j < N; j++ {
				vals := map[*loops.Var]int64{m: i, n: j}
				s := 0.0
				for l := int64(0); l < K; l++ {
					vals[k] = l
					s += av[at(ta, ca, vals)] * bv[at(tb, cb, vals)]
				}
				want[at(tc, cc, vals)] = s
			}
		}
		for i := int64(0); i < M; i++ {
			for j := int64(0); j < N; j++ {
				vals := map[*loops.Var]int64{p: i, q: j}
				o := at(epCoef, cc, vals)
				want[o] += biasv[at(sb, cbias, vals)]
			}
		}
		// The call with its epilogue.
		l := g.lib
		res := make([]float64, 4096)
		arrays := map[*loops.Buffer][]float64{A: av, B: bv}
		x, y := arrays[g.a.Buf], arrays[g.b.Buf]
		for j := int64(0); j < l.N; j++ {
			for i := int64(0); i < l.M; i++ {
				res[g.offC+i+j*l.LDC] = gemmElement(g, x, y, 0, i, j) + biasv[off+i]
			}
		}
		require.Equal(t, want, res, "trial %d: %s with bias from %d", trial, l, off)
	}
	require.Greater(t, fused, 500, "stages fused")
	require.Greater(t, refused, 500, "stages refused")
}

// gemmElement is element (i, j) of batch bi of g's product as cuBLAS
// defines it (column-major, op N or T, leading dimensions, batch
// strides), A and B read from x and y.
func gemmElement(g *gemmPlan, x, y []float64, bi, i, j int64) float64 {
	l := g.lib
	sum := 0.0
	for p := int64(0); p < l.K; p++ {
		ia, ib := i+p*l.LDA, p+j*l.LDB
		if l.TransA == "T" {
			ia = p + i*l.LDA
		}
		if l.TransB == "T" {
			ib = j + p*l.LDB
		}
		sum += x[g.offA+bi*l.StrideA+ia] * y[g.offB+bi*l.StrideB+ib]
	}
	return sum
}
