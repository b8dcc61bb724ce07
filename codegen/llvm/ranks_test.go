package llvm_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestCollectivesUnderMPI: the compiled SPMD program, run by mpirun on 4
// ranks, computes each collective as the interpreter's ranks do: on the
// world and on the two axes of a 2×2 mesh, along a middle axis, in f64
// and i64. Error model: MPI may add in another order than the
// interpreter's rank order; four f64 terms: 1e-15 relative.
func TestCollectivesUnderMPI(t *testing.T) {
	requireClang(t)
	if _, err := exec.LookPath("mpirun"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI installs Open MPI, and mpirun is missing")
		}
		t.Skip("mpirun is not installed (libopenmpi-dev openmpi-bin)")
	}
	src := `func @f(%x: f64[2,4,3], %k: i64[4]) -> (f64[2,4,3], f64[2,4,3], f64[2,2,3], f64[2,8,3], f64[2,4,3], i64[4]) attributes {ranks = 4} {
  %s = all_reduce(%x) {size = 4} : f64[2,4,3]
  %m = all_reduce(%x) {size = 2, stride = 2, op = "max"} : f64[2,4,3]
  %rs = reduce_scatter(%x) {size = 2, axis = 1} : f64[2,2,3]
  %g = all_gather(%x) {size = 2, stride = 2, axis = 1} : f64[2,8,3]
  %b = broadcast(%x) {size = 4, root = 3} : f64[2,4,3]
  %ks = all_reduce(%k) {size = 4, op = "min"} : i64[4]
  return %s, %m, %rs, %g, %b, %ks
}`
	m := passtest.Parse(t, src)
	pipelineOn(t, m, "assign")
	f := m.Funcs[0]
	args := make([][]*interp.Tensor, 4)
	for r := range args {
		args[r] = interp.RandomArgs(f, uint64(r+1))
	}
	want, _, err := interp.RunRanks(f, args, interp.Options{})
	require.NoError(t, err)
	p, err := loops.Lower(f)
	require.NoError(t, err)
	got, _, err := llvm.RunRanks(p, args)
	require.NoError(t, err)
	for r := range want {
		for i := range want[r] {
			require.LessOrEqual(t, passtest.RelErr(got[r][i], want[r][i]), 1e-15, "rank %d, result %s", r, f.ResultName(i))
		}
	}
}
