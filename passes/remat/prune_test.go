package remat

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passtest"
)

// convBN is two conv-bn-relu layers with a pooled loss: a training step
// whose lowest peak is reached by recomputing the first layer's batch
// norm before its gradient, and whose running statistics are updated at
// the end of the step.
const convBN = `func @f(%x: f64[16,2,16,16], %w1: f64[4,2,3,3] {param}, %g1: f64[4] {param}, %b1: f64[4] {param}, %m1: f64[4] {state}, %v1: f64[4] {state}, %w2: f64[4,4,3,3] {param}, %g2: f64[4] {param}, %b2: f64[4] {param}, %m2: f64[4] {state}, %v2: f64[4] {state}) -> (f64[]) {
  %c1 = conv2d(%x, %w1) {pads = [1, 1, 1, 1]} : f64[16,4,16,16]
  %n1, %rm1, %rv1, %sm1, %si1 = batch_norm_train(%c1, %g1, %b1, %m1, %v1) {epsilon = 1e-05, momentum = 0.9} : f64[16,4,16,16], f64[4], f64[4], f64[4], f64[4]
  %r1 = relu(%n1) : f64[16,4,16,16]
  %c2 = conv2d(%r1, %w2) {pads = [1, 1, 1, 1]} : f64[16,4,16,16]
  %n2, %rm2, %rv2, %sm2, %si2 = batch_norm_train(%c2, %g2, %b2, %m2, %v2) {epsilon = 1e-05, momentum = 0.9} : f64[16,4,16,16], f64[4], f64[4], f64[4], f64[4]
  %r2 = relu(%n2) : f64[16,4,16,16]
  %p = max_pool2d(%r2) {kernel = [2, 2], strides = [2, 2]} : f64[16,4,8,8]
  %loss = reduce_sum(%p) : f64[]
  return %loss
}
`

// TestSavedSetKeepsStatistics: the saved-set selection recomputes a
// batch norm's output where that lowers the peak, but not its statistics
// alone (a reduction over the whole activation, to save a few bytes):
// every recomputed batch_norm_train has its normalised output read. The
// step stays bit-identical and its peak no higher than the unpruned plan's
// allowance.
func TestSavedSetKeepsStatistics(t *testing.T) {
	step := trainingStep(t, convBN)
	f := passtest.Parse(t, step).Funcs[0]
	before := liveness.Analyze(f).Peak
	res := SelectSaved(f)
	require.Less(t, res.Peak, before, "the selection should lower this step's peak")
	reads := map[string]bool{}
	for _, op := range f.Body {
		for _, u := range op.Operands {
			reads[u.Name] = true
		}
	}
	recomputed := 0
	for _, op := range f.Body {
		if op.Kind == "batch_norm_train" && op.Attr().Bool("recomputed") {
			recomputed++
			require.True(t, reads[op.Results[0].Name], "%s: a batch norm recomputed for its statistics alone\n%s", op.Results[0].Name, f)
		}
	}
	require.Positive(t, recomputed, "the first batch norm should be recomputed\n%s", f)
	passtest.Equivalent(t, passtest.Parse(t, step).Funcs[0], f, 0, 1, 2)
}

// TestPruneRestoresOnlyWithinTarget: prune on a plan that recomputes
// everything it can saves values again only while the peak stays at or
// below the target, and the result computes the same.
func TestPruneRestoresOnlyWithinTarget(t *testing.T) {
	step := trainingStep(t, convBN)
	for _, slack := range []int64{0, 64, 1 << 20} {
		f := passtest.Parse(t, step).Funcs[0]
		cheapOnly(f, 0)
		lowest := liveness.Analyze(f).Peak
		before := recomputeFLOPs(f)
		changed := prune(f, lowest+slack)
		require.LessOrEqual(t, liveness.Analyze(f).Peak, lowest+slack)
		if changed {
			require.Less(t, recomputeFLOPs(f), before)
		}
		passtest.Equivalent(t, passtest.Parse(t, step).Funcs[0], f, 0, 1, 2)
		if slack == 1<<20 {
			for _, op := range f.Body {
				require.True(t, !op.Attr().Bool("recomputed") || fusesAway(op), "with room to spare only ops that fuse away stay recomputed: %s", op.Kind)
			}
		}
	}
}

// TestOriginalNames: copies' names map back to their originals, and
// nothing else does.
func TestOriginalNames(t *testing.T) {
	for in, want := range map[string]string{"x.remat": "x", "x.remat.3": "x", "a.4.remat.2": "a.4", "x.3": "x.3", ".remat": ".remat", "x.rematt": "x.rematt", "y": "y"} {
		require.Equal(t, want, originalName(in), in)
	}
}

// TestPruneKeepsOriginalsBeforeReaders: a copy placed before its original
// (a plan reordered by hand) keeps its readers: reading the original
// there would read it before it is defined.
func TestPruneKeepsOriginalsBeforeReaders(t *testing.T) {
	const src = `func @f(%a: f64[8,8], %w: f64[8,8], %b: f64[8,8]) -> (f64[8,8]) {
  %y.remat = matmul(%a, %w) {recomputed = true} : f64[8,8]
  %z = matmul(%y.remat, %b) : f64[8,8]
  %y = matmul(%a, %w) : f64[8,8]
  %q = add(%y, %z) : f64[8,8]
  return %q
}
`
	m := passtest.Parse(t, src)
	require.False(t, prune(m.Funcs[0], 1<<30))
	require.NoError(t, ir.Verify(m))
}
