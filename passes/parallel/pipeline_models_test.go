package parallel_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes/microbatch"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestPipelineOnCIModels: ResNet-50, BERT and GPT-2 at CI size, with
// Adam, cut into 2 stages of 2 microbatches (and 4 stages without), equal
// the one-device step split into the same microbatches, exactly: every
// stage computes its ops as one device does, on the same values, and the
// slices' sums are added in the same order. (With microbatches, batch
// normalisation takes each slice's statistics, allowed by name, as under
// microbatch{n} with per-slice-bn: the reference is that step; dropout
// draws the whole batch's masks in both.)
func TestPipelineOnCIModels(t *testing.T) {
	if testing.Short() {
		t.Skip("model-scale")
	}
	for _, name := range []string{"resnet50_ci", "bert_base_ci", "gpt2_small_ci"} {
		for _, pm := range [][2]int{{2, 2}, {4, 1}} {
			t.Run(fmt.Sprintf("%s/pp=%d,m=%d", name, pm[0], pm[1]), func(t *testing.T) {
				m, err := onnx.ImportFile("../../testdata/models/ci/"+name+".onnx", onnx.Options{})
				require.NoError(t, err)
				passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam}")
				whole := m.Funcs[0]
				start := time.Now()
				stages, st, err := parallel.PipelinePlan(whole, parallel.Plan{DP: 1, PP: pm[0], Microbatches: pm[1], LocalBN: true})
				if name == "resnet50_ci" && pm[1] > 1 {
					// Each microbatch would update the running statistics
					// in turn: refused, naming them.
					require.ErrorContains(t, err, "running statistic")
					return
				}
				require.NoError(t, err)
				cut := time.Since(start)
				ref := passtest.Clone(t, m).Funcs[0]
				if pm[1] > 1 {
					_, err := microbatch.SplitWith(ref, pm[1], microbatch.Options{PerSliceBN: true})
					require.NoError(t, err)
				}
				args := interp.RandomArgs(whole, 3)
				want, wantArgs, err := interp.RunWithUpdates(ref, interp.CloneAll(args), interp.Options{})
				require.NoError(t, err)
				parts, err := parallel.StageValues(stages, whole.Args, interp.CloneAll(args))
				require.NoError(t, err)
				res, finals, err := interp.RunPrograms(stages, parts, interp.Options{})
				require.NoError(t, err)
				got, gotArgs := parallel.JoinStages(stages, whole.Args, args, res, finals)
				for i := range want {
					require.Zero(t, passtest.RelErr(got[i], want[i]), "result %s", whole.ResultName(i))
				}
				for i, a := range whole.Args {
					if a.Arg.InOut {
						require.Zero(t, passtest.RelErr(gotArgs[i], wantArgs[i]), "updated %s", a.Name)
					}
				}
				t.Logf("%d ops cut in %v; %d sends, %d bytes; step %.3g s, busy %v, bubble %.2f; 1F1B %v", len(whole.Body), cut, st.Sends, st.SentBytes, st.Step, st.Busy, st.Bubble(), st.Interleave)
			})
		}
	}
}

// TestTensorParallelOnCIModels: BERT and GPT-2 at CI size, with SGD,
// split by Megatron's pattern over 2 ranks (attention by heads, MLPs,
// each dropout drawing its part of the one-device mask) equal the
// one-device step in f32 within 1e-5 (partial products summed in another
// order, unit roundoff 6e-8 over sums of at most a few thousand terms);
// GPT-2 also in 2 pipeline stages of 2 tensor-parallel ranks each, within
// 1e-4: f32 sums over the widest contraction (128) and the batch's rows
// (32), compounded over the backward of 2 layers, have a worst case of
// 4 · 128 · 32 · u ≈ 1e-3 and a random-sign estimate of √16384 · u ≈ 8e-6,
// which measured errors reach (1.04e-5 on one updated norm weight).
// (With microbatches too, a dropout inside a split block draws the whole
// batch's mask and each slice takes its rows, while one outside draws
// the slice's own, as under microbatch{n}: that step is neither the
// one-device step nor the microbatched one, so it is compared on models
// without dropout, TestPipelineWithTensorParallelism.) (Adam's first
// step divides each gradient by its own magnitude: a gradient near zero
// turns its roundoff into a different update, which no relative bound on
// the parameters can hold; SGD's update is linear in the gradient.)
func TestTensorParallelOnCIModels(t *testing.T) {
	if testing.Short() {
		t.Skip("model-scale")
	}
	for _, name := range []string{"bert_base_ci", "gpt2_small_ci"} {
		t.Run(name, func(t *testing.T) {
			m, err := onnx.ImportFile("../../testdata/models/ci/"+name+".onnx", onnx.Options{})
			require.NoError(t, err)
			require.Equal(t, 2, equalsOneDeviceWithin(t, m, "autodiff{loss=sum},optimizer{kind=sgd}", "tp=2", 3, 1e-5))
		})
	}
	// The 4-rank target: dp=2 with ZeRO-2 beside tp=2, the ranks
	// drawing their rows of the one-device dropout masks.
	t.Run("gpt2_small_ci/dp=2,tp=2,zero=2", func(t *testing.T) {
		m, err := onnx.ImportFile("../../testdata/models/ci/gpt2_small_ci.onnx", onnx.Options{})
		require.NoError(t, err)
		require.Equal(t, 4, equalsOneDeviceWithin(t, m, "autodiff{loss=sum},optimizer{kind=sgd}", "dp=2,tp=2,zero=2,exact-dropout=true", 3, 1e-5))
	})
	t.Run("gpt2_small_ci/pp=2,tp=2", func(t *testing.T) {
		m, err := onnx.ImportFile("../../testdata/models/ci/gpt2_small_ci.onnx", onnx.Options{})
		require.NoError(t, err)
		passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=sgd}")
		pipelineEquals(t, m.Funcs[0], m.Funcs[0], parallel.Plan{DP: 1, TP: 2, PP: 2, Microbatches: 1}, 1e-4)
	})
}

// TestResNetOnFourRanks: the 4-rank numerics target for
// ResNet-50, in f64 (batch 4, 32x32, exported in f64 by
// scripts/export_ci.py). A CNN has no blocks to split by tensor
// parallelism, so its 4 ranks are data parallel with ZeRO-2, batch
// normalisation taking the whole batch's statistics (sync-bn). SGD,
// because Adam's first step divides each gradient by its own magnitude,
// which no relative bound holds for a gradient near zero.
//
// Error model: the ranks compute what one device does with its sums over
// the batch in another order. So does one device given the batch in
// another order (rotated by one row), which changes nothing mathematically: that
// step's distance from the first, per result and per parameter's update
// (updated − initial, so that the learning rate does not scale the error
// away), is the floor of summation order for that value, measured here.
// Each value of the 4 ranks must be within passtest.OrderBound of its own
// floor. (In f64 the updates' floors reach 2.4e-12 for ResNet-50: the
// first layers' gradients pass through 53 batch norms whose backward
// cancels. The loss's is 2.8e-14.)
// Its pipeline target (pp=2, microbatches) is TestPipelineOnCIModels':
// microbatches take their own statistics.
func TestResNetOnFourRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("model-scale")
	}
	m, err := onnx.ImportFile("../../testdata/models/ci/resnet50_ci_f64.onnx", onnx.Options{})
	require.NoError(t, err)
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=sgd}")
	whole := m.Funcs[0]
	args := interp.RandomArgs(whole, 3)
	wantRes, want, floors := passtest.OrderFloor(t, whole, args, "input")
	require.Positive(t, floors.Max(), "the rotated batch changed no sum")

	sharded := passtest.Clone(t, m)
	passtest.Run(t, sharded, "parallel{dp=4,zero=2}")
	f := sharded.Funcs[0]
	require.Equal(t, 4, parallel.RanksOf(f))
	parts, err := parallel.ShardValues(f, args)
	require.NoError(t, err)
	gotRes, gotArgs, err := interp.RunRanks(f, parts, interp.Options{})
	require.NoError(t, err)
	joined := parallel.JoinValues(f, gotArgs)
	worst := 0.0 // the largest error over its bound
	for r := range gotRes {
		for i := range wantRes {
			e, bound := passtest.RelErr(gotRes[r][i], wantRes[i]), passtest.OrderBound(floors.Results[i])
			worst = max(worst, e/bound)
			require.LessOrEqual(t, e, bound, "rank %d, result %s", r, whole.ResultName(i))
		}
	}
	for i, a := range whole.Args {
		if a.Arg.InOut {
			e, bound := passtest.UpdateErr(joined[i], want[i], args[i]), passtest.OrderBound(floors.Updates[i])
			worst = max(worst, e/bound)
			require.LessOrEqual(t, e, bound, "update of %s", a.Name)
		}
	}
	t.Logf("floors up to %.3g; 4 ranks at worst %.3g of their bounds", floors.Max(), worst)
}

// TestPipelineTargetsOnCIModels: the pipeline target, pp=2 with
// microbatches. GPT-2 (f32, SGD, batch 2) in 2 stages of 2 microbatches
// equals the one-device step itself, unsplit: each slice draws its rows of
// the whole batch's dropout masks, and the slices' gradients are summed in
// another order (f32 sums of two terms per slice boundary over the
// backward of 2 layers, as in TestTensorParallelOnCIModels: bound 1e-5).
// (ResNet's pipeline target is TestPipelineOnCIModels' at 64x64: the f64
// model's 32x32 images leave layer4 1x1, so a microbatch of one sample
// normalises single values and no gradient reaches the earlier layers.)
func TestPipelineTargetsOnCIModels(t *testing.T) {
	if testing.Short() {
		t.Skip("model-scale")
	}
	t.Run("gpt2_small_ci/pp=2,m=2", func(t *testing.T) {
		m, err := onnx.ImportFile("../../testdata/models/ci/gpt2_small_ci.onnx", onnx.Options{})
		require.NoError(t, err)
		passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=sgd}")
		pipelineEquals(t, m.Funcs[0], m.Funcs[0], parallel.Plan{DP: 1, PP: 2, Microbatches: 2}, 1e-5)
	})
}
