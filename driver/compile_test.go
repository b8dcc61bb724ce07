package driver

import (
	"archive/zip"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passtest"
)

func needClang(t *testing.T) {
	if _, err := llvm.Clang(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// TestRunBackendsAgree: kiln run --backend llvm writes the files kiln run
// with the interpreter writes, with the same values within 1e-5, for the
// bundled examples forward, as training steps and after an optimizer
// step (updated.<param>.npy).
func TestRunBackendsAgree(t *testing.T) {
	needClang(t)
	pipelines := []string{"", "autodiff", "autodiff,optimizer{kind=adam}"}
	if testing.Short() {
		pipelines = pipelines[2:] // the step with an optimizer: the others are parts of it
	}
	for _, name := range []string{"mlp", "cnn"} {
		for _, pipeline := range pipelines {
			src := filepath.Join("..", "testdata", "examples", name+".kir")
			ref, got := t.TempDir(), t.TempDir()
			_, stderr, code := kiln(t, "run", src, "--passes", pipeline, "--seed", "3", "--output-dir", ref)
			require.Equal(t, 0, code, stderr)
			compiled := "assign"
			if pipeline != "" {
				compiled = pipeline + ",assign"
			}
			_, stderr, code = kiln(t, "run", src, "--passes", compiled, "--seed", "3", "--backend", "llvm", "--output-dir", got)
			require.Equal(t, 0, code, stderr)
			files, _ := filepath.Glob(filepath.Join(ref, "*.npy"))
			require.NotEmpty(t, files)
			for _, f := range files {
				want := readNpy(t, f)
				have := readNpy(t, filepath.Join(got, filepath.Base(f)))
				require.Equal(t, want.Type, have.Type, f)
				e := passtest.RelErr(have, want)
				require.True(t, e <= 1e-5, "%s %q %s: relative error %g", name, pipeline, filepath.Base(f), e)
			}
			others, _ := filepath.Glob(filepath.Join(got, "*"))
			require.Len(t, others, len(files), "the same files")
		}
	}
}

// TestCompileEmitsEveryKind: ll, header, obj, lib and exe come out, and
// the executable takes kiln run's flags.
func TestCompileEmitsEveryKind(t *testing.T) {
	needClang(t)
	dir := t.TempDir()
	src := filepath.Join("..", "testdata", "examples", "mlp.kir")
	for _, kind := range []string{"ll", "header", "obj", "lib", "exe"} {
		out := filepath.Join(dir, "mlp."+kind)
		_, stderr, code := kiln(t, "compile", src, "-O2", "--emit", kind, "-o", out)
		require.Equal(t, 0, code, stderr)
		require.FileExists(t, out)
	}
	ll, _ := os.ReadFile(filepath.Join(dir, "mlp.ll"))
	require.Contains(t, string(ll), "target triple = \""+llvm.Triple()+"\"")
	require.Contains(t, string(ll), "define i32 @kiln_mlp(i8* %arena, i8** %params, i8** %inputs, i8** %outputs)")
	h, _ := os.ReadFile(filepath.Join(dir, "mlp.header"))
	require.Contains(t, string(h), "int kiln_mlp(void *arena, void **params, void **inputs, void **outputs);")

	// The executable reads the arguments kiln run would use.
	ref := t.TempDir()
	_, stderr, code := kiln(t, "run", src, "--seed", "9", "--output-dir", ref)
	require.Equal(t, 0, code, stderr)
	inputs := t.TempDir()
	var args []string
	for _, a := range []string{"x", "w1", "b1", "w2"} {
		args = append(args, "--input", a+"="+filepath.Join(inputs, a+".npy"))
	}
	writeArgs(t, src, 9, inputs)
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(dir, "mlp.exe"), append(args, "--output-dir", out)...)
	msg, err := cmd.CombinedOutput()
	require.NoError(t, err, string(msg))
	e := passtest.RelErr(readNpy(t, filepath.Join(out, "logits.npy")), readNpy(t, filepath.Join(ref, "logits.npy")))
	require.True(t, e <= 1e-5, "relative error %g", e)

	// A missing input is a clear error.
	msg, err = exec.Command(filepath.Join(dir, "mlp.exe"), "--output-dir", out).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(msg), "missing --input w1=FILE.npy")
}

// writeArgs writes the seeded argument values of src's first function.
func writeArgs(t *testing.T, src string, seed uint64, dir string) {
	in, err := readModule(&env{}, src, onnx.Options{})
	require.NoError(t, err)
	f := in.module.Funcs[0]
	vals, err := argumentValues(&env{}, f, ownBound(f), nil, "", seed)
	require.NoError(t, err)
	for i, a := range f.Args {
		fh, err := os.Create(filepath.Join(dir, a.Name+".npy"))
		require.NoError(t, err)
		require.NoError(t, npy.Write(fh, vals[i]))
		require.NoError(t, fh.Close())
	}
}

// TestCompileWithoutClang: obj, lib and exe name the missing tool; ll
// and header need no clang.
func TestCompileWithoutClang(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	src := filepath.Join("..", "testdata", "examples", "mlp.kir")
	_, stderr, code := kiln(t, "compile", src, "--emit", "exe", "-o", filepath.Join(t.TempDir(), "x"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "clang is not installed")
	require.False(t, strings.Contains(stderr, "goroutine"))
	_, stderr, code = kiln(t, "compile", src, "--emit", "ll")
	require.Equal(t, 0, code, stderr)
}

// TestExecutableRunsOnItsOwn: a compiled executable uses the init values
// embedded in the .kir by default, reads arguments from --inputs DIR
// (DIR/NAME.npy) as kiln run does, lists its arguments with --help, and
// computes what the interpreter computes.
func TestExecutableRunsOnItsOwn(t *testing.T) {
	needClang(t)
	dir := t.TempDir()
	model := "../testdata/models/mlp/model.onnx"
	exe := filepath.Join(dir, "mlp")
	_, stderr, code := kiln(t, "compile", model, "-O1", "--emit", "exe", "-o", exe)
	require.Equal(t, 0, code, stderr)
	help, err := exec.Command(exe, "--help").CombinedOutput()
	require.NoError(t, err, "%s", help)
	require.Contains(t, string(help), "net.0.weight             f32[32,16]  (default: embedded init)")
	require.Contains(t, string(help), "input                    f32[4,16]")
	in := filepath.Join(dir, "in")
	require.NoError(t, os.MkdirAll(in, 0o755))
	raw, err := os.ReadFile("../testdata/models/mlp/input.npy")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(in, "input.npy"), raw, 0o644))
	out, err := exec.Command(exe, "--inputs", in, "--output-dir", filepath.Join(dir, "exe")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, stderr, code = kiln(t, "run", model, "--inputs", in, "--output-dir", filepath.Join(dir, "run"))
	require.Equal(t, 0, code, stderr)
	got, want := readNpy(t, filepath.Join(dir, "exe", "output.npy")), readNpy(t, filepath.Join(dir, "run", "output.npy"))
	// Error model: the same f32 graph, compiled (fused, reassociated sums
	// of at most 32 terms) against the interpreter's f64 sums rounded to
	// f32: a few ulps of the largest term.
	require.LessOrEqual(t, passtest.RelErr(got, want), 1e-5)
	out, err = exec.Command(exe, "--output-dir", filepath.Join(dir, "none")).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "missing --input input=FILE.npy (or --inputs DIR or .npz holding it, or --seed N)")

	// --seed fills what nothing else gives, the same way each time;
	// --report-time reports a step of --steps.
	seeded := func(seed, name string) *interp.Tensor {
		out, err := exec.Command(exe, "--seed", seed, "--steps", "2", "--report-time", "--output-dir", filepath.Join(dir, name)).CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "2 runs, ")
		return readNpy(t, filepath.Join(dir, name, "output.npy"))
	}
	a, b, c := seeded("3", "seed3"), seeded("3", "seed3again"), seeded("4", "seed4")
	require.Equal(t, a.F, b.F, "one seed, one input")
	require.NotEqual(t, a.F, c.F, "two seeds, two inputs")
	for _, v := range a.F {
		require.False(t, math.IsNaN(v) || math.IsInf(v, 0))
	}
	cmd := exec.Command(exe, "--seed", "x3", "--output-dir", filepath.Join(dir, "bad"))
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Equal(t, 2, cmd.ProcessState.ExitCode(), "%s", out)
}

// TestExecutableEmbedsSplatInits: init values stored as one repeated
// value (a bias of zeros, a norm weight of ones, as ONNX imports them)
// are embedded whole: the executable computes what kiln run computes
// (they embedded one element and read garbage after it).
func TestExecutableEmbedsSplatInits(t *testing.T) {
	needClang(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "splat.kir")
	require.NoError(t, os.WriteFile(src, []byte(`func @f(%x: f32[2,64], %g: f32[64] {param, init = dense<f32[64]: 1.5>}, %b: f32[64] {param, init = dense<f32[64]: -0.25>}) -> (y: f32[2,64]) {
  %m = mul(%x, %g) : f32[2,64]
  %y = add(%m, %b) : f32[2,64]
  return %y
}
`), 0o644))
	exe := filepath.Join(dir, "splat")
	_, stderr, code := kiln(t, "compile", src, "-O1", "--emit", "exe", "-o", exe)
	require.Equal(t, 0, code, stderr)
	in := filepath.Join(dir, "in")
	require.NoError(t, os.MkdirAll(in, 0o755))
	_, stderr, code = kiln(t, "run", src, "--output-dir", in) // any x: the function's own output serves
	require.Equal(t, 0, code, stderr)
	require.NoError(t, os.Rename(filepath.Join(in, "y.npy"), filepath.Join(in, "x.npy")))
	out, err := exec.Command(exe, "--inputs", in, "--output-dir", filepath.Join(dir, "exe")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, stderr, code = kiln(t, "run", src, "--inputs", in, "--output-dir", filepath.Join(dir, "run"))
	require.Equal(t, 0, code, stderr)
	got, want := readNpy(t, filepath.Join(dir, "exe", "y.npy")), readNpy(t, filepath.Join(dir, "run", "y.npy"))
	require.LessOrEqual(t, passtest.RelErr(got, want), 1e-6, "one multiply-add per element in f32")

	// A splat of 2^40 elements (4 TiB) is one element in the program: it
	// compiles at once to a small executable, which then says it cannot
	// allocate the step (exit 1, no crash).
	huge := filepath.Join(dir, "huge.kir")
	require.NoError(t, os.WriteFile(huge, []byte("func @f(%x: f32[4], %w: f32[1099511627776] {param, init = dense<f32[1099511627776]: 1.0>}) -> (f32[4]) {\n  %y = neg(%x) : f32[4]\n  return %y\n}\n"), 0o644))
	hugeExe := filepath.Join(dir, "huge")
	_, stderr, code = kiln(t, "compile", huge, "--emit", "exe", "-o", hugeExe)
	require.Equal(t, 0, code, stderr)
	st, err := os.Stat(hugeExe)
	require.NoError(t, err)
	require.Less(t, st.Size(), int64(1<<20), "the splat is stored as one element")
	require.NoError(t, os.WriteFile(filepath.Join(in, "x.npy"), npyImage(`{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }`, 1, 1, 2, 3, 4), 0o644))
	cmd := exec.Command(hugeExe, "--inputs", in, "--output-dir", filepath.Join(dir, "huge-out"))
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out)
	require.Contains(t, string(out), "cannot allocate the step")
}

// writeNPZ writes tensors as an .npz archive (members NAME.npy), stored
// or deflated.
func writeNPZ(t *testing.T, path string, method uint16, tensors map[string]*interp.Tensor) {
	f, err := os.Create(path)
	require.NoError(t, err)
	z := zip.NewWriter(f)
	for name, x := range tensors {
		w, err := z.CreateHeader(&zip.FileHeader{Name: name + ".npy", Method: method})
		require.NoError(t, err)
		require.NoError(t, npy.Write(w, x))
	}
	require.NoError(t, z.Close())
	require.NoError(t, f.Close())
}

// TestNPZInputs: kiln run and a compiled executable take an .npz archive
// as --inputs (numpy.savez: members NAME.npy, stored) and compute the
// same; kiln run also reads deflated members (savez_compressed), which
// the executable refuses by name; a member that names no argument is an
// error.
func TestNPZInputs(t *testing.T) {
	needClang(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "f.kir")
	require.NoError(t, os.WriteFile(src, []byte(`func @f(%x: f32[4,8], %w: f32[8,8] {param}) -> (y: f32[4,8]) {
  %m = matmul(%x, %w) : f32[4,8]
  %y = tanh(%m) : f32[4,8]
  return %y
}
`), 0o644))
	args := interp.RandomArgs(passtest.Parse(t, "func @f(%x: f32[4,8], %w: f32[8,8] {param}) -> (f32[4,8]) {\n  return %x\n}").Funcs[0], 3)
	stored, deflated, bad := filepath.Join(dir, "in.npz"), filepath.Join(dir, "inc.npz"), filepath.Join(dir, "bad.npz")
	writeNPZ(t, stored, zip.Store, map[string]*interp.Tensor{"x": args[0], "w": args[1]})
	writeNPZ(t, deflated, zip.Deflate, map[string]*interp.Tensor{"x": args[0], "w": args[1]})
	writeNPZ(t, bad, zip.Store, map[string]*interp.Tensor{"x": args[0], "v": args[1]})
	exe := filepath.Join(dir, "f")
	_, stderr, code := kiln(t, "compile", src, "-O1", "--emit", "exe", "-o", exe)
	require.Equal(t, 0, code, stderr)
	out, err := exec.Command(exe, "--inputs", stored, "--output-dir", filepath.Join(dir, "exe")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, in := range []string{stored, deflated} {
		_, stderr, code = kiln(t, "run", src, "--inputs", in, "--output-dir", filepath.Join(dir, "run"))
		require.Equal(t, 0, code, stderr)
		got, want := readNpy(t, filepath.Join(dir, "exe", "y.npy")), readNpy(t, filepath.Join(dir, "run", "y.npy"))
		require.LessOrEqual(t, passtest.RelErr(got, want), 1e-5, "8-term f32 sums against the interpreter's")
	}
	out, err = exec.Command(exe, "--inputs", deflated, "--output-dir", filepath.Join(dir, "exe2")).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "savez_compressed")
	_, stderr, code = kiln(t, "run", src, "--inputs", bad, "--output-dir", filepath.Join(dir, "run2"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `member "v.npy" names no argument of @f`)
}

// TestCompileCUDAExecutable: --target cuda --emit exe writes the plan
// with its host program and an executable build.sh; --emit plan (the
// default) the plan alone; other kinds are misuse (exit 2).
func TestCompileCUDAExecutable(t *testing.T) {
	dir := t.TempDir()
	model := "../testdata/examples/cnn.kir"
	exe, plan := filepath.Join(dir, "exe"), filepath.Join(dir, "plan")
	_, stderr, code := kiln(t, "compile", model, "--train", "--optimizer", "sgd", "--target", "cuda", "--emit", "exe", "-o", exe)
	require.Equal(t, 0, code, stderr)
	for _, name := range []string{"plan.json", "kernels.cu", "kiln_cuda.h", "module.kir", "step.cu", "kiln_cuda_runtime.cu", "kiln_cuda_program.h",
		"program.c", "driver.c", "checkpoint.c", "kiln_program.h", "kiln_runtime.h", "build.sh"} {
		require.FileExists(t, filepath.Join(exe, name))
	}
	st, err := os.Stat(filepath.Join(exe, "build.sh"))
	require.NoError(t, err)
	require.NotZero(t, st.Mode()&0o100, "build.sh is executable")
	_, stderr, code = kiln(t, "compile", model, "--train", "--target", "cuda", "-o", plan)
	require.Equal(t, 0, code, stderr)
	require.NoFileExists(t, filepath.Join(plan, "step.cu"))
	_, stderr, code = kiln(t, "compile", model, "--target", "cuda", "--emit", "lib", "-o", filepath.Join(dir, "bad"))
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "with --target cuda, --emit must be plan or exe")
}
