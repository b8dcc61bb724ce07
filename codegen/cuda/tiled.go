package cuda

import (
	"fmt"
	"strings"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// A product that is not a library call (its operands are computed or
// read under a convolution's taps, or its result has an epilogue cuBLAS
// cannot fuse) runs as a tiled kernel: each block computes a tile of
// tileM × tileN outputs, its 256 threads 4 × 4 each, from tiles of A
// and B staged in shared memory tileK columns of the contraction at a
// time. The operands are the stage's own expressions, so a
// convolution's B is read under its taps straight from the input
// (implicit GEMM: no im2col in memory).
//
// A product of few tiles and a long contraction (a weight gradient:
// K = images × positions, one tile or a few of outputs) splits K into
// parts, a block per tile and part, each adding its partial sums into
// the result with atomicAdd after a stage that zeroes it: the result's
// order of summation varies from run to run on a GPU, within the f32
// error model. Only an f32 or f64 result without epilogue splits (a
// 16-bit one would round at every add), and not one that accumulates
// into its result, which the CUDA lowering of products never asks.
const (
	tileM, tileN, tileK = 64, 64, 16
	// splitKBlocks is the blocks a split product aims at: two per
	// multiprocessor of an H100 (132).
	splitKBlocks = 264
	// splitKMin is the least contraction a part folds.
	splitKMin = 512
)

// tiling is how a product stage runs as a tiled kernel.
type tiling struct {
	tilesN int64 // tiles along N
	tiles  int64 // tiles of the result
	parts  int64 // parts of K (1: not split)
	chunk  int64 // contraction per part
	// wide is the 16-bit dtype (bf16 or f16) both operands hold exactly
	// (reads of buffers of that dtype, 0 where guarded), or Invalid:
	// then the tiles are staged as 16-bit values and multiplied on the
	// tensor cores (WMMA, f32 sums), 8 warps of 16 × 32 outputs each.
	wide ir.DType
}

// exact16 is the 16-bit float dtype x reads exactly: a read of a bf16 or
// f16 buffer (0 where a guard fails), possibly under a guard with 0
// elsewhere or converted to f32; else Invalid.
func exact16(x loops.Expr) ir.DType {
	switch x := x.(type) {
	case *loops.Load:
		if d := x.Buf.Type.DType; (d == ir.BF16 || d == ir.F16) && (x.Guard == nil || x.Else == 0) {
			return d
		}
	case *loops.Guarded:
		if x.Else == 0 {
			return exact16(x.X)
		}
	case *loops.Convert:
		if x.To == loops.F32 {
			return exact16(x.X)
		}
	}
	return ir.Invalid
}

// The leading dimensions of a 16-bit tile's shared arrays: A (64 × 16),
// B (16 × 64) and the f32 results (64 × 64), padded.
const wideLDA, wideLDB, wideLDC = tileK + 8, tileN + 8, tileN + 4

// sharedBytes is the static shared memory of a tiled function.
func (t *tiling) sharedBytes(acc loops.Kind) int64 {
	if t.wide != ir.Invalid {
		return (tileM*wideLDA+tileK*wideLDB)*2 + tileM*wideLDC*4
	}
	return (tileK*(tileM+1) + tileK*tileN) * kindBytes(acc)
}

// tile is the tiling of product stage st.
func tile(st *loops.Stage) *tiling {
	M, N, K := st.Extents[0], st.Extents[1], st.Matmul.Extent
	t := &tiling{tilesN: (N + tileN - 1) / tileN, parts: 1, chunk: K}
	if a := exact16(st.Matmul.A); a != ir.Invalid && a == exact16(st.Matmul.B) && st.Matmul.A.Kind() == loops.F32 {
		t.wide = a
	}
	t.tiles = (M + tileM - 1) / tileM * t.tilesN
	d := st.Out.Type.DType
	if t.tiles < splitKBlocks && K >= 2*splitKMin && st.Matmul.Epilogue == nil && !st.Accumulate && st.Guard == nil && (d == ir.F32 || d == ir.F64) {
		t.parts = min((splitKBlocks+t.tiles-1)/t.tiles, K/splitKMin)
		t.chunk = (K + t.parts - 1) / t.parts
		t.chunk = (t.chunk + tileK - 1) / tileK * tileK
		t.parts = (K + t.chunk - 1) / t.chunk
	}
	return t
}

// blocks is the blocks of a tiled launch: one per tile and part.
func (t *tiling) blocks() int64 { return t.tiles * t.parts }

// tiled writes the body of a product stage's tiled device function (the
// caller adds the signature): the tile and part of block kiln_block,
// the staged loads of A and B, the 4 × 4 sums of each thread, and the
// stores (or atomic adds of a split).
func (w *cw) tiled(k *stageKernel) {
	s, m, t := k.stage, k.stage.Matmul, k.tile
	M, N := s.Extents[0], s.Extents[1]
	vm, vn, vk := s.Vars[0], s.Vars[1], m.K
	acc := cType(m.A.Kind())
	if t.wide != ir.Invalid {
		// Rows padded against bank conflicts, keeping every fragment's
		// pointer 32-byte aligned and its leading dimension whole 16-byte
		// rows (mma.h's rules; the emulation checks them).
		w.line("__shared__ __align__(32) unsigned short kiln_as[%d][%d];", tileM, wideLDA)
		w.line("__shared__ __align__(32) unsigned short kiln_bs[%d][%d];", tileK, wideLDB)
		w.line("__shared__ __align__(32) float kiln_cs[%d][%d];", tileM, wideLDC)
	} else {
		w.line("__shared__ %s kiln_as[%d][%d];", acc, tileK, tileM+1)
		w.line("__shared__ %s kiln_bs[%d][%d];", acc, tileK, tileN)
	}
	w.line("const long long kiln_tile = kiln_block %% %dLL, kiln_part = kiln_block / %dLL;", t.tiles, t.tiles)
	w.line("const long long kiln_m0 = kiln_tile / %dLL * %d, kiln_n0 = kiln_tile %% %dLL * %d;", t.tilesN, tileM, t.tilesN, tileN)
	w.line("const long long kiln_k0 = kiln_part * %dLL;", t.chunk)
	w.line("const long long kiln_k1 = kiln_k0 + %dLL < %dLL ? kiln_k0 + %dLL : %dLL;", t.chunk, m.Extent, t.chunk, m.Extent)
	w.line("const int kiln_tx = threadIdx.x %% 16, kiln_ty = threadIdx.x / 16;")
	w.line("%s kiln_acc[4][4];", acc)
	w.line("for (int i = 0; i < 4; i++)")
	w.line("  for (int j = 0; j < 4; j++) kiln_acc[i][j] = %s;", floatLit(0, m.A.Kind()))
	if t.wide != ir.Invalid {
		w.wmma(k)
		return
	}
	w.line("for (long long kiln_kt = kiln_k0; kiln_kt < kiln_k1; kiln_kt += %d) {", tileK)
	w.indent++
	// A: consecutive threads take consecutive k (A is mostly a row of
	// the kernel per output channel); B: consecutive n.
	w.operand("kiln_as", m.A, vm, vk, fmt.Sprintf("kiln_m0 + kiln_e / %d", tileK), fmt.Sprintf("kiln_kt + kiln_e %% %d", tileK), M,
		fmt.Sprintf("kiln_e %% %d", tileK), fmt.Sprintf("kiln_e / %d", tileK), "")
	w.operand("kiln_bs", m.B, vn, vk, fmt.Sprintf("kiln_n0 + kiln_e %% %d", tileN), fmt.Sprintf("kiln_kt + kiln_e / %d", tileN), N,
		fmt.Sprintf("kiln_e / %d", tileN), fmt.Sprintf("kiln_e %% %d", tileN), "")
	w.line("__syncthreads();")
	w.line("for (int kk = 0; kk < %d; kk++) {", tileK)
	w.line("  %s a[4], b[4];", acc)
	w.line("  for (int i = 0; i < 4; i++) a[i] = kiln_as[kk][kiln_ty * 4 + i], b[i] = kiln_bs[kk][kiln_tx * 4 + i];")
	w.line("  for (int i = 0; i < 4; i++)")
	w.line("    for (int j = 0; j < 4; j++) kiln_acc[i][j] += a[i] * b[j];")
	w.line("}")
	w.line("__syncthreads();")
	w.indent--
	w.line("}")
	w.stores(k)
}

// wmma writes the K loop of a tiled product of 16-bit operands: A's tile
// staged row-major (64 × 16) and B's (16 × 64) as 16-bit values, each
// warp's 16 × 32 outputs summed by two accumulator fragments on the
// tensor cores, which then go through shared memory into each thread's
// 4 × 4 outputs, as the f32 tiles leave them.
func (w *cw) wmma(k *stageKernel) {
	s, m, t := k.stage, k.stage.Matmul, k.tile
	M, N := s.Extents[0], s.Extents[1]
	vm, vn, vk := s.Vars[0], s.Vars[1], m.K
	elem := map[ir.DType]string{ir.BF16: "__nv_bfloat16", ir.F16: "__half"}[t.wide]
	narrow := map[ir.DType]string{ir.BF16: "kiln_f32_to_bf16", ir.F16: "kiln_f32_to_f16"}[t.wide]
	w.line("const int kiln_warp = threadIdx.x / 32, kiln_wm = kiln_warp / 2 * 16, kiln_wn = kiln_warp %% 2 * 32;")
	w.line("nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> kiln_c0, kiln_c1;")
	w.line("nvcuda::wmma::fill_fragment(kiln_c0, 0.0f);")
	w.line("nvcuda::wmma::fill_fragment(kiln_c1, 0.0f);")
	w.line("for (long long kiln_kt = kiln_k0; kiln_kt < kiln_k1; kiln_kt += %d) {", tileK)
	w.indent++
	// The values are the operands' own 16-bit ones, so narrowing them
	// back is exact.
	w.operand("kiln_as", m.A, vm, vk, fmt.Sprintf("kiln_m0 + kiln_e / %d", tileK), fmt.Sprintf("kiln_kt + kiln_e %% %d", tileK), M,
		fmt.Sprintf("kiln_e / %d", tileK), fmt.Sprintf("kiln_e %% %d", tileK), narrow)
	w.operand("kiln_bs", m.B, vn, vk, fmt.Sprintf("kiln_n0 + kiln_e %% %d", tileN), fmt.Sprintf("kiln_kt + kiln_e / %d", tileN), N,
		fmt.Sprintf("kiln_e / %d", tileN), fmt.Sprintf("kiln_e %% %d", tileN), narrow)
	w.line("__syncthreads();")
	w.line("nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, %s, nvcuda::wmma::row_major> kiln_a;", elem)
	w.line("nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, %s, nvcuda::wmma::row_major> kiln_b0, kiln_b1;", elem)
	w.line("nvcuda::wmma::load_matrix_sync(kiln_a, (const %s *)&kiln_as[kiln_wm][0], %d);", elem, wideLDA)
	w.line("nvcuda::wmma::load_matrix_sync(kiln_b0, (const %s *)&kiln_bs[0][kiln_wn], %d);", elem, wideLDB)
	w.line("nvcuda::wmma::load_matrix_sync(kiln_b1, (const %s *)&kiln_bs[0][kiln_wn + 16], %d);", elem, wideLDB)
	w.line("nvcuda::wmma::mma_sync(kiln_c0, kiln_a, kiln_b0, kiln_c0);")
	w.line("nvcuda::wmma::mma_sync(kiln_c1, kiln_a, kiln_b1, kiln_c1);")
	w.line("__syncthreads();")
	w.indent--
	w.line("}")
	w.line("nvcuda::wmma::store_matrix_sync(&kiln_cs[kiln_wm][kiln_wn], kiln_c0, %d, nvcuda::wmma::mem_row_major);", wideLDC)
	w.line("nvcuda::wmma::store_matrix_sync(&kiln_cs[kiln_wm][kiln_wn + 16], kiln_c1, %d, nvcuda::wmma::mem_row_major);", wideLDC)
	w.line("__syncthreads();")
	w.line("for (int i = 0; i < 4; i++)")
	w.line("  for (int j = 0; j < 4; j++) kiln_acc[i][j] = kiln_cs[kiln_ty * 4 + i][kiln_tx * 4 + j];")
	w.line("__syncthreads(); // the next tile's stores into kiln_cs wait for these reads")
	w.stores(k)
}

// stores writes each thread's 4 × 4 outputs of a tiled product from
// kiln_acc: the epilogue, then a store (an atomic add for a split).
func (w *cw) stores(k *stageKernel) {
	s, m, t := k.stage, k.stage.Matmul, k.tile
	M, N := s.Extents[0], s.Extents[1]
	vm, vn := s.Vars[0], s.Vars[1]
	w.line("for (int kiln_r = 0; kiln_r < 16; kiln_r++) {")
	w.indent++
	w.push()
	mName, nName := fmt.Sprintf("v%d", vm.ID), fmt.Sprintf("v%d", vn.ID)
	w.vars[vm], w.vars[vn] = mName, nName
	w.line("const long long %s = kiln_m0 + kiln_ty * 4 + kiln_r / 4, %s = kiln_n0 + kiln_tx * 4 + kiln_r %% 4;", mName, nName)
	w.line("if (%s >= %dLL || %s >= %dLL) continue;", mName, M, nName, N)
	if s.Guard != nil {
		w.line("if (!(%s)) continue;", w.expr(s.Guard))
	}
	var v loops.Expr = accRef{name: "kiln_acc[kiln_r / 4][kiln_r % 4]", kind: m.A.Kind()}
	if m.Epilogue != nil {
		v = m.Epilogue(v)
	}
	outKind := loops.ComputeKind(s.Out.Type.DType)
	value := convert(w.expr(v), v.Kind(), outKind)
	at := w.flat(s.Out, s.Index)
	out := w.ptr(s.Out)
	d := s.Out.Type.DType
	switch {
	case t.parts > 1:
		w.line("atomicAdd(&%s[%s], %s);", out, at, value)
	case s.Accumulate:
		old := w.tmp()
		w.line("const %s %s = %s;", cType(outKind), old, w.load(s.Out, s.Index))
		w.line("%s[%s] = %s;", out, at, toStorage(w.binary(scalar.Add, outKind, old, value), d))
	default:
		w.line("%s[%s] = %s;", out, at, toStorage(value, d))
	}
	w.pop()
	w.indent--
	w.line("}")
}

// operand stages a tile of a product operand x (of variables row, the
// output's, and k) into shared array dst: element e of the block's 1024
// takes row index rowAt and contraction index kAt (C expressions of
// kiln_e), within extent rows and [kiln_k0, kiln_k1), 0 outside, and
// lands at dst[i][j] (narrowed by the function narrow, unless "").
func (w *cw) operand(dst string, x loops.Expr, row, k *loops.Var, rowAt, kAt string, rows int64, i, j, narrow string) {
	w.line("for (int kiln_e = threadIdx.x; kiln_e < %d; kiln_e += 256) {", tileK*tileM)
	w.indent++
	w.push()
	rName, kName := fmt.Sprintf("v%d", row.ID), fmt.Sprintf("v%d", k.ID)
	w.vars[row], w.vars[k] = rName, kName
	w.line("const long long %s = %s, %s = %s;", rName, rowAt, kName, kAt)
	t := w.tmp()
	w.line("%s %s = %s;", cType(x.Kind()), t, floatLit(0, x.Kind()))
	w.line("if (%s < %dLL && %s < kiln_k1) {", rName, rows, kName)
	w.indent++
	w.push()
	w.line("%s = %s;", t, w.expr(x))
	w.pop()
	w.indent--
	w.line("}")
	if narrow != "" {
		t = narrow + "(" + t + ")"
	}
	w.line("%s[%s][%s] = %s;", dst, i, j, t)
	delete(w.vars, row) // bound again where the stores use it
	delete(w.vars, k)
	w.pop()
	w.indent--
	w.line("}")
}

// tiledSignature is the device function of a tiled stage.
func tiledSignature(k *stageKernel, params []string, body string) string {
	return fmt.Sprintf("static __device__ inline void %s_b(%s) {\n%s}\n", k.name, strings.Join(append(params, "long long kiln_block"), ", "), body)
}
