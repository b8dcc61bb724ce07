package parallel_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// attentions are multi-head attention blocks (2 heads): separate query,
// key and value projections with heads cut from the width, and PyTorch's
// nn.MultiheadAttention layout (a fused projection sliced in three, heads
// folded into the batch).
var attentions = map[string]string{
	"separate": passtest.ReadFile("../../testdata/steps/mha_f64.kir"),
	"fused":    passtest.ReadFile("../../testdata/steps/mha_fused_f64.kir"),
}

// TestTensorParallelAttentionEqualsOneDevice: attention split by heads
// on 2 ranks (a head each), alone and beside data parallelism with ZeRO,
// with and without optimizers, equals the one-device step (error model
// of TestTensorParallelEqualsOneDevice: 1e-12 in f64). Over 4 ranks the
// 2 heads do not split: an error, not a plan that gathers the weights.
func TestTensorParallelAttentionEqualsOneDevice(t *testing.T) {
	for name, src := range attentions {
		m := passtest.Parse(t, src)
		err := passtest.RunErr(m, "autodiff{loss=sum},parallel{tp=4}")
		require.ErrorContains(t, err, "no block splits over 4 ranks", name)
		specs := []string{"tp=2", "dp=2,tp=2", "dp=2,tp=2,zero=2", "dp=2,tp=2,zero=3"}
		if name == "fused" {
			specs = specs[:1] // its first dimension is the sequence, which dp does not split
		}
		for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean},optimizer{kind=adam}"} {
			for _, spec := range specs {
				t.Run(fmt.Sprintf("%s/%s/%s", name, pipe, spec), func(t *testing.T) {
					equalsOneDevice(t, src, pipe, spec, 7)
				})
			}
		}
	}
}

// TestTensorParallelAttentionIsMegatron: with a head per rank, the
// attention block communicates as Megatron-LM's does: one all_reduce
// forward (after the output projection) and one backward (the input
// gradient of the query, key and value projections, summed before it is
// reduced), nothing gathered; the projections are split by heads (the
// fused one in each of its three segments) and the output projection by
// rows.
func TestTensorParallelAttentionIsMegatron(t *testing.T) {
	cuts := map[string]map[string][2]int64{ // dimension and segments of each split weight
		"separate": {"wq": {1, 1}, "bq": {0, 1}, "wk": {1, 1}, "wv": {1, 1}, "bv": {0, 1}, "wo": {0, 1}},
		"fused":    {"w": {0, 3}, "b": {0, 3}, "wo": {1, 1}},
	}
	for name, src := range attentions {
		t.Run(name, func(t *testing.T) { isMegatron(t, src, 2, cuts[name]) })
	}
}

// TestTensorParallelBreadthZoo splits every breadth-zoo model's Adam step
// over 2 tensor-parallel ranks. A model either has no block to split (an
// error saying so) or is split with nothing gathered (every split block
// communicates by all_reduce only, Megatron's pattern) and equals the
// one-device step in f32 within 1e-5 (partial products summed in
// another order over a few dozen terms, unit roundoff 6e-8). How many
// split is a floor: the transformers of the zoo (attention and MLP
// blocks), and a ConvNeXt's MLP.
func TestTensorParallelBreadthZoo(t *testing.T) {
	paths, _ := filepath.Glob("../../testdata/models/breadth/*/model.onnx")
	require.GreaterOrEqual(t, len(paths), 25)
	var split []string
	for _, path := range paths {
		name := filepath.Base(filepath.Dir(path))
		load := func() *ir.Module {
			m, err := onnx.ImportFile(path, onnx.Options{Batch: 2})
			require.NoError(t, err, name)
			return m
		}
		m := load()
		err := passtest.RunErr(m, "autodiff,optimizer{kind=adam},parallel{tp=2}")
		if err != nil {
			require.ErrorContains(t, err, "no block splits over 2 ranks", name)
			continue
		}
		split = append(split, name)
		for _, op := range m.Funcs[0].Body {
			require.NotEqual(t, "all_gather", op.Kind, "%s: %s", name, op.Results)
		}
		t.Run(name, func(t *testing.T) { equalsOneDeviceWithin(t, load(), "autodiff,optimizer{kind=adam}", "tp=2", 1, 1e-5) })
	}
	t.Logf("%d of %d models split: %v", len(split), len(paths), split)
	require.GreaterOrEqual(t, len(split), 8)
}

// TestTensorParallelWithMicrobatches: each rank of a tensor-parallel
// group (alone, or on a dp × tp mesh with ZeRO-2) runs its part of the
// batch as microbatches, the tensor-parallel all_reduces inside each
// slice, and the step equals one device (error model of
// TestTensorParallelEqualsOneDevice: 1e-12 in f64).
func TestTensorParallelWithMicrobatches(t *testing.T) {
	blocks := passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	cases := map[string][]string{
		"blocks":    {"tp=2,microbatches=2", "tp=2,microbatches=4", "dp=2,tp=2,microbatches=2", "dp=2,tp=2,zero=2,microbatches=2"},
		"attention": {"tp=2,microbatches=2"},
	}
	srcs := map[string]string{"blocks": blocks, "attention": attentions["separate"]}
	for name, specs := range cases {
		for _, spec := range specs {
			for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean},optimizer{kind=adam}"} {
				t.Run(fmt.Sprintf("%s/%s/%s", name, spec, pipe), func(t *testing.T) { equalsOneDevice(t, srcs[name], pipe, spec, 5) })
			}
		}
	}
}

// TestPipelineWithTensorParallelism: pipeline stages whose ranks split
// MLP and attention blocks by Megatron's pattern (tp=2 per stage, and
// beside dp=2 with ZeRO-2: 8 ranks), with 1 and 2 microbatches and Adam,
// equal one device (f64, 1e-12: microbatches and partial products sum in
// another order). A stage runs on dp × tp ranks and sends to the same
// rank of the other stage.
func TestPipelineWithTensorParallelism(t *testing.T) {
	blocks := passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	for name, src := range map[string]string{"blocks": blocks, "attention": attentions["separate"]} {
		for _, plan := range []parallel.Plan{{DP: 1, TP: 2, PP: 2, Microbatches: 1}, {DP: 1, TP: 2, PP: 2, Microbatches: 2}, {DP: 2, TP: 2, PP: 2, Zero: 2, Microbatches: 1}} {
			t.Run(fmt.Sprintf("%s/dp=%d,tp=%d,m=%d", name, plan.DP, plan.TP, plan.Microbatches), func(t *testing.T) {
				mod := passtest.Parse(t, src)
				passtest.Run(t, mod, "autodiff{loss=mean},optimizer{kind=adam}")
				stages, _ := pipelineEquals(t, mod.Funcs[0], mod.Funcs[0], plan, 1e-12)
				tpReduces, splitArgs := 0, 0
				for _, f := range stages {
					require.Equal(t, plan.DP*plan.TP, parallel.RanksOf(f))
					for _, op := range f.Body {
						if ir.IsPointToPoint(op.Kind) {
							require.Equal(t, int64(plan.DP*plan.TP), abs(op.Attrs["offset"].Int), "the same rank of the other stage")
						}
						if op.Kind == "all_reduce" && op.Attrs.Int("stride", 1) == 1 && op.Attrs.Int("size", 0) == int64(plan.TP) {
							tpReduces++
						}
					}
					for _, a := range f.Args {
						if levels, _ := ir.ShardLevels(f, a); len(levels) > 0 && levels[0].Size == int64(plan.TP) && levels[0].Stride == 1 {
							splitArgs++
						}
					}
				}
				require.Positive(t, tpReduces, "the stages' blocks are split")
				require.Positive(t, splitArgs)
			})
		}
	}
}

// withDropout puts dropouts inside the split blocks: after the first
// block's activation (between the two products) and on the attention's
// probabilities.
func withDropout(t *testing.T, src string) string {
	out := strings.NewReplacer(
		"%o1 = matmul(%a1, %w2)", "%d1, %k1 = dropout(%a1) {ratio = 0.25, seed = 11} : f64[4,5,16], bool[4,5,16]\n  %o1 = matmul(%d1, %w2)",
		"%o = matmul(%p, %vt)", "%pd, %pk = dropout(%p) {ratio = 0.25, seed = 12} : f64[2,2,3,3], bool[2,2,3,3]\n  %o = matmul(%pd, %vt)",
	).Replace(src)
	require.NotEqual(t, src, out)
	return out
}

// TestTensorParallelDropout: a dropout inside a split block (between an
// MLP's products, on an attention's probabilities) draws on each rank its
// part of the one-device mask, so the step still equals one device (f64,
// 1e-12), with and without Adam; the blocks stay split, nothing is
// gathered, and each mask's part is taken twice (by the dropout, and by
// its gradient, which autodiff makes to draw the mask again from the
// seed rather than keep it). Beside dp with exact-dropout each rank
// keeps its rows of the whole batch's masks, and the step equals one
// device too.
func TestTensorParallelDropout(t *testing.T) {
	blocks := passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	for name, src := range map[string]string{"blocks": withDropout(t, blocks), "attention": withDropout(t, attentions["separate"])} {
		for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean},optimizer{kind=adam}"} {
			t.Run(name+"/"+pipe, func(t *testing.T) { equalsOneDevice(t, src, pipe, "tp=2", 5) })
		}
		if name == "blocks" {
			// Beside dp, with each rank's rows of the whole batch's masks.
			t.Run("dp=2,tp=2,zero=2,exact-dropout", func(t *testing.T) {
				equalsOneDevice(t, src, "autodiff{loss=mean},optimizer{kind=adam}", "dp=2,tp=2,zero=2,exact-dropout=true", 5)
			})
		}
		m := passtest.Parse(t, src)
		passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam},parallel{tp=2}")
		kinds := map[string]int{}
		for _, op := range m.Funcs[0].Body {
			kinds[op.Kind]++
		}
		require.Zero(t, kinds["all_gather"], name)
		require.Equal(t, 2, kinds["reduce_scatter"], name)
		require.Positive(t, kinds["all_reduce"], name)
	}
}
