package llvm_test

import (
	"strings"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// bigKernels holds ops large enough to run on several threads and to
// take the packed matmul path (ragged sizes on purpose): panels shared
// out between threads (%wide), few panels whose rows are shared out
// (%mm, the convolution), a panel narrower than usual (%narrow); plus
// the matrix-vector path (two rows). Products longer than one block of K
// (1100, 2048) keep their accumulators between blocks: with panels shared
// out (%kwide), rows shared out with a bias epilogue (%kgemm), and a
// weight gradient over the whole batch (%gw). %gw2 is a grouped weight
// gradient whose im2col is too large for the whole batch, computed per
// image as dwᵀ = col · DYᵀ.
const bigKernels = `func @big(%x: f32[2,16,30,30], %w: f32[40,16,3,3] {param}, %s: f32[40] {param}, %b: f32[40] {param},
          %rm: f32[40] {state}, %rv: f32[40] {state}, %a: f32[100,300], %c: f32[300,270], %v: f32[2,300], %q: f32[130,300], %g: f32[270] {param},
          %c5: f32[300,520], %d: f32[300,40], %ka: f32[20,1100], %kb: f32[1100,530], %kc: f32[100,1100], %kbias: f32[100],
          %dy: f32[2,8,32,32], %xx: f32[2,4,32,32], %dy2: f32[4,64,32,32], %xx2: f32[4,32,32,32]) ->
          (y: f32[2,40,15,15], mm: f32[100,270], mv: f32[2,130], sm: f32[100,270], ln: f32[100,270], wide: f32[100,520], narrow: f32[100,40],
           kwide: f32[20,530], kgemm: f32[20,100], gw: f32[8,4,3,3], gw2: f32[64,16,3,3]) {
  %conv = conv2d(%x, %w) {strides = [2, 2], pads = [1, 1, 1, 1]} : f32[2,40,15,15]
  %bn, %nrm, %nrv, %mean, %inv = batch_norm_train(%conv, %s, %b, %rm, %rv) : f32[2,40,15,15], f32[40], f32[40], f32[40], f32[40]
  %y = relu(%bn) : f32[2,40,15,15]
  %mm = matmul(%a, %c) : f32[100,270]
  %mv = gemm(%v, %q) {trans_b = true} : f32[2,130]
  %sm = softmax(%mm) {axis = -1} : f32[100,270]
  %ln, %lm, %li = layer_norm(%mm, %g) {axis = -1} : f32[100,270], f32[100,1], f32[100,1]
  %wide = matmul(%a, %c5) : f32[100,520]
  %narrow = matmul(%a, %d) : f32[100,40]
  %kwide = matmul(%ka, %kb) : f32[20,530]
  %kgemm = gemm(%ka, %kc, %kbias) {trans_b = true} : f32[20,100]
  %gw = conv2d_grad_weight(%dy, %xx) {pads = [1, 1, 1, 1], weight_shape = [8, 4, 3, 3]} : f32[8,4,3,3]
  %gw2 = conv2d_grad_weight(%dy2, %xx2) {groups = 2, pads = [1, 1, 1, 1], weight_shape = [64, 16, 3, 3]} : f32[64,16,3,3]
  return %y, %mm, %mv, %sm, %ln, %wide, %narrow, %kwide, %kgemm, %gw, %gw2
}
`

// TestParallelKernelsMatchInterpreter: with 1, 2 and 3 threads, and as
// many as the machine has, the
// compiled kernels give the interpreter's results within 1e-5.
func TestParallelKernelsMatchInterpreter(t *testing.T) {
	t.Parallel()
	requireClang(t)
	m := passtest.Parse(t, bigKernels)
	f := m.Funcs[0]
	args := interp.RandomArgs(f, 3)
	want, err := interp.Run(f, cloneAll(args), interp.Options{})
	require.NoError(t, err)
	passtest.CheckPipeline(t, bigKernels, "fuse,reorder,assign", 1e-6)
	m2 := passtest.Parse(t, bigKernels)
	pipelineOn(t, m2, "fuse,reorder,assign")
	p, err := llvm.Lower(m2.Funcs[0])
	require.NoError(t, err)
	text, err := llvm.Text(p, llvm.Options{Threads: 2})
	require.NoError(t, err)
	require.Contains(t, text, "@kiln_parallel_for(", "the stages run on threads")
	serial, err := llvm.Emit(p, llvm.Options{Threads: 2})
	require.NoError(t, err)
	require.Equal(t, serial.String(), text, "functions printed on several cores read as llir prints them")
	require.Contains(t, text, "@llvm.fmuladd.v16f32(", "the matmuls take the packed vector kernel")
	counts := []int{1, 2, 3, 0}
	if testing.Short() {
		counts = []int{1, 0} // the serial loops and the machine's cores: a build each
	}
	for _, threads := range counts {
		got, _, err := llvm.Run(p, args, llvm.RunOptions{Options: llvm.Options{Threads: threads}})
		require.NoError(t, err)
		for i := range want {
			e := passtest.RelErr(got[i], want[i])
			require.True(t, e <= 1e-5, "%d threads, result %s: relative error %g", threads, f.ResultName(i), e)
		}
	}
}

// TestParallelScatterMatchesInterpreter: a max pool's gradient (its
// windows inside the input, and reaching into padding; average pools
// and their gradients alike) scatters
// within each image and channel, so it splits across threads by image;
// with overlapping windows (3×3, stride 2) two outputs add into one
// element, which one thread does in order. A gather's gradient scatters
// to rows the indices choose and stays on one thread. With 2 and 3
// threads the results equal one thread's bit for bit (each element's
// additions run in one order), and the interpreter's (which adds in f64)
// within f32 rounding of at most 4 and 2 additions (1e-6 relative).
func TestParallelScatterMatchesInterpreter(t *testing.T) {
	requireClang(t)
	const src = `func @f(%dy: f32[8,16,15,15], %x: f32[8,16,31,31], %e: f32[64,100], %i: i64[64], %x2: f32[8,16,29,29]) -> (dx: f32[8,16,31,31], de: f32[50,100], dx2: f32[8,16,29,29], ap: f32[8,16,15,15], da: f32[8,16,31,31], da2: f32[8,16,29,29]) {
  %dx = max_pool2d_grad(%dy, %x) {kernel = [3, 3], strides = [2, 2]} : f32[8,16,31,31]
  %de = gather_grad(%e, %i) {axis = 0, data_shape = [50, 100]} : f32[50,100]
  %dx2 = max_pool2d_grad(%dy, %x2) {kernel = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : f32[8,16,29,29]
  %ap = avg_pool2d(%x) {kernel = [3, 3], strides = [2, 2]} : f32[8,16,15,15]
  %da = avg_pool2d_grad(%dy) {input_shape = [8, 16, 31, 31], kernel = [3, 3], strides = [2, 2]} : f32[8,16,31,31]
  %da2 = avg_pool2d_grad(%dy) {input_shape = [8, 16, 29, 29], kernel = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : f32[8,16,29,29]
  return %dx, %de, %dx2, %ap, %da, %da2
}
`
	m := passtest.Parse(t, src)
	f := m.Funcs[0]
	args := interp.RandomArgs(f, 5)
	for j := range args[3].I {
		args[3].I[j] = int64(j*7) % 50
	}
	want, err := interp.Run(f, cloneAll(args), interp.Options{})
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	text, err := llvm.Text(p, llvm.Options{Threads: 2})
	require.NoError(t, err)
	require.Contains(t, text, "@kiln_parallel_for(", "the max pool's gradient runs on threads")
	one, _, err := llvm.Run(p, args, llvm.RunOptions{Options: llvm.Options{Threads: 1}})
	require.NoError(t, err)
	for i := range want {
		require.LessOrEqual(t, passtest.RelErr(one[i], want[i]), 1e-6, "result %s", f.ResultName(i))
	}
	for _, threads := range []int{2, 3} {
		got, _, err := llvm.Run(p, args, llvm.RunOptions{Options: llvm.Options{Threads: threads}})
		require.NoError(t, err)
		for i := range want {
			require.Equal(t, one[i].F, got[i].F, "%d threads, result %s", threads, f.ResultName(i))
		}
	}
}

// TestScatterSearchCountsAsWork: a 2×2 max pool's gradient over 50176
// windows scatters to each window's first maximum, a search of four taps
// in the scatter's index: that search is the stage's work, and the
// scatter runs on threads (it ran on one, its value being a bare load:
// the small CNN's pool gradients 0.62 → 0.31 ms), the fill before it too.
func TestScatterSearchCountsAsWork(t *testing.T) {
	requireClang(t)
	m := passtest.Parse(t, `func @f(%dy: f32[32,8,14,14], %x: f32[32,8,28,28]) -> (dx: f32[32,8,28,28]) {
  %dx = max_pool2d_grad(%dy, %x) {kernel = [2, 2], strides = [2, 2]} : f32[32,8,28,28]
  return %dx
}
`)
	pipelineOn(t, m, "assign")
	p, err := llvm.Lower(m.Funcs[0])
	require.NoError(t, err)
	text, err := llvm.Text(p, llvm.Options{Threads: 2})
	require.NoError(t, err)
	require.True(t, strings.Contains(text, "define internal void @k0_max_pool2d_grad_p1("), "the fill runs on threads")
	require.True(t, strings.Contains(text, "define internal void @k0_max_pool2d_grad_p2("), "the scatter runs on threads")
}
