package cuda

import (
	"fmt"
	"math"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// Library is a library call of a plan node (kind "library"): today
// cublasGemmStridedBatchedEx, in cuBLAS's column-major terms. For each
// batch b < Batch: C_b = Alpha·op(A_b)·op(B_b) + Beta·C_b, C_b an M × N
// matrix with column stride LDC (element (i, j) at C + b·StrideC + i +
// j·LDC), op(X) = X or Xᵀ (TransA, TransB "N" or "T") of the matrix
// stored column-major at X + b·StrideX with leading dimension LDX;
// strides and leading dimensions count elements. AType, BType and CType
// are the dtypes stored ("f32", "f16", "bf16"); products accumulate in
// f32 (CUBLAS_COMPUTE_32F: no TF32). The node's Args are A and B (read)
// and C (written; read and written when Beta is not 0), as pointer
// arguments, so that events, races and lifetimes see them like a
// kernel's.
type Library struct {
	Call           string  `json:"call"`
	TransA         string  `json:"trans_a"`
	TransB         string  `json:"trans_b"`
	M              int64   `json:"m"`
	N              int64   `json:"n"`
	K              int64   `json:"k"`
	Alpha          float64 `json:"alpha"`
	Beta           float64 `json:"beta"`
	LDA            int64   `json:"lda"`
	LDB            int64   `json:"ldb"`
	LDC            int64   `json:"ldc"`
	StrideA        int64   `json:"stride_a"`
	StrideB        int64   `json:"stride_b"`
	StrideC        int64   `json:"stride_c"`
	Batch          int64   `json:"batch"`
	AType          string  `json:"a_type"`
	BType          string  `json:"b_type"`
	CType          string  `json:"c_type"`
	WorkspaceBytes int64   `json:"-"`
}

// GemmCall is the cuBLAS function library nodes call.
const GemmCall = "cublasGemmStridedBatchedEx"

// BLASWorkspace is the device memory the runtime gives cuBLAS
// (cublasSetWorkspace), so that a step captured into a graph allocates
// nothing: 32 MiB, what NVIDIA recommends for Hopper.
const BLASWorkspace = 32 << 20

// affine is Σ coef[v]·v + c over loop variables.
type affine struct {
	coef map[*loops.Var]int64
	c    int64
}

// affineOf writes an index expression as an affine form, or reports
// that it is not one (products of variables, divisions, selects).
func affineOf(x loops.Expr) (affine, bool) {
	switch x := x.(type) {
	case loops.Int:
		return affine{coef: map[*loops.Var]int64{}, c: x.V}, true
	case *loops.Var:
		return affine{coef: map[*loops.Var]int64{x: 1}}, true
	case *loops.Convert:
		if x.To.IsInteger() && x.X.Kind().IsInteger() {
			return affineOf(x.X)
		}
	case *loops.Binary:
		a, okA := affineOf(x.A)
		b, okB := affineOf(x.B)
		if !okA || !okB {
			return affine{}, false
		}
		switch x.Op {
		case scalar.Add, scalar.Sub:
			sign := int64(1)
			if x.Op == scalar.Sub {
				sign = -1
			}
			out := affine{coef: map[*loops.Var]int64{}, c: a.c + sign*b.c}
			for v, k := range a.coef {
				out.coef[v] += k
			}
			for v, k := range b.coef {
				out.coef[v] += sign * k
			}
			return out, true
		case scalar.Mul:
			if len(b.coef) == 0 {
				a, b = b, a
			}
			if len(a.coef) != 0 {
				return affine{}, false
			}
			out := affine{coef: map[*loops.Var]int64{}, c: a.c * b.c}
			for v, k := range b.coef {
				out.coef[v] = a.c * k
			}
			return out, true
		}
	}
	return affine{}, false
}

// elementOffset is the row-major element offset of buf at index, as an
// affine form.
func elementOffset(buf *loops.Buffer, index []loops.Expr) (affine, bool) {
	shape := buf.Type.Shape
	if len(index) != len(shape) {
		return affine{}, false
	}
	out := affine{coef: map[*loops.Var]int64{}}
	stride := int64(1)
	for d := len(shape) - 1; d >= 0; d-- {
		a, ok := affineOf(index[d])
		if !ok {
			return affine{}, false
		}
		out.c += stride * a.c
		for v, k := range a.coef {
			out.coef[v] += stride * k
		}
		stride *= shape[d]
	}
	return out, true
}

// operand is a matrix operand of a matmul stage: a plain load of a
// buffer (through a conversion to the compute kind).
func operand(x loops.Expr) (*loops.Load, bool) {
	if c, ok := x.(*loops.Convert); ok {
		x = c.X
	}
	l, ok := x.(*loops.Load)
	if !ok || l.Guard != nil {
		return nil, false
	}
	return l, true
}

// blasType is the cuBLAS storage type of a dtype: "" when none.
func blasType(d ir.DType) string {
	switch d {
	case ir.F32:
		return "f32"
	case ir.F16:
		return "f16"
	case ir.BF16:
		return "bf16"
	}
	return ""
}

// colMajor describes the matrix X(r, c) = X + r·sr + c·sc (rows × cols)
// as cuBLAS takes it: op "N" with leading dimension ld when it is stored
// column-major (unit stride down a column), op "T" when it is the
// transpose of a column-major cols × rows matrix (unit stride along a
// row). A dimension of extent 1 may have any stride.
func colMajor(rows, cols, sr, sc int64) (op string, ld int64, ok bool) {
	if (rows == 1 || sr == 1) && (cols == 1 || sc >= max(rows, 1)) {
		if cols == 1 {
			sc = max(rows, 1)
		}
		return "N", sc, true
	}
	if (cols == 1 || sc == 1) && (rows == 1 || sr >= max(cols, 1)) {
		if rows == 1 {
			sr = max(cols, 1)
		}
		return "T", sr, true
	}
	return "", 0, false
}

// gemm maps the matmul stage st (inside a loop over batch when batch is
// not nil; every other loop variable has the value fixed) to one
// strided-batched GEMM, or reports that it does not map: a guard, an
// accumulation through an epilogue, operands that are not plain loads
// affine in the stage's variables, strides cuBLAS cannot express, or
// dtypes it does not multiply. The result is the call and its
// operands' loads and offsets (elements).
type gemmPlan struct {
	lib              *Library
	a, b             *loops.Load
	offA, offB, offC int64
}

func gemm(st *loops.Stage, batch *loops.Var, batchN int64, fixed map[*loops.Var]int64) (*gemmPlan, bool) {
	mm := st.Matmul
	if mm == nil || st.Guard != nil || len(st.Vars) != 2 || (st.Accumulate && mm.Epilogue != nil) || (batch != nil && batchN < 1) {
		return nil, false
	}
	la, okA := operand(mm.A)
	lb, okB := operand(mm.B)
	if !okA || !okB {
		return nil, false
	}
	at, bt, ct := blasType(la.Buf.Type.DType), blasType(lb.Buf.Type.DType), blasType(st.Out.Type.DType)
	if at == "" || at != bt || ct == "" || (ct != at && ct != "f32") {
		return nil, false
	}
	if mm.Epilogue != nil && ct != "f32" {
		// The epilogue would read the product rounded to 16 bits, where
		// the kernel applies it to the f32 sum.
		return nil, false
	}
	idx := st.Index
	if idx == nil {
		idx = []loops.Expr{st.Vars[0], st.Vars[1]}
	}
	fa, ok1 := elementOffset(la.Buf, la.Index)
	fb, ok2 := elementOffset(lb.Buf, lb.Index)
	fc, ok3 := elementOffset(st.Out, idx)
	if !ok1 || !ok2 || !ok3 {
		return nil, false
	}
	mv, nv, kv := st.Vars[0], st.Vars[1], mm.K
	M, N, K := st.Extents[0], st.Extents[1], mm.Extent
	// Every variable is the stage's, the batch or fixed.
	resolve := func(f affine) (int64, bool) {
		c := f.c
		for v, k := range f.coef {
			switch {
			case k == 0 || v == mv || v == nv || v == kv || v == batch:
			default:
				val, ok := fixed[v]
				if !ok {
					return 0, false
				}
				c += k * val
			}
		}
		return c, true
	}
	oa, ok1 := resolve(fa)
	ob, ok2 := resolve(fb)
	oc, ok3 := resolve(fc)
	if !ok1 || !ok2 || !ok3 || fa.coef[nv] != 0 || fb.coef[mv] != 0 || fc.coef[kv] != 0 {
		return nil, false
	}
	lib := &Library{Call: GemmCall, Alpha: 1, AType: at, BType: bt, CType: ct, K: K, Batch: 1}
	if st.Accumulate {
		lib.Beta = 1
	}
	var okA2, okB2 bool
	first, second := la, lb
	var fFirst, fSecond affine
	cRow, cCol := fc.coef[mv], fc.coef[nv]
	switch {
	case (N == 1 || cCol == 1) && (M == 1 || cRow >= max(N, 1)):
		// C is row-major: Cᵀ (N × M, column-major) = Bᵀ·Aᵀ.
		lib.M, lib.N, lib.LDC = N, M, cRow
		if M == 1 {
			lib.LDC = max(N, 1)
		}
		// op(A') = Bᵀ: rows j < N, columns k < K of B(k, j).
		lib.TransA, lib.LDA, okA2 = colMajor(N, K, fb.coef[nv], fb.coef[kv])
		// op(B') = Aᵀ: rows k < K, columns i < M of A(i, k).
		lib.TransB, lib.LDB, okB2 = colMajor(K, M, fa.coef[kv], fa.coef[mv])
		first, second, fFirst, fSecond = lb, la, fb, fa
		lib.AType, lib.BType = bt, at
	case (M == 1 || cRow == 1) && (N == 1 || cCol >= max(M, 1)):
		// C is column-major: C = A·B as it stands.
		lib.M, lib.N, lib.LDC = M, N, cCol
		if N == 1 {
			lib.LDC = max(M, 1)
		}
		lib.TransA, lib.LDA, okA2 = colMajor(M, K, fa.coef[mv], fa.coef[kv])
		lib.TransB, lib.LDB, okB2 = colMajor(K, N, fb.coef[kv], fb.coef[nv])
		fFirst, fSecond = fa, fb
	default:
		return nil, false
	}
	if !okA2 || !okB2 {
		return nil, false
	}
	if batch != nil && batchN > 1 {
		lib.Batch = batchN
		lib.StrideA, lib.StrideB, lib.StrideC = fFirst.coef[batch], fSecond.coef[batch], fc.coef[batch]
		// Batches of C must not overlap, nor run backwards.
		if lib.StrideA < 0 || lib.StrideB < 0 || lib.StrideC < (lib.N-1)*lib.LDC+lib.M {
			return nil, false
		}
	}
	for _, v := range []int64{lib.M, lib.N, lib.K, lib.LDA, lib.LDB, lib.LDC, lib.Batch} {
		if v > math.MaxInt32 || v < 1 {
			return nil, false
		}
	}
	p := &gemmPlan{lib: lib, a: first, b: second, offC: oc}
	p.offA, p.offB = oa, ob
	if first == lb {
		p.offA, p.offB = ob, oa
	}
	return p, true
}

// String describes the call for messages.
func (l *Library) String() string {
	return fmt.Sprintf("%s(%s, %s, m=%d, n=%d, k=%d, lda=%d, ldb=%d, ldc=%d, batch=%d)", l.Call, l.TransA, l.TransB, l.M, l.N, l.K, l.LDA, l.LDB, l.LDC, l.Batch)
}

// library adds the GEMM of the matmul stage st as a library node (over
// the loop batch of batchN iterations when batch is not nil), and the
// stage's epilogue as a kernel over the same points after it; it reports
// false, adding nothing, when the stage does not map to cuBLAS (gemm).
func (b *planner) library(op int, k *loops.Kernel, st *loops.Stage, batch *loops.Var, batchN int64, outer []*loops.Var, extents, iter []int64, temps map[string]int64) (bool, error) {
	fixed := map[*loops.Var]int64{}
	for i, v := range outer {
		fixed[v] = iter[i]
	}
	g, ok := gemm(st, batch, batchN, fixed)
	if !ok {
		return false, nil
	}
	access := func(lb *loops.Buffer, elems int64, mode string) (*Access, error) {
		skip := elems * lb.Type.DType.Size()
		a, err := b.pointerAccess(k, lb, lb.Type.SizeBytes()-skip, mode, temps)
		if err != nil {
			return nil, err
		}
		a.Offset += skip
		return a, nil
	}
	mode := "write"
	if g.lib.Beta != 0 {
		mode = "readwrite"
	}
	c, err := access(st.Out, g.offC, mode)
	if err != nil {
		return false, err
	}
	x, err := access(g.a.Buf, g.offA, "read")
	if err != nil {
		return false, err
	}
	y, err := access(g.b.Buf, g.offB, "read")
	if err != nil {
		return false, err
	}
	b.raw = append(b.raw, Node{Kind: "library", Stream: 0, Op: op, Library: g.lib,
		Args: []KArg{{Kind: "pointer", Pointer: x}, {Kind: "pointer", Pointer: y}, {Kind: "pointer", Pointer: c}}})
	if st.Matmul.Epilogue == nil {
		return true, nil
	}
	// The epilogue, on the product the library left in Out (f32, as the
	// kernel's accumulator is).
	idx := st.Index
	if idx == nil {
		idx = []loops.Expr{st.Vars[0], st.Vars[1]}
	}
	kind := loops.ComputeKind(st.Out.Type.DType)
	epi := &loops.Stage{Vars: st.Vars, Extents: st.Extents, Out: st.Out, Index: idx,
		Value: st.Matmul.Epilogue(&loops.Load{Buf: st.Out, Index: idx})}
	if v := epi.Value; v.Kind() != kind {
		epi.Value = &loops.Convert{To: kind, X: v}
	}
	if batch != nil {
		epi.Vars = append([]*loops.Var{batch}, st.Vars...)
		epi.Extents = append([]int64{batchN}, st.Extents...)
	}
	b.alias[epi] = fmt.Sprintf("%s_s%d_epilogue", k.Name, b.stageIndex(k, st))
	return true, b.launches(op, k, []loops.Step{epi}, outer, extents, iter, temps)
}
