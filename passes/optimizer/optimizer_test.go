package optimizer_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
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
