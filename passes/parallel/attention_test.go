package parallel_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
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
