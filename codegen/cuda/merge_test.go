package cuda_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/plancheck"
)

// TestIndependentStagesShareALaunch: fuse makes one kernel op of the folds
// of x and the sum of x+y (siblings reading a large input). Its first
// three stages (max, min, the add) touch no common bytes and run as one
// launch, its blocks split between them; the sum reads what the add
// writes and stays a launch of its own. The program equals the
// interpreter (max, min and the add exactly; the sum within f32 rounding
// of 128 terms), and the merged kernel carries the launch contract
// plan-check reads.
func TestIndependentStagesShareALaunch(t *testing.T) {
	dir, out, m := executable(t, "testdata/siblings.kir", "fuse,assign", 0)
	f := m.Funcs[0]
	var launches []string
	for _, n := range out.Plan.Nodes {
		if n.Kind == "kernel" {
			launches = append(launches, n.Kernel)
		}
	}
	require.Len(t, launches, 2, "the independent stages, then the sum: %v", launches)
	require.True(t, strings.HasSuffix(launches[0], "_m0"), "a merged launch first: %v", launches)
	require.Regexp(t, `// kiln launch: threads=\d+ bytes=\d+(,\d+)+ modes=[rw,]+ outer=\n`+`extern "C" __global__ void __launch_bounds__\(256\) `+launches[0]+`\(`, out.Kernels)
	require.Equal(t, 6, strings.Count(out.Kernels, "_b("), "three device functions, each defined and called once")
	lp, err := plancheck.LoadDir(dir)
	require.NoError(t, err)
	require.Contains(t, lp.Kernels, launches[0], "plan-check reads the merged kernel's signature")
	_, err = plancheck.CheckPlan(lp, 1)
	require.NoError(t, err, "plan-check")
	args := interp.RandomArgs(f, 3)
	want, err := interp.Run(f, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, _, _ := runProgram(t, dir, f, args, 1)
	require.Equal(t, want[0].F, got[0].F, "max")
	require.Equal(t, want[1].F, got[1].F, "min")
	require.Equal(t, want[2].F, got[2].F, "x + y")
	for i := range want[3].F {
		require.InDelta(t, want[3].F[i], got[3].F[i], 128*6e-8*maxAbs(want[2].F), "sum %d", i)
	}
}

func maxAbs(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x, -x)
	}
	return m
}

// TestMergedPlansPassPlanCheck: stages inside a loop (a convolution run
// per image and chunk: its epilogue, the next im2col, the fill of a
// weight gradient) do not merge: plan-check holds a kernel with loop
// indices to one launch per point of its loops, which a merge of one
// iteration's launch with another stage's breaks.
func TestMergedPlansPassPlanCheck(t *testing.T) {
	for _, c := range []struct{ model, pipeline string }{
		{"testdata/conv_bias.kir", "fuse,assign"},
		{"testdata/conv_wide.kir", "autodiff,optimizer{kind=sgd,lr=0.1},fuse,assign"},
	} {
		dir, _, _ := compileWith(t, c.model, c.pipeline, onnx.Options{})
		lp, err := plancheck.LoadDir(dir)
		require.NoError(t, err)
		_, err = plancheck.CheckStructure(lp)
		require.NoError(t, err, "%s: plan-check", c.model)
	}
}
