package interp

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

// run parses src, runs its first function on args (floats or ints by the
// argument's dtype) and returns the results.
func run(t *testing.T, src string, args ...[]float64) []*Tensor {
	t.Helper()
	m, err := parser.Parse("t.kir", src)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	f := m.Funcs[0]
	vals := make([]*Tensor, len(args))
	for i, a := range args {
		ty := f.Args[i].Type
		if ty.DType.IsFloat() {
			vals[i] = FromFloats(ty, a)
		} else {
			ints := make([]int64, len(a))
			for j, v := range a {
				ints[j] = int64(v)
			}
			vals[i] = FromInts(ty, ints)
		}
	}
	res, err := Run(f, vals, Options{})
	require.NoError(t, err)
	return res
}

func values(x *Tensor) []float64 {
	out := make([]float64, x.Len())
	for i := range out {
		out[i] = x.At(i)
	}
	return out
}

func near(t *testing.T, want []float64, got *Tensor, msg string) {
	t.Helper()
	g := values(got)
	require.Len(t, g, len(want), msg)
	for i := range want {
		if math.IsNaN(want[i]) {
			require.True(t, math.IsNaN(g[i]), "%s[%d]", msg, i)
			continue
		}
		require.InDelta(t, want[i], g[i], 1e-9*math.Max(1, math.Abs(want[i])), "%s[%d]: want %v got %v", msg, i, want, g)
	}
}

func TestElementwise(t *testing.T) {
	x := []float64{-2, -0.5, 0, 1.5}
	cases := map[string][]float64{
		"relu":       {0, 0, 0, 1.5},
		"neg":        {2, 0.5, 0, -1.5},
		"abs":        {2, 0.5, 0, 1.5},
		"sign":       {-1, -1, 0, 1},
		"exp":        {math.Exp(-2), math.Exp(-0.5), 1, math.Exp(1.5)},
		"tanh":       {math.Tanh(-2), math.Tanh(-0.5), 0, math.Tanh(1.5)},
		"sigmoid":    {1 / (1 + math.Exp(2)), 1 / (1 + math.Exp(0.5)), 0.5, 1 / (1 + math.Exp(-1.5))},
		"erf":        {math.Erf(-2), math.Erf(-0.5), 0, math.Erf(1.5)},
		"silu":       {-2 / (1 + math.Exp(2)), -0.5 / (1 + math.Exp(0.5)), 0, 1.5 / (1 + math.Exp(-1.5))},
		"hard_swish": {-2 * 1.0 / 6, -0.5 * 2.5 / 6, 0, 1.5 * 4.5 / 6},
		"identity":   x,
	}
	for op, want := range cases {
		res := run(t, "func @f(%x: f64[4]) -> (f64[4]) {\n  %y = "+op+"(%x) : f64[4]\n  return %y\n}\n", x)
		near(t, want, res[0], op)
	}
	pos := []float64{0.25, 1, 4, 9}
	for op, want := range map[string][]float64{
		"log": {math.Log(0.25), 0, math.Log(4), math.Log(9)}, "sqrt": {0.5, 1, 2, 3}, "reciprocal": {4, 1, 0.25, 1.0 / 9},
	} {
		near(t, want, run(t, "func @f(%x: f64[4]) -> (f64[4]) {\n  %y = "+op+"(%x) : f64[4]\n  return %y\n}\n", pos)[0], op)
	}
	g := run(t, `func @f(%x: f64[2]) -> (f64[2], f64[2], f64[2]) {
  %a = gelu(%x) : f64[2]
  %b = gelu(%x) {approximate = "tanh"} : f64[2]
  %c = hard_sigmoid(%x) {alpha = 0.5, beta = 0.25} : f64[2]
  return %a, %b, %c
}
`, []float64{1, -3})
	near(t, []float64{0.8413447460685429, -0.00404969409489031}, g[0], "gelu")
	near(t, []float64{0.8411919906082768, -0.0036373920817729943}, g[1], "gelu tanh")
	near(t, []float64{0.75, 0}, g[2], "hard_sigmoid")
}

func TestBinaryBroadcastAndCompare(t *testing.T) {
	a := []float64{1, 2, 3, 4, 5, 6}
	b := []float64{10, 20, 30}
	src := func(op, rt string) string {
		return "func @f(%a: f64[2,3], %b: f64[3]) -> (" + rt + "[2,3]) {\n  %y = " + op + "(%a, %b) : " + rt + "[2,3]\n  return %y\n}\n"
	}
	for op, want := range map[string][]float64{
		"add": {11, 22, 33, 14, 25, 36}, "sub": {-9, -18, -27, -6, -15, -24}, "mul": {10, 40, 90, 40, 100, 180},
		"div": {0.1, 0.1, 0.1, 0.4, 0.25, 0.2}, "max": {10, 20, 30, 10, 20, 30}, "min": {1, 2, 3, 4, 5, 6},
		"pow": {1, math.Pow(2, 20), math.Pow(3, 30), math.Pow(4, 10), math.Pow(5, 20), math.Pow(6, 30)},
	} {
		near(t, want, run(t, src(op, "f64"), a, b)[0], op)
	}
	c := []float64{4, 2, 3}
	for op, want := range map[string][]float64{
		"eq": {0, 1, 1, 1, 0, 0}, "ne": {1, 0, 0, 0, 1, 1}, "lt": {1, 0, 0, 0, 0, 0},
		"le": {1, 1, 1, 1, 0, 0}, "gt": {0, 0, 0, 0, 1, 1}, "ge": {0, 1, 1, 1, 1, 1},
	} {
		near(t, want, run(t, src(op, "bool"), a, c)[0], op)
	}
	w := run(t, `func @f(%c: bool[2,1], %a: f64[2,2], %b: f64[]) -> (f64[2,2]) {
  %y = where(%c, %a, %b) : f64[2,2]
  return %y
}
`, []float64{1, 0}, []float64{1, 2, 3, 4}, []float64{-1})
	near(t, []float64{1, 2, -1, -1}, w[0], "where")
	i := run(t, `func @f(%a: i64[3], %b: i64[3]) -> (i64[3], f32[3], i32[3], bool[3]) {
  %q = div(%a, %b) : i64[3]
  %f = cast(%a) {to = f32} : f32[3]
  %n = cast(%q) {to = i32} : i32[3]
  %z = cast(%a) {to = bool} : bool[3]
  return %q, %f, %n, %z
}
`, []float64{7, -7, 0}, []float64{2, 2, 5})
	near(t, []float64{3, -3, 0}, i[0], "int div truncates")
	near(t, []float64{7, -7, 0}, i[1], "cast")
	near(t, []float64{1, 1, 0}, i[3], "cast to bool")
}

func TestLowPrecisionRounding(t *testing.T) {
	res := run(t, `func @f(%x: f32[2], %y: f32[2]) -> (bf16[2], f16[2], f16[2]) {
  %b = cast(%x) {to = bf16} : bf16[2]
  %h = cast(%x) {to = f16} : f16[2]
  %hy = cast(%y) {to = f16} : f16[2]
  %s = add(%h, %hy) : f16[2]
  return %b, %h, %s
}
`, []float64{3.14159265, 1 + 1.0/256}, []float64{1e-4, 65504})
	near(t, []float64{3.140625, 1}, res[0], "bf16 rounds to nearest even")
	near(t, []float64{3.140625, 1.00390625}, res[1], "f16")
	near(t, []float64{3.140625, 65504}, res[2], "f16 add rounds on store")
}

func TestMatmulAndGemm(t *testing.T) {
	res := run(t, `func @f(%a: f64[2,2,3], %b: f64[3,2], %v: f64[3]) -> (f64[2,2,2], f64[2,2]) {
  %c = matmul(%a, %b) : f64[2,2,2]
  %d = matmul(%a, %v) : f64[2,2]
  return %c, %d
}
`, []float64{1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0}, []float64{1, 2, 3, 4, 5, 6}, []float64{1, 1, 1})
	near(t, []float64{22, 28, 49, 64, 1, 2, 3, 4}, res[0], "batched matmul")
	near(t, []float64{6, 15, 1, 1}, res[1], "matrix-vector")
}

func TestGemmTransposes(t *testing.T) {
	g := run(t, `func @f(%a: f64[2,2], %b: f64[3,2], %c: f64[2]) -> (f64[2,3]) {
  %y = gemm(%a, %b) {alpha = 2.0, trans_a = true, trans_b = true} : f64[2,3]
  return %y
}
`, []float64{1, 2, 3, 4}, []float64{1, 0, 0, 1, 1, 1}, []float64{0, 0})
	// A^T = [[1,3],[2,4]]; B^T = [[1,0,1],[0,1,1]]; A^T B^T = [[1,3,4],[2,4,6]].
	near(t, []float64{2, 6, 8, 4, 8, 12}, g[0], "gemm")
	b := run(t, `func @f(%a: f64[1,2], %b: f64[2,2], %c: f64[2]) -> (f64[1,2]) {
  %y = gemm(%a, %b, %c) {beta = 0.5} : f64[1,2]
  return %y
}
`, []float64{1, 1}, []float64{1, 2, 3, 4}, []float64{10, 20})
	near(t, []float64{9, 16}, b[0], "gemm bias")
}

func TestConv(t *testing.T) {
	// 1x1x3x3 input, one 2x2 kernel of ones, stride 1, pad 0.
	res := run(t, `func @f(%x: f64[1,1,3,3], %w: f64[1,1,2,2], %b: f64[1]) -> (f64[1,1,2,2], f64[1,1,2,2]) {
  %y = conv2d(%x, %w, %b) : f64[1,1,2,2]
  %z = conv2d(%x, %w) {pads = [1, 1, 0, 0], strides = [2, 2]} : f64[1,1,2,2]
  return %y, %z
}
`, []float64{1, 2, 3, 4, 5, 6, 7, 8, 9}, []float64{1, 1, 1, 1}, []float64{100})
	near(t, []float64{112, 116, 124, 128}, res[0], "conv")
	near(t, []float64{1, 5, 11, 28}, res[1], "strided padded conv")
	// groups=2 with dilation 2: each output channel sees only its group.
	g := run(t, `func @f(%x: f64[1,2,3,3], %w: f64[2,1,2,2]) -> (f64[1,2,1,1]) {
  %y = conv2d(%x, %w) {dilations = [2, 2], groups = 2} : f64[1,2,1,1]
  return %y
}
`, []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30, 40, 50, 60, 70, 80, 90}, []float64{1, 1, 1, 1, 1, 0, 0, -1})
	near(t, []float64{1 + 3 + 7 + 9, 10 - 90}, g[0], "grouped dilated conv")
}

func TestPooling(t *testing.T) {
	x := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9}
	res := run(t, `func @f(%x: f64[1,1,3,3]) -> (f64[1,1,1,1], f64[1,1,2,2], f64[1,1,2,2], f64[1,1,2,2], f64[1,1,1,1]) {
  %a = max_pool2d(%x) {kernel = [2, 2], strides = [2, 2]} : f64[1,1,1,1]
  %b = max_pool2d(%x) {ceil_mode = true, kernel = [2, 2], strides = [2, 2]} : f64[1,1,2,2]
  %c = avg_pool2d(%x) {kernel = [2, 2], pads = [1, 1, 1, 1], strides = [2, 2]} : f64[1,1,2,2]
  %d = avg_pool2d(%x) {count_include_pad = true, kernel = [2, 2], pads = [1, 1, 1, 1], strides = [2, 2]} : f64[1,1,2,2]
  %e = global_avg_pool(%x) : f64[1,1,1,1]
  return %a, %b, %c, %d, %e
}
`, x)
	near(t, []float64{5}, res[0], "max pool")
	near(t, []float64{5, 6, 8, 9}, res[1], "ceil mode")
	near(t, []float64{1, 2.5, 5.5, 7}, res[2], "avg pool excludes padding")
	near(t, []float64{0.25, 1.25, 2.75, 7}, res[3], "avg pool counts padding")
	near(t, []float64{5}, res[4], "global average")
}

func TestNormalisationAndSoftmax(t *testing.T) {
	res := run(t, `func @f(%x: f64[2,2,1,1], %s: f64[2], %b: f64[2], %m: f64[2], %v: f64[2]) -> (f64[2,2,1,1], f64[2], f64[2], f64[2], f64[2], f64[2,2,1,1]) {
  %y, %rm, %rv, %sm, %si = batch_norm_train(%x, %s, %b, %m, %v) {epsilon = 0.0, momentum = 0.9} : f64[2,2,1,1], f64[2], f64[2], f64[2], f64[2]
  %z = batch_norm_infer(%x, %s, %b, %m, %v) {epsilon = 0.0} : f64[2,2,1,1]
  return %y, %rm, %rv, %sm, %si, %z
}
`, []float64{1, 10, 3, 30}, []float64{2, 1}, []float64{0, 5}, []float64{0, 0}, []float64{1, 4})
	// channel 0: values 1,3 mean 2 var 1; channel 1: 10,30 mean 20 var 100.
	near(t, []float64{-2, 4, 2, 6}, res[0], "bn train")
	near(t, []float64{0.2, 2}, res[1], "running mean")
	near(t, []float64{0.9 + 0.1*2, 3.6 + 0.1*200}, res[2], "running var (unbiased)")
	near(t, []float64{2, 20}, res[3], "saved mean")
	near(t, []float64{1, 0.1}, res[4], "saved invstd")
	near(t, []float64{2, 10, 6, 20}, res[5], "bn inference")

	ln := run(t, `func @f(%x: f64[2,2], %s: f64[2], %b: f64[2]) -> (f64[2,2], f64[2,1], f64[2,1]) {
  %y, %m, %i = layer_norm(%x, %s, %b) {axis = 1, epsilon = 0.0} : f64[2,2], f64[2,1], f64[2,1]
  return %y, %m, %i
}
`, []float64{1, 3, 10, 30}, []float64{1, 2}, []float64{0, 1})
	near(t, []float64{-1, 3, -1, 3}, ln[0], "layer norm")
	near(t, []float64{2, 20}, ln[1], "mean")
	near(t, []float64{1, 0.1}, ln[2], "invstd")

	sm := run(t, `func @f(%x: f64[2,2]) -> (f64[2,2], f64[2,2]) {
  %a = softmax(%x) {axis = 0} : f64[2,2]
  %b = log_softmax(%x) : f64[2,2]
  return %a, %b
}
`, []float64{0, 1, 0, 3})
	e := math.E
	near(t, []float64{0.5, e / (e + e*e*e), 0.5, e * e * e / (e + e*e*e)}, sm[0], "softmax axis 0")
	near(t, []float64{-math.Log(1 + e), 1 - math.Log(1+e), -math.Log(1 + e*e*e), 3 - math.Log(1+e*e*e)}, sm[1], "log softmax")

	ce := run(t, `func @f(%x: f64[2,2], %l: i64[2]) -> (f64[], f64[]) {
  %m = softmax_cross_entropy(%x, %l) : f64[]
  %s = softmax_cross_entropy(%x, %l) {reduction = "sum"} : f64[]
  return %m, %s
}
`, []float64{0, 1, 0, 3}, []float64{1, 0})
	want := (math.Log(1+e) - 1) + math.Log(1+e*e*e)
	near(t, []float64{want / 2}, ce[0], "cross entropy mean")
	near(t, []float64{want}, ce[1], "cross entropy sum")
}

func TestDropoutIsReproducible(t *testing.T) {
	src := `func @f(%x: f64[1000]) -> (f64[1000], bool[1000], f64[1000]) {
  %y, %m = dropout(%x) {ratio = 0.25, seed = 7} : f64[1000], bool[1000]
  %y2, %m2 = dropout(%x) {ratio = 0.25, seed = 7} : f64[1000], bool[1000]
  %d = sub(%y, %y2) : f64[1000]
  return %y, %m, %d
}
`
	x := make([]float64, 1000)
	for i := range x {
		x[i] = 1
	}
	res := run(t, src, x)
	kept := 0
	for i, v := range res[0].F {
		if res[1].I[i] == 1 {
			kept++
			require.Equal(t, 1/0.75, v)
		} else {
			require.Equal(t, 0.0, v)
		}
		require.Equal(t, 0.0, res[2].F[i], "the same seed gives the same mask")
	}
	require.InDelta(t, 750, kept, 50)
}

func TestShapeOps(t *testing.T) {
	x := []float64{1, 2, 3, 4, 5, 6}
	res := run(t, `func @f(%x: f64[2,3], %i: i64[2]) -> (f64[3,2], f64[6], f64[2,3,1], f64[2,3,2], f64[2,1], f64[4,3], f64[2,2], f64[1,1], f64[2,2], f64[3,5]) {
  %t = transpose(%x) {perm = [1, 0]} : f64[3,2]
  %r = reshape(%x) {shape = [6]} : f64[6]
  %u = unsqueeze(%x) {axes = [2]} : f64[2,3,1]
  %e = expand(%u) {shape = [2, 3, 2]} : f64[2,3,2]
  %a, %b = split(%x) {axis = 1, sizes = [1, 2]} : f64[2,1], f64[2,2]
  %c = concat(%x, %x) {axis = 0} : f64[4,3]
  %s = slice(%x) {axes = [1], ends = [100], starts = [1]} : f64[2,2]
  %s2 = slice(%x) {axes = [0, 1], ends = [-2, 0], starts = [-1, -1], steps = [-1, -2]} : f64[1,1]
  %g = gather(%x, %i) {axis = 1} : f64[2,2]
  %p = pad(%t) {pads = [0, 1, 0, 2], value = -1.0} : f64[3,5]
  return %t, %r, %u, %e, %a, %c, %b, %s2, %g, %p
}
`, x, []float64{2, -3})
	near(t, []float64{1, 4, 2, 5, 3, 6}, res[0], "transpose")
	near(t, x, res[1], "reshape")
	near(t, []float64{1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6}, res[3], "expand")
	near(t, []float64{1, 4}, res[4], "split")
	near(t, []float64{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}, res[5], "concat")
	near(t, []float64{2, 3, 5, 6}, res[6], "split second")
	near(t, []float64{6}, res[7], "negative-step slice")
	near(t, []float64{3, 1, 6, 4}, res[8], "gather with negative index")
	near(t, []float64{-1, 1, 4, -1, -1, -1, 2, 5, -1, -1, -1, 3, 6, -1, -1}, res[9], "pad")
}

func TestRegionsRun(t *testing.T) {
	res := run(t, `func @f(%x: f64[2], %y: f64[2]) -> (f64[2]) {
  %k = kernel(%x, %y) : f64[2] region(%p: f64[2], %q: f64[2]) {
    %s = sub(%p, %q) : f64[2]
    %r = relu(%s) : f64[2]
    yield %r
  }
  return %k
}
`, []float64{1, 5}, []float64{3, 2})
	near(t, []float64{0, 3}, res[0], "kernel region")
}

func TestRunErrors(t *testing.T) {
	m, _ := parser.Parse("t.kir", "func @f(%x: f32[2], %i: i64[1]) -> (f32[1]) {\n  %g = gather(%x, %i) : f32[1]\n  return %g\n}\n")
	f := m.Funcs[0]
	_, err := Run(f, []*Tensor{New(ir.TensorOf(ir.F32, 3)), New(ir.TensorOf(ir.I64, 1))}, Options{})
	require.ErrorContains(t, err, "argument %x: got f32[3], want f32[2]")
	_, err = Run(f, []*Tensor{New(ir.TensorOf(ir.F32, 2)), FromInts(ir.TensorOf(ir.I64, 1), []int64{5})}, Options{})
	require.ErrorContains(t, err, "gather index 5 is out of range")
	args := RandomArgs(f, 1)
	require.Less(t, args[1].I[0], int64(2), "indices are drawn within the indexed dimension")

	// Inside a fused kernel the labels are read through a region argument
	// (plan-check drew labels up to 10 for 3 classes there).
	k, err := parser.Parse("t.kir", `func @f(%z: f32[8,3], %labels: i64[8]) -> (f32[]) {
  %k = kernel(%z, %labels) : f32[] region(%a: f32[8,3], %b: i64[8]) {
    %l = softmax_cross_entropy(%a, %b) : f32[]
    yield %l
  }
  return %k
}
`)
	require.NoError(t, err)
	bound, ok := IndexBound(k.Funcs[0], k.Funcs[0].Args[1])
	require.True(t, ok)
	require.Equal(t, int64(3), bound)
}

func TestReductionsAndViews(t *testing.T) {
	x := []float64{1, 5, 3, 4, 2, 6}
	res := run(t, `func @f(%x: f64[2,3]) -> (f64[3], f64[2,1], f64[], f64[1,3], f64[6], f64[3], f64[2,3]) {
  %s = reduce_sum(%x) {axes = [0]} : f64[3]
  %m = reduce_mean(%x) {axes = [1], keepdims = true} : f64[2,1]
  %mx = reduce_max(%x) : f64[]
  %st = sum_to(%x) {shape = [1, 3]} : f64[1,3]
  %fl = flatten(%x) {axis = 0} : f64[1,6]
  %sq = squeeze(%fl) : f64[6]
  %r = reshape(%sq) {shape = [2, 3]} : f64[2,3]
  %u = unsqueeze(%s) {axes = [0]} : f64[1,3]
  %v = squeeze(%u) {axes = [0]} : f64[3]
  return %s, %m, %mx, %st, %sq, %v, %r
}
`, x)
	near(t, []float64{5, 7, 9}, res[0], "reduce_sum over axis 0")
	near(t, []float64{3, 4}, res[1], "reduce_mean keepdims")
	near(t, []float64{6}, res[2], "reduce_max over all")
	near(t, []float64{5, 7, 9}, res[3], "sum_to")
	near(t, x, res[4], "flatten + squeeze")
	near(t, []float64{5, 7, 9}, res[5], "unsqueeze + squeeze")
	near(t, x, res[6], "reshape")
	r := run(t, `func @f() -> (f64[1000]) {
  %r = random_uniform() {dtype = f64, shape = [1000]} : f64[1000]
  return %r
}
`)
	mean := 0.0
	for _, v := range r[0].F {
		require.True(t, v >= 0 && v < 1)
		mean += v / 1000
	}
	require.InDelta(t, 0.5, mean, 0.05)
}

// TestObserveSeesEveryOpInOrder: Observe is called once per op of the
// body, in order, with the op's results before any value is released.
func TestObserveSeesEveryOpInOrder(t *testing.T) {
	m, err := parser.Parse("t.kir", `func @f(%x: f32[2]) -> (f32[2]) {
  %a = neg(%x) : f32[2]
  %b = exp(%a) : f32[2]
  %c = add(%a, %b) : f32[2]
  return %c
}`)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	f := m.Funcs[0]
	var seen []string
	var sums []float64
	opt := Options{Observe: func(i int, op *ir.Op, res []*Tensor) {
		require.Same(t, f.Body[i], op)
		seen = append(seen, op.Results[0].Name)
		sums = append(sums, res[0].F[0]+res[0].F[1])
	}}
	_, err = Run(f, []*Tensor{FromFloats(f.Args[0].Type, []float64{1, 2})}, opt)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, seen)
	require.InDelta(t, -3, sums[0], 1e-12)
	require.InDelta(t, math.Exp(-1)+math.Exp(-2), sums[1], 1e-6)
}

// TestUint64PadAndConstants: pad's value fills a u64 as a conversion
// does, saturating (1e19 is 10^19, above 2^63; -3 is 0), and a u64
// constant may be written with a leading +.
func TestUint64PadAndConstants(t *testing.T) {
	m, err := parser.Parse("u.kir", `func @f(%x: u64[1]) -> (u64[3], u64[3], u64[1]) {
  %a = pad(%x) {pads = [1, 1], value = 1e19} : u64[3]
  %b = pad(%x) {pads = [1, 1], value = -3.0} : u64[3]
  %c = constant() {value = dense<u64[1]: +5>} : u64[1]
  return %a, %b, %c
}
`)
	require.NoError(t, err)
	res, err := Run(m.Funcs[0], []*Tensor{FromInts(ir.TensorOf(ir.U64, 1), []int64{7})}, Options{})
	require.NoError(t, err)
	big := uint64(10000000000000000000)
	require.Equal(t, []int64{int64(big), 7, int64(big)}, res[0].I)
	require.Equal(t, []int64{0, 7, 0}, res[1].I)
	require.Equal(t, []int64{5}, res[2].I)
}
