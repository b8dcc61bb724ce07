package cuda_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/kiln-compiler/kiln/plancheck"
)

// TestConvolutionsAsImplicitGemm: convolutions, input gradients and
// weight gradients of many geometries (padding, strides, dilations,
// groups, 1×1, bf16 and f16 operands: on the tensor cores, 64 output
// channels filling all 8 warps' rows of a tile) each run as one
// product over the whole batch read under the taps: no im2col or col2im
// in the workspace, at most one kernel launch per op (a pointwise one of
// one group is one strided-batched GEMM over the images instead), a
// weight gradient of few output tiles split along its contraction
// (atomic adds after a zeroing stage). plan-check passes, and the emulated program
// equals the interpreter within the f32 error model: sums of K terms
// differ from the interpreter's by at most K·2⁻²⁴ relative to the
// result's norm.
func TestConvolutionsAsImplicitGemm(t *testing.T) {
	dir, out, m := executable(t, "testdata/convs.kir", "assign", 0)
	f := m.Funcs[0]
	for _, b := range out.Plan.Buffers {
		for _, v := range b.Values {
			require.False(t, strings.Contains(v, ".col"), "an im2col in the workspace: %s", v)
		}
	}
	kernels := map[int]int{}
	library := 0
	for _, n := range out.Plan.Nodes {
		switch n.Kind {
		case "kernel":
			kernels[n.Op]++
		case "library":
			library++
		}
	}
	for op, n := range kernels {
		require.Equal(t, 1, n, "op %d: kernel launches", op)
	}
	require.Equal(t, 2, library, "the pointwise convolution and input gradient: a strided-batched GEMM each, over the batch")
	require.Contains(t, out.Kernels, "atomicAdd(&", "the long weight gradient split along K")
	require.Equal(t, 3*2, strings.Count(out.Kernels, "nvcuda::wmma::mma_sync("), "the bf16 and f16 convolutions on the tensor cores (two fragments a warp)")
	require.Contains(t, out.Kernels, "fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half,", "the f16 one")
	lp, err := plancheck.LoadDir(dir)
	require.NoError(t, err)
	_, err = plancheck.CheckPlan(lp, 1)
	require.NoError(t, err, "plan-check")
	args := interp.RandomArgs(f, 5)
	want, err := interp.Run(f, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, _, _ := runProgram(t, dir, f, args, 1)
	for i, K := range []float64{36, 36, 6, 36, 72, 36, 72, 32, 16, 72, 48, 12, 72, 8, 162, 98, 128, 2048} {
		e := passtest.RelErr(got[i], want[i])
		require.LessOrEqual(t, e, K*0x1p-24, "result %s", f.ResultName(i))
	}
}
