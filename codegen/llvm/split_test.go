package llvm_test

import (
	"strings"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// splitSource has kernels with parallel bodies (the products), an
// inlinable helper (integer pow), a constant, and a checked index whose
// failure every part reports through the one kiln_status.
const splitSource = `func @f(%x: f32[64,64], %w: f32[64,64], %n: i64[8], %e: f32[5,3], %i: i64[4]) -> (f32[64,64], i64[8], f32[4,3], i64[4,3]) {
  %k = constant() {value = dense<i64[8]: [0, 1, 2, 3, 4, 5, 6, 7]>} : i64[8]
  %p = pow(%n, %k) : i64[8]
  %m = matmul(%x, %w) : f32[64,64]
  %r = relu(%m) : f32[64,64]
  %g = gather(%e, %i) : f32[4,3]
  %m2 = matmul(%r, %w) : f32[64,64]
  %t = tanh(%m2) : f32[64,64]
  %c = cast(%g) {to = i64} : i64[4,3]
  %q = pow(%c, %c) : i64[4,3]
  return %t, %p, %g, %q
}
`

// TestSplitModulesRunAsOne: a step compiled as a module per kernel (in
// parallel) gives the interpreter's results, and fails on an index out of
// range as the one-module build does; each module defines its own
// kernels, declares the others' and copies the helpers it inlines.
func TestSplitModulesRunAsOne(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("t.kir", splitSource)
	require.NoError(t, err)
	pipelineOn(t, m, "fuse,assign")
	f := m.Funcs[0]
	p, err := llvm.Lower(f)
	require.NoError(t, err)

	// A module per kernel, the entry point in the last.
	texts, err := llvm.SplitText(p, llvm.Options{Parts: 16})
	require.NoError(t, err)
	require.Len(t, texts, len(p.Kernels)+1)
	all := strings.Join(texts, "\n")
	require.Equal(t, 2, strings.Count(all, "define internal i64 @kiln_ipow("), "each pow's module has its own copy of the helper, to inline")
	require.Equal(t, 1, strings.Count(all, "@kiln_status = hidden global"), "one module defines the status")
	require.Equal(t, 1, strings.Count(all, "@kiln_status = external hidden global"), "the entry point reads the status the gather writes")
	require.Equal(t, 1, strings.Count(all, "define weak void @kiln_parallel_for("), "one weak default of the thread pool")
	require.Contains(t, texts[len(texts)-1], "declare hidden void @k0_", "the entry point calls the kernels of other modules")
	require.Equal(t, 1, strings.Count(all, "define i32 @kiln_f("))
	one, err := llvm.SplitText(p, llvm.Options{})
	require.NoError(t, err)
	require.Len(t, one, 1, "a small step stays one module")

	args := interp.RandomArgs(f, 3)
	want, err := interp.Run(f, cloneAll(args), interp.Options{})
	require.NoError(t, err)
	for _, parts := range []int{1, 16} {
		got, _, err := llvm.Run(p, cloneAll(args), llvm.RunOptions{Options: llvm.Options{Parts: parts}})
		require.NoError(t, err, "%d modules", parts)
		for i := range want {
			require.True(t, passtest.RelErr(got[i], want[i]) <= 1e-5, "%d modules, result %d", parts, i)
		}
		bad := cloneAll(args)
		bad[4] = interp.FromInts(f.Args[4].Type, []int64{0, 1, 9, 2})
		_, _, err = llvm.Run(p, bad, llvm.RunOptions{Options: llvm.Options{Parts: parts}})
		require.Error(t, err, "%d modules: index 9 of 5", parts)
		require.Contains(t, err.Error(), "out of range", "%d modules", parts)
	}
}
