package cuda_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/plancheck"
)

// kernelLaunches are the kernels out's plan launches, in order.
func kernelLaunches(out *cuda.Output) []cuda.Node {
	var ks []cuda.Node
	for _, n := range out.Plan.Nodes {
		if n.Kind == "kernel" {
			ks = append(ks, n)
		}
	}
	return ks
}

// TestIndependentStagesShareALaunch: fuse makes one kernel op of the folds
// of x and x+y, three stages that touch no common bytes: one launch, its
// blocks split between them, with no barrier. The program equals the
// interpreter exactly, and the merged kernel carries the launch contract
// plan-check reads.
func TestIndependentStagesShareALaunch(t *testing.T) {
	dir, out, m := executable(t, "testdata/independent.kir", "fuse,assign", 0)
	f := m.Funcs[0]
	ks := kernelLaunches(out)
	require.Len(t, ks, 1, "one launch for the op")
	require.True(t, strings.HasSuffix(ks[0].Kernel, "_m0") && !ks[0].Cooperative, "a merged launch: %+v", ks[0])
	require.Regexp(t, `// kiln launch: threads=\d+ bytes=\d+(,\d+)+ modes=[rw,]+ outer=\n`+`extern "C" __global__ void __launch_bounds__\(256\) `+ks[0].Kernel+`\(`, out.Kernels)
	require.Equal(t, 6, strings.Count(out.Kernels, "_b("), "three device functions, each defined and called once")
	require.NotContains(t, out.Kernels, "kiln_grid_sync()", "no barrier")
	lp, err := plancheck.LoadDir(dir)
	require.NoError(t, err)
	require.Contains(t, lp.Kernels, ks[0].Kernel, "plan-check reads the merged kernel's signature")
	_, err = plancheck.CheckPlan(lp, 1)
	require.NoError(t, err, "plan-check")
	args := interp.RandomArgs(f, 3)
	want, err := interp.Run(f, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, _, _ := runProgram(t, dir, f, args, 1)
	for i := range want {
		require.Equal(t, want[i].F, got[i].F, "result %s", f.ResultName(i))
	}
}

// TestKernelOpIsOneLaunch: the same op with the sum of x+y too. The sum
// reads what the add writes, so the op is one cooperative launch: the
// three independent stages, a grid-wide barrier, the sum. The program
// equals the interpreter (the sum within f32 rounding of 128 terms);
// plan-check refuses the node launched plainly; and without its barrier
// the emulated program (which runs each block up to the barrier in turn,
// on a grid of 3) reads sums of x+y not yet written; and plan-check,
// reading the stage calls' phases from the launch contract, refuses a
// contract that puts the sum in the add's phase.
func TestKernelOpIsOneLaunch(t *testing.T) {
	dir, out, m := executable(t, "testdata/siblings.kir", "fuse,assign", 0)
	f := m.Funcs[0]
	ks := kernelLaunches(out)
	require.Len(t, ks, 1, "one launch for the op")
	k := ks[0]
	require.True(t, k.Cooperative, "a cooperative launch")
	require.Equal(t, 128, k.Grid[0], "its grid is the add's 128 blocks, the largest phase")
	src := out.Kernels[strings.Index(out.Kernels, "__global__ void __launch_bounds__(256) "+k.Kernel+"("):]
	src = src[:strings.Index(src, "\n}\n")]
	require.Equal(t, 1, strings.Count(src, "kiln_grid_sync();"), "one barrier, before the sum: %s", src)
	require.Less(t, strings.Index(src, "_s2_b("), strings.Index(src, "kiln_grid_sync();"), "the add before the barrier")
	require.Greater(t, strings.Index(src, "_s3_b("), strings.Index(src, "kiln_grid_sync();"), "the sum after it")
	require.Regexp(t, `// kiln launch: threads=256 bytes=[\d,]+ modes=[rw,]+ outer= cooperative=1 phases=[\d:rw./]+\nextern "C" __global__ void __launch_bounds__\(256\) `+k.Kernel+`\(`, out.Kernels)

	lp, err := plancheck.LoadDir(dir)
	require.NoError(t, err)
	require.True(t, lp.Kernels[k.Kernel].Cooperative, "plan-check reads the contract")
	_, err = plancheck.CheckPlan(lp, 1)
	require.NoError(t, err, "plan-check")
	plain := *lp.Plan
	plain.Nodes = append([]cuda.Node{}, lp.Plan.Nodes...)
	for i := range plain.Nodes {
		plain.Nodes[i].Cooperative = false
	}
	lp2 := *lp
	lp2.Plan = &plain
	_, err = plancheck.CheckStructure(&lp2)
	require.ErrorContains(t, err, "declares cooperatively", "a plain launch of a kernel with barriers")
	var phases []int
	for _, c := range lp.Kernels[k.Kernel].Calls {
		phases = append(phases, c.Phase)
	}
	require.Equal(t, []int{0, 0, 0, 1}, phases, "plan-check reads the stage calls' phases")
	// A contract that puts the sum in the add's phase: plan-check finds
	// the two stages touching the sum's operand with no barrier between.
	kernelsFile := filepath.Join(dir, "kernels.cu")
	raw, err := os.ReadFile(kernelsFile)
	require.NoError(t, err)
	contract := regexp.MustCompile(`phases=(\S*)/1:`).FindStringSubmatchIndex(string(raw))
	require.NotNil(t, contract)
	moved := string(raw[:contract[1]-2]) + "0:" + string(raw[contract[1]:])
	require.NoError(t, os.WriteFile(kernelsFile, []byte(moved), 0o644))
	lp3, err := plancheck.LoadDir(dir)
	require.NoError(t, err)
	_, err = plancheck.CheckStructure(lp3)
	require.ErrorContains(t, err, "with no barrier between", "a conflict within a phase")
	require.NoError(t, os.WriteFile(kernelsFile, raw, 0o644))

	args := interp.RandomArgs(f, 3)
	want, err := interp.Run(f, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, _, report := runProgram(t, dir, f, args, 1)
	require.Equal(t, want[0].F, got[0].F, "max")
	require.Equal(t, want[1].F, got[1].F, "min")
	require.Equal(t, want[2].F, got[2].F, "x + y")
	for i := range want[3].F {
		require.InDelta(t, want[3].F[i], got[3].F[i], 128*6e-8*maxAbs(want[2].F), "sum %d", i)
	}
	mm := emulated.FindStringSubmatch(report)
	require.NotNil(t, mm, report)
	require.Equal(t, "1", mm[6], "one launch issued: %s", report)

	// Three steps: the second captures a graph and launches it, as the
	// third does.
	// Where CUDA cannot capture a cooperative launch, the runtime says so
	// and issues the nodes each step, with the same results.
	graphed, _, report := runProgram(t, dir, f, args, 3)
	require.Contains(t, report, " 2 graph launches", report)
	direct, _, report := runProgram(t, dir, f, args, 3, "KILN_EMU_NO_COOPERATIVE_CAPTURE=1")
	require.Contains(t, report, "could not be captured into a CUDA graph")
	require.Contains(t, report, " 0 graph launches", report)
	for i := range graphed {
		require.Equal(t, graphed[i].F, direct[i].F, "result %s", f.ResultName(i))
	}

	// The same program without its barrier.
	require.NoError(t, os.WriteFile(kernelsFile, []byte(strings.Replace(string(raw), "  kiln_grid_sync();\n", "", 1)), 0o644))
	rebuild(t, dir)
	broken, _, _ := runProgram(t, dir, f, args, 1)
	require.Equal(t, want[2].F, broken[2].F, "x + y is still right")
	require.NotEqual(t, want[3].F, broken[3].F, "without the barrier the sums read rows of x + y not written yet")
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
