package cuda

import (
	"fmt"
	"math"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// Library is a library call of a plan node (kind "library"):
// cublasGemmStridedBatchedEx, or cublasLtMatmul when the GEMM carries an
// epilogue, in cuBLAS's column-major terms. For each
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
//
// Epilogue "bias" (Call cublasLtMatmul, CUBLASLT_EPILOGUE_BIAS; Batch 1,
// Alpha 1, Beta 0, CType f32) adds bias[i] to every element of row i of
// C after the product, in f32, before C is stored: the node's fourth Arg
// is bias, M f32 elements read. It is the only epilogue Kiln fuses:
// cuBLASLt's ReLU is max(x, 0), which would turn a NaN into 0 where
// Kiln's relu (and PyTorch's) keeps it.
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
	Epilogue       string  `json:"epilogue,omitempty"`
	WorkspaceBytes int64   `json:"-"`
}

// GemmCall is the cuBLAS function library nodes call; LtCall the
// cuBLASLt one of a GEMM with an epilogue.
const (
	GemmCall = "cublasGemmStridedBatchedEx"
	LtCall   = "cublasLtMatmul"
)

// BiasEpilogue is Library.Epilogue of a GEMM that adds a bias per row;
// BiasAlignment the bytes a fused bias's offset in its memory is a
// multiple of. cuBLASLt's heuristic takes the alignment of A, B and C as
// a preference but not the bias's, and some of its kernels load the bias
// 16 bytes at a time; every memory space starts at least that aligned.
const (
	BiasEpilogue  = "bias"
	BiasAlignment = 16
)

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
	vars             [2]*loops.Var // the stage's variables (m, n)
	extents          [2]int64
	rows             *loops.Var // the one along cuBLAS's rows of C
	out              *loops.Buffer
	outOffset        affine // the stage's element offset into out
	fixed            map[*loops.Var]int64
}

// at is a with the variables of fixed replaced by their values.
func (a affine) at(fixed map[*loops.Var]int64) affine {
	out := affine{coef: map[*loops.Var]int64{}, c: a.c}
	for v, c := range a.coef {
		if val, ok := fixed[v]; ok {
			out.c += c * val
		} else if c != 0 {
			out.coef[v] = c
		}
	}
	return out
}

// equal reports whether a and b are the same form.
func (a affine) equal(b affine) bool {
	if a.c != b.c {
		return false
	}
	for v, c := range a.coef {
		if b.coef[v] != c {
			return false
		}
	}
	for v, c := range b.coef {
		if a.coef[v] != c {
			return false
		}
	}
	return true
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
	p := &gemmPlan{lib: lib, a: first, b: second, offC: oc, vars: [2]*loops.Var{mv, nv}, extents: [2]int64{M, N}, rows: mv, out: st.Out, outOffset: fc, fixed: fixed}
	p.offA, p.offB = oa, ob
	if first == lb {
		p.offA, p.offB = ob, oa
		p.rows = nv
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
	if batch != nil && batchN == 1 {
		fixed[batch] = 0 // the epilogue's bias may be read at it
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
	node := Node{Kind: "library", Stream: 0, Op: op, Library: g.lib,
		Args: []KArg{{Kind: "pointer", Pointer: x}, {Kind: "pointer", Pointer: y}, {Kind: "pointer", Pointer: c}}}
	b.plainGemm = nil
	if st.Matmul.Epilogue == nil {
		b.raw = append(b.raw, node)
		if batch == nil || batchN == 1 {
			b.plainGemm = g
		}
		return true, nil
	}
	idx := st.Index
	if idx == nil {
		idx = []loops.Expr{st.Vars[0], st.Vars[1]}
	}
	// What the epilogue reads beside the product (a probe stands for it):
	// C's own elements at each point make the call accumulate (beta 1);
	// any other read of C's bytes would find the product there, written
	// over what the epilogue needs, so the stage stays a kernel.
	probe := &loops.Buffer{Name: "kiln.product", Type: st.Out.Type, Storage: loops.Temp}
	probed := st.Matmul.Epilogue(&loops.Load{Buf: probe, Index: idx})
	if g.lib.Beta == 0 && accumulates(g, probed, probe) {
		g.lib.Beta, c.Mode = 1, "readwrite"
		b.raw = append(b.raw, node)
		return true, nil
	}
	for _, p := range pointers(&loops.Stage{Vars: st.Vars, Extents: st.Extents, Out: probe, Index: idx, Value: probed}, nil) {
		if p.key == keyOf(probe) || !p.read {
			continue
		}
		a, err := b.pointerAccess(k, p.buf, p.size, "read", temps)
		if err != nil {
			return false, err
		}
		if overlap(a, c) {
			return false, nil
		}
	}
	kind := loops.ComputeKind(st.Out.Type.DType)
	epi := &loops.Stage{Vars: st.Vars, Extents: st.Extents, Out: st.Out, Index: idx,
		Value: st.Matmul.Epilogue(&loops.Load{Buf: st.Out, Index: idx})}
	if v := epi.Value; v.Kind() != kind {
		epi.Value = &loops.Convert{To: kind, X: v}
	}
	if batch == nil || batchN == 1 {
		if ok, err := b.fuseBias(k, &node, g, epi, temps); ok || err != nil {
			b.raw = append(b.raw, node)
			return err == nil, err
		}
	}
	b.raw = append(b.raw, node)
	// The epilogue, on the product the library left in Out (f32, as the
	// kernel's accumulator is).
	if batch != nil {
		epi.Vars = append([]*loops.Var{batch}, st.Vars...)
		epi.Extents = append([]int64{batchN}, st.Extents...)
	}
	b.alias[epi] = fmt.Sprintf("%s_s%d_epilogue", k.Name, b.stageIndex(k, st))
	return true, b.launches(op, k, []loops.Step{epi}, outer, extents, iter, temps)
}

// sameMemory reports whether a and b are one buffer, perhaps under two
// shapes (loops.alias): the same memory, read as the same dtype.
func sameMemory(a, b *loops.Buffer) bool {
	return keyOf(a) == keyOf(b) && a.Type.DType == b.Type.DType
}

// accumulates reports whether the epilogue value (of the product, read
// from probe) is the product plus the element of C at the same point
// (multiplications by 1 aside): what cuBLAS computes with beta 1.
func accumulates(g *gemmPlan, value loops.Expr, probe *loops.Buffer) bool {
	sum, ok := withoutUnits(value).(*loops.Binary)
	if !ok || sum.Op != scalar.Add {
		return false
	}
	a, b := withoutUnits(sum.A), withoutUnits(sum.B)
	if l, ok := b.(*loops.Load); ok && l.Buf == probe {
		a, b = b, a
	}
	la, okA := a.(*loops.Load)
	lc, okC := b.(*loops.Load)
	if !okA || !okC || la.Buf != probe || lc.Guard != nil || !sameMemory(lc.Buf, g.out) {
		return false
	}
	f, ok := elementOffset(lc.Buf, lc.Index)
	return ok && f.at(g.fixed).equal(g.outOffset.at(g.fixed))
}

// withoutUnits is x without multiplications by 1 and conversions to its
// own kind around it.
func withoutUnits(x loops.Expr) loops.Expr {
	for {
		switch y := x.(type) {
		case *loops.Binary:
			if f, ok := y.B.(loops.Float); ok && y.Op == scalar.Mul && f.V == 1 {
				x = y.A
				continue
			}
		case *loops.Convert:
			if y.To == y.X.Kind() {
				x = y.X
				continue
			}
		}
		return x
	}
}

// fuseNext fuses the stage that follows a library call, first of rest,
// into it when it adds a bias in place to the product (biasOf): it
// reports whether it did.
func (b *planner) fuseNext(k *loops.Kernel, rest []loops.Step, temps map[string]int64) (bool, error) {
	g := b.plainGemm
	if g == nil || len(rest) == 0 {
		return false, nil
	}
	next, ok := rest[0].(*loops.Stage)
	if _, made := b.alias[next]; !ok || made || b.override[next] != nil {
		return false, nil
	}
	return b.fuseBias(k, &b.raw[len(b.raw)-1], g, next, temps)
}

// fuseBias makes the GEMM node n (of plan g) a cuBLASLt call with a bias
// epilogue when biasOf finds the stage ep to be one; it reports false,
// changing nothing, when ep is anything else.
func (b *planner) fuseBias(k *loops.Kernel, n *Node, g *gemmPlan, ep *loops.Stage, temps map[string]int64) (bool, error) {
	buf, off, ok := biasOf(g, ep)
	if !ok {
		return false, nil
	}
	skip := off * 4
	a, err := b.pointerAccess(k, buf, buf.Type.SizeBytes()-skip, "read", temps)
	if err != nil {
		return false, err
	}
	a.Offset += skip
	a.SizeBytes = g.lib.M * 4
	if c := n.Args[2].Pointer; overlap(a, c) || a.Offset%BiasAlignment != 0 {
		// cuBLASLt would read the bias while it writes C, or might pick a
		// kernel that assumes an aligned bias (no preference says
		// otherwise).
		return false, nil
	}
	g.lib.Call, g.lib.Epilogue = LtCall, BiasEpilogue
	n.Args = append(n.Args, KArg{Kind: "pointer", Pointer: a})
	return true, nil
}

// biasOf reports whether the stage ep, run right after the product g,
// is a bias epilogue cuBLASLt can apply: at every point of the product's
// domain (ep's variables standing for the product's, in order) it
// stores exactly Out[point] + bias[row] in f32, in place (multiplications
// by 1 aside; row the variable along cuBLAS's rows), with bias an
// unguarded f32 buffer in memory (not a constant of the kernel) other
// than Out read contiguously along the rows from element off; and the
// product is one f32 GEMM that overwrites C.
func biasOf(g *gemmPlan, ep *loops.Stage) (bias *loops.Buffer, off int64, ok bool) {
	l := g.lib
	if ep == nil || l.Batch != 1 || l.Beta != 0 || l.Alpha != 1 || l.CType != "f32" || ep.Out.Type.DType != ir.F32 ||
		ep.Guard != nil || ep.Matmul != nil || ep.Accumulate || len(ep.Vars) != 2 || len(ep.Extents) != 2 {
		return nil, 0, false
	}
	ren := map[*loops.Var]*loops.Var{}
	for i, v := range ep.Vars {
		if ep.Extents[i] != g.extents[i] {
			return nil, 0, false
		}
		ren[v] = g.vars[i]
	}
	offset := func(buf *loops.Buffer, index []loops.Expr) (affine, bool) {
		f, ok := elementOffset(buf, index)
		if !ok {
			return affine{}, false
		}
		out := affine{coef: map[*loops.Var]int64{}, c: f.c}
		for v, c := range f.coef {
			if r, ok := ren[v]; ok {
				v = r
			}
			out.coef[v] += c
		}
		return out.at(g.fixed), true
	}
	idx := ep.Index
	if idx == nil {
		idx = []loops.Expr{ep.Vars[0], ep.Vars[1]}
	}
	same := func(buf *loops.Buffer, index []loops.Expr) bool {
		f, ok := offset(buf, index)
		return ok && sameMemory(buf, g.out) && f.equal(g.outOffset.at(g.fixed))
	}
	if !same(ep.Out, idx) {
		return nil, 0, false
	}
	sum, isSum := withoutUnits(ep.Value).(*loops.Binary)
	if !isSum || sum.Op != scalar.Add || sum.Kind() != loops.F32 {
		return nil, 0, false
	}
	acc, other := withoutUnits(sum.A), withoutUnits(sum.B)
	if la, ok := acc.(*loops.Load); !ok || la.Guard != nil || !same(la.Buf, la.Index) {
		acc, other = other, acc
	}
	la, okA := acc.(*loops.Load)
	lb, okB := other.(*loops.Load)
	if !okA || !okB || la.Guard != nil || !same(la.Buf, la.Index) || lb.Guard != nil || lb.Buf.Type.DType != ir.F32 || lb.Buf.Storage == loops.Const || sameMemory(lb.Buf, g.out) {
		return nil, 0, false
	}
	fb, ok := offset(lb.Buf, lb.Index)
	if !ok {
		return nil, 0, false
	}
	// bias[row]: unit stride along the rows, no other variable but fixed
	// ones.
	off = fb.c
	for v, c := range fb.coef {
		switch {
		case c == 0:
		case v == g.rows:
			if c != 1 && l.M > 1 {
				return nil, 0, false
			}
		default:
			val, isFixed := g.fixed[v]
			if !isFixed {
				return nil, 0, false
			}
			off += c * val
		}
	}
	if l.M > 1 && fb.coef[g.rows] != 1 || off < 0 || off+l.M > lb.Buf.Type.NumElements() {
		return nil, 0, false
	}
	return lb.Buf, off, true
}
