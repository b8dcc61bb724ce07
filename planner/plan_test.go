package planner

import (
	"errors"
	"github.com/kiln-compiler/kiln/onnx"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/remat"
	"github.com/kiln-compiler/kiln/passtest"
)

// deepMLP is three tanh layers at batch 256 in f64: recomputation alone
// cannot bring its training step to half its peak.
const deepMLP = `func @deep(%x: f64[256,32], %w0: f64[32,32] {param}, %w1: f64[32,32] {param}, %w2: f64[32,32] {param}) -> (f64[256,32]) {
  %h0 = matmul(%x, %w0) : f64[256,32]
  %a0 = tanh(%h0) : f64[256,32]
  %h1 = matmul(%a0, %w1) : f64[256,32]
  %a1 = tanh(%h1) : f64[256,32]
  %h2 = matmul(%a1, %w2) : f64[256,32]
  %a2 = tanh(%h2) : f64[256,32]
  return %a2
}`

// plan plans src as req asks, verifying after every pass.
func plan(t *testing.T, src string, req Request) (*ir.Module, *Result, error) {
	t.Helper()
	m := passtest.Parse(t, src)
	res, err := Plan(m, req, Session{Inst: passes.Instrumentation{VerifyEach: true}})
	return m, res, err
}

// autodiffed is src's training step (loss sum) and its peak.
func autodiffed(t *testing.T, src string) (*ir.Func, int64) {
	t.Helper()
	m, _, err := plan(t, src, Request{Level: -1, Passes: "autodiff"})
	require.NoError(t, err)
	return m.Funcs[0], liveness.Analyze(m.Funcs[0]).Peak
}

func ran(res *Result, pass string) bool {
	for _, r := range res.Runs {
		if r.Name == pass {
			return true
		}
	}
	return false
}

// TestBudgetSplitsWhenRecomputationCannotReachIt: half the peak of an MLP
// at batch 256 is under what recomputation reaches; the planner splits
// the step into microbatches before remat and says so on remat. Loss and
// gradients stay the whole batch's within 1e-12 in f64 (the slices' sums
// are added in another order); the plan's peak is within the budget.
func TestBudgetSplitsWhenRecomputationCannotReachIt(t *testing.T) {
	whole, peak := autodiffed(t, deepMLP)
	_, err := remat.Rematerialize(whole.Clone(), peak/2, "best")
	require.ErrorContains(t, err, "can't reduce memory below", "recomputation alone cannot")

	m, res, err := plan(t, deepMLP, Request{Train: "sum", Level: 2, Budget: "0.5"})
	require.NoError(t, err)
	require.True(t, ran(res, "microbatch"), "pipeline %s", res.Pipeline)
	require.LessOrEqual(t, liveness.Analyze(m.Funcs[0]).Peak, peak/2)
	notes := strings.Join(res.NotesOf("remat"), "\n")
	require.Contains(t, notes, "recomputation alone reached")
	require.Contains(t, notes, "microbatches (gradient accumulation)")
	require.Empty(t, res.Approximations())
	passtest.Equivalent(t, whole, m.Funcs[0], 1e-12, 1, 2)
}

// wideMLP is a step whose recomputation must redo a 17-GFLOP matmul at
// 0.9 of its peak, while two microbatches reach that budget with no
// recomputation of it; bn adds batch normalisation in training mode
// after the first layer.
func wideMLP(bn bool) string {
	norm := "%n0 = relu(%h0) : f32[4096,1024]"
	args := ""
	if bn {
		args = ", %g: f32[1024] {param}, %b: f32[1024] {param}, %m: f32[1024], %v: f32[1024]"
		norm = "%n0, %rm, %rv, %sm, %si = batch_norm_train(%h0, %g, %b, %m, %v) {epsilon = 1e-05, momentum = 0.9} : f32[4096,1024], f32[1024], f32[1024], f32[1024], f32[1024]"
	}
	return `func @wide(%x: f32[4096,2048], %w0: f32[2048,1024] {param}, %w1: f32[1024,1024] {param}, %w2: f32[1024,1024] {param}` + args + `) -> (f32[4096,1024]) {
  %h0 = matmul(%x, %w0) : f32[4096,1024]
  ` + norm + `
  %a0 = relu(%n0) : f32[4096,1024]
  %h1 = matmul(%a0, %w1) : f32[4096,1024]
  %a1 = relu(%h1) : f32[4096,1024]
  %h2 = matmul(%a1, %w2) : f32[4096,1024]
  %a2 = relu(%h2) : f32[4096,1024]
  return %a2
}`
}

// TestBudgetWeighsMicrobatchesByModelledTime: where recomputation alone
// reaches the budget but microbatches reach it in less modelled time,
// the planner splits; with batch normalisation the split keeps the whole
// batch's statistics (exact-bn) unless per-slice statistics are allowed,
// and only then is an approximation reported.
func TestBudgetWeighsMicrobatchesByModelledTime(t *testing.T) {
	whole, peak := autodiffed(t, wideMLP(false))
	_, err := remat.Rematerialize(whole, peak*9/10, "best")
	require.NoError(t, err, "recomputation alone reaches 0.9")
	m, res, err := plan(t, wideMLP(false), Request{Train: "sum", Level: 2, Budget: "0.9"})
	require.NoError(t, err)
	require.True(t, ran(res, "microbatch"), "pipeline %s", res.Pipeline)
	require.LessOrEqual(t, liveness.Analyze(m.Funcs[0]).Peak, peak*9/10)
	require.Contains(t, strings.Join(res.NotesOf("remat"), "\n"), "recomputation alone")

	_, peak = autodiffed(t, wideMLP(true))
	m, res, err = plan(t, wideMLP(true), Request{Train: "sum", Level: 2, Budget: "0.9"})
	require.NoError(t, err)
	require.LessOrEqual(t, liveness.Analyze(m.Funcs[0]).Peak, peak*9/10)
	require.Empty(t, res.Approximations(), "the whole batch's statistics unless allowed")
	for _, st := range res.Pipeline {
		if st.Pass.Name == "microbatch" {
			require.Equal(t, "true", st.Args["exact-bn"], "%s", st)
		}
	}
	_, res, err = plan(t, wideMLP(true), Request{Train: "sum", Level: 2, Budget: "0.9", Allow: []string{passes.PerSliceBN}})
	require.NoError(t, err)
	if ran(res, "microbatch") {
		require.NotEmpty(t, res.Approximations(), "per-slice statistics are reported")
	}
}

// TestFloorRefusesBeforeAnyPass: a budget below what the largest op's
// operands need together, with the batch split as finely as it can be,
// is refused before any pass runs, naming the op.
func TestFloorRefusesBeforeAnyPass(t *testing.T) {
	_, res, err := plan(t, deepMLP, Request{Train: "sum", Level: 2, Budget: "1KiB"})
	var fe *FloorError
	require.True(t, errors.As(err, &fe), "%v", err)
	require.Nil(t, res)
	require.Equal(t, 64, fe.Split, "256 rows in at most 64 slices")
	require.Greater(t, fe.Floor, int64(1024))
	require.Contains(t, err.Error(), "needs its operands (or its results) on the device together")
	require.Contains(t, err.Error(), fe.Op.Kind)
}

// TestRequestErrors: requests that cannot be planned as asked are
// RequestErrors, before any pass runs.
func TestRequestErrors(t *testing.T) {
	for _, c := range []struct {
		req  Request
		want string
	}{
		{Request{Train: "max", Level: -1}, "the loss is sum or mean"},
		{Request{Train: "sum", Optimizer: "lion", Level: -1}, "--optimizer must be one of"},
		{Request{Microbatches: 2, Level: -1}, "needs --train"},
		{Request{Parallel: "dp=2", Level: -1}, "it needs --train"},
		{Request{Level: 4}, "there is no -O4"},
		{Request{Level: 1, Passes: "dce"}, "not both"},
		{Request{Level: 1, Budget: "0.5"}, "need -O2 or -O3"},
		{Request{Level: 2, Budget: "1.5"}, "a budget fraction is in (0, 1]"},
		{Request{Level: 2, DeviceBudget: "lots"}, "budget \"lots\""},
		{Request{Level: -1, Allow: []string{"fast-math"}}, "--allow"},
		{Request{Level: -1, Passes: "nosuchpass"}, "nosuchpass"},
		{Request{Train: "sum", Level: 2, Parallel: "devices=2", Microbatches: 2}, "without --microbatches"},
		{Request{Train: "sum", Level: 2, Parallel: "devices=2,dp=2"}, "not both"},
	} {
		_, _, err := plan(t, deepMLP, c.req)
		var re *RequestError
		require.True(t, errors.As(err, &re), "%+v: %v", c.req, err)
		require.ErrorContains(t, err, c.want, "%+v", c.req)
	}
}

// TestUpdatesPlacedWithANote: the optimizer's updates go where the plan
// needs less memory, and the optimizer's notes say what each placement
// gave.
func TestUpdatesPlacedWithANote(t *testing.T) {
	_, res, err := plan(t, deepMLP, Request{Train: "mean", Optimizer: "adam", Level: 2})
	require.NoError(t, err)
	notes := strings.Join(res.NotesOf("optimizer"), "\n")
	require.Contains(t, notes, "updates placed")
	require.Contains(t, notes, "early: ")
	require.Contains(t, notes, "end: ")
}

// TestParallelSearchThroughTheRequest: --parallel devices=N plans the
// fastest partition, noted on the parallel pass with every candidate.
func TestParallelSearchThroughTheRequest(t *testing.T) {
	m, res, err := plan(t, deepMLP, Request{Train: "sum", Optimizer: "sgd", Level: 2, Parallel: "devices=2"})
	require.NoError(t, err)
	require.True(t, ran(res, "parallel"))
	notes := strings.Join(res.NotesOf("parallel"), "\n")
	require.Contains(t, notes, "chose ")
	require.Contains(t, notes, "weighed dp=1,zero=0")
	require.NotEmpty(t, m.Funcs)
}

// TestUnreachableBudgetRefusedWithoutSearch: MobileNetV3-Large's training
// step at 0.01 of its peak is above the floor of the finest split (so not
// refused up front), but every plan the toolbox would try is refused by
// a bound before it runs: recomputation by the bytes its arguments and
// results need together (remat.StepFloor), the offloaded splits into 2,
// 4 and 8 by their own floors. The toolbox searched for more than ten
// minutes before reaching the same answer.
func TestUnreachableBudgetRefusedWithoutSearch(t *testing.T) {
	m, err := onnx.ImportFile("../testdata/models/torchvision/mobilenet_v3_large/model.onnx", onnx.Options{})
	require.NoError(t, err)
	var tries []string
	_, err = Plan(m, Request{Train: "mean", Level: 2, Budget: "0.01"}, Session{Pipeline: func(p passes.Pipeline) { tries = append(tries, p.String()) }})
	require.Error(t, err)
	var fe *FloorError
	require.False(t, errors.As(err, &fe), "not refused by the up-front floor: the case is the search")
	require.Contains(t, err.Error(), "which no schedule or recomputation goes below", "remat refuses at once")
	require.Contains(t, err.Error(), "with the batch split into 2", "the splits are refused by their floors")
	for _, p := range tries {
		require.NotContains(t, p, "microbatch", "a split try ran: %s", p)
	}
}
