package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/precision"
	"github.com/kiln-compiler/kiln/passtest"
)

// tanhMLP is three tanh layers at batch 1024 in f32: the backward pass
// reads every tanh output (512 KiB each).
const tanhMLP = `func @wide(%x: f32[1024,128], %w0: f32[128,128] {param}, %w1: f32[128,128] {param}, %w2: f32[128,128] {param}) -> (f32[1024,128]) {
  %h0 = matmul(%x, %w0) : f32[1024,128]
  %a0 = tanh(%h0) : f32[1024,128]
  %h1 = matmul(%a0, %w1) : f32[1024,128]
  %a1 = tanh(%h1) : f32[1024,128]
  %h2 = matmul(%a1, %w2) : f32[1024,128]
  %a2 = tanh(%h2) : f32[1024,128]
  return %a2
}`

// TestNarrowSavedValuesOnlyWhenAllowed: under a budget the toolbox weighs
// storing the saved values in bf16 or fp8 beside recomputation,
// microbatches and offloading only when the request names the
// approximation, keeps the plan of least modelled time that meets the
// budget, says so on the pass it chose, and the report names the
// approximation it made. A quarter of the tanh MLP's peak is out of
// every other tool's reach; with fp8-saved allowed (alone or with
// bf16-saved, which does not reach it either) the plan meets it.
func TestNarrowSavedValuesOnlyWhenAllowed(t *testing.T) {
	if testing.Short() {
		t.Skip("the toolbox's tries take about 30 s; the full suite runs them")
	}
	_, peak := autodiffed(t, tanhMLP)
	budget := peak / 4
	req := Request{Train: "sum", Level: 2, Budget: "0.25", Device: NewRequest().Device}
	_, _, err := planWithWorkspace(t, tanhMLP, req)
	require.ErrorContains(t, err, "pass remat failed", "the budget is out of reach without narrower saved values")

	for _, allow := range [][]string{{precision.FP8Saved}, {precision.BF16Saved, precision.FP8Saved}} {
		req.Allow = allow
		m, res, err := planWithWorkspace(t, tanhMLP, req)
		require.NoError(t, err, "%v", allow)
		require.LessOrEqual(t, liveness.Analyze(m.Funcs[0]).Peak, budget, "%v", allow)
		var weighed string
		for _, n := range res.Notes {
			if n.Pass == "precision" && strings.Contains(n.Text, "weighed narrower saved values and kept fp8") {
				weighed = n.Text
			}
		}
		require.NotEmpty(t, weighed, "%v: no note on the narrowing kept", allow)
		t.Logf("%v: %s", allow, weighed)
		approx := res.Report(m.Funcs[0], false).Approximations
		require.Len(t, approx, 1)
		require.Equal(t, precision.FP8Saved, approx[0].Name)
		require.True(t, slices.Contains(allow, approx[0].Name))
	}
}

// TestNoNarrowingUnasked: with a budget and no allowance the plan has no
// precision step and makes no approximation.
func TestNoNarrowingUnasked(t *testing.T) {
	req := Request{Train: "sum", Level: 2, Budget: "0.5", Device: NewRequest().Device}
	m, res, err := planWithWorkspace(t, deepMLP, req)
	require.NoError(t, err)
	require.False(t, ran(res, "precision"), "narrowed unasked")
	require.Empty(t, res.Report(m.Funcs[0], false).Approximations)
}

// planWithWorkspace is plan with the LLVM backend's workspace sizes, as
// the commands plan (swap, the toolbox's last tools, needs them).
func planWithWorkspace(t *testing.T, src string, req Request) (*ir.Module, *Result, error) {
	t.Helper()
	m := passtest.Parse(t, src)
	res, err := Plan(m, req, Session{Inst: passes.Instrumentation{VerifyEach: true}, Workspace: loops.Workspace})
	return m, res, err
}
