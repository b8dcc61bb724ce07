package driver

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passtest"
)

func kiln(t *testing.T, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := Main(args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func readNpy(t *testing.T, path string) *interp.Tensor {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	x, err := npy.Read(bytes.NewReader(b))
	require.NoError(t, err)
	return x
}

// TestRunBundledModels runs the bundled MLP and CNN forward and as
// training steps, and checks the written .npy files against the
// interpreter run directly.
func TestRunBundledModels(t *testing.T) {
	for _, name := range []string{"mlp", "cnn"} {
		for _, pipeline := range []string{"", "autodiff"} {
			src := filepath.Join("..", "testdata", "examples", name+".kir")
			dir := t.TempDir()
			_, stderr, code := kiln(t, "run", src, "--passes", pipeline, "--seed", "5", "--output-dir", dir)
			require.Equal(t, 0, code, stderr)

			text, _ := os.ReadFile(src)
			m, err := parser.Parse(src, string(text))
			require.NoError(t, err)
			if pipeline != "" {
				p, _ := passes.ParsePipeline(pipeline, nil)
				require.NoError(t, (&passes.Manager{}).Run(m, p))
			}
			f := m.Funcs[0]
			want, err := interp.Run(f, interp.RandomArgs(f, 5), interp.Options{})
			require.NoError(t, err)
			for i := range want {
				got := readNpy(t, filepath.Join(dir, FileName(f.ResultName(i))))
				require.Equal(t, want[i].Type, got.Type)
				require.Equal(t, want[i].F, got.F, "%s %s result %s", name, pipeline, f.ResultName(i))
			}
			if pipeline == "autodiff" {
				require.FileExists(t, filepath.Join(dir, "grad.w1.npy"))
				require.FileExists(t, filepath.Join(dir, "loss.npy"))
			}
		}
	}
}

// TestRunWithInputs feeds an argument from a .npy file and checks a
// shape mismatch names the argument.
func TestRunWithInputs(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f.kir")
	require.NoError(t, os.WriteFile(src, []byte("func @f(%x: f32[3], %y: f32[3]) -> (\"out/y\": f32[3]) {\n  %z = add(%x, %y) : f32[3]\n  return %z\n}\n"), 0o644))
	var b bytes.Buffer
	x := interp.FromFloats(parseType(t, "f32[3]"), []float64{1, 2, 3})
	require.NoError(t, npy.Write(&b, x))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x.npy"), b.Bytes(), 0o644))
	_, stderr, code := kiln(t, "run", src, "--input", "x="+filepath.Join(dir, "x.npy"), "--input", "y="+filepath.Join(dir, "x.npy"), "--output-dir", filepath.Join(dir, "out"))
	require.Equal(t, 0, code, stderr)
	got := readNpy(t, filepath.Join(dir, "out", "out_y.npy"))
	require.Equal(t, []float64{2, 4, 6}, got.F)

	b.Reset()
	require.NoError(t, npy.Write(&b, interp.FromFloats(parseType(t, "f32[4]"), []float64{1, 2, 3, 4})))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.npy"), b.Bytes(), 0o644))
	_, stderr, code = kiln(t, "run", src, "--input", "x="+filepath.Join(dir, "bad.npy"), "--output-dir", filepath.Join(dir, "out"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "holds f32[4], but argument %x is f32[3]")

	x1 := "x=" + filepath.Join(dir, "x.npy")
	_, stderr, code = kiln(t, "run", src, "--input", x1, "--input", x1, "--output-dir", filepath.Join(dir, "out"))
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--input x is given twice")
}

func parseType(t *testing.T, s string) ir.Type {
	m, err := parser.Parse("t", "func @f(%x: "+s+") -> () {\n  return\n}\n")
	require.NoError(t, err)
	return m.Funcs[0].Args[0].Type
}

// TestRunIndexOutOfRange: an embedding index outside the table is an
// error on both backends, located at the op by the interpreter, and no
// result is written.
func TestRunIndexOutOfRange(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "g.kir")
	require.NoError(t, os.WriteFile(src, []byte("func @f(%e: f32[5,3] {param}, %i: i64[4]) -> (f32[4,3]) {\n  %g = gather(%e, %i) {axis = 0} : f32[4,3]\n  return %g\n}\n"), 0o644))
	var b bytes.Buffer
	require.NoError(t, npy.Write(&b, interp.FromInts(parseType(t, "i64[4]"), []int64{0, 7, 1, 2})))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "i.npy"), b.Bytes(), 0o644))
	out := filepath.Join(dir, "out")
	_, stderr, code := kiln(t, "run", src, "--input", "i="+filepath.Join(dir, "i.npy"), "--output-dir", out)
	require.Equal(t, 1, code)
	require.Equal(t, src+":2:3: error: gather %g: gather index 7 is out of range for dimension 0 of size 5\n", stderr)
	if _, err := exec.LookPath("clang-14"); err == nil {
		_, stderr, code = kiln(t, "run", src, "--backend", "llvm", "--input", "i="+filepath.Join(dir, "i.npy"), "--output-dir", out)
		require.Equal(t, 1, code)
		require.Contains(t, stderr, "index out of range")
	}
	_, err := os.Stat(out)
	require.True(t, os.IsNotExist(err), "no results are written")
}

// TestRunParallelEqualsOneDevice: kiln run --parallel dp=N (with ZeRO
// stages 2 and 3, whose parameters and moments are joined from the
// ranks' parts; in the interpreter and compiled under mpirun), and
// pp=P with and without microbatches (the stages' results and updates
// joined) writes what
// the one-device run writes: loss, gradients, updated parameters and
// Adam's moments, from the same inputs and seed. Error model: f32, the
// ranks' partial sums added in another order, a few hundred terms per
// element: 1e-5 relative to the tensor.
func TestRunParallelEqualsOneDevice(t *testing.T) {
	dir := t.TempDir()
	steps := [][]string{{"--train=sum"}, {"--train=mean", "--optimizer", "adam"}}
	if testing.Short() {
		steps = steps[1:] // the step with an optimizer: the harder of the two
	}
	for _, extra := range steps {
		one := filepath.Join(dir, "one")
		base := append([]string{"run", "../testdata/examples/mlp.kir", "--seed", "5"}, extra...)
		_, stderr, code := kiln(t, append(base, "--output-dir", one)...)
		require.Equal(t, 0, code, stderr)
		specs := [][]string{{"dp=2"}, {"dp=4"}, {"dp=2,zero=2"}, {"dp=4,zero=3"}, {"dp=2", "--microbatches", "2"}, {"pp=2"}, {"pp=2,microbatches=4"}, {"pp=3,microbatches=2"}, {"dp=2,pp=2,zero=2,microbatches=2"}}
		if _, err := exec.LookPath("mpirun"); err == nil {
			// The compiled ranks under mpirun.
			specs = append(specs, []string{"dp=2,pp=2,zero=3", "--backend", "llvm"})
			if !testing.Short() {
				specs = append(specs, []string{"dp=2", "--backend", "llvm"}, []string{"dp=4,zero=3", "--backend", "llvm"}, []string{"pp=2,microbatches=4", "--backend", "llvm"})
			}
		} else if os.Getenv("CI") != "" {
			t.Fatal("CI installs Open MPI: mpirun is missing")
		}
		for _, spec := range specs {
			n := strings.Join(spec, " ")
			par := filepath.Join(dir, strings.NewReplacer(",", "_", " ", "_").Replace(n))
			_, stderr, code := kiln(t, append(append(base, "--parallel"), append(spec, "--output-dir", par)...)...)
			require.Equal(t, 0, code, stderr)
			files, err := os.ReadDir(one)
			require.NoError(t, err)
			require.NotEmpty(t, files)
			for _, fe := range files {
				want := readNpy(t, filepath.Join(one, fe.Name()))
				got := readNpy(t, filepath.Join(par, fe.Name()))
				require.True(t, got.Type.Equal(want.Type), "%s", fe.Name())
				require.LessOrEqual(t, passtest.RelErr(got, want), 1e-5, "%s %v: %s", n, extra, fe.Name())
			}
		}
		require.NoError(t, os.RemoveAll(one))
	}
}

// TestCompilePipelineWritesAFilePerStage: kiln compile of a pipeline
// writes OUT/stage0, OUT/stage1, … (LLVM IR whose sends and recvs call
// the driver's kiln_send and kiln_recv; executables that mpirun runs as
// one program per stage, as kiln run --backend llvm does).
func TestCompilePipelineWritesAFilePerStage(t *testing.T) {
	dir := t.TempDir()
	base := []string{"compile", "../testdata/examples/mlp.kir", "--train=sum", "--optimizer", "adam", "--parallel", "pp=2,microbatches=2"}
	_, stderr, code := kiln(t, append(base, "--emit", "ll", "-o", filepath.Join(dir, "ll"))...)
	require.Equal(t, 0, code, stderr)
	for s, call := range []string{"kiln_send", "kiln_recv"} {
		text, err := os.ReadFile(filepath.Join(dir, "ll", fmt.Sprintf("stage%d.ll", s)))
		require.NoError(t, err)
		require.Contains(t, string(text), "@kiln_send")
		require.Contains(t, string(text), "@"+call)
	}
	if _, err := exec.LookPath("clang-14"); err != nil && os.Getenv("CI") == "" {
		passtest.Missing(t, "clang-14 is not installed")
	}
	if _, err := exec.LookPath("mpicc"); err != nil && os.Getenv("CI") == "" {
		passtest.Missing(t, "mpicc is not installed")
	}
	_, stderr, code = kiln(t, append(base, "--emit", "exe", "-o", filepath.Join(dir, "exe"))...)
	require.Equal(t, 0, code, stderr)
	for s := range 2 {
		st, err := os.Stat(filepath.Join(dir, "exe", fmt.Sprintf("stage%d", s)))
		require.NoError(t, err)
		require.NotZero(t, st.Mode()&0o100, "stage %d is executable", s)
	}
}

// TestRunParallelDrawsTheOneDeviceInputs: a step whose input is token ids
// (GPT-2 at CI size: ids index a 100-row embedding) draws them below the
// embedding's rows when partitioned too, so kiln run --parallel (tp, pp,
// dp with exact dropout masks; and, outside -short, dp=2 with ZeRO-2
// beside tp=2 compiled under mpirun) writes the one-device loss from the
// same seed. The partitioned runs once drew ids below 10 (their argument views
// had no reader to bound them) and wrote another step's loss. Error
// model: f32, partial sums in another order: 1e-5. Under mpirun the
// gradients and updated parameters are compared too, with the compiled
// one-device step's.
func TestRunParallelDrawsTheOneDeviceInputs(t *testing.T) {
	dir := t.TempDir()
	base := []string{"run", "../testdata/models/ci/gpt2_small_ci.onnx", "--train=sum", "--optimizer", "sgd", "--seed", "3"}
	_, stderr, code := kiln(t, append(base, "--output-dir", filepath.Join(dir, "one"))...)
	require.Equal(t, 0, code, stderr)
	want := readNpy(t, filepath.Join(dir, "one", "loss.npy"))
	specs := [][]string{{"tp=2"}, {"pp=2"}, {"dp=2,exact-dropout=true"}}
	if _, err := exec.LookPath("mpirun"); err == nil && !testing.Short() {
		// The 4-rank step, compiled and run under mpirun.
		specs = append(specs, []string{"dp=2,tp=2,zero=2,exact-dropout=true", "--backend", "llvm"})
	}
	for i, spec := range specs {
		out := filepath.Join(dir, fmt.Sprint(i))
		_, stderr, code := kiln(t, append(append(base, "--parallel"), append(spec, "--output-dir", out)...)...)
		require.Equal(t, 0, code, stderr)
		require.LessOrEqual(t, passtest.RelErr(readNpy(t, filepath.Join(out, "loss.npy")), want), 1e-5, spec)
		if len(spec) > 1 {
			// The compiled ranks' gradients and updated parameters against
			// the compiled one-device step's. Error model as for pp=2 × tp=2
			// in TestTensorParallelOnCIModels: f32 sums over the widest
			// contraction and the batch's rows, compounded over the backward
			// of 2 layers: worst case ≈ 1e-3, random-sign estimate ≈ 8e-6;
			// bound 1e-4.
			one := filepath.Join(dir, "one-llvm")
			_, stderr, code := kiln(t, append(base, "--backend", "llvm", "--output-dir", one)...)
			require.Equal(t, 0, code, stderr)
			files, err := filepath.Glob(filepath.Join(one, "*.npy"))
			require.NoError(t, err)
			compared, worst := 0, 0.0
			for _, f := range files {
				name := filepath.Base(f)
				if !strings.HasPrefix(name, "grad.") && !strings.HasPrefix(name, "updated.") {
					continue
				}
				compared++
				e := passtest.RelErr(readNpy(t, filepath.Join(out, name)), readNpy(t, f))
				worst = max(worst, e)
				require.LessOrEqual(t, e, 1e-4, "%s under mpirun", name)
			}
			require.Greater(t, compared, 10, "gradients and updated parameters compared")
			t.Logf("%v under mpirun: %d gradients and updated parameters, %.3g at worst", spec, compared, worst)
		}
	}
}

// TestRunResNetOnFourRanksUnderMPI: the 4-rank target for
// ResNet-50 through mpirun: the f64 CI model (batch 4) in 4 data-parallel
// ranks with ZeRO-2 and synchronised batch norms, compiled and run by
// mpirun, writes the one-device interpreter's loss and each parameter's
// update (updated − initial) within passtest.OrderBound of that value's
// floor. The compiled ranks sum over the batch in another order, and
// their kernels contract in another order than the interpreter's: the
// floor is the larger of the step's with its batch rotated
// (passtest.OrderFloor, up to 2.4e-12 here, see TestResNetOnFourRanks) and
// the one-device compiled step's distance from the interpreter's.
func TestRunResNetOnFourRanksUnderMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("model-scale")
	}
	if _, err := exec.LookPath("mpirun"); err != nil {
		passtest.Missing(t, "mpirun not installed (libopenmpi-dev openmpi-bin)")
	}
	model := "../testdata/models/ci/resnet50_ci_f64.onnx"
	m, err := onnx.ImportFile(model, onnx.Options{})
	require.NoError(t, err)
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=sgd}")
	f := m.Funcs[0]
	// kiln run's values: the model's initial values, and seeded draws for
	// the rest (checked below: the loss is the same bit for bit).
	args := interp.RandomArgs(f, 3)
	for i, a := range f.Args {
		if a.Arg.Init != nil {
			args[i] = interp.FromDense(a.Arg.Init)
		}
	}
	res, _, floors := passtest.OrderFloor(t, f, args, "input")

	dir := t.TempDir()
	base := []string{"run", model, "--train=sum", "--optimizer", "sgd", "--seed", "3"}
	for _, run := range [][]string{
		{"--output-dir", filepath.Join(dir, "one")},
		{"--backend", "llvm", "--output-dir", filepath.Join(dir, "compiled")},
		{"--parallel", "dp=4,zero=2", "--backend", "llvm", "--output-dir", filepath.Join(dir, "mpi")},
	} {
		_, stderr, code := kiln(t, append(base, run...)...)
		require.Equal(t, 0, code, stderr)
	}
	require.Len(t, f.Results, 1)
	loss := FileName(f.ResultName(0))
	require.Zero(t, passtest.RelErr(readNpy(t, filepath.Join(dir, "one", loss)), res[0]), "kiln run drew other values than this test")

	worst, compared := 0.0, 0 // the largest error over its bound
	// check bounds the error of the mpirun value against the interpreter's
	// by err, which measures it, given the value's batch-order floor.
	check := func(file string, floor float64, err func(got, want *interp.Tensor) float64) {
		one := readNpy(t, filepath.Join(dir, "one", file))
		floor = max(floor, err(readNpy(t, filepath.Join(dir, "compiled", file)), one))
		e, bound := err(readNpy(t, filepath.Join(dir, "mpi", file)), one), passtest.OrderBound(floor)
		worst, compared = max(worst, e/bound), compared+1
		require.LessOrEqual(t, e, bound, file)
	}
	check(loss, floors.Results[0], passtest.RelErr)
	for i, a := range f.Args {
		if a.Arg.InOut {
			check(FileName("updated."+a.Name), floors.Updates[i], func(got, want *interp.Tensor) float64 {
				return passtest.UpdateErr(got, want, args[i])
			})
		}
	}
	require.Greater(t, compared, 100)
	t.Logf("4 ranks under mpirun at worst %.3g of their bounds over %d values", worst, compared)
}
