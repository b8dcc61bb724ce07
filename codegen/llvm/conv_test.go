package llvm_test

import (
	"strings"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	kir "github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// TestConvsOverImageChunks: this backend multiplies a weight gradient
// whose per-image product is narrow (14², 196 columns of contraction)
// and whose whole batch's im2col (3.6 MiB) passes the default bound over
// chunks of images (4 of the batch's 16: 784 positions, each chunk's
// im2col stored in turn, the gradient accumulating chunk by chunk), and
// the forward convolution and the input gradient over the whole batch
// (their B read under the taps, no im2col: TestConvTapPanels), and the
// results are the interpreter's. Error model: f32 sums of at most K
// terms (the weight gradient's 16 · 196 positions) differ from the
// interpreter's by at most K·2⁻²⁴ relative to the result's norm.
func TestConvsOverImageChunks(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%x: f32[16,32,14,14], %w: f32[16,32,3,3], %dy: f32[16,16,14,14]) -> (y: f32[16,16,14,14], dx: f32[16,32,14,14], dw: f32[16,32,3,3]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f32[16,16,14,14]
  %dx = conv2d_grad_input(%dy, %w) {input_shape = [16, 32, 14, 14], pads = [1, 1, 1, 1]} : f32[16,32,14,14]
  %dw = conv2d_grad_weight(%dy, %x) {pads = [1, 1, 1, 1], weight_shape = [16, 32, 3, 3]} : f32[16,32,3,3]
  return %y, %dx, %dw
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	f := m.Funcs[0]
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	// The forward and input-gradient kernels are one product of 16 · 196
	// columns, the weight gradient loops over 4 chunks of 4 images, each a
	// product of 4 · 196 positions of contraction.
	for i, k := range p.Kernels[:3] {
		chunks, extent := 0, int64(0)
		walkStages(k.Steps, 0, func(s *loops.Stage, loopsAround int64) {
			if s.Matmul != nil {
				chunks = int(loopsAround)
				extent = s.Extents[1]
				if i == 2 {
					extent = s.Matmul.Extent
				}
			}
		})
		want := []int{1, 1, 4}[i]
		require.Equal(t, want, chunks, "kernel %s: chunks of images", k.Name)
		require.Equal(t, []int64{3136, 3136, 784}[i], extent, "kernel %s: columns (contraction) of its product", k.Name)
	}
	args := interp.RandomArgs(f, 3)
	want, err := interp.Run(f, cloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, _, err := llvm.Run(p, args)
	require.NoError(t, err)
	for i, K := range []float64{288, 144, 3136} {
		e := passtest.RelErr(got[i], want[i])
		require.LessOrEqual(t, e, K*0x1p-24, "result %s", f.ResultName(i))
	}
}

// walkStages calls fn for every stage in steps with the product of the
// extents of the loops around it (times outer).
func walkStages(steps []loops.Step, outer int64, fn func(*loops.Stage, int64)) {
	if outer == 0 {
		outer = 1
	}
	for _, s := range steps {
		switch s := s.(type) {
		case *loops.Loop:
			walkStages(s.Body, outer*s.Extent, fn)
		case *loops.Stage:
			fn(s, outer)
		}
	}
}

// TestConvTapPanels: a convolution reading its columns at stride 1 (or
// 2, from an f32 buffer: even lanes of two vector loads), and the
// input gradient of a stride-1 one (a convolution of dy with the kernel
// flipped, its padding (K-1)·D - P, negative where the padding outgrows
// the kernel), multiply with B read straight from their input under the
// kernel taps (no im2col stored). Sixteen or more of the products are
// large enough for the packed microkernel, over geometries that put
// every case of a run in its panels: zeros before, after and instead of
// the input's columns, rows wholly in the padding, dilated and strided
// rows, dilated columns, grouped channels, one-column outputs, runs that
// split across images, K-blocked products (576 taps); the input an f32
// buffer (the vector copy) or bf16 (element by element). The smaller
// ones read B's own expression. Results are the interpreter's under the
// f32 model (K terms: K·2⁻²⁴ relative to the norm; bf16 inputs are exact
// in f32, the interpreter rounds the same products).
func TestConvTapPanels(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%a: f32[3,4,9,9], %wa: f32[8,4,3,3], %ba: f32[8], %b: f32[2,6,7,5], %wb: f32[8,6,3,2], %c: f32[2,4,8,8], %wc: f32[8,2,1,3], %d: f32[4,4,3,3], %wd: f32[8,4,2,2], %e: f32[4,4,6,3], %we: f32[8,4,3,3], %h: bf16[2,4,9,9], %wh: bf16[8,4,3,3], %r: f32[2,4,9,9], %wr: f32[8,4,3,3], %s: f32[1,2,4,4], %ws: f32[4,2,3,3], %da: f32[2,8,9,9], %wda: f32[8,4,3,3], %db: f32[2,8,6,7], %wdb: f32[8,6,3,2], %dc: f32[2,8,8,8], %wdc: f32[8,4,1,3], %dd: f32[16,8,8,8], %wdd: f32[8,4,2,2], %de: f32[4,8,4,1], %wde: f32[8,4,3,3], %pa: f32[4,8,8,8], %wpa: f32[16,4,3,3], %pb: f32[2,8,11,11], %wpb: f32[8,8,3,3], %pc: f32[8,8,6,3], %wpc: f32[8,8,3,3], %pd: f32[2,64,6,6], %wpd: f32[8,64,3,3], %qa: f32[2,64,6,6], %wqa: f32[64,8,3,3], %qb: f32[2,16,8,8], %wqb: f32[16,4,3,3], %qc: f32[2,8,8,6], %wqc: f32[8,8,3,3], %sa: f32[2,8,13,13], %wsa: f32[8,8,3,3], %sb: f32[2,4,12,15], %wsb: f32[8,4,7,7], %sc: f32[8,32,10,10], %wsc: f32[16,32,1,1], %sd: f32[2,8,6,17], %wsd: f32[8,8,3,3]) -> (ya: f32[3,8,9,9], yb: f32[2,8,3,7], yc: f32[2,8,8,8], yd: f32[4,8,8,8], ye: f32[4,8,4,1], yh: f32[2,8,7,7], yr: f32[2,8,9,9], ys: f32[1,4,4,4], xa: f32[2,4,9,9], xb: f32[2,6,7,5], xc: f32[2,8,8,8], xd: f32[16,4,3,3], xe: f32[4,4,6,3], ypa: f32[4,16,8,8], ypb: f32[2,8,5,11], ypc: f32[8,8,4,1], ypd: f32[2,8,6,6], xqa: f32[2,8,6,6], xqb: f32[2,8,8,8], xqc: f32[2,8,7,7], ysa: f32[2,8,7,7], ysb: f32[2,8,6,8], ysc: f32[8,16,5,5], ysd: f32[2,8,4,8]) {
  %ya = conv2d(%a, %wa, %ba) {pads = [1, 1, 1, 1]} : f32[3,8,9,9]
  %yb = conv2d(%b, %wb) {pads = [0, 2, 3, 1], strides = [2, 1], dilations = [2, 1]} : f32[2,8,3,7]
  %yc = conv2d(%c, %wc) {groups = 2, pads = [0, 1, 0, 1]} : f32[2,8,8,8]
  %yd = conv2d(%d, %wd) {pads = [3, 3, 3, 3]} : f32[4,8,8,8]
  %ye = conv2d(%e, %we) : f32[4,8,4,1]
  %hc = conv2d(%h, %wh) {result_dtype = f32} : f32[2,8,7,7]
  %yh = add(%hc, %hc) : f32[2,8,7,7]
  %rr = relu(%r) : f32[2,4,9,9]
  %yr = conv2d(%rr, %wr) {pads = [1, 1, 1, 1]} : f32[2,8,9,9]
  %ys = conv2d(%s, %ws) {pads = [1, 1, 1, 1]} : f32[1,4,4,4]
  %xa = conv2d_grad_input(%da, %wda) {input_shape = [2, 4, 9, 9], pads = [1, 1, 1, 1]} : f32[2,4,9,9]
  %xb = conv2d_grad_input(%db, %wdb) {input_shape = [2, 6, 7, 5], pads = [0, 2, 3, 1], dilations = [2, 1]} : f32[2,6,7,5]
  %xc = conv2d_grad_input(%dc, %wdc) {input_shape = [2, 8, 8, 8], groups = 2, pads = [0, 1, 0, 1]} : f32[2,8,8,8]
  %xd = conv2d_grad_input(%dd, %wdd) {input_shape = [16, 4, 3, 3], pads = [3, 3, 3, 3]} : f32[16,4,3,3]
  %xe = conv2d_grad_input(%de, %wde) {input_shape = [4, 4, 6, 3]} : f32[4,4,6,3]
  %ypa = conv2d(%pa, %wpa) {groups = 2, pads = [1, 1, 1, 1]} : f32[4,16,8,8]
  %ypb = conv2d(%pb, %wpb) {pads = [1, 3, 2, 1], strides = [2, 1], dilations = [2, 2]} : f32[2,8,5,11]
  %ypc = conv2d(%pc, %wpc) : f32[8,8,4,1]
  %ypd = conv2d(%pd, %wpd) {pads = [1, 1, 1, 1]} : f32[2,8,6,6]
  %xqa = conv2d_grad_input(%qa, %wqa) {input_shape = [2, 8, 6, 6], pads = [1, 1, 1, 1]} : f32[2,8,6,6]
  %xqb = conv2d_grad_input(%qb, %wqb) {input_shape = [2, 8, 8, 8], groups = 2, pads = [1, 1, 1, 1]} : f32[2,8,8,8]
  %xqc = conv2d_grad_input(%qc, %wqc) {input_shape = [2, 8, 7, 7], pads = [1, 3, 2, 0], dilations = [1, 2]} : f32[2,8,7,7]
  %ysa = conv2d(%sa, %wsa) {pads = [1, 1, 1, 1], strides = [2, 2]} : f32[2,8,7,7]
  %ysb = conv2d(%sb, %wsb) {pads = [3, 3, 3, 3], strides = [2, 2]} : f32[2,8,6,8]
  %ysc = conv2d(%sc, %wsc) {strides = [2, 2]} : f32[8,16,5,5]
  %ysd = conv2d(%sd, %wsd) {pads = [0, 2, 0, 1], strides = [1, 2], dilations = [1, 2]} : f32[2,8,4,8]
  return %ya, %yb, %yc, %yd, %ye, %yh, %yr, %ys, %xa, %xb, %xc, %xd, %xe, %ypa, %ypb, %ypc, %ypd, %xqa, %xqb, %xqc, %ysa, %ysb, %ysc, %ysd
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "fuse,assign")
	f := m.Funcs[0]
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	direct, computed, packedTaps := 0, 0, 0
	for _, k := range p.Kernels {
		for _, b := range k.Temps {
			require.False(t, strings.HasPrefix(b.Name, "col"), "kernel %s stores an im2col", k.Name)
		}
		walkStages(k.Steps, 0, func(s *loops.Stage, _ int64) {
			if s.Matmul == nil {
				return
			}
			require.NotNil(t, s.Matmul.Taps, "kernel %s: product read under the taps", k.Name)
			if s.Extents[0]*s.Extents[1]*s.Matmul.Extent >= 16384 {
				packedTaps++
			}
			if buf, _, ok := s.Matmul.Taps.Row(); ok && buf.Type.DType == kir.F32 {
				direct++
			} else {
				computed++
			}
		})
	}
	require.Equal(t, 24, direct+computed, "one product per convolution")
	require.GreaterOrEqual(t, packedTaps, 16, "products large enough for the packed microkernel")
	require.GreaterOrEqual(t, computed, 1, "a bf16 input packs element by element")
	require.GreaterOrEqual(t, direct, 4, "f32 buffers pack by vector copies")
	args := interp.RandomArgs(f, 5)
	want, err := interp.Run(f, cloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, _, err := llvm.Run(p, args)
	require.NoError(t, err)
	for i, K := range []float64{36, 36, 6, 16, 36, 36, 36, 18, 72, 48, 12, 32, 72, 36, 72, 72, 576, 576, 72, 72, 72, 196, 32, 72} {
		e := passtest.RelErr(got[i], want[i])
		require.LessOrEqual(t, e, K*0x1p-24, "result %s", f.ResultName(i))
	}
}
