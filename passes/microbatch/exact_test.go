package microbatch_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/microbatch"
	"github.com/kiln-compiler/kiln/passtest"
)

// bnCNN stacks three batch normalisations in training mode (two after
// convolutions, one after a residual add, so that each one's statistics
// depend on the others' whole-batch normalisation) in f64. A nonlinearity
// lies between each pair: a bias right before a batch norm has no
// gradient (the normalisation removes it), which no relative bound can
// check.
const bnCNN = `func @bn(%x: f64[8,3,4,4], %w: f64[4,3,3,3] {param}, %g: f64[4] {param}, %b: f64[4] {param}, %m: f64[4] {state}, %v: f64[4] {state}, %w2: f64[4,4,3,3] {param}, %g2: f64[4] {param}, %b2: f64[4] {param}, %m2: f64[4] {state}, %v2: f64[4] {state}, %g3: f64[4] {param}, %b3: f64[4] {param}, %m3: f64[4] {state}, %v3: f64[4] {state}, %fw: f64[64,2] {param}) -> (f64[8,2], f64[4], f64[4], f64[4], f64[4], f64[4], f64[4]) {
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f64[8,4,4,4]
  %n, %rm, %rv, %sm, %si = batch_norm_train(%c, %g, %b, %m, %v) {epsilon = 1e-05, momentum = 0.9} : f64[8,4,4,4], f64[4], f64[4], f64[4], f64[4]
  %r = tanh(%n) : f64[8,4,4,4]
  %c2 = conv2d(%r, %w2) {pads = [1, 1, 1, 1]} : f64[8,4,4,4]
  %n2, %rm2, %rv2, %sm2, %si2 = batch_norm_train(%c2, %g2, %b2, %m2, %v2) {epsilon = 1e-05, momentum = 0.9} : f64[8,4,4,4], f64[4], f64[4], f64[4], f64[4]
  %t2 = tanh(%n2) : f64[8,4,4,4]
  %s = add(%t2, %r) : f64[8,4,4,4]
  %n3, %rm3, %rv3, %sm3, %si3 = batch_norm_train(%s, %g3, %b3, %m3, %v3) {epsilon = 1e-05, momentum = 0.9} : f64[8,4,4,4], f64[4], f64[4], f64[4], f64[4]
  %r3 = sigmoid(%n3) : f64[8,4,4,4]
  %f = reshape(%r3) {shape = [8, 64]} : f64[8,64]
  %y = matmul(%f, %fw) : f64[8,2]
  return %y, %rm, %rv, %rm2, %rv2, %rm3, %rv3
}`

// TestExactBNEqualsWholeBatch: with exact-bn, the split step's loss,
// gradients, outputs, running statistics and (after an optimizer)
// updated parameters equal the whole-batch step's. Error model as for
// Split (f64 sums over the slices in another order, relative 1e-12); the
// statistics' sums and the variance about the whole batch's mean are
// those of the data-parallel SyncBatchNorm, tested to the same bound.
// Without exact-bn the statistics are per slice and the loss differs.
func TestExactBNEqualsWholeBatch(t *testing.T) {
	for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean}", "autodiff{loss=mean},optimizer{kind=adam}"} {
		whole := passtest.Parse(t, bnCNN)
		passtest.Run(t, whole, pipe)
		for _, n := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("%s/n=%d", pipe, n), func(t *testing.T) {
				exact := passtest.Clone(t, whole)
				passtest.Run(t, exact, fmt.Sprintf("microbatch{n=%d,exact-bn=true}", n))
				passtest.Equivalent(t, whole.Funcs[0], exact.Funcs[0], 1e-12, 1, 2)
			})
		}
	}
	// Without exact-bn the split is refused, naming the first norm; with
	// per-slice statistics allowed by name (the running statistics, each
	// slice's own, no longer returned) the loss changes.
	whole := passtest.Parse(t, bnCNN)
	passtest.Run(t, whole, "autodiff{loss=mean}")
	refused := passtest.Clone(t, whole)
	err := passtest.RunErr(refused, "microbatch{n=2}")
	require.ErrorContains(t, err, "test.kir:3:3: microbatch: %n (batch_norm_train) takes statistics over the batch")
	require.ErrorContains(t, err, "--allow per-slice-bn")
	f := whole.Funcs[0]
	keep := f.Results[:0]
	for _, r := range f.Results {
		if r.Role() != "" {
			keep = append(keep, r)
		}
	}
	f.Results = keep
	passes.RemoveDeadOps(f)
	perSlice := passtest.Clone(t, whole)
	passtest.RunAllowing(t, perSlice, "microbatch{n=2}", passes.PerSliceBN)
	args := interp.RandomArgs(whole.Funcs[0], 3)
	want, err := interp.Run(whole.Funcs[0], interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, err := interp.Run(perSlice.Funcs[0], interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	require.Greater(t, passtest.RelErr(got[0], want[0]), 1e-6, "per-slice statistics change the loss")
}

// TestExactBNUpdatesRunningStatistics: split before the optimizer pass
// (the planner's order, what --microbatches asks for), exact-bn's
// decomposed statistics still reach the running statistics: they are
// inout, updated once, and after the step equal the whole batch's update,
// as do the parameters (f64, the bound of TestExactBNEqualsWholeBatch).
func TestExactBNUpdatesRunningStatistics(t *testing.T) {
	whole := passtest.Parse(t, bnCNN)
	f := whole.Funcs[0]
	f.Results = f.Results[:1]
	passes.RemoveDeadOps(f)
	split := passtest.Clone(t, whole)
	passtest.Run(t, whole, "autodiff{loss=mean},optimizer{kind=momentum}")
	passtest.Run(t, split, "autodiff{loss=mean},microbatch{n=2,exact-bn=true},optimizer{kind=momentum}")
	args := interp.RandomArgs(whole.Funcs[0], 4)
	want, wantArgs, err := interp.RunWithUpdates(whole.Funcs[0], interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, gotArgs, err := interp.RunWithUpdates(split.Funcs[0], interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	require.LessOrEqual(t, passtest.RelErr(got[0], want[0]), 1e-12, "the loss")
	stats := 0
	for i, a := range split.Funcs[0].Args {
		w := whole.Funcs[0].Args[i]
		require.Equal(t, w.Name, a.Name)
		require.Equal(t, w.Arg.InOut, a.Arg.InOut, "%s is inout in one step only", a.Name)
		if a.Arg.Kind == ir.ArgState && a.Arg.Attrs.String("role", "") == "running_stat" {
			stats++
			require.Equal(t, int64(1), a.Arg.Attrs.Int("updates", 0), "%s is updated once", a.Name)
		}
		require.LessOrEqual(t, passtest.RelErr(gotArgs[i], wantArgs[i]), 1e-12, "%s after the step", a.Name)
	}
	require.Equal(t, 6, stats, "every running statistic is written back")
}

// TestExactBNPhases: a stack of L convolutions with batch norms runs in
// 3L+1 phases (each norm's mean, variance and gradient sums, then the
// gradients that wait for all of them). The peak's error model: one
// slice's values at a time, as in the per-slice split, plus what the
// phases keep from one to the next (Stats.Kept, all slices of the
// frontier), plus the whole batch's per-channel sums; and it stays below
// the whole batch's peak.
func TestExactBNPhases(t *testing.T) {
	const layers = 6
	var src strings.Builder
	src.WriteString("func @deep(%x: f32[16,8,8,8]")
	for l := 0; l < layers; l++ {
		fmt.Fprintf(&src, ", %%w%d: f32[8,8,3,3] {param}, %%g%d: f32[8] {param}, %%b%d: f32[8] {param}, %%m%d: f32[8] {state}, %%v%d: f32[8] {state}", l, l, l, l, l)
	}
	src.WriteString(") -> (f32[16,8,8,8]) {\n")
	prev := "%x"
	for l := 0; l < layers; l++ {
		fmt.Fprintf(&src, "  %%c%d = conv2d(%s, %%w%d) {pads = [1, 1, 1, 1]} : f32[16,8,8,8]\n", l, prev, l)
		fmt.Fprintf(&src, "  %%n%d, %%rm%d, %%rv%d, %%sm%d, %%si%d = batch_norm_train(%%c%d, %%g%d, %%b%d, %%m%d, %%v%d) {epsilon = 1e-05, momentum = 0.9} : f32[16,8,8,8], f32[8], f32[8], f32[8], f32[8]\n", l, l, l, l, l, l, l, l, l, l)
		fmt.Fprintf(&src, "  %%a%d = tanh(%%n%d) : f32[16,8,8,8]\n", l, l)
		prev = fmt.Sprintf("%%a%d", l)
	}
	fmt.Fprintf(&src, "  return %s\n}\n", prev)
	whole := passtest.Parse(t, src.String())
	passtest.Run(t, whole, "autodiff{loss=sum}")
	exact := passtest.Clone(t, whole)
	st, err := microbatch.SplitExact(exact.Funcs[0], 4, microbatch.Options{})
	require.NoError(t, err)
	require.Equal(t, 3*layers+1, st.Phases)
	perSlice := passtest.Clone(t, whole)
	passtest.RunAllowing(t, perSlice, "microbatch{n=4}", passes.PerSliceBN)
	pw, ps, pe := liveness.Analyze(whole.Funcs[0]).Peak, liveness.Analyze(perSlice.Funcs[0]).Peak, liveness.Analyze(exact.Funcs[0]).Peak
	t.Logf("peaks: whole batch %d, per-slice statistics %d, exact %d bytes (kept between phases %d)", pw, ps, pe, st.Kept)
	require.Less(t, pe, pw)
	sums := int64(layers * 6 * 8 * 4) // per layer: mean, variance, invstd, two gradient sums, one more in flight
	require.LessOrEqual(t, pe, ps+st.Kept+sums)
}

// TestExactBNWithoutBatchNormIsSplit: with no batch normalisation,
// exact-bn is the ordinary split.
func TestExactBNWithoutBatchNormIsSplit(t *testing.T) {
	a := passtest.Parse(t, models["cnn"])
	passtest.Run(t, a, "autodiff")
	b := passtest.Clone(t, a)
	passtest.Run(t, a, "microbatch{n=2}")
	passtest.Run(t, b, "microbatch{n=2,exact-bn=true}")
	require.Equal(t, a.String(), b.String())
}

// TestExactBNRefusesAPartitionedStep: the phases are cut at collectives,
// so a step that already has its own (a rank's of tensor parallelism,
// whose group happens to be as large as n) is refused, not split with its
// all_reduce taken for the slices' sum.
func TestExactBNRefusesAPartitionedStep(t *testing.T) {
	m := passtest.Parse(t, `func @f(%x: f64[4,2,2,2], %g: f64[2] {param}, %b: f64[2] {param}, %m: f64[2] {state}, %v: f64[2] {state}) -> (f64[4,2,2,2]) attributes {ranks = 2} {
  %n, %rm, %rv, %sm, %si = batch_norm_train(%x, %g, %b, %m, %v) {epsilon = 1e-05, momentum = 0.9} : f64[4,2,2,2], f64[2], f64[2], f64[2], f64[2]
  %s = all_reduce(%n) {size = 2} : f64[4,2,2,2]
  return %s
}`)
	before := m.String()
	_, err := microbatch.SplitExact(m.Funcs[0], 2, microbatch.Options{})
	require.ErrorContains(t, err, "already exchanges tensors")
	require.Equal(t, before, m.String())
}
