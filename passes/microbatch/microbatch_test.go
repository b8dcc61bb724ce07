package microbatch_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	"github.com/kiln-compiler/kiln/passes/microbatch"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	"github.com/kiln-compiler/kiln/passtest"
)

// Forward functions in f64 without batch normalisation, whose microbatched
// steps must equal the whole-batch step: an MLP, a CNN with pooling and a
// flatten, and an attention block whose reshapes fold the batch into rows.
var models = map[string]string{
	"mlp": passtest.ReadFile("../../testdata/steps/mlp_f64.kir"),
	"cnn": `func @cnn(%x: f64[6,2,8,8], %w: f64[4,2,3,3] {param}, %w2: f64[4,4,3,3] {param}, %fw: f64[16,5] {param}) -> (f64[6,5]) {
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f64[6,4,8,8]
  %r = relu(%c) : f64[6,4,8,8]
  %c2 = conv2d(%r, %w2) {pads = [1, 1, 1, 1]} : f64[6,4,8,8]
  %s = sigmoid(%c2) : f64[6,4,8,8]
  %p = max_pool2d(%s) {kernel = [4, 4], strides = [4, 4]} : f64[6,4,2,2]
  %f = reshape(%p) {shape = [6, 16]} : f64[6,16]
  %y = matmul(%f, %fw) : f64[6,5]
  return %y
}`,
	"attention": passtest.ReadFile("../../testdata/steps/attention_f64.kir"),
}

// TestMicrobatchEqualsWholeBatch: for sum and mean losses and every n that
// divides the batch, loss and gradients equal the whole-batch step's. The
// error model: the slices' partial sums are added in another order, in
// f64 (unit roundoff 1.1e-16) over at most a few hundred terms, so the
// relative error stays below 1e-12.
func TestMicrobatchEqualsWholeBatch(t *testing.T) {
	for name, src := range models {
		for _, loss := range []string{"sum", "mean"} {
			whole := passtest.Parse(t, src)
			passtest.Run(t, whole, "autodiff{loss="+loss+"}")
			batch := whole.Funcs[0].Args[0].Type.Shape[0]
			for n := int64(2); n <= batch; n++ {
				if batch%n != 0 {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/n=%d", name, loss, n), func(t *testing.T) {
					split := passtest.Clone(t, whole)
					passtest.Run(t, split, fmt.Sprintf("microbatch{n=%d}", n))
					passtest.Equivalent(t, whole.Funcs[0], split.Funcs[0], 1e-12, 1, 2, 3)
				})
			}
		}
	}
}

// TestMicrobatchWithOptimizer: after the optimizer pass (updates placed
// right after their gradients), the updates run once after the slices on
// the gradients' sums: loss, parameters and Adam's moments equal the
// whole-batch step's (same error model as above).
func TestMicrobatchWithOptimizer(t *testing.T) {
	for name, src := range models {
		for _, kind := range []string{"sgd", "adam"} {
			whole := passtest.Parse(t, src)
			passtest.Run(t, whole, "autodiff{loss=mean},optimizer{kind="+kind+"}")
			split := passtest.Clone(t, whole)
			passtest.Run(t, split, "microbatch{n=2}")
			t.Run(name+"/"+kind, func(t *testing.T) {
				passtest.Equivalent(t, whole.Funcs[0], split.Funcs[0], 1e-12, 1, 2)
			})
		}
	}
}

// TestMicrobatchDividesActivations: n slices hold one slice's activations
// at a time. The error model of the peak: what stays whole (inputs,
// parameters, the gradients' running sums: fixed), plus 1/n of what the
// whole step holds beyond that, plus one slice's copy of the inputs and
// one slice's gradient while it joins its running sum.
func TestMicrobatchDividesActivations(t *testing.T) {
	var src strings.Builder
	src.WriteString("func @deep(%x: f32[512,64], %w0: f32[64,64] {param}, %w1: f32[64,64] {param}, %w2: f32[64,64] {param}, %w3: f32[64,64] {param}) -> (f32[512,64]) {\n")
	prev := "%x"
	for i := 0; i < 4; i++ {
		fmt.Fprintf(&src, "  %%h%d = matmul(%s, %%w%d) : f32[512,64]\n  %%a%d = tanh(%%h%d) : f32[512,64]\n", i, prev, i, i, i)
		prev = fmt.Sprintf("%%a%d", i)
	}
	fmt.Fprintf(&src, "  return %s\n}\n", prev)
	m := passtest.Parse(t, src.String())
	passtest.Run(t, m, "autodiff")
	f := m.Funcs[0]
	whole := liveness.Analyze(f).Peak
	var inputs, params, grads int64
	for _, a := range f.Args {
		if a.Arg.Kind == ir.ArgData {
			inputs += a.Type.SizeBytes()
		} else {
			params += a.Type.SizeBytes()
		}
	}
	for _, r := range f.Results {
		if r.Role() == ir.RoleGrad {
			grads += r.Value.Type.SizeBytes()
		}
	}
	fixed := inputs + params + grads
	for _, n := range []int64{2, 4, 8} {
		s := passtest.Clone(t, m)
		passtest.Run(t, s, fmt.Sprintf("microbatch{n=%d}", n))
		peak := liveness.Analyze(s.Funcs[0]).Peak
		bound := fixed + (whole-fixed)/n + inputs/n + grads
		t.Logf("n=%d: peak %d bytes, %.3f of the whole batch's %d (bound %d)", n, peak, float64(peak)/float64(whole), whole, bound)
		require.LessOrEqual(t, peak, bound, "n=%d", n)
	}
}

// TestSplitErrorLeavesTheStep: a step that cannot be split (a softmax
// over the batch, found after the ops before it were planned) is left
// exactly as it was.
func TestSplitErrorLeavesTheStep(t *testing.T) {
	m := passtest.Parse(t, `func @m(%x: f32[4,3], %w: f32[3,2] {param}) -> (f32[4,2]) {
  %y = matmul(%x, %w) : f32[4,2]
  %s = softmax(%y) {axis = 0} : f32[4,2]
  return %s
}`)
	passtest.Run(t, m, "autodiff")
	before := m.String()
	_, err := microbatch.Split(m.Funcs[0], 2)
	require.ErrorContains(t, err, "test.kir:3:3: microbatch: %s (softmax) mixes the batch")
	require.Equal(t, before, m.String())
}

// TestMaxLossSplits: a loss that is the largest value over the batch is
// folded over the slices by max, and equals the whole batch's.
func TestMaxLossSplits(t *testing.T) {
	m := passtest.Parse(t, `func @m(%x: f64[4,3], %w: f64[3,2] {param}) -> (grad.w: f64[3,2] {param = "w", role = "grad"}, loss: f64[] {role = "loss"}) {
  %y = matmul(%x, %w) : f64[4,2]
  %loss = reduce_max(%y) : f64[]
  %seed = constant() {role = "loss_seed", value = dense<f64[]: 1.0>} : f64[]
  %g = expand(%seed) {shape = [4, 2]} : f64[4,2]
  %gw = gemm(%x, %g) {trans_a = true} : f64[3,2]
  return %gw, %loss
}`)
	split := passtest.Clone(t, m)
	passtest.Run(t, split, "microbatch{n=2}")
	passtest.Equivalent(t, m.Funcs[0], split.Funcs[0], 1e-12, 1, 2)
}

// TestGemmGradientsAccumulateInPlace: a weight gradient made by a gemm
// joins its running sum inside the gemm (C = the sum, beta = 1), and the
// product is written over the sum's buffer, so no slice's gradient is
// live beside the sum (VGG16's 392 MiB classifier gradient was live twice).
func TestGemmGradientsAccumulateInPlace(t *testing.T) {
	m := passtest.Parse(t, models["mlp"])
	passtest.Run(t, m, "autodiff,microbatch{n=3}")
	f := m.Funcs[0]
	info := liveness.Analyze(f)
	accumulating := 0
	for _, op := range f.Body {
		if op.Kind != "gemm" || len(op.Operands) != 3 {
			continue
		}
		accumulating++
		require.Same(t, info.BufferOf[op.Operands[2]], info.BufferOf[op.Results[0]], "%s is written over its running sum", op.Results[0].Ref())
	}
	// w1 and w2 take their gradients from gemms; two slices after the
	// first join the sum that way.
	require.Equal(t, 4, accumulating)
	for _, op := range f.Body {
		if op.Kind == "add" && op.Operands[1].Def != nil && op.Operands[1].Def.Kind == "gemm" {
			t.Errorf("%s adds a gemm's gradient outside it", op.Results[0].Ref())
		}
	}
}

// TestSliceOfOneMeetsAWholeOperand: a slice of one row multiplied by a
// whole tensor of the batch's shape (a parameter expanded to it) must
// take that tensor's row, not broadcast to the whole batch: mul is of
// the broadcasting class, which the check once missed (a slice then
// counted every row, and the summed loss doubled silently).
func TestSliceOfOneMeetsAWholeOperand(t *testing.T) {
	m := passtest.Parse(t, `func @f(%x: f64[2,3], %q: f64[3] {param}) -> (f64[2,3]) {
  %e = expand(%q) {shape = [2, 3]} : f64[2,3]
  %s = exp(%e) : f64[2,3]
  %y = mul(%x, %s) : f64[2,3]
  return %y
}`)
	passtest.Run(t, m, "autodiff{loss=sum}")
	split := passtest.Clone(t, m)
	passtest.Run(t, split, "microbatch{n=2}")
	passtest.Equivalent(t, m.Funcs[0], split.Funcs[0], 1e-12, 1, 2)
	// matmul broadcasts its batch dimensions too.
	m = passtest.Parse(t, `func @f(%x: f64[2,3,4], %q: f64[4,5] {param}) -> (f64[2,3,5]) {
  %e = expand(%q) {shape = [2, 4, 5]} : f64[2,4,5]
  %s = exp(%e) : f64[2,4,5]
  %y = matmul(%x, %s) : f64[2,3,5]
  return %y
}`)
	passtest.Run(t, m, "autodiff{loss=sum}")
	split = passtest.Clone(t, m)
	passtest.Run(t, split, "microbatch{n=2}")
	passtest.Equivalent(t, m.Funcs[0], split.Funcs[0], 1e-12, 1, 2)
}

// TestDropoutSlicesDrawTheWholeBatchsMask: a dropout (and its gradient,
// which draws the mask again from the seed) copied for a slice of the
// batch draws the whole batch's mask for the slice's rows (its counter
// offset by the slice's first element), so the split step equals the
// whole step, loss and gradients (same error model as
// TestMicrobatchEqualsWholeBatch). This also checks that the forward and
// the backward of a slice draw one mask: they once drew two.
func TestDropoutSlicesDrawTheWholeBatchsMask(t *testing.T) {
	src := `func @f(%x: f64[8,5], %w: f64[5,6] {param}, %w2: f64[6,3] {param}) -> (f64[8,3]) {
  %h = matmul(%x, %w) : f64[8,6]
  %d, %k = dropout(%h) {ratio = 0.3, seed = 7} : f64[8,6], bool[8,6]
  %a = tanh(%d) : f64[8,6]
  %y = matmul(%a, %w2) : f64[8,3]
  return %y
}`
	for _, loss := range []string{"sum", "mean"} {
		whole := passtest.Parse(t, src)
		passtest.Run(t, whole, "autodiff{loss="+loss+"}")
		for _, n := range []int{2, 4, 8} {
			split := passtest.Clone(t, whole)
			passtest.Run(t, split, fmt.Sprintf("microbatch{n=%d}", n))
			passtest.Equivalent(t, whole.Funcs[0], split.Funcs[0], 1e-12, 1, 2)
		}
	}
}

// flatLabelsLM is a language model's step as PyTorch exports it when the
// labels come flattened ([B·T], not led by the batch B of the ids) and
// the loss is cross-entropy's mean over the labels not ignored
// (ignore_index): the count of those is a sum over the whole batch that
// every row's gradient reads.
const flatLabelsLM = `func @lm(%ids: i64[4,8], %labels: i64[32], %emb: f64[16,8] {param}, %head: f64[16,8] {param}) -> (f64[]) {
  %e = gather(%emb, %ids) {axis = 0} : f64[4,8,8]
  %rows = reshape(%e) {shape = [32, 8]} : f64[32,8]
  %logits = gemm(%rows, %head) {trans_b = true} : f64[32,16]
  %lp = log_softmax(%logits) {axis = 1} : f64[32,16]
  %ignore = constant() {value = dense<i64[]: -100>} : i64[]
  %valid = ne(%labels, %ignore) : bool[32]
  %zero = constant() {value = dense<i64[]: 0>} : i64[]
  %safe = where(%valid, %labels, %zero) : i64[32]
  %idx = unsqueeze(%safe) {axes = [1]} : i64[32,1]
  %picked = gather_elements(%lp, %idx) {axis = 1, negative = false} : f64[32,1]
  %p = squeeze(%picked) {axes = [1]} : f64[32]
  %one = constant() {value = dense<f64[]: 1.0>} : f64[]
  %nil = constant() {value = dense<f64[]: 0.0>} : f64[]
  %w = where(%valid, %one, %nil) : f64[32]
  %neg = neg(%p) : f64[32]
  %l = mul(%neg, %w) : f64[32]
  %sum = reduce_sum(%l) {axes = [0], keepdims = false} : f64[]
  %count = reduce_sum(%w) {axes = [0], keepdims = false} : f64[]
  %loss = div(%sum, %count) : f64[]
  return %loss
}`

// TestFlatLabelsMeanLossSplits: the split of that step used to promote the
// loss gradient's expand into the slices after the count it reads had
// become a sum of the slices' parts: the slices read a value defined only
// after them (invalid IR). Split and SplitExact now equal the whole step.
func TestFlatLabelsMeanLossSplits(t *testing.T) {
	whole := passtest.Parse(t, flatLabelsLM)
	passtest.Run(t, whole, "autodiff{loss=sum}")
	for _, pipe := range []string{"microbatch{n=2}", "microbatch{n=4}", "microbatch{n=2,exact-bn=true}"} {
		split := passtest.Clone(t, whole)
		passtest.Run(t, split, pipe)
		passtest.Equivalent(t, whole.Funcs[0], split.Funcs[0], 1e-12, 1, 2, 3)
	}
}
