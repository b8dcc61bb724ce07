package llvm_test

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/parser"
)

// TestExecutableCounts: --steps and --repeat take a positive whole count
// in decimal digits and nothing else; anything else (an exponent, a
// fraction, trailing text, a count past INT_MAX that would wrap, a
// missing value) and an unknown flag are misuses of the command line,
// exit 2, with nothing run.
func TestExecutableCounts(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("t.kir", `func @f(%x: f32[4], %w: f32[4] {param}) -> (f32[]) {
  %p = mul(%x, %w) : f32[4]
  %l = reduce_sum(%p) : f32[]
  return %l
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "autodiff,optimizer{kind=sgd,lr=0.1},assign")
	p, err := llvm.Lower(m.Funcs[0])
	require.NoError(t, err)
	exe, err := llvm.Build(p, "exe", llvm.Options{})
	require.NoError(t, err)
	dir := t.TempDir()
	bin := filepath.Join(dir, "step")
	require.NoError(t, os.WriteFile(bin, exe, 0o755))
	run := func(args ...string) (int, string) {
		out := filepath.Join(dir, "out")
		require.NoError(t, os.RemoveAll(out))
		cmd := exec.Command(bin, append([]string{"--seed", "1", "--output-dir", out}, args...)...)
		b, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(b)
		}
		require.NoError(t, err, "%s", b)
		return 0, string(b)
	}
	for _, args := range [][]string{
		{"--steps", "1e3"}, {"--steps", "3x"}, {"--steps", "4294967298"}, {"--steps", "-2"}, {"--steps", "0"},
		{"--steps", "+3"}, {"--steps", ""}, {"--steps", " 3"}, {"--repeat", "2.9"}, {"--repeat", "0x10"},
		{"--bogus"}, {"--steps"}, {"--repeat"},
	} {
		code, out := run(args...)
		require.Equal(t, 2, code, "%q: %s", args, out)
		require.Contains(t, out, "--help lists the arguments", "%q", args)
		_, err := os.Stat(filepath.Join(dir, "out", "loss.npy"))
		require.True(t, os.IsNotExist(err), "%q ran the step", args)
	}
	code, out := run("--steps", "3")
	require.Equal(t, 0, code, out)
	code, out = run("--repeat", "2")
	require.Equal(t, 0, code, out)
}

// TestBuildTimeout: a build that runs past Options.BuildTimeout stops
// clang (its cc1 child too) and says so; the same build without the
// limit succeeds. Progress hears the time.
func TestBuildTimeout(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("t.kir", `func @f(%x: f32[64,64], %w: f32[64,64] {param}) -> (f32[64,64]) {
  %p = matmul(%x, %w) : f32[64,64]
  %r = relu(%p) : f32[64,64]
  return %r
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "fuse,assign")
	p, err := llvm.Lower(m.Funcs[0])
	require.NoError(t, err)
	_, err = llvm.Build(p, "obj", llvm.Options{BuildTimeout: time.Millisecond})
	require.ErrorContains(t, err, "clang did not finish compiling the step within 1ms")
	require.ErrorContains(t, err, "--build-timeout")
	ticks := 0
	_, err = llvm.Build(p, "obj", llvm.Options{BuildTimeout: 10 * time.Minute, Progress: func(time.Duration) { ticks++ }})
	require.NoError(t, err)
	require.Contains(t, llvm.Flags, "-unroll-allow-partial=false", "partial unrolling stays off (Zen 3's cost model asked for it and clang took hours)")
}

// TestBuildCachesKernels: with a cache, a library of the same kernels and
// other embedded weights links the cached objects (the cache gains
// nothing) and behaves as one built without the cache.
func TestBuildCachesKernels(t *testing.T) {
	requireClang(t)
	src := func(w string) string {
		return `func @f(%x: f32[4,4], %w: f32[4,4] {param, init = dense<f32[4,4]: ` + w + `>}) -> (f32[4,4]) {
  %p = matmul(%x, %w) : f32[4,4]
  %r = relu(%p) : f32[4,4]
  return %r
}
`
	}
	cache := t.TempDir()
	count := func() int {
		n := 0
		require.NoError(t, filepath.WalkDir(cache, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return err
		}))
		return n
	}
	var libs [][]byte
	for i, w := range []string{"1.0", "2.0"} {
		m, err := parser.Parse("t.kir", src(w))
		require.NoError(t, err)
		pipelineOn(t, m, "fuse,assign")
		p, err := llvm.Lower(m.Funcs[0])
		require.NoError(t, err)
		lib, err := llvm.Build(p, "lib", llvm.Options{CacheDir: cache})
		require.NoError(t, err)
		libs = append(libs, lib)
		require.Equal(t, 2, count(), "build %d: the runtime's object and the kernels'", i)
		plain, err := llvm.Build(p, "lib", llvm.Options{})
		require.NoError(t, err)
		require.Equal(t, plain, lib, "a cached build is the build")
	}
	require.NotEqual(t, libs[0], libs[1], "the weights differ")
}
