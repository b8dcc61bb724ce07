package llvm_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestCollectivesUnderMPI: the compiled SPMD program, run by mpirun on 4
// ranks, computes each collective as the interpreter's ranks do: on the
// world and on the two axes of a 2×2 mesh, along a middle axis, in f64
// and i64. Error model: MPI may add in another order than the
// interpreter's rank order; four f64 terms: 1e-15 relative.
func TestCollectivesUnderMPI(t *testing.T) {
	requireMPI(t)
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
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	got, _, err := llvm.RunRanks(p, args)
	require.NoError(t, err)
	for r := range want {
		for i := range want[r] {
			require.LessOrEqual(t, passtest.RelErr(got[r][i], want[r][i]), 1e-15, "rank %d, result %s", r, f.ResultName(i))
		}
	}
}

// TestDataParallelStepUnderMPI: an f64 training step with Adam, under
// ZeRO-3 on 4 ranks (and on 2 × 2 ranks with tensor parallelism and
// ZeRO-2), compiled and run by mpirun, gives the one-device
// step's loss, gradients' effect (the updated parameters and moments,
// joined from the ranks' parts) within 1e-12: the ranks' partial sums
// and MPI's reduction order change the order of f64 additions only.
func TestDataParallelStepUnderMPI(t *testing.T) {
	requireMPI(t)
	src := `func @mlp(%x: f64[8,6], %w1: f64[6,16] {param}, %b1: f64[16] {param}, %w2: f64[16,4] {param}) -> (f64[8,4]) {
  %h = matmul(%x, %w1) : f64[8,16]
  %hb = add(%h, %b1) : f64[8,16]
  %a = tanh(%hb) : f64[8,16]
  %y = matmul(%a, %w2) : f64[8,4]
  return %y
}`
	for _, spec := range []string{"dp=4,zero=3", "dp=2,tp=2,zero=2"} {
		t.Run(spec, func(t *testing.T) {
			if testing.Short() && spec == "dp=4,zero=3" {
				t.Skip("-short runs the mesh (data and tensor parallel, ZeRO-2) alone")
			}
			stepUnderMPI(t, src, spec)
		})
	}
}

// TestTensorParallelBlocksUnderMPI: two transformer MLP blocks on a mesh
// of 2 data-parallel × 2 tensor-parallel ranks with ZeRO-2, compiled and
// run by mpirun, equal one device (the error model of
// TestDataParallelStepUnderMPI).
func TestTensorParallelBlocksUnderMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("-short compiles one partitioned step under mpirun (TestDataParallelStepUnderMPI)")
	}
	requireMPI(t)
	raw, err := os.ReadFile("../../testdata/steps/mlp_blocks_f64.kir")
	require.NoError(t, err)
	stepUnderMPI(t, string(raw), "dp=2,tp=2,zero=2")
}

// TestTensorParallelAttentionUnderMPI: attention split by heads, both
// with separate projections (beside dp=2 and ZeRO-2) and with a fused
// one whose parts hold each rank's heads of the query, key and value
// rows (shard_outer), compiled and run on its ranks, equals one device.
func TestTensorParallelAttentionUnderMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("-short compiles one partitioned step under mpirun (TestDataParallelStepUnderMPI)")
	}
	requireMPI(t)
	for file, spec := range map[string]string{"mha_f64.kir": "dp=2,tp=2,zero=2", "mha_fused_f64.kir": "tp=2"} {
		raw, err := os.ReadFile("../../testdata/steps/" + file)
		require.NoError(t, err)
		t.Run(file, func(t *testing.T) { stepUnderMPI(t, string(raw), spec) })
	}
}

// stepUnderMPI compiles src's Adam step partitioned by spec, runs its
// ranks under mpirun and compares them with the one-device interpreter.
func stepUnderMPI(t *testing.T, src, spec string) {
	whole := passtest.Parse(t, src)
	pipelineOn(t, whole, "autodiff{loss=mean},optimizer{kind=adam}")
	m := passtest.Clone(t, whole)
	pipelineOn(t, m, "parallel{"+spec+"},assign")
	f, wf := m.Funcs[0], whole.Funcs[0]
	args := interp.RandomArgs(wf, 9)
	want, wantArgs, err := interp.RunWithUpdates(wf, interp.CloneAll(args), interp.Options{})
	require.NoError(t, err)
	parts, err := parallel.ShardValues(f, args)
	require.NoError(t, err)
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	got, gotArgs, err := llvm.RunRanks(p, parts)
	require.NoError(t, err)
	for r := range got {
		require.LessOrEqual(t, passtest.RelErr(got[r][0], want[0]), 1e-12, "rank %d: loss", r)
	}
	joined := parallel.JoinValues(f, gotArgs)
	for i, a := range wf.Args {
		if a.Arg.InOut {
			require.LessOrEqual(t, passtest.RelErr(joined[i], wantArgs[i]), 1e-12, "updated %s", a.Name)
		}
	}
}

// requireMPI skips a test without clang or mpirun, except in CI, which
// installs both.
func requireMPI(t *testing.T) {
	t.Helper()
	requireClang(t)
	if _, err := exec.LookPath("mpirun"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI installs Open MPI, and mpirun is missing")
		}
		t.Skip("mpirun is not installed (libopenmpi-dev openmpi-bin)")
	}
}

// TestSendRecvUnderMPI: three stage programs of two ranks each (six MPI
// ranks, a program per stage) pass tensors of several dtypes along and
// back with send and recv, taken by tag in another order than sent, as
// the interpreter's ranks do: bit for bit (nothing is computed in
// another order).
func TestSendRecvUnderMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("-short compiles one partitioned step under mpirun (TestDataParallelStepUnderMPI)")
	}
	requireMPI(t)
	src := `func @s0(%x: f64[2,3], %k: i32[4]) -> (f64[2,3]) attributes {ranks = 2, stage = 0, stages = 3} {
  %y = neg(%x) : f64[2,3]
  send(%x) {offset = 2, tag = 1}
  send(%k) {offset = 2, tag = 2}
  send(%y) {offset = 4, tag = 3}
  %b = recv() {offset = 4, tag = 9, shape = [2, 3], dtype = f64} : f64[2,3]
  return %b
}

func @s1(%x: f64[2,3]) -> (f64[2,3], i32[4]) attributes {ranks = 2, stage = 1, stages = 3} {
  %k = recv() {offset = -2, tag = 2, shape = [4], dtype = i32} : i32[4]
  %a = recv() {offset = -2, tag = 1, shape = [2, 3], dtype = f64} : f64[2,3]
  %s = add(%a, %x) : f64[2,3]
  send(%s) {offset = 2, tag = 5}
  return %s, %k
}

func @s2(%x: f64[2,3]) -> (f64[2,3]) attributes {ranks = 2, stage = 2, stages = 3} {
  %c = recv() {offset = -4, tag = 3, shape = [2, 3], dtype = f64} : f64[2,3]
  %s = recv() {offset = -2, tag = 5, shape = [2, 3], dtype = f64} : f64[2,3]
  %m = mul(%c, %s) : f64[2,3]
  send(%m) {offset = -4, tag = 9}
  return %m
}`
	m := passtest.Parse(t, src)
	pipelineOn(t, m, "assign")
	var args [][]*interp.Tensor
	var progs []*ir.Func
	var ps []*loops.Program
	for _, f := range m.Funcs {
		p, err := llvm.Lower(f)
		require.NoError(t, err)
		ps = append(ps, p)
		for r := 0; r < 2; r++ {
			args = append(args, interp.RandomArgs(f, uint64(len(args)+1)))
			progs = append(progs, f)
		}
	}
	want, _, err := interp.RunPrograms(progs, args, interp.Options{})
	require.NoError(t, err)
	got, _, err := llvm.RunStages(ps, args, llvm.Options{})
	require.NoError(t, err)
	for r := range want {
		for i := range want[r] {
			require.Zero(t, passtest.RelErr(got[r][i], want[r][i]), "rank %d, result %d", r, i)
		}
	}
}
