package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
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
// approximation, keeps the plan that meets the budget in the least
// modelled time, says which on the pass it chose, and the report names
// the approximation it made. At 0.3 of the tanh MLP's peak the plain plan
// recomputes and splits (2.06 ms modelled); bf16 saved values take longer
// (2.17 ms: the casts, and as much recomputation) and are weighed and
// left; fp8 ones are kept (1.48 ms).
func TestNarrowSavedValuesOnlyWhenAllowed(t *testing.T) {
	if testing.Short() {
		t.Skip("the toolbox's tries take about a minute; the full suite runs them")
	}
	_, peak := autodiffed(t, tanhMLP)
	budget := peak * 3 / 10
	req := Request{Train: "sum", Level: 2, Budget: "0.3", Device: NewRequest().Device}
	m, res, err := planWithWorkspace(t, tanhMLP, req)
	require.NoError(t, err)
	require.False(t, ran(res, "precision"), "narrowed unasked")
	require.LessOrEqual(t, liveness.Analyze(m.Funcs[0]).Peak, budget)

	for _, c := range []struct {
		allow []string
		kept  string // the approximation the plan makes ("": none)
	}{
		{[]string{precision.BF16Saved}, ""},
		{[]string{precision.FP8Saved}, precision.FP8Saved},
		{[]string{precision.BF16Saved, precision.FP8Saved}, precision.FP8Saved},
	} {
		req.Allow = c.allow
		m, res, err := planWithWorkspace(t, tanhMLP, req)
		require.NoError(t, err, "%v", c.allow)
		require.LessOrEqual(t, liveness.Analyze(m.Funcs[0]).Peak, budget, "%v", c.allow)
		var weighed string
		for _, n := range res.Notes {
			if strings.Contains(n.Text, "weighed narrower saved values") {
				weighed = n.Text
			}
		}
		require.NotEmpty(t, weighed, "%v: no note on the narrowings weighed", c.allow)
		t.Logf("%v: %s", c.allow, weighed)
		approx := res.Report(m.Funcs[0], false).Approximations
		if c.kept == "" {
			require.Empty(t, approx, "%v", c.allow)
			require.False(t, ran(res, "precision"))
			continue
		}
		require.Len(t, approx, 1)
		require.Equal(t, c.kept, approx[0].Name)
		require.True(t, slices.Contains(c.allow, approx[0].Name))
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

// planWithWorkspace plans src with the LLVM backend's workspace sizes, as
// the commands plan (swap, the toolbox's last tool, needs them), without
// verifying after every pass (the toolbox's many tries would take
// minutes; the other planner tests verify).
func planWithWorkspace(t *testing.T, src string, req Request) (*ir.Module, *Result, error) {
	t.Helper()
	m := passtest.Parse(t, src)
	res, err := Plan(m, req, Session{Workspace: loops.Workspace})
	return m, res, err
}
