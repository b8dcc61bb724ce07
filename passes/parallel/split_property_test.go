package parallel_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/kiln-compiler/kiln/planner"
)

func init() {
	// A shift by one row along dimension 0 that declares no per-axis
	// semantics: what an op added without them looks like to the passes.
	ir.Register(&ir.OpDef{
		Name: passtest.RollOp, Summary: "y[i] = x[i+1 mod n] along dimension 0 (tests only)", MinOperands: 1, MaxOperands: 1,
		Infer:  func(in []ir.Type, _ ir.AttrValues) ([]ir.Type, error) { return []ir.Type{in[0]}, nil },
		Fusion: ir.Opaque,
		Grad:   ir.GradZero, // the forward is what the test splits
	})
	interp.RegisterKernel(passtest.RollOp, func(_ *ir.Op, in []*interp.Tensor, out []ir.Type) ([]*interp.Tensor, error) {
		x := in[0]
		y := interp.New(out[0])
		n := int(x.Type.Shape[0])
		row := x.Len() / n
		for r := range n {
			copy(y.F[r*row:(r+1)*row], x.F[((r+1)%n)*row:((r+1)%n+1)*row])
		}
		return []*interp.Tensor{y}, nil
	})
}

// A split is one way the property test cuts a step.
type split struct {
	name string
	pipe string
	dp   bool // the result is an SPMD step (parallel), run on all ranks
	// exact says what the split must do for a step whose batch is mixed
	// by statistics alone: split it (it computes them exactly) or refuse.
	exact bool
	// budget, when set, plans the step at -O2 under this budget with the
	// planner instead: its toolbox may recompute, split, swap or offload,
	// or refuse the budget, as it decides.
	budget string
}

var splits = []split{
	{"microbatch{n=2}", "microbatch{n=2}", false, false, ""},
	{"microbatch{n=4}", "microbatch{n=4}", false, false, ""},
	{"microbatch{n=8,exact-bn=true}", "microbatch{n=8,exact-bn=true}", false, true, ""},
	{"microbatch{n=2,exact-bn=true}", "microbatch{n=2,exact-bn=true}", false, true, ""},
	{"parallel{dp=2}", "parallel{dp=2}", true, true, ""},
	{"parallel{dp=4,zero=2}", "parallel{dp=4,zero=2}", true, true, ""},
	{"parallel{dp=2,microbatches=2}", "parallel{dp=2,microbatches=2}", true, false, ""},
	{"toolbox -O2 --budget 0.5", "", false, false, "0.5"},
}

// TestSplitsAreExactOrRefused is the property the per-axis records exist
// for: 500 random steps of batch 8, three quarters of them with ops that
// mix the batch (statistics over it read back by the rows, batch
// normalisation, softmax over it, gathers and shifts along it, an op that
// declares no axes, dropout), each split by microbatch (2, 4 and 8
// slices, plain and exact-bn) and by parallel (dp = 2 and 4, with
// microbatches): every split either computes the whole step or is
// refused with an error naming the op. Zero silent changes.
//
// Error model: a split sums over the batch in another order. Each result
// (and each parameter's update) must be within passtest.OrderBound of its
// own summation-order floor: the same step with its batch rotated by one
// row (for steps with dropout, on the same step with dropout keeping
// everything, since rotating the rows moves them under other masks).
//
// A result that vanishes mathematically (a batch norm's scale gradient
// when nothing after the norm depends on it but a sum over its
// features) is roundoff in the whole step and may be another roundoff,
// or exactly zero, in the split: what stays of such a value is bounded
// by a few roundings of the terms it cancels, so every result also gets
// 1e-12 (about 4500 f64 roundings) of the largest result's norm.
//
// What must split: steps that mix nothing (or only draw dropout masks)
// split every way; steps whose only mixing is statistics split under
// exact-bn and on data-parallel ranks (all-reduced) and are refused by
// the plain split; steps with a softmax over the batch, gathers or
// shifts along it, or the op without axes are refused by every split.
func TestSplitsAreExactOrRefused(t *testing.T) {
	steps := 500
	if testing.Short() {
		steps = 60 // the same first steps as the full run
	}
	r := rand.New(rand.NewSource(38))
	accepted := map[string]int{}
	refused := map[string]int{}
	toolboxSplits := 0
	for i := range steps {
		mixing := i%4 != 0
		bs := passtest.RandomBatchStep(r, 8, mixing)
		pipe := []string{"autodiff{loss=sum}", "autodiff{loss=mean}", "autodiff{loss=sum},optimizer{kind=sgd,lr=0.5}"}[i%3]
		m := passtest.Parse(t, bs.Src)
		passtest.Run(t, m, pipe)
		whole := m.Funcs[0]
		args := interp.RandomArgs(whole, uint64(i))
		want, wantArgs, err := interp.RunWithUpdates(whole, interp.CloneAll(args), interp.Options{})
		require.NoError(t, err)
		floors := stepFloors(t, m, bs, args)
		for _, sp := range splits {
			if sp.budget != "" && testing.Short() && i%10 != 3 {
				continue // the toolbox plans each step many times over (0.5 s): every 10th in -short, all 500 in the full run
			}
			got := passtest.Clone(t, m)
			var err error
			if sp.budget != "" {
				var res *planner.Result
				res, err = planner.Plan(got, planner.Request{Level: 2, Budget: sp.budget}, planner.Session{Inst: passes.Instrumentation{VerifyEach: true}, Workspace: loops.Workspace})
				if err == nil && slices.ContainsFunc(res.Runs, func(r passes.PassRun) bool { return r.Name == "microbatch" }) {
					toolboxSplits++
				}
			} else {
				err = passtest.RunErr(got, sp.pipe)
			}
			var fe *planner.FloorError
			if errors.As(err, &fe) {
				refused[sp.name]++ // a budget under what any plan reaches, refused before any pass ran
				continue
			}
			if err != nil {
				var pe *passes.PassError
				require.True(t, errors.As(err, &pe), "step %d, %s: %v", i, sp.name, err)
				require.NotContains(t, err.Error(), "panic", "step %d, %s", i, sp.name)
				if sp.budget == "" { // the toolbox refuses budgets, naming what holds the peak
					require.Regexp(t, `test\.kir:\d+:\d+: `, err.Error(), "step %d, %s: the refusal names the op", i, sp.name)
				}
				refused[sp.name]++
			} else {
				accepted[sp.name]++
				res, upd := runSplit(t, got.Funcs[0], sp.dp, args)
				largest := 0.0
				for k := range want {
					largest = max(largest, norm(want[k]))
				}
				for k := range want {
					d, w := distance(res[k], want[k]), norm(want[k])
					require.LessOrEqual(t, d, passtest.OrderBound(floors.Results[k])*w+vanishing*largest, "step %d (%s), %s changes result %s (%.3g from %.3g; floor %.2g):\n%s", i, mixName(bs.Mix), sp.name, whole.ResultName(k), d, w, floors.Results[k], bs.Src)
				}
				for k, a := range whole.Args {
					if a.Arg.InOut {
						e := passtest.UpdateErr(upd[k], wantArgs[k], args[k])
						require.LessOrEqual(t, e, passtest.OrderBound(floors.Updates[k]), "step %d (%s), %s changes the update of %s:\n%s", i, mixName(bs.Mix), sp.name, a.Name, bs.Src)
					}
				}
			}
			mustSplit := bs.Mix&^passtest.MixRandom == 0 || bs.Mix&^(passtest.MixRandom|passtest.MixStatistics) == 0 && sp.exact
			mustRefuse := bs.Mix&(passtest.MixSoftmax|passtest.MixGather|passtest.MixShift|passtest.MixRoll) != 0 ||
				bs.Mix&passtest.MixStatistics != 0 && !sp.exact
			switch {
			case sp.budget != "":
				// The toolbox chooses whether to split at all.
			case mustSplit:
				require.NoError(t, err, "step %d (%s), %s:\n%s", i, mixName(bs.Mix), sp.name, bs.Src)
			case mustRefuse:
				require.Error(t, err, "step %d (%s), %s", i, mixName(bs.Mix), sp.name)
			}
		}
	}
	for _, sp := range splits {
		t.Logf("%-32s %3d split exactly, %3d refused", sp.name, accepted[sp.name], refused[sp.name])
	}
	t.Logf("the toolbox's plans split %d steps into microbatches", toolboxSplits)
}

// stepFloors measures the summation-order floors of m's step on args.
func stepFloors(t *testing.T, m *ir.Module, bs passtest.BatchStep, args []*interp.Tensor) passtest.Floors {
	f := m.Funcs[0]
	if bs.Mix&passtest.MixRandom != 0 {
		g := passtest.Clone(t, m).Funcs[0]
		g.Walk(func(op *ir.Op) {
			if ir.DrawsRandom(op) {
				op.Attrs["ratio"] = ir.FloatAttr(0)
			}
		})
		f = g
	}
	_, _, floors := passtest.OrderFloor(t, f, args, "x")
	return floors
}

// runSplit runs the split step f on args: on one device, or on all its
// ranks (whose results must agree; the updated arguments are joined).
func runSplit(t *testing.T, f *ir.Func, ranks bool, args []*interp.Tensor) ([]*interp.Tensor, []*interp.Tensor) {
	if !ranks {
		res, upd, err := interp.RunWithUpdates(f, interp.CloneAll(args), interp.Options{})
		require.NoError(t, err)
		return res, upd
	}
	parts, err := parallel.ShardValues(f, args)
	require.NoError(t, err)
	got, gotArgs, err := interp.RunRanks(f, parts, interp.Options{})
	require.NoError(t, err)
	for rk := 1; rk < len(got); rk++ {
		for k := range got[0] {
			require.Zero(t, passtest.RelErr(got[rk][k], got[0][k]), "rank %d's result %d differs from rank 0's", rk, k)
		}
	}
	return got[0], parallel.JoinValues(f, gotArgs)
}

func mixName(mix int) string {
	var parts []string
	for _, k := range []struct {
		bit  int
		name string
	}{{passtest.MixStatistics, "statistics"}, {passtest.MixSoftmax, "softmax"}, {passtest.MixGather, "gather"}, {passtest.MixShift, "shift"}, {passtest.MixRoll, "roll"}, {passtest.MixRandom, "dropout"}} {
		if mix&k.bit != 0 {
			parts = append(parts, k.name)
		}
	}
	if len(parts) == 0 {
		return "mixes nothing"
	}
	return fmt.Sprint(strings.Join(parts, "+"))
}

// vanishing is the absolute slack of every result, relative to the
// largest result of the step (see TestSplitsAreExactOrRefused).
const vanishing = 1e-12

func norm(x *interp.Tensor) float64 { return distance(x, interp.New(x.Type)) }

// distance is ‖a − b‖ over the whole tensors, NaN in both places agreeing.
func distance(a, b *interp.Tensor) float64 {
	s := 0.0
	for i := 0; i < b.Len(); i++ {
		x, y := a.At(i), b.At(i)
		if math.IsNaN(x) && math.IsNaN(y) {
			continue
		}
		s += (x - y) * (x - y)
	}
	return math.Sqrt(s)
}
