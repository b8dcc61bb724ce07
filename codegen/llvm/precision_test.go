package llvm_test

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"

	_ "github.com/kiln-compiler/kiln/passes/microbatch"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	_ "github.com/kiln-compiler/kiln/passes/precision"
)

// TestLowPrecisionRoundingMatchesInterpreter: bf16 and f16 values are
// rounded to nearest even on every store, compiled as interpreted, bit
// for bit (sums and products of 16-bit values are exact in f32, so both
// round the same number).
func TestLowPrecisionRoundingMatchesInterpreter(t *testing.T) {
	requireClang(t)
	src := `func @low(%x: f32[257], %y: f32[257], %h: f16[257]) -> (a: bf16[257], b: f16[257], c: f32[257], d: bf16[257]) {
  %xb = cast(%x) {to = bf16} : bf16[257]
  %yb = cast(%y) {to = bf16} : bf16[257]
  %s = add(%xb, %yb) : bf16[257]
  %p = mul(%s, %xb) : bf16[257]
  %r = relu(%p) : bf16[257]
  %xh = cast(%x) {to = f16} : f16[257]
  %hs = add(%xh, %h) : f16[257]
  %hm = mul(%hs, %hs) : f16[257]
  %back = cast(%r) {to = f32} : f32[257]
  %d = cast(%hm) {to = bf16} : bf16[257]
  return %r, %hm, %back, %d
}
`
	// Fused, the bf16 and f16 intermediates live inside kernels and are
	// rounded there as the interpreter rounds them.
	for _, pipeline := range []string{"assign", "fuse,assign"} {
		m := passtest.Parse(t, src)
		pipelineOn(t, m, pipeline)
		f := m.Funcs[0]
		want, got := interpretedAndCompiled(t, f, interp.RandomArgs(f, 21))
		for i := range want {
			require.Equal(t, want[i].Type, got[i].Type)
			require.Equal(t, want[i].F, got[i].F, "%s: result %s", pipeline, f.ResultName(i))
		}
	}
}

// TestMixedPrecisionStepCompiled: a bf16 training step of the small
// models, compiled, stays within bf16 rounding of the interpreted one, and
// so do the steps that save the backward pass's values in fp8 (compiled
// code stores them as bytes through the runtime's conversions): both
// sides round each saved value to the same fp8 value unless its bf16 or
// f32 input differs by a rounding across an fp8 tie, which moves that
// element by one fp8 step and the gradients by its share of their sums.
func TestMixedPrecisionStepCompiled(t *testing.T) {
	t.Parallel()
	requireClang(t)
	dirs := []string{"../../testdata/models/mlp", "../../testdata/models/small_cnn", "../../testdata/models/one_layer_transformer"}
	if testing.Short() {
		dirs = dirs[:1]
	}
	configs := [][2]string{{"bf16", "none"}, {"bf16", "fp8"}, {"f32", "fp8"}}
	if testing.Short() {
		configs = configs[:2]
	}
	for _, c := range configs {
		for _, dir := range dirs {
			mixedStepCompiled(t, dir, fmt.Sprintf("autodiff,precision{dtype=%s,saved=%s},%s", c[0], c[1], o2))
		}
	}
}

func mixedStepCompiled(t *testing.T, dir, pipeline string) {
	f, args := modelRun(t, dir, pipeline)
	want, got := interpretedAndCompiled(t, f, args)
	for i := range want {
		if i > 0 && maxAbs(loadNpy(t, filepath.Join(dir, f.ResultName(i)+".npy"))) < 1e-5 {
			continue // zero in PyTorch (a conv bias before batch norm): noise
		}
		e := passtest.RelErr(got[i], want[i])
		require.True(t, e <= 2e-2, "%s %s %s: relative error %g", dir, pipeline, f.ResultName(i), e)
	}
}

// TestDynamicLossScaleCompiled: the f16 step of the small transformer
// with dynamic loss scaling and a momentum update, compiled, agrees with
// the interpreter: at the first scale (2^15) it overflows, reports it,
// skips the update and halves the scale; at 2^10 it updates.
func TestDynamicLossScaleCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("a transformer's step compiled several times: 12 s")
	}
	t.Parallel()
	requireClang(t)
	dir := "../../testdata/models/one_layer_transformer"
	for _, c := range []struct {
		init   float64
		finite bool
	}{{32768, false}, {1024, true}} {
		f, args := modelRun(t, dir, fmt.Sprintf("autodiff,precision{dtype=f16,init-scale=%g},optimizer{kind=momentum,lr=0.01},%s", c.init, o2))
		res, final := compiledAndInterpreted(t, f, args, 1e-3) // f16 gradients, rounded apart
		last := len(f.Results) - 1
		require.Equal(t, "grads.finite", f.ResultName(last))
		require.Equal(t, c.finite, res[last].I[0] != 0)
		for i, a := range f.Args {
			switch {
			case a.Name == "loss_scale" && c.finite:
				require.Equal(t, c.init, final[i].F[0])
			case a.Name == "loss_scale":
				require.Equal(t, c.init/2, final[i].F[0])
			case a.Arg.Kind == ir.ArgParam && !c.finite:
				require.Equal(t, args[i].F, final[i].F, "skipped update changed %s", a.Name)
			}
		}
	}
}

// TestAccumulatingGemmOverItsSumCompiled: in a microbatched step the
// weight gradients' gemms add the running sum (their C) and are written
// over it; compiled (the packed f32 kernel reads each C element before
// storing its own), the step equals the interpreter's within f32
// summation-order error (K = 16 products per element, unit roundoff
// 6e-8: 1e-5 relative).
func TestAccumulatingGemmOverItsSumCompiled(t *testing.T) {
	requireClang(t)
	src := `func @mlp(%x: f32[64,32], %w1: f32[32,64] {param}, %w2: f32[64,16] {param}) -> (f32[64,16]) {
  %h = matmul(%x, %w1) : f32[64,64]
  %a = tanh(%h) : f32[64,64]
  %y = matmul(%a, %w2) : f32[64,16]
  return %y
}`
	m := passtest.Parse(t, src)
	pipelineOn(t, m, "autodiff,microbatch{n=4},assign")
	f := m.Funcs[0]
	shared := 0
	for _, op := range f.Body {
		if op.Kind == "gemm" && len(op.Operands) == 3 && op.Operands[2].Offset == op.Results[0].Offset {
			shared++
		}
	}
	require.Positive(t, shared, "some gemm writes over its running sum")
	want, got := interpretedAndCompiled(t, f, interp.RandomArgs(f, 5))
	for i := range want {
		e := passtest.RelErr(got[i], want[i])
		require.True(t, e <= 1e-5, "result %s: relative error %g", f.ResultName(i), e)
	}
}

// interpretedAndCompiled runs f on args in the interpreter and compiled,
// and returns both results.
func interpretedAndCompiled(t *testing.T, f *ir.Func, args []*interp.Tensor) (want, got []*interp.Tensor) {
	t.Helper()
	want, err := interp.Run(f, cloneAll(args), interp.Options{})
	require.NoError(t, err)
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	got, _, err = llvm.Run(p, args)
	require.NoError(t, err)
	return want, got
}

// TestMixedDTypeOpsCompiled: ops that read operands of different float
// dtypes and round once to their result_dtype (as mixed precision emits
// them) compute, compiled, what the interpreter computes.
//
// Error model: the interpreter sums exactly (in f64) and rounds once; the
// compiled kernel sums K terms in f32, off by at most K·2^-24·Σ|terms|
// (Σ|terms| ≤ K·max|a|·max|b| for products of operands bounded by those),
// and then rounds once, which can step one unit of the result's last
// place the other way. So each element agrees within one ulp of the
// result's dtype at the result's magnitude plus K²·2^-24·max|a|·max|b|.
func TestMixedDTypeOpsCompiled(t *testing.T) {
	requireClang(t)
	src := `func @mixed(%x: f32[2,4,6,6], %w: f32[8,4,3,3], %a: f32[16,32], %b: f32[32,8], %s: f32[8], %u: f32[6], %labels: i64[16]) -> (c: bf16[2,8,6,6], cw: f32[8,4,3,3], m: f32[16,8], g: f32[16,8], bn: bf16[2,8,6,6], mean: f32[8], st: f32[8,1,1], ad: bf16[2,8,6,6], rs: f32[8], ln: bf16[2,8,6,6], lstat: f32[2,8,6,1], ce: f32[], sm: bf16[2,8,6,6], lsm: bf16[2,4,6,6], smg: f32[2,8,6,6], lsg: bf16[2,4,6,6], gg: f32[8,8]) {
  %xb = cast(%x) {to = bf16} : bf16[2,4,6,6]
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1], result_dtype = bf16} : bf16[2,8,6,6]
  %cw = conv2d_grad_weight(%c, %xb) {pads = [1, 1, 1, 1], result_dtype = f32, weight_shape = [8, 4, 3, 3]} : f32[8,4,3,3]
  %ab = cast(%a) {to = bf16} : bf16[16,32]
  %m = matmul(%ab, %b) {result_dtype = f32} : f32[16,8]
  %g = gemm(%ab, %b, %m) {result_dtype = f32} : f32[16,8]
  %bn, %rm, %rv, %mean, %inv = batch_norm_train(%c, %s, %s, %s, %s) : bf16[2,8,6,6], f32[8], f32[8], f32[8], f32[8]
  %st = sum_to(%c) {result_dtype = f32, shape = [8, 1, 1]} : f32[8,1,1]
  %ad = add(%c, %u) {result_dtype = bf16} : bf16[2,8,6,6]
  %rs = reduce_sum(%c) {axes = [0, 2, 3], result_dtype = f32} : f32[8]
  %ln, %lmean, %linv = layer_norm(%c, %u, %u) : bf16[2,8,6,6], f32[2,8,6,1], f32[2,8,6,1]
  %lb = cast(%g) {to = bf16} : bf16[16,8]
  %ce = softmax_cross_entropy(%lb, %labels) {result_dtype = f32} : f32[]
  %sm = softmax(%c) {axis = 1, result_dtype = bf16} : bf16[2,8,6,6]
  %lsm = log_softmax(%x) {result_dtype = bf16} : bf16[2,4,6,6]
  %smg = softmax_grad(%ad, %sm) {axis = 1, result_dtype = f32} : f32[2,8,6,6]
  %lsg = log_softmax_grad(%x, %lsm) {result_dtype = bf16} : bf16[2,4,6,6]
  %gg = gather_grad(%lb, %labels) {axis = 0, data_shape = [8, 8], result_dtype = f32} : f32[8,8]
  return %c, %cw, %m, %g, %bn, %mean, %st, %ad, %rs, %ln, %linv, %ce, %sm, %lsm, %smg, %lsg, %gg
}
`
	// K: the longest sum behind each result (conv: 4·3·3; its weight
	// gradient: 2·6·6; matmul: 32, and gemm's C; batch norm and the sums
	// over a channel: 2·6·6; layer norm: 6; cross-entropy: 8 classes and 16
	// rows; softmax and its gradient: the 8 channels or 6 columns of a
	// line; the embedding gradient: the 16 rows one index may gather).
	k := []float64{36, 72, 32, 33, 72, 72, 72, 1, 72, 6, 6, 128, 8, 6, 8, 6, 16}
	for _, pipeline := range []string{"assign", "fuse,assign"} {
		m := passtest.Parse(t, src)
		pipelineOn(t, m, pipeline)
		f := m.Funcs[0]
		args := interp.RandomArgs(f, 5)
		want, got := interpretedAndCompiled(t, f, args)
		// Every operand is an argument or a result (c and g feed the later
		// ops): amax bounds them all (at least 1: normalised values).
		amax := 1.0
		for i, a := range args {
			if f.Args[i].Type.DType.IsFloat() {
				amax = max(amax, maxAbs(a))
			}
		}
		for _, w := range want {
			amax = max(amax, maxAbs(w))
		}
		for i := range want {
			require.Equal(t, want[i].Type, got[i].Type)
			scale := maxAbs(want[i])
			ulp := scale * math.Pow(2, 1-float64(mantissaBits(want[i].Type.DType)))
			tol := ulp + k[i]*k[i]*math.Pow(2, -24)*amax*amax
			require.LessOrEqual(t, maxAbsDiff(got[i], want[i]), tol, "%s: result %s", pipeline, f.ResultName(i))
		}
	}
}

// mantissaBits counts the significand bits of a float dtype (the hidden
// one included).
func mantissaBits(d ir.DType) int {
	switch d {
	case ir.BF16:
		return 8
	case ir.F16:
		return 11
	case ir.F64:
		return 53
	}
	return 24
}
