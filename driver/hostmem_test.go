package driver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-compiler/kiln/parser"
	"github.com/stretchr/testify/require"
)

// TestHostBytesNeeded: the interpreter's estimate follows the schedule
// (a value dies at its last use), a compiled run counts arguments and
// results only; both add the largest file (40 B here) and a quarter.
func TestHostBytesNeeded(t *testing.T) {
	m, err := parser.Parse("chain.kir", `func @f(%x: f32[10]) -> (f32[]) {
  %a = relu(%x) : f32[10]
  %b = exp(%a) : f32[10]
  %c = reduce_sum(%b) {axes = [0]} : f32[]
  return %c
}
`)
	require.NoError(t, err)
	f := m.Funcs[0]
	// x throughout; a and b overlap at b's op: 10 + 10 + 10 elements.
	require.Equal(t, int64(30*hostTensorBytes), liveHostBytes(f, true))
	require.Equal(t, int64(11*hostTensorBytes), liveHostBytes(f, false))
	require.Equal(t, int64(280+70), hostBytesNeeded(f, true))
	require.Equal(t, int64(128+32), hostBytesNeeded(f, false))
	require.NoError(t, checkHostMemory("chain.kir", f, true, 350))
	err = checkHostMemory("chain.kir", f, true, 349)
	require.EqualError(t, err, "chain.kir:1:1: error: running @f needs about 350 B of host memory (the interpreter holds every element of a live value as 8 bytes, with one file's bytes and a quarter more for the Go runtime), more than the 349 B available")
	require.NoError(t, checkHostMemory("chain.kir", f, true, 0), "no figure: no check")
}

// TestRunTooLargeForTheHost: kiln run on tensors no machine holds says so
// and exits 1 (it used to die in the Go runtime with a stack trace).
func TestRunTooLargeForTheHost(t *testing.T) {
	if availableMemory() == 0 {
		t.Skip("no MemAvailable here")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "huge.kir")
	require.NoError(t, os.WriteFile(src, []byte(`func @f(%x: f32[1000000,1000000]) -> (f32[1000000,1000000]) {
  %y = relu(%x) : f32[1000000,1000000]
  return %y
}
`), 0o644))
	for _, backend := range []string{"interp", "llvm"} {
		_, stderr, code := kiln(t, "run", src, "--backend", backend, "--output-dir", filepath.Join(dir, "out"))
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "huge.kir:1:1: error: running @f needs about 22.74 TiB of host memory")
		require.NotContains(t, stderr, "goroutine")
	}
}

// TestRunWithinAnAddressSpaceLimit: under an 8 GB RLIMIT_AS, kiln run of
// a 16 GiB splat parameter (30 GiB with the file and the runtime's headroom) is refused with a diagnostic (exit 1) before
// anything is allocated: the guard counts the limit, not only the
// machine's free memory.
func TestRunWithinAnAddressSpaceLimit(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "splat.kir")
	require.NoError(t, os.WriteFile(src, []byte("func @f(%w: f32[2147483648] {param, init = dense<f32[2147483648]: 1.0>}) -> (f32[]) {\n  %s = reduce_sum(%w) : f32[]\n  return %s\n}\n"), 0o644))
	cmd := exec.Command("sh", "-c", `ulimit -v 8000000 && exec "$0" "$@"`, os.Args[0], "run", src, "--output-dir", filepath.Join(dir, "out"))
	cmd.Env = append(os.Environ(), "KILN_TEST_AS_KILN=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out)
	require.Contains(t, string(out), "splat.kir:1:1: error: running @f needs about 30.00 GiB of host memory")
	require.NotContains(t, string(out), "goroutine")
}

// TestTinyModelsOfHugeTensors: under an 8 GB RLIMIT_AS, a 91-byte ONNX
// Dropout on 2^40 elements imports (its all-ones mask is never built),
// and an Expand to 2^41 x 6 that a ReduceSum fuses back is refused at
// -O2 with a diagnostic (the guard counts the values inside fused
// kernels): exit 0 and 1, never the Go runtime's out of memory.
func TestTinyModelsOfHugeTensors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"opt", "../testdata/hostile/dropout_2e40.onnx"}, 0, "return %x"},
		{[]string{"run", "../testdata/hostile/expand_2e41.onnx", "-O2", "--output-dir", filepath.Join(dir, "out")}, 1, "expand_2e41.onnx: error: running @g needs about 120.00 TiB of host memory"},
	} {
		cmd := exec.Command("sh", append([]string{"-c", `ulimit -v 8000000 && exec "$0" "$@"`, os.Args[0]}, c.args...)...)
		cmd.Env = append(os.Environ(), "KILN_TEST_AS_KILN=1")
		out, _ := cmd.CombinedOutput()
		require.Equal(t, c.code, cmd.ProcessState.ExitCode(), "%v: %s", c.args, out)
		require.Contains(t, string(out), c.want, "%v", c.args)
		require.NotContains(t, string(out), "goroutine", "%v", c.args)
	}
}

// TestRunSizedToTheLimit: a 512 MiB result (a concat of a 256 MiB input)
// under address-space limits around what the run needs: each run either
// writes its result or is refused with the diagnostic, exit 0 or 1, never
// the Go runtime's out of memory (at 4 GB it passed the guard, 1.5 GiB of
// tensors counted, and died holding 2.15 GiB).
func TestRunSizedToTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 512 MiB results under several limits")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "big.kir")
	require.NoError(t, os.WriteFile(src, []byte(`func @f(%x: f32[64,1024,1024]) -> (f32[128,1024,1024]) {
  %y = concat(%x, %x) {axis = 0} : f32[128,1024,1024]
  return %y
}
`), 0o644))
	for _, gib := range []int{3, 4, 5, 6} {
		out := filepath.Join(dir, "out")
		require.NoError(t, os.RemoveAll(out))
		cmd := exec.Command("sh", "-c", fmt.Sprintf(`ulimit -v %d && exec "$0" "$@"`, gib<<20), os.Args[0], "run", src, "--seed", "1", "--output-dir", out)
		cmd.Env = append(os.Environ(), "KILN_TEST_AS_KILN=1")
		b, _ := cmd.CombinedOutput()
		code := cmd.ProcessState.ExitCode()
		require.NotContains(t, string(b), "goroutine", "%d GiB", gib)
		switch code {
		case 0:
			st, err := os.Stat(filepath.Join(out, "result0.npy"))
			require.NoError(t, err, "%d GiB", gib)
			require.Equal(t, int64(512<<20+128), st.Size())
		case 1:
			require.Contains(t, string(b), "big.kir:1:1: error: running @f needs about", "%d GiB", gib)
		default:
			t.Fatalf("%d GiB: exit %d: %s", gib, code, b)
		}
	}
}

// TestInputBytesNeeded: reading costs inputBytesPerByte a byte, and a .kir
// text's numbers outside hex cost inputBytesPerNumber each (a hex
// constant is one).
func TestInputBytesNeeded(t *testing.T) {
	text := []byte("%c = constant() {value = dense<f32[3]: [1.5, -2.0, 3e4]>} : f32[3]\n%d = constant() {value = dense<f32[2]: 0x0000803f00000040>} : f32[2]\n")
	// The numbers: 1.5, 2.0, 3e4, 0x…, and the extents [3] and [2] twice each; f32 counts none.
	require.Equal(t, int64(8), countNumbers(text))
	want := int64(len(text))*inputBytesPerByte + 8*inputBytesPerNumber
	require.Equal(t, want+want/4, inputBytesNeeded(text, true))
	bin := int64(len(text)) * inputBytesPerByte
	require.Equal(t, bin+bin/4, inputBytesNeeded(text, false))
}

// TestLargeTextsWithinAnAddressSpaceLimit: a 10 MB .kir of a million
// numbers in a list holds about 1 GB while it is parsed; under a 2.6 GB
// address-space limit (some 0.8 GB left to the heap once the runtime has
// started) it is refused before parsing, under 8 GB it is read; never the
// Go runtime's out of memory.
func TestLargeTextsWithinAnAddressSpaceLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("parses a 40 MB text")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "list.kir")
	const n = 1000000
	var b strings.Builder
	fmt.Fprintf(&b, "func @f(%%x: f32[%d]) -> (f32[%d]) {\n  %%c = constant() {value = dense<f32[%d]: [", n, n, n)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d.%06d", i%10, i%999983)
	}
	fmt.Fprintf(&b, "]>} : f32[%d]\n  %%y = add(%%x, %%c) : f32[%d]\n  return %%y\n}\n", n, n)
	require.NoError(t, os.WriteFile(src, []byte(b.String()), 0o644))
	for _, c := range []struct {
		kb   int
		code int
		want string
	}{{2600000, 1, "list.kir needs about"}, {8 << 20, 0, ""}} {
		cmd := exec.Command("sh", "-c", fmt.Sprintf(`ulimit -v %d && exec "$0" "$@"`, c.kb), os.Args[0], "opt", src, "-o", filepath.Join(dir, "out.kir"))
		cmd.Env = append(os.Environ(), "KILN_TEST_AS_KILN=1")
		out, _ := cmd.CombinedOutput()
		require.Equal(t, c.code, cmd.ProcessState.ExitCode(), "%d KiB: %s", c.kb, out)
		require.Contains(t, string(out), c.want)
		require.NotContains(t, string(out), "goroutine")
	}
}
