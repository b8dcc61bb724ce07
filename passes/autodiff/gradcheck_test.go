package autodiff

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

// Each case is a forward function in f64 whose float arguments marked
// param are checked: the test weights the first result with a random data
// tensor, sums it, differentiates, and compares every gradient with
// central finite differences.
var gradCases = map[string]string{
	"unary": `func @f(%x: f64[2,3] {param}) -> (f64[2,3]) {
  %a = relu(%x) : f64[2,3]
  %b = sigmoid(%x) : f64[2,3]
  %c = tanh(%x) : f64[2,3]
  %d = erf(%x) : f64[2,3]
  %e = silu(%x) : f64[2,3]
  %g = hard_swish(%x) : f64[2,3]
  %h = gelu(%x) : f64[2,3]
  %i = gelu(%x) {approximate = "tanh"} : f64[2,3]
  %j = hard_sigmoid(%x) {alpha = 0.3, beta = 0.4} : f64[2,3]
  %k = neg(%x) : f64[2,3]
  %l = abs(%x) : f64[2,3]
  %m = exp(%x) : f64[2,3]
  %n = identity(%x) : f64[2,3]
  %s1 = add(%a, %b) : f64[2,3]
  %s2 = add(%s1, %c) : f64[2,3]
  %s3 = add(%s2, %d) : f64[2,3]
  %s4 = add(%s3, %e) : f64[2,3]
  %s5 = add(%s4, %g) : f64[2,3]
  %s6 = add(%s5, %h) : f64[2,3]
  %s7 = add(%s6, %i) : f64[2,3]
  %s8 = add(%s7, %j) : f64[2,3]
  %s9 = add(%s8, %k) : f64[2,3]
  %s10 = add(%s9, %l) : f64[2,3]
  %s11 = add(%s10, %m) : f64[2,3]
  %s12 = add(%s11, %n) : f64[2,3]
  return %s12
}`,
	"positive-unary": `func @f(%x: f64[4] {param}) -> (f64[4]) {
  %p = mul(%x, %x) : f64[4]
  %one = constant() {value = dense<f64[]: 1.0>} : f64[]
  %q = add(%p, %one) : f64[4]
  %a = log(%q) : f64[4]
  %b = sqrt(%q) : f64[4]
  %c = reciprocal(%q) : f64[4]
  %s = add(%a, %b) : f64[4]
  %t = add(%s, %c) : f64[4]
  return %t
}`,
	"broadcast-binary": `func @f(%a: f64[2,3] {param}, %b: f64[3] {param}, %c: f64[2,1] {param}) -> (f64[2,3]) {
  %x = add(%a, %b) : f64[2,3]
  %y = sub(%x, %c) : f64[2,3]
  %z = mul(%y, %b) : f64[2,3]
  %one = constant() {value = dense<f64[]: 3.0>} : f64[]
  %cp = mul(%c, %c) : f64[2,1]
  %cq = add(%cp, %one) : f64[2,1]
  %w = div(%z, %cq) : f64[2,3]
  %m = max(%w, %a) : f64[2,3]
  %n = min(%m, %b) : f64[2,3]
  return %n
}`,
	"pow-where": `func @f(%a: f64[3] {param}, %e: f64[3] {param}, %c: bool[3]) -> (f64[3]) {
  %one = constant() {value = dense<f64[]: 2.0>} : f64[]
  %sq = mul(%a, %a) : f64[3]
  %pa = add(%sq, %one) : f64[3]
  %p = pow(%pa, %e) : f64[3]
  %w = where(%c, %p, %e) : f64[3]
  return %w
}`,
	"matmul": `func @f(%a: f64[2,3,4] {param}, %b: f64[4,5] {param}, %v: f64[5] {param}, %u: f64[3] {param}) -> (f64[2]) {
  %c = matmul(%a, %b) : f64[2,3,5]
  %d = matmul(%c, %v) : f64[2,3]
  %e = matmul(%d, %u) : f64[2]
  return %e
}`,
	"matmul-batch-broadcast": `func @f(%a: f64[2,1,3,4] {param}, %b: f64[3,4,2] {param}) -> (f64[2,3,3,2]) {
  %c = matmul(%a, %b) : f64[2,3,3,2]
  return %c
}`,
	"gemm": `func @f(%a: f64[3,2] {param}, %b: f64[4,3] {param}, %c: f64[4] {param}, %d: f64[2,4] {param}) -> (f64[2,4], f64[2,4]) {
  %x = gemm(%a, %b, %c) {alpha = 0.5, beta = 2.0, trans_a = true, trans_b = true} : f64[2,4]
  %y = gemm(%x, %d) {trans_b = true} : f64[2,2]
  %z = gemm(%y, %d) : f64[2,4]
  return %z, %x
}`,
	"conv": `func @f(%x: f64[2,4,7,6] {param}, %w: f64[6,2,3,2] {param}, %b: f64[6] {param}) -> (f64[2,6,4,3]) {
  %y = conv2d(%x, %w, %b) {dilations = [1, 2], groups = 2, pads = [1, 0, 2, 1], strides = [2, 2]} : f64[2,6,4,3]
  return %y
}`,
	"conv-pointwise": `func @f(%x: f64[1,3,4,4] {param}, %w: f64[5,3,1,1] {param}) -> (f64[1,5,4,4]) {
  %y = conv2d(%x, %w) : f64[1,5,4,4]
  return %y
}`,
	"pooling": `func @f(%x: f64[1,2,5,5] {param}) -> (f64[1,2,3,3], f64[1,2,3,3], f64[1,2,1,1]) {
  %a = max_pool2d(%x) {ceil_mode = true, kernel = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : f64[1,2,3,3]
  %b = avg_pool2d(%x) {count_include_pad = true, kernel = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : f64[1,2,3,3]
  %c = global_avg_pool(%x) : f64[1,2,1,1]
  %d = add(%a, %b) : f64[1,2,3,3]
  %e = mul(%d, %c) : f64[1,2,3,3]
  return %e, %b, %c
}`,
	"avg-pool-exclusive": `func @f(%x: f64[1,1,4,5] {param}) -> (f64[1,1,2,3]) {
  %b = avg_pool2d(%x) {kernel = [2, 3], pads = [0, 1, 0, 1], strides = [2, 2]} : f64[1,1,2,3]
  return %b
}`,
	"batch-norm": `func @f(%x: f64[3,2,2,2] {param}, %s: f64[2] {param}, %b: f64[2] {param}, %m: f64[2] {state}, %v: f64[2] {state}) -> (f64[3,2,2,2], f64[3,2,2,2]) {
  %y, %rm, %rv, %sm, %si = batch_norm_train(%x, %s, %b, %m, %v) {epsilon = 0.001, momentum = 0.9} : f64[3,2,2,2], f64[2], f64[2], f64[2], f64[2]
  %vv = mul(%v, %v) : f64[2]
  %z = batch_norm_infer(%y, %s, %b, %m, %vv) {epsilon = 0.5} : f64[3,2,2,2]
  return %z, %y
}`,
	"layer-norm": `func @f(%x: f64[2,3,4] {param}, %s: f64[3,4] {param}, %b: f64[3,4] {param}, %t: f64[4] {param}) -> (f64[2,3,4]) {
  %y, %m, %i = layer_norm(%x, %s, %b) {axis = 1, epsilon = 0.01} : f64[2,3,4], f64[2,1,1], f64[2,1,1]
  %z, %m2, %i2 = layer_norm(%y, %t) {epsilon = 0.01} : f64[2,3,4], f64[2,3,1], f64[2,3,1]
  return %z
}`,
	"softmax": `func @f(%x: f64[2,3,4] {param}) -> (f64[2,3,4]) {
  %a = softmax(%x) {axis = 1} : f64[2,3,4]
  %b = log_softmax(%x) : f64[2,3,4]
  %c = mul(%a, %b) : f64[2,3,4]
  return %c
}`,
	"dropout": `func @f(%x: f64[64] {param}) -> (f64[64]) {
  %y, %m = dropout(%x) {ratio = 0.3, seed = 11} : f64[64], bool[64]
  %z = mul(%y, %x) : f64[64]
  return %z
}`,
	"cross-entropy": `func @f(%x: f64[4,5] {param}, %l: i64[4], %y: f64[2,3,2] {param}, %k: i64[2,2]) -> (f64[]) {
  %a = softmax_cross_entropy(%x, %l) : f64[]
  %b = softmax_cross_entropy(%y, %k) {reduction = "sum"} : f64[]
  %c = add(%a, %b) : f64[]
  return %c
}`,
	"reductions": `func @f(%x: f64[2,3,4] {param}) -> (f64[2,3], f64[2,1,4], f64[3], f64[2,3]) {
  %a = reduce_sum(%x) {axes = [1]} : f64[2,4]
  %b = reduce_mean(%x) {axes = [1], keepdims = true} : f64[2,1,4]
  %c = reduce_max(%x) {axes = [0, 2]} : f64[3]
  %d = sum_to(%x) {shape = [3, 1]} : f64[3,1]
  %e = reshape(%d) {shape = [3]} : f64[3]
  %f = add(%c, %e) : f64[3]
  %g = reduce_sum(%b) : f64[]
  %h = mul(%a, %g) : f64[2,4]
  %i = reduce_sum(%h) {axes = [1], keepdims = true} : f64[2,1]
  %j = mul(%i, %f) : f64[2,3]
  return %j, %b, %f, %j
}`,
	"shapes": `func @f(%x: f64[2,3,4] {param}, %y: f64[2,2,4] {param}, %idx: i64[5]) -> (f64[3,5,2]) {
  %t = transpose(%x) {perm = [1, 2, 0]} : f64[3,4,2]
  %r = reshape(%t) {shape = [12, 2]} : f64[12,2]
  %fl = flatten(%x) {axis = 2} : f64[6,4]
  %u = unsqueeze(%fl) {axes = [0]} : f64[1,6,4]
  %sq = squeeze(%u) {axes = [0]} : f64[6,4]
  %c = concat(%x, %y) {axis = 1} : f64[2,5,4]
  %a, %b = split(%c) {axis = 2, sizes = [1, 3]} : f64[2,5,1], f64[2,5,3]
  %s = slice(%b) {axes = [2, 1], ends = [3, 0], starts = [0, 5], steps = [2, -2]} : f64[2,2,2]
  %e = expand(%a) {shape = [2, 5, 3]} : f64[2,5,3]
  %p = pad(%s) {pads = [0, 1, -1, 1, 0, 0]} : f64[3,3,1]
  %g = gather(%r, %idx) : f64[5,2]
  %ge = expand(%g) {shape = [3, 5, 2]} : f64[3,5,2]
  %q = reduce_sum(%sq) : f64[]
  %w = reduce_sum(%e) : f64[]
  %z = reduce_sum(%p) : f64[]
  %qw = add(%q, %w) : f64[]
  %qz = add(%qw, %z) : f64[]
  %o = mul(%ge, %qz) : f64[3,5,2]
  return %o
}`,
	"cast": `func @f(%x: f64[3] {param}) -> (f64[3]) {
  %a = cast(%x) {to = f32} : f32[3]
  %b = cast(%a) {to = f64} : f64[3]
  %c = mul(%b, %x) : f64[3]
  return %c
}`,
}

// weighted appends a data argument w of the first result's type and makes
// the first result w * result, so that the implicit sum loss gives every
// element a different weight.
func weighted(t *testing.T, f *ir.Func) {
	r := f.Results[0].Value
	w := &ir.Value{Name: "__w", Type: r.Type, Index: len(f.Args), Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
	f.Args = append(f.Args, w)
	op, err := f.NewOp("mul", []*ir.Value{r, w}, nil, ir.Location{}, "weighted")
	require.NoError(t, err)
	f.Body = append(f.Body, op)
	f.Results[0].Value = op.Results[0]
}

func parseFunc(t *testing.T, src string) *ir.Func {
	m, err := parser.Parse("case.kir", src+"\n")
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	return m.Funcs[0]
}

func TestGradientsMatchFiniteDifferences(t *testing.T) {
	for name, src := range gradCases {
		t.Run(name, func(t *testing.T) {
			fwd := parseFunc(t, src)
			weighted(t, fwd)
			args := interp.RandomArgs(fwd, 42)
			// Keep inputs away from kinks (relu at 0, abs at 0, max ties).
			rng := rand.New(rand.NewPCG(7, 7))
			for _, a := range args {
				for i, v := range a.F {
					if math.Abs(v) < 0.05 {
						a.F[i] = v + 0.1 + 0.1*rng.Float64()
					}
				}
			}
			step := parseFunc(t, src)
			weighted(t, step)
			_, err := Differentiate(step, "sum", false)
			require.NoError(t, err)
			require.NoError(t, ir.Verify(&ir.Module{Funcs: []*ir.Func{step}}), step.String())
			res, err := interp.Run(step, args, interp.Options{})
			require.NoError(t, err)
			loss := func() float64 {
				out, err := interp.Run(fwd, args, interp.Options{})
				require.NoError(t, err)
				s := 0.0
				for _, v := range out[0].F {
					s += v
				}
				return s
			}
			require.InDelta(t, loss(), res[0].F[0], 1e-9*math.Max(1, math.Abs(res[0].F[0])), "loss")
			k := 1
			checked := 0
			for ai, a := range fwd.Args {
				if a.Arg.Kind != ir.ArgParam {
					continue
				}
				g := res[k]
				require.Equal(t, "grad."+a.Name, step.ResultName(k))
				k++
				for i := range args[ai].F {
					orig := args[ai].F[i]
					h := 1e-6 * math.Max(1, math.Abs(orig))
					tol := 1e-5
					if name == "cast" { // an f32 round trip: steps below f32 resolution mean nothing
						h, tol = 1e-2, 1e-3
					}
					args[ai].F[i] = orig + h
					up := loss()
					args[ai].F[i] = orig - h
					down := loss()
					args[ai].F[i] = orig
					fd := (up - down) / (2 * h)
					require.InDelta(t, fd, g.F[i], tol*math.Max(1, math.Abs(fd)), "%s: d loss / d %s[%d]", name, a.Name, i)
					checked++
				}
			}
			require.Greater(t, checked, 0)
		})
	}
}
