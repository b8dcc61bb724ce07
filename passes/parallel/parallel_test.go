package parallel_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// f64 models without batch normalisation or dropout: an MLP, a CNN with a
// flatten, and an attention block whose reshapes fold the batch into rows
// (dropout and batch norm would draw masks and statistics per rank, as in
// PyTorch's DDP).
var models = map[string]string{
	"mlp": passtest.ReadFile("../../testdata/steps/mlp_f64.kir"),
	"cnn": `func @cnn(%x: f64[4,2,8,8], %w: f64[4,2,3,3] {param}, %fw: f64[64,5] {param}) -> (f64[4,5]) {
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f64[4,4,8,8]
  %r = relu(%c) : f64[4,4,8,8]
  %p = max_pool2d(%r) {kernel = [2, 2], strides = [2, 2]} : f64[4,4,4,4]
  %f = reshape(%p) {shape = [4, 64]} : f64[4,64]
  %y = matmul(%f, %fw) : f64[4,5]
  return %y
}`,
	"attention": passtest.ReadFile("../../testdata/steps/attention_f64.kir"),
}

// TestDataParallelEqualsOneDevice: for sum and mean losses, with and
// without an optimizer, plain, with ZeRO stages 1, 2 and 3 and with each
// rank accumulating two microbatches, every rank's
// loss and gradients, and the updated parameters and optimizer state
// (joined from the ranks' parts under ZeRO), equal the one-device step's. Error
// model: the ranks' partial sums are added in another order, in f64 over
// a few hundred terms: 1e-12 relative.
func TestDataParallelEqualsOneDevice(t *testing.T) {
	for name, src := range models {
		for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean}", "autodiff{loss=mean},optimizer{kind=adam}", "autodiff{loss=sum},optimizer{kind=momentum}", "autodiff{loss=sum},optimizer{kind=sgd}", "autodiff{loss=mean},optimizer{kind=adam,placement=end}"} {
			for _, spec := range []string{"dp=2", "dp=4", "dp=2,zero=1", "dp=4,zero=1", "dp=2,zero=2", "dp=4,zero=3", "dp=2,microbatches=2", "dp=2,zero=3,microbatches=2", "dp=2,zero=1,microbatches=2"} {
				n := 2
				if strings.HasPrefix(spec, "dp=4") {
					n = 4
				}
				t.Run(fmt.Sprintf("%s/%s/%s", name, pipe, spec), func(t *testing.T) {
					require.Equal(t, n, equalsOneDevice(t, src, pipe, spec, 3))
				})
			}
		}
	}
}

// TestDataParallelDividesActivations: each rank holds 1/n of the batch's
// activations; parameters and gradients stay whole (no ZeRO).
func TestDataParallelDividesActivations(t *testing.T) {
	m := passtest.Parse(t, models["mlp"])
	passtest.Run(t, m, "autodiff")
	whole := passtest.Clone(t, m)
	passtest.Run(t, m, "parallel{dp=4}")
	var inWhole, inRank int64
	for i, a := range m.Funcs[0].Args {
		inWhole += whole.Funcs[0].Args[i].Type.SizeBytes()
		inRank += a.Type.SizeBytes()
	}
	require.Less(t, inRank, inWhole)
	require.Equal(t, whole.Funcs[0].Args[0].Type.SizeBytes()/4, m.Funcs[0].Args[0].Type.SizeBytes())
}

// TestZeroShardsParametersAndState: under ZeRO-3 on 4 ranks each rank
// holds a quarter of every parameter and of Adam's moments, receives a
// quarter of each gradient (reduce_scatter), and gathers each parameter
// once for the forward and once for the backward.
func TestZeroShardsParametersAndState(t *testing.T) {
	m := passtest.Parse(t, models["mlp"])
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam}")
	whole := passtest.Clone(t, m).Funcs[0]
	passtest.Run(t, m, "parallel{dp=4,zero=3}")
	f := m.Funcs[0]
	kinds := map[string]int{}
	for _, op := range f.Body {
		kinds[op.Kind]++
	}
	// w1 [6,16], b1 [16], w2 [16,3]: each is held in quarters of its first
	// dimension that 4 divides (w1's second).
	require.Equal(t, 3, kinds["reduce_scatter"], "every gradient")
	require.Equal(t, 1, kinds["all_reduce"], "the loss")
	for i, a := range f.Args {
		w := whole.Args[i]
		if a.Arg.Kind == ir.ArgData || a.Type.Rank() == 0 {
			continue // the batch, the learning rate and the step count
		}
		require.Equal(t, w.Type.SizeBytes()/4, a.Type.SizeBytes(), "%s", a.Name)
	}
	require.Equal(t, 4, kinds["all_gather"], "w1 and b1 gathered for the forward only (the backward reads neither), w2 for the forward and the backward")
}

// TestZeroStageOneKeepsGradientsWhole: ZeRO-1 shards the optimizer state
// as ZeRO-2 does, but every gradient stays whole until the backward ends
// (the reduce_scatters and the updates come last), so a rank's peak is
// never below ZeRO-2's and its state is the same quarter.
func TestZeroStageOneKeepsGradientsWhole(t *testing.T) {
	plan := func(zero int) *ir.Func {
		m := passtest.Parse(t, models["mlp"])
		passtest.Run(t, m, fmt.Sprintf("autodiff{loss=sum},optimizer{kind=adam},parallel{dp=4,zero=%d}", zero))
		return m.Funcs[0]
	}
	one, two := plan(1), plan(2)
	tail := false
	for _, op := range one.Body {
		if op.Kind == "reduce_scatter" {
			tail = true
			continue
		}
		if tail && op.Kind != "reduce_scatter" {
			require.NotEmpty(t, op.Def().Writes, "%s after the gradients are reduced", op.Kind)
		}
	}
	require.True(t, tail, "no reduce_scatter")
	a, b := liveness.Analyze(one), liveness.Analyze(two)
	require.Equal(t, b.StateBytes, a.StateBytes)
	require.GreaterOrEqual(t, a.Peak, b.Peak)
}

// TestGradientsAllReduceInBuckets: the loss and the MLP's three
// gradients (f64: 4, 384, 128 and 768 bytes in the order the backward
// makes them) share one all_reduce in a 25 MiB bucket; with bucket=0 each
// has its own; with 600-byte buckets, {loss, w2's, b1's} and {w1's}.
func TestGradientsAllReduceInBuckets(t *testing.T) {
	count := func(pipe string) int {
		m := passtest.Parse(t, models["mlp"])
		passtest.Run(t, m, pipe)
		n := 0
		for _, op := range m.Funcs[0].Body {
			if op.Kind == "all_reduce" {
				n++
			}
		}
		return n
	}
	require.Equal(t, 1, count("autodiff,optimizer{kind=sgd,placement=end},parallel{dp=2}"))
	require.Equal(t, 4, count("autodiff,optimizer{kind=sgd,placement=end},parallel{dp=2,bucket=0}"))
	require.Equal(t, 2, count("autodiff,optimizer{kind=sgd,placement=end},parallel{dp=2,bucket=600}"))
}

// TestSyncBatchNormEqualsOneDevice: with batch normalisation in training
// mode, the ranks' step (statistics and their gradients' sums all-reduced)
// equals the one-device step in f64 within 1e-12, loss, gradients and
// updated parameters; with sync-bn=false each rank normalises by its own
// statistics and the loss differs, as under DDP.
func TestSyncBatchNormEqualsOneDevice(t *testing.T) {
	src := `func @bn(%x: f64[8,3,4,4], %w: f64[4,3,3,3] {param}, %g: f64[4] {param}, %b: f64[4] {param}, %m: f64[4] {state}, %v: f64[4] {state}, %fw: f64[64,2] {param}) -> (f64[8,2]) {
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f64[8,4,4,4]
  %n, %rm, %rv, %sm, %si = batch_norm_train(%c, %g, %b, %m, %v) {epsilon = 1e-05, momentum = 0.9} : f64[8,4,4,4], f64[4], f64[4], f64[4], f64[4]
  %r = tanh(%n) : f64[8,4,4,4]
  %f = reshape(%r) {shape = [8, 64]} : f64[8,64]
  %y = matmul(%f, %fw) : f64[8,2]
  return %y
}`
	for _, spec := range []string{"dp=2", "dp=4", "dp=2,zero=2"} {
		t.Run(spec, func(t *testing.T) {
			equalsOneDevice(t, src, "autodiff{loss=mean},optimizer{kind=momentum}", spec, 4)
		})
	}
	m := passtest.Parse(t, src)
	passtest.Run(t, m, "autodiff{loss=mean}")
	whole := m.Funcs[0]
	local := passtest.Clone(t, m)
	require.ErrorContains(t, passtest.RunErr(passtest.Clone(t, m), "parallel{dp=2,sync-bn=false}"), "--allow per-slice-bn")
	passtest.RunAllowing(t, local, "parallel{dp=2,sync-bn=false}", passes.PerSliceBN)
	args := interp.RandomArgs(whole, 4)
	want, err := interp.Run(whole, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	parts, err := parallel.ShardValues(local.Funcs[0], args)
	require.NoError(t, err)
	got, _, err := interp.RunRanks(local.Funcs[0], parts, interp.Options{})
	require.NoError(t, err)
	require.Greater(t, passtest.RelErr(got[0][0], want[0]), 1e-6, "each rank's own statistics change the loss")
}

// equalsOneDevice builds src's step with pipe, partitions a copy with
// parallel{spec}, runs both on the arguments drawn from seed and requires
// every rank's results, and the updated arguments joined from the ranks,
// within 1e-12 of the one-device step's (f64: the ranks' sums are added in
// another order). It returns the number of ranks.
func equalsOneDevice(t *testing.T, src, pipe, spec string, seed uint64) int {
	return equalsOneDeviceWithin(t, passtest.Parse(t, src), pipe, spec, seed, 1e-12)
}

// equalsOneDeviceWithin is equalsOneDevice on module m within tol.
func equalsOneDeviceWithin(t *testing.T, m *ir.Module, pipe, spec string, seed uint64, tol float64) int {
	t.Helper()
	passtest.Run(t, m, pipe)
	whole := m.Funcs[0]
	sharded := passtest.Clone(t, m)
	passtest.Run(t, sharded, "parallel{"+spec+"}")
	f := sharded.Funcs[0]
	args := interp.RandomArgs(whole, seed)
	want, wantArgs, err := interp.RunWithUpdates(whole, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	parts, err := parallel.ShardValues(f, args)
	require.NoError(t, err)
	got, gotArgs, err := interp.RunRanks(f, parts, interp.Options{})
	require.NoError(t, err)
	for r := range got {
		for i := range want {
			require.LessOrEqual(t, passtest.RelErr(got[r][i], want[i]), tol, "rank %d, result %s", r, whole.ResultName(i))
		}
	}
	joined := parallel.JoinValues(f, gotArgs)
	for i, a := range whole.Args {
		if a.Arg.InOut {
			require.LessOrEqual(t, passtest.RelErr(joined[i], wantArgs[i]), tol, "updated %s", a.Name)
		}
	}
	return parallel.RanksOf(f)
}

// TestTensorParallelEqualsOneDevice: Megatron splits of an MLP and of two
// transformer MLP blocks (layer norms, GELU, residuals) on 2 and 4 ranks,
// and on a mesh of 2 × 2 ranks with data parallelism beside them (ZeRO 1
// to 3 sharding the split weights' parts further, or buckets), with and
// without optimizers, give every rank the one-device loss and
// gradients, and the updated weights and optimizer state joined from the
// ranks' parts equal the one-device step's. Error model: as the data
// parallel test (partial products summed in another order, f64): 1e-12.
func TestTensorParallelEqualsOneDevice(t *testing.T) {
	blocks := passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	for name, src := range map[string]string{"mlp": models["mlp"], "blocks": blocks, "expanded": expandBiases(t, blocks)} {
		for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean},optimizer{kind=adam}", "autodiff{loss=sum},optimizer{kind=momentum,placement=end}"} {
			for _, spec := range []string{"tp=2", "tp=4", "dp=2,tp=2", "dp=2,tp=2,zero=1", "dp=2,tp=2,zero=2", "dp=2,tp=2,zero=3", "dp=2,tp=2,bucket=0"} {
				t.Run(fmt.Sprintf("%s/%s/%s", name, pipe, spec), func(t *testing.T) {
					n := 2
					if spec != "tp=2" {
						n = 4
					}
					require.Equal(t, n, equalsOneDevice(t, src, pipe, spec, 5))
				})
			}
		}
	}
}

// expandBiases broadcasts the first linear biases of the MLP blocks by
// expand: to the whole activation, and to a shape with ones before the
// split dimension.
func expandBiases(t *testing.T, blocks string) string {
	expanded := strings.NewReplacer(
		"%hb1 = add(%h1, %b1)", "%e1 = expand(%b1) {shape = [4, 5, 16]} : f64[4,5,16]\n  %hb1 = add(%h1, %e1)",
		"%hb2 = add(%h2, %b3)", "%e3 = expand(%b3) {shape = [1, 1, 16]} : f64[1,1,16]\n  %hb2 = add(%h2, %e3)").Replace(blocks)
	require.NotEqual(t, blocks, expanded)
	return expanded
}

// TestTensorParallelIsMegatron: on two MLP blocks with Adam, tp=2 splits
// W1 (and b1) by columns and W2 by rows, and communicates exactly as
// Megatron-LM does: one all_reduce per block forward (after the row
// product) and one backward (the input gradient of the column product),
// and nothing else; each rank holds half of the split weights and their
// moments.
func TestTensorParallelIsMegatron(t *testing.T) {
	blocks := passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	for _, src := range []string{blocks, expandBiases(t, blocks)} {
		isMegatron(t, src, 4, map[string][2]int64{"w1": {1, 1}, "b1": {0, 1}, "w2": {0, 1}, "w3": {1, 1}, "b3": {0, 1}, "w4": {0, 1}})
	}
}

// isMegatron splits src's Adam step over 2 tensor-parallel ranks and
// requires allReduces all_reduces, nothing gathered, and each weight named
// in cuts (or its Adam moments) split along its dimension in its number
// of segments, half of it on each rank; every other argument stays whole.
func isMegatron(t *testing.T, src string, allReduces int, cuts map[string][2]int64) {
	t.Helper()
	m := passtest.Parse(t, src)
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam}")
	whole := passtest.Clone(t, m).Funcs[0]
	passtest.Run(t, m, "parallel{tp=2}")
	f := m.Funcs[0]
	kinds := map[string]int{}
	for _, op := range f.Body {
		kinds[op.Kind]++
	}
	require.Equal(t, allReduces, kinds["all_reduce"])
	require.Zero(t, kinds["all_gather"])
	for i, a := range f.Args {
		cut, ok := cuts[strings.TrimPrefix(strings.TrimPrefix(a.Name, "adam.m."), "adam.v.")]
		levels, err := ir.ShardLevels(f, a)
		require.NoError(t, err)
		if !ok {
			require.Empty(t, levels, "%s stays whole", a.Name)
			continue
		}
		require.Len(t, levels, 1, a.Name)
		require.Equal(t, cut, [2]int64{levels[0].Dim, levels[0].Segments()}, a.Name)
		require.Equal(t, whole.Args[i].Type.SizeBytes()/2, a.Type.SizeBytes(), a.Name)
	}
}

// TestTensorParallelOnAPyTorchExport: PyTorch's export of two MLP blocks
// (nn.Linear as reshape, gemm and reshape; scripts/export_mlp_blocks.py)
// gets Megatron's splits and its four all_reduces, and on 2 × 2 ranks with
// ZeRO-2 equals one device in f32 within 1e-5 (the bound: partial
// products summed in another order, a few dozen terms).
func TestTensorParallelOnAPyTorchExport(t *testing.T) {
	load := func() *ir.Module {
		m, err := onnx.ImportFile("../../testdata/parallel/mlp_blocks.onnx", onnx.Options{})
		require.NoError(t, err)
		return m
	}
	m := load()
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam},parallel{tp=2}")
	n := 0
	for _, op := range m.Funcs[0].Body {
		if op.Kind == "all_reduce" {
			n++
		}
		require.NotEqual(t, "all_gather", op.Kind)
	}
	require.Equal(t, 4, n)
	require.Equal(t, 4, equalsOneDeviceWithin(t, load(), "autodiff{loss=sum},optimizer{kind=adam}", "dp=2,tp=2,zero=2", 3, 1e-5))
}

// TestPartitionLeavesFAloneOnError: a plan that fails after tensor
// parallelism rewrote the step (a batch of 4 that dp=3 cannot divide)
// leaves the step as it was, ranks attribute included.
func TestPartitionLeavesFAloneOnError(t *testing.T) {
	m := passtest.Parse(t, passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir"))
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam}")
	f := m.Funcs[0]
	before := f.String()
	for _, p := range []parallel.Plan{{DP: 3, TP: 2}, {DP: 1, TP: 3}, {DP: 2, TP: 2, Zero: 2, Microbatches: 3}} {
		_, err := parallel.Partition(f, p)
		require.Error(t, err, "%+v", p)
		require.Equal(t, before, f.String(), "%+v: %v", p, err)
	}
	_, err := parallel.Partition(f, parallel.Plan{DP: 2, TP: 2, Zero: 2})
	require.NoError(t, err)
	require.NotEqual(t, before, f.String())
}
