package remat

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	"github.com/kiln-compiler/kiln/passtest"
)

// A forward MLP in f64 with cheap activations between matmuls, dropout
// included: its training step saves them for the backward pass.
const mlp = `func @mlp(%x: f64[256,16], %w1: f64[16,32] {param}, %w2: f64[32,32] {param}, %w3: f64[32,4] {param}) -> (f64[256,4]) {
  %h1 = matmul(%x, %w1) : f64[256,32]
  %a1 = tanh(%h1) : f64[256,32]
  %d1, %m1 = dropout(%a1) {ratio = 0.25, seed = 5} : f64[256,32], bool[256,32]
  %h2 = matmul(%d1, %w2) : f64[256,32]
  %a2 = sigmoid(%h2) : f64[256,32]
  %e2 = exp(%a2) : f64[256,32]
  %h3 = matmul(%e2, %w3) : f64[256,4]
  return %h3
}
`

// trainingStep differentiates src and returns the step's text.
func trainingStep(t testing.TB, src string) string {
	m := passtest.Parse(t, src)
	pipe, err := passes.ParsePipeline("autodiff", nil)
	require.NoError(t, err)
	require.NoError(t, (&passes.Manager{Inst: passes.Instrumentation{VerifyEach: true}}).Run(m, pipe))
	return m.String()
}

// TestRematIsBitExactAndFitsTheBudget: every solver keeps loss and
// gradients bit-identical in f64 and meets the budget (without splits,
// whose sums over the slices run in another order).
func TestRematIsBitExactAndFitsTheBudget(t *testing.T) {
	step := trainingStep(t, mlp)
	base := liveness.Analyze(passtest.Parse(t, step).Funcs[0]).Peak
	for _, solver := range []string{"greedy", "sqrt", "exact", "best"} {
		for _, budget := range []string{"0.9", "0.8"} {
			m := passtest.CheckPipeline(t, step, "remat{budget="+budget+",solver="+solver+"}", 0)
			f := m.Funcs[0]
			peak := liveness.Analyze(f).Peak
			require.LessOrEqual(t, float64(peak), float64(base)*mustFloat(budget)+1, "%s at %s", solver, budget)
			recomputed := 0
			for _, op := range f.Body {
				if op.Attrs.Bool("recomputed", false) {
					recomputed++
				}
			}
			require.Greater(t, recomputed, 0, "%s at %s", solver, budget)
		}
	}
}

func mustFloat(s string) float64 {
	switch s {
	case "0.9":
		return 0.9
	case "0.8":
		return 0.8
	}
	return 1
}

func TestHintsAndImpureOps(t *testing.T) {
	src := `func @f(%x: f64[64], %w: f64[64] {param}) -> (f64[64]) {
  %a = mul(%x, %w) : f64[64]
  %b = tanh(%a) {remat = "never"} : f64[64]
  %c = exp(%b) {remat = "always"} : f64[64]
  %r = random_uniform() {dtype = f64, shape = [64]} : f64[64]
  %d = mul(%c, %r) : f64[64]
  %e = mul(%d, %c) : f64[64]
  return %e
}
`
	m := passtest.CheckPipeline(t, trainingStep(t, src), "remat", 0)
	text := m.String()
	require.Contains(t, text, "%c.remat = exp(%b) {recomputed = true}", "an always value is recomputed before its later uses")
	require.NotContains(t, text, "tanh(%a) {recomputed", "a never value is kept")
	require.Equal(t, 1, strings.Count(text, "random_uniform"), "impure ops are never recomputed")
}

// TestBudgetErrorNamesTheHolders: a budget no solver reaches names the
// values live at the lowest peak reached; one below what the arguments
// and results need together is refused before any solver runs, naming
// that floor and the values live at the peak.
func TestBudgetErrorNamesTheHolders(t *testing.T) {
	f := passtest.Parse(t, mlp).Funcs[0]
	_, err := Rematerialize(f, 100, "best")
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	require.Equal(t, StepFloor(f), be.Floor)
	require.Contains(t, err.Error(), "that the step's arguments and results need together, which no schedule or recomputation goes below")
	require.NotEmpty(t, be.Holders)

	f = passtest.Parse(t, mlp).Funcs[0]
	_, err = Rematerialize(f, StepFloor(f)+1, "best")
	require.ErrorAs(t, err, &be)
	require.Zero(t, be.Floor)
	require.Contains(t, err.Error(), "can't reduce memory below")
	require.Greater(t, be.Reached, StepFloor(f))
	require.NotEmpty(t, be.Holders)
	_ = ir.F64
}

// TestPlanMatchesRecompute: Recomputer.Plan lists the ops Recompute then
// clones (same kinds, same order) for every forward value at its last use,
// and changes nothing.
func TestPlanMatchesRecompute(t *testing.T) {
	f := passtest.Parse(t, trainingStep(t, mlp)).Funcs[0]
	before := f.String()
	rc := NewRecomputer(f)
	planned := 0
	for _, v := range savedValues(f) {
		s := analyse(f)
		at := s.uses[v][len(s.uses[v])-1]
		ops, ok := rc.Plan(rc.Schedule(), v, at)
		require.Equal(t, before, f.String(), "Plan changed the function")
		rc.Begin()
		inserted, ok2 := rc.Recompute(v, at)
		require.Equal(t, ok, ok2, v.Name)
		require.Len(t, inserted, len(ops), v.Name)
		for i := range ops {
			require.Equal(t, ops[i].Kind, inserted[i].Kind, v.Name)
		}
		rc.Undo()
		planned += len(ops)
	}
	require.Positive(t, planned)
}

func TestRecomputedNames(t *testing.T) {
	for in, want := range map[string]string{
		"x":                         "x.remat",
		"x.remat":                   "x.remat",
		"x.remat.1":                 "x.remat",
		"x.remat.1.remat.1.remat.2": "x.remat",
		"loss.grad.remat.1.remat":   "loss.grad.remat",
		"v.1":                       "v.1.remat",
		"remat":                     "remat.remat",
		".remat":                    ".remat.remat",
	} {
		require.Equal(t, want, RecomputedName(in), in)
	}
}

// TestStepFloorCountsEachBufferOnce: a result that is a view of an
// argument, and two results in one buffer, count once.
func TestStepFloorCountsEachBufferOnce(t *testing.T) {
	f := passtest.Parse(t, `func @f(%x: f32[16,16]) -> (f32[256], f32[16,16], f32[256]) {
  %v = reshape(%x) {shape = [256]} : f32[256]
  %e = exp(%x) : f32[16,16]
  %w = reshape(%e) {shape = [256]} : f32[256]
  return %v, %e, %w
}`).Funcs[0]
	require.Equal(t, int64(2*16*16*4), StepFloor(f), "x once, e once")
}
