package optimizer_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/microbatch"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	_ "github.com/kiln-compiler/kiln/passes/reorder"
	"github.com/kiln-compiler/kiln/passtest"
)

func load(t *testing.T, path string) *interp.Tensor {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	x, err := npy.Read(bytes.NewReader(b))
	require.NoError(t, err)
	return x
}

func maxAbs(x *interp.Tensor) float64 {
	m := 0.0
	for i := 0; i < x.Len(); i++ {
		m = max(m, x.At(i), -x.At(i))
	}
	return m
}

func pipeline(t *testing.T, m *ir.Module, p string) { passtest.Run(t, m, p) }

// TestOneStepMatchesTorchOptim: after one step, parameters and optimizer
// states equal torch.optim's (committed by scripts/export_optim.py) within
// 1e-5 relative error.
func TestOneStepMatchesTorchOptim(t *testing.T) {
	models, _ := filepath.Glob("../../testdata/models/*/optim")
	require.NotEmpty(t, models)
	for _, dir := range models {
		model := filepath.Dir(dir)
		for _, kind := range []string{"sgd", "momentum", "adam", "adamw"} {
			m, err := onnx.ImportFile(filepath.Join(model, "model.onnx"), onnx.Options{})
			require.NoError(t, err)
			pipeline(t, m, "autodiff,optimizer{kind="+kind+",lr=0.01,weight-decay=0.01,momentum=0.9}")
			f := m.Funcs[0]
			args := make([]*interp.Tensor, len(f.Args))
			for i, a := range f.Args {
				if a.Arg.Kind == ir.ArgData {
					args[i] = load(t, filepath.Join(model, "input.npy"))
				} else {
					args[i] = interp.FromDense(a.Arg.Init)
				}
			}
			_, final, err := interp.RunWithUpdates(f, args, interp.Options{})
			require.NoError(t, err)
			checked := 0
			for i, a := range f.Args {
				if !a.Arg.InOut {
					continue
				}
				switch a.Arg.Attrs.String("role", "") {
				case "step":
					require.Equal(t, 1.0, final[i].F[0], "the step count after one step")
					continue
				case "running_stat":
					continue // the training tests compare these with PyTorch's modules
				}
				want := load(t, filepath.Join(model, "optim", kind, a.Name+".npy"))
				if kind == "adam" || kind == "adamw" || a.Arg.Kind == ir.ArgState {
					// A gradient that is mathematically zero is rounding noise
					// on both sides; Adam's step is then its sign, and the
					// optimizer states are dominated by it: skip those.
					base := a.Name
					for _, p := range []string{"adam.m.", "adam.v.", "momentum."} {
						if len(base) > len(p) && base[:len(p)] == p {
							base = base[len(p):]
						}
					}
					g := load(t, filepath.Join(model, "grad."+base+".npy"))
					if maxAbs(g) < 1e-5 {
						continue
					}
					// Compare only the elements whose gradient is not noise
					// (the key bias of attention has an exactly zero gradient).
					got, ref := &interp.Tensor{Type: want.Type}, &interp.Tensor{Type: want.Type}
					for j := range want.F {
						if g.F[j] > 1e-6 || g.F[j] < -1e-6 {
							got.F = append(got.F, final[i].F[j])
							ref.F = append(ref.F, want.F[j])
						}
					}
					final[i], want = got, ref
				}
				require.LessOrEqual(t, passtest.RelErr(final[i], want), 1e-5, "%s %s %s", filepath.Base(model), kind, a.Name)
				checked++
			}
			if filepath.Base(model) != "mlp" || kind == "sgd" || kind == "momentum" {
				// The MLP's loss is a sum of softmax outputs: all its gradients are zero.
				require.Greater(t, checked, 0, "%s %s", model, kind)
			}
		}
	}
}

// TestEarlyUpdatesFreeGradients: placing each update right after its
// gradient lowers the peak against all updates at the end.
func TestEarlyUpdatesFreeGradients(t *testing.T) {
	src, err := os.ReadFile("../../testdata/examples/cnn.kir")
	require.NoError(t, err)
	early := passtest.Parse(t, string(src))
	end := passtest.Parse(t, string(src))
	pipeline(t, early, "autodiff,optimizer{kind=adam}")
	pipeline(t, end, "autodiff,optimizer{kind=adam,placement=end}")
	require.Less(t, liveness.Analyze(early.Funcs[0]).Peak, liveness.Analyze(end.Funcs[0]).Peak)
	// Both compute the same step.
	passtest.Equivalent(t, end.Funcs[0], early.Funcs[0], 0, 1)
	// Reordering keeps every read of a parameter before its update.
	pipeline(t, early, "reorder")
}

// bnStep is a convolution, a training-mode batch norm with running
// statistics and a sum loss, at batch BATCH.
const bnStep = `func @step(%x: f32[BATCH,2,5,5], %w: f32[3,2,3,3] {param}, %g: f32[3] {param}, %b: f32[3] {param}, %rm: f32[3] {state}, %rv: f32[3] {state}) -> (f32[]) {
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f32[BATCH,3,5,5]
  %n, %mean, %invstd, %nrm, %nrv = batch_norm_train(%c, %g, %b, %rm, %rv) {epsilon = 1e-05, momentum = 0.9} : f32[BATCH,3,5,5], f32[3], f32[3], f32[3], f32[3]
  %l = reduce_sum(%n) {axes = [0, 1, 2, 3]} : f32[]
  return %l
}
`

// TestRunningStatsOfSlicesUpdateInTurn: split into two microbatches with
// per-slice statistics, a step updates the running statistics as PyTorch
// does under gradient accumulation, once per slice in order: exactly as
// two steps on the halves of the batch, one after the other (the update
// of one application read by the next). The learning rate, 1e-30, leaves
// every f32 parameter as it was, so the second half's step sees the
// same weights as the split step's second slice.
func TestRunningStatsOfSlicesUpdateInTurn(t *testing.T) {
	split := passtest.Parse(t, strings.ReplaceAll(bnStep, "BATCH", "4"))
	require.NoError(t, passtest.RunErr(split, "autodiff,microbatch{n=2},optimizer{kind=sgd,lr=1e-30}", "per-slice-bn"))
	half := passtest.Parse(t, strings.ReplaceAll(bnStep, "BATCH", "2"))
	pipeline(t, half, "autodiff,optimizer{kind=sgd,lr=1e-30}")
	f, h := split.Funcs[0], half.Funcs[0]
	args := interp.RandomArgs(f, 3)
	_, got, err := interp.RunWithUpdates(f, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	byName := func(fn *ir.Func, vals []*interp.Tensor, name string) *interp.Tensor {
		for i, a := range fn.Args {
			if a.Name == name {
				return vals[i]
			}
		}
		t.Fatalf("@%s has no argument %s", fn.Name, name)
		return nil
	}
	// The halves' steps, in turn, each from the statistics the last left.
	state := interp.CloneAll(args)
	for part := 0; part < 2; part++ {
		in := make([]*interp.Tensor, len(h.Args))
		for i, a := range h.Args {
			v := byName(f, state, a.Name)
			if a.Name == "x" {
				n := v.Len() / 2
				v = &interp.Tensor{Type: a.Type, F: append([]float64{}, v.F[part*n:(part+1)*n]...)}
			}
			in[i] = v.Clone()
		}
		_, out, err := interp.RunWithUpdates(h, in, interp.Options{})
		require.NoError(t, err)
		for _, name := range []string{"rm", "rv"} {
			copy(byName(f, state, name).F, byName(h, out, name).F)
		}
	}
	for _, name := range []string{"rm", "rv"} {
		want, have := byName(f, state, name), byName(f, got, name)
		require.NotEqual(t, byName(f, args, name).F, have.F, "%s is updated", name)
		require.InDeltaSlice(t, want.F, have.F, 1e-12, "%s after the two slices", name)
	}
}

// TestRunningStatWrittenAfterItsViews: the running statistic is written
// back after the last reader of any view of it (a reshape shares its
// bytes), so the loss reads the old statistic.
func TestRunningStatWrittenAfterItsViews(t *testing.T) {
	m := passtest.Parse(t, `func @step(%x: f32[4,3,1,1], %g: f32[3] {param}, %b: f32[3] {param}, %rm: f32[3] {state}, %rv: f32[3] {state}) -> (f32[]) {
  %r = reshape(%rm) {shape = [1, 3]} : f32[1,3]
  %n, %mean, %invstd, %nrm, %nrv = batch_norm_train(%x, %g, %b, %rm, %rv) {epsilon = 1e-05, momentum = 0.9} : f32[4,3,1,1], f32[3], f32[3], f32[3], f32[3]
  %s = reduce_sum(%n) {axes = [0, 1, 2, 3]} : f32[]
  %t = reduce_sum(%r) {axes = [0, 1]} : f32[]
  %l = add(%s, %t) : f32[]
  return %l
}
`)
	f := m.Funcs[0]
	args := interp.RandomArgs(f, 4)
	want, err := interp.Run(f, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	byName := map[string]*interp.Tensor{}
	for i, a := range f.Args {
		byName[a.Name] = args[i]
	}
	pipeline(t, m, "autodiff,optimizer{kind=sgd,lr=1e-30},reorder,assign")
	g := m.Funcs[0]
	in := interp.RandomArgs(g, 5) // the optimizer's own state: any values
	for i, a := range g.Args {
		if v, ok := byName[a.Name]; ok {
			in[i] = v.Clone()
		}
	}
	got, err := interp.Run(g, in, interp.Options{})
	require.NoError(t, err)
	require.InDelta(t, want[0].F[0], got[0].F[0], 1e-12, "the loss reads the statistic before its update")
}
