package llvm_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/parser"
)

// TestStepsAdvanceTheirState: a training step with dropout, run three
// times on its own updated arguments (the learning rate kept at 0 so
// that only the random state changes what the step computes), draws new
// masks every step (the loss differs from step to step), and the compiled
// step draws exactly the interpreter's masks from the same state: equal
// losses (the same masks, to f32 sums) and the same generator position
// and step count after each step.
func TestStepsAdvanceTheirState(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%x: f32[8,32], %w: f32[32,16] {param}) -> (f32[8,16]) {
  %h = matmul(%x, %w) : f32[8,16]
  %d, %mask = dropout(%h) {ratio = 0.5, seed = 3} : f32[8,16], bool[8,16]
  %y = tanh(%d) : f32[8,16]
  return %y
}`)
	require.NoError(t, err)
	pipelineOn(t, m, "autodiff,optimizer{kind=sgd,lr=0.5},fuse,reorder,assign")
	f := m.Funcs[0]
	args := interp.RandomArgs(f, 5)
	lr, key, step := -1, -1, -1
	for i, a := range f.Args {
		switch a.Name {
		case "optimizer.lr":
			lr = i
		case "random.offset":
			key = i
		case "optimizer.step":
			step = i
		}
	}
	require.True(t, lr >= 0 && key >= 0 && step >= 0, "the step's state: %s", f)
	args[lr].F[0] = 0
	p, err := loops.Lower(f)
	require.NoError(t, err)
	exe, err := llvm.Compile(p, llvm.Options{})
	require.NoError(t, err)
	defer exe.Close()
	var losses []float64
	for s := 0; s < 3; s++ {
		want, wantArgs, err := interp.RunWithUpdates(f, cloneAll(args), interp.Options{})
		require.NoError(t, err)
		got, gotArgs, err := exe.Run(cloneAll(args), llvm.RunOptions{})
		require.NoError(t, err)
		require.InDelta(t, want[0].F[0], got[0].F[0], 1e-5*(1+abs(want[0].F[0])), "step %d: the loss", s)
		require.Equal(t, wantArgs[key].I[0], gotArgs[key].I[0], "step %d: the generator's position", s)
		require.Equal(t, float64(s+1), gotArgs[step].F[0], "step %d: the step count", s)
		losses = append(losses, want[0].F[0])
		args = gotArgs
	}
	require.NotEqual(t, losses[0], losses[1], "the same masks in steps 1 and 2")
	require.NotEqual(t, losses[1], losses[2], "the same masks in steps 2 and 3")
}

func abs(x float64) float64 { return max(x, -x) }
