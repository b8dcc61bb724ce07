package parallel_test

import (
	"fmt"
	"math/rand"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes/microbatch"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// pipelineEqualsOneDevice cuts the step of src (after pipe) into pp
// stages of m microbatches, runs them on pp ranks and compares the
// loss, gradients and updated arguments with the one-device step.
func pipelineEqualsOneDevice(t *testing.T, src, pipe string, pp, m int, tol float64) ([]*ir.Func, parallel.PipelineStats) {
	t.Helper()
	mod := passtest.Parse(t, src)
	passtest.Run(t, mod, pipe)
	return pipelineEquals(t, mod.Funcs[0], mod.Funcs[0], parallel.Plan{DP: 1, PP: pp, Microbatches: m}, tol)
}

// pipelineEquals cuts whole by plan p (stages, microbatches, dp ranks
// each) and compares the ranks' run with ref's.
func pipelineEquals(t *testing.T, whole, ref *ir.Func, p parallel.Plan, tol float64) ([]*ir.Func, parallel.PipelineStats) {
	t.Helper()
	before := whole.String()
	stages, st, err := parallel.PipelinePlan(whole, p)
	require.NoError(t, err)
	require.Equal(t, before, whole.String(), "Pipeline leaves the step alone")
	require.Len(t, stages, p.PP)
	require.NoError(t, ir.Verify(&ir.Module{Funcs: stages}))
	args := interp.RandomArgs(whole, 7)
	want, wantArgs, err := interp.RunWithUpdates(ref, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	parts, err := parallel.RankValues(stages, whole.Args, interp.CloneAll(args))
	require.NoError(t, err)
	require.Len(t, parts, p.PP*max(1, p.DP)*max(1, p.TP))
	res, finals, err := interp.RunPrograms(parallel.RankPrograms(stages), parts, interp.Options{})
	require.NoError(t, err)
	got, gotArgs := parallel.JoinRanks(stages, whole.Args, args, res, finals)
	require.Len(t, got, len(want))
	for i := range want {
		require.LessOrEqual(t, passtest.RelErr(got[i], want[i]), tol, "result %s", whole.ResultName(i))
	}
	for i, a := range whole.Args {
		if a.Arg.InOut {
			require.LessOrEqual(t, passtest.RelErr(gotArgs[i], wantArgs[i]), tol, "updated %s", a.Name)
		}
	}
	for s, f := range stages {
		require.NotEmpty(t, f.Body, "stage %d", s)
	}
	return stages, st
}

// TestPipelineEqualsOneDevice: two transformer MLP blocks, an MLP, a CNN
// and an attention block, cut into 2 to 4 stages with 1 to 4
// microbatches, with and without optimizers, give the one-device loss,
// gradients and updated parameters and state. Error model: microbatches
// sum the gradients in another order (f64): 1e-12; without microbatches
// the stages compute exactly what one device does.
func TestPipelineEqualsOneDevice(t *testing.T) {
	blocks := passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	srcs := map[string]string{"blocks": blocks, "mlp": models["mlp"], "cnn": models["cnn"], "attention": models["attention"]}
	for name, src := range srcs {
		for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean},optimizer{kind=adam}", "autodiff{loss=sum},optimizer{kind=momentum,placement=end}"} {
			for _, pm := range [][2]int{{2, 1}, {2, 2}, {2, 4}, {3, 4}, {4, 2}} {
				t.Run(fmt.Sprintf("%s/%s/pp=%d,m=%d", name, pipe, pm[0], pm[1]), func(t *testing.T) {
					tol := 1e-12
					if pm[1] == 1 {
						tol = 0
					}
					_, st := pipelineEqualsOneDevice(t, src, pipe, pm[0], pm[1], tol)
					require.Positive(t, st.Sends)
				})
			}
		}
	}
}

// TestPipelineIs1F1B: two MLP blocks in 2 stages of 4 microbatches send
// one activation forward and one gradient back per slice and nothing
// else; stage s holds at most 2−s slices in flight (1F1B), so the
// backward of the first slice runs before the forward of the last; and
// the modelled step idles about as GPipe's bound says, (p−1)/(m+p−1) of
// the stages' time, plus the links' latency.
func TestPipelineIs1F1B(t *testing.T) {
	const pp, m = 2, 4
	stages, st := pipelineEqualsOneDevice(t, passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir"), "autodiff{loss=sum},optimizer{kind=adam}", pp, m, 1e-12)
	require.True(t, st.Interleave)
	require.Equal(t, 2*m, st.Sends)
	slice := regexp.MustCompile(`\.mb(\d+)`)
	for s, f := range stages {
		started, done := map[string]bool{}, map[string]bool{}
		most := 0
		firstBackward, lastForward := -1, -1
		for i, op := range f.Body {
			if len(op.Results) == 0 {
				continue
			}
			name := op.Results[0].Name
			k := slice.FindStringSubmatch(name)
			if k == nil {
				continue
			}
			if strings.Contains(name, ".bwd") || strings.Contains(name, ".grad") {
				done[k[1]] = true
				if firstBackward < 0 {
					firstBackward = i
				}
			} else if !done[k[1]] {
				started[k[1]] = true
				lastForward = i
			}
			most = max(most, len(started)-len(done))
		}
		require.LessOrEqual(t, most, pp-s, "stage %d: slices in flight", s)
		if s == 0 {
			require.Less(t, firstBackward, lastForward, "stage 0 starts the first backward before the last forward")
		}
	}
	bound := float64(pp-1) / float64(m+pp-1)
	require.InDelta(t, bound, st.Bubble(), 0.1, "idle fraction")
	t.Logf("step %.3g s, busy %v, idle %.3f (bound %.3f)", st.Step, st.Busy, st.Bubble(), bound)
}

// TestPipelineOnRandomSteps: random forward graphs (matmuls with their
// weights, unary and binary ops, dropout, skip links) as training steps
// with momentum, cut into 2 or 3 stages of 1 or 2 microbatches, equal the
// one-device step (f64, 1e-12: microbatches sum in another order).
func TestPipelineOnRandomSteps(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	ran := 0
	defer func() { t.Logf("%d of 40 steps cut", ran); require.GreaterOrEqual(t, ran, 30, "steps cut") }()
	for trial := 0; trial < 40; trial++ {
		src := passtest.RandomForward(r, 6+r.Intn(20), 8)
		pp, m := 2+r.Intn(2), 1+r.Intn(2)
		t.Run(fmt.Sprintf("%d/pp=%d,m=%d", trial, pp, m), func(t *testing.T) {
			mod := passtest.Parse(t, src)
			passtest.Run(t, mod, "autodiff{loss=sum},optimizer{kind=momentum}")
			if _, _, err := parallel.Pipeline(mod.Funcs[0], pp, m); err != nil {
				// A forward of fewer ops than stages (what only the data
				// argument makes, every stage makes for itself) is refused.
				require.ErrorContains(t, err, fmt.Sprintf("fewer than pp=%d stages", pp))
				return
			}
			ran++
			if m > 1 {
				// Dropout draws each slice's mask: the reference is the step
				// split into the same slices.
				ref := passtest.Clone(t, mod)
				_, err := microbatch.Split(ref.Funcs[0], m)
				require.NoError(t, err)
				pipelineEquals(t, mod.Funcs[0], ref.Funcs[0], parallel.Plan{DP: 1, PP: pp, Microbatches: m}, 0)
				return
			}
			pipelineEquals(t, mod.Funcs[0], mod.Funcs[0], parallel.Plan{DP: 1, PP: pp, Microbatches: m}, 0)
		})
	}
}

// TestPipelineWithDataParallelism: each of 2 stages run by 2 data-parallel
// ranks (4 ranks), with ZeRO 0 to 3 and 1 or 2 microbatches per rank,
// equals the one-device step (f64, 1e-12: the ranks' and slices' sums in
// another order), for two MLP blocks, an MLP, a CNN and an attention
// block.
func TestPipelineWithDataParallelism(t *testing.T) {
	blocks := passtest.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	for name, src := range map[string]string{"blocks": blocks, "mlp": models["mlp"], "cnn": models["cnn"], "attention": models["attention"]} {
		for _, zero := range []int{0, 1, 2, 3} {
			for _, m := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/zero=%d/m=%d", name, zero, m), func(t *testing.T) {
					mod := passtest.Parse(t, src)
					passtest.Run(t, mod, "autodiff{loss=mean},optimizer{kind=adam}")
					stages, _ := pipelineEquals(t, mod.Funcs[0], mod.Funcs[0], parallel.Plan{DP: 2, PP: 2, Zero: zero, Microbatches: m}, 1e-12)
					for _, f := range stages {
						require.Equal(t, 2, parallel.RanksOf(f))
						sends, collectives := 0, 0
						for _, op := range f.Body {
							switch {
							case ir.IsPointToPoint(op.Kind):
								sends++
								require.Equal(t, int64(2), abs(op.Attrs["offset"].Int), "the same data-parallel rank of the other stage")
								if op.Kind == "send" && op.Operands[0].Def != nil {
									require.False(t, ir.IsCollective(op.Operands[0].Def.Kind), "%s: a collective's result is sent: it runs on the stage that reads it", op.Operands[0].Ref())
								}
							case ir.IsCollective(op.Kind):
								collectives++
							}
						}
						require.Positive(t, sends)
						require.Positive(t, collectives, "the stage's ranks combine their gradients")
						if zero == 3 {
							// Each parameter is gathered in its reader's turn, not
							// all at the start (where they would stay live).
							last := -1
							for i, op := range f.Body {
								if op.Kind == "all_gather" {
									last = i
								}
							}
							first := slices.IndexFunc(f.Body, func(op *ir.Op) bool { return op.Kind == "matmul" || op.Kind == "gemm" })
							require.Greater(t, last, first, "%s: a gather after the first product", f.Name)
						}
					}
				})
			}
		}
	}
}

func abs(x int64) int64 { return max(x, -x) }

// TestPipelineLongSkipsAndSharedWeights: a skip from the first layer
// into the last and a weight read by both puts gradient sums on another
// stage than their parameter: the updates wait for the last slice's
// backward, in every order (the review found them in slice 0's turn,
// which deadlocked).
func TestPipelineLongSkipsAndSharedWeights(t *testing.T) {
	src := `func @skips(%x: f64[8,4], %w1: f64[4,4] {param}, %w2: f64[4,4] {param}, %w3: f64[4,4] {param}, %w4: f64[4,4] {param}) -> (f64[8,4]) {
  %h1 = matmul(%x, %w1) : f64[8,4]
  %a1 = tanh(%h1) : f64[8,4]
  %h2 = matmul(%a1, %w2) : f64[8,4]
  %a2 = tanh(%h2) : f64[8,4]
  %h3 = matmul(%a2, %w3) : f64[8,4]
  %a3 = tanh(%h3) : f64[8,4]
  %h4 = matmul(%a3, %w4) : f64[8,4]
  %s = add(%h4, %a1) : f64[8,4]
  %r = matmul(%s, %w1) : f64[8,4]
  return %r
}`
	for _, p := range []parallel.Plan{{DP: 1, PP: 2, Microbatches: 2}, {DP: 1, PP: 3, Microbatches: 4}, {DP: 1, PP: 4, Microbatches: 4}, {DP: 2, PP: 2, Microbatches: 2}, {DP: 2, PP: 2, Zero: 3, Microbatches: 2}} {
		t.Run(p.String(), func(t *testing.T) {
			mod := passtest.Parse(t, src)
			passtest.Run(t, mod, "autodiff{loss=sum},optimizer{kind=adam}")
			_, st := pipelineEquals(t, mod.Funcs[0], mod.Funcs[0], p, 1e-12)
			require.True(t, st.Interleave, "1F1B")
		})
	}
}
