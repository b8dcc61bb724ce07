package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// build runs go build in dir and returns the binary's path.
func build(t *testing.T, dir, out string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build", "-o", out}, args...)...)
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %v in %s:\n%s", args, dir, b)
	return out
}

func runProgram(t *testing.T, prog string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(prog, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

const pluginInput = `func @f(%x: f32[4]) -> (f32[4]) {
  %a = relu(%x) : f32[4] loc("model.py":1:1)
  %b = exp(%a) : f32[4] loc("other.py":2:2)
  return %b
}
`

// TestOutOfTreeExamples builds the example module (a kiln with an extra
// pass compiled in, and an executable pass written in Go) and runs both.
func TestOutOfTreeExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	tmp := t.TempDir()
	example, err := filepath.Abs("../examples/passcount")
	require.NoError(t, err)
	custom := build(t, example, filepath.Join(tmp, "kiln-custom"), "./cmd/kiln-custom")
	build(t, example, filepath.Join(tmp, "kiln-pass-strip-locs"), "./cmd/kiln-pass-strip-locs")
	in := filepath.Join(tmp, "in.kir")
	require.NoError(t, os.WriteFile(in, []byte(pluginInput), 0o644))

	out, _, err := runProgram(t, custom, "passes")
	require.NoError(t, err)
	require.Contains(t, out, "count-ops\n    count the ops of each kind")

	out, stderr, err := runProgram(t, custom, "opt", in, "--passes=count-ops{mark=true}", "--stats")
	require.NoError(t, err, stderr)
	require.Contains(t, stderr, "count-ops: ops = 2")
	require.Contains(t, out, "opcount.kind_count = 1")

	// The Go executable pass runs from --plugin-dir, with its option.
	out, stderr, err = runProgram(t, custom, "opt", in, "--plugin-dir", tmp, "--passes=ext:strip-locs{keep=model.py}")
	require.NoError(t, err, stderr)
	require.Contains(t, out, `loc("model.py":1:1)`)
	require.NotContains(t, out, "other.py")
}

// TestSharedObjectPlugin builds kiln and a -buildmode=plugin pass from this
// module, loads it, and checks the error for a file that is no plugin.
func TestSharedObjectPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	tmp := t.TempDir()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	kilnBin := build(t, root, filepath.Join(tmp, "kiln"), "./cmd/kiln")
	so := build(t, root, filepath.Join(tmp, "countkinds.so"), "-buildmode=plugin", "./examples/soplugin")
	in := filepath.Join(tmp, "in.kir")
	require.NoError(t, os.WriteFile(in, []byte(pluginInput), 0o644))
	_, stderr, err := runProgram(t, kilnBin, "opt", in, "--load-pass-plugin", so, "--passes=count-kinds", "--stats")
	require.NoError(t, err, stderr)
	require.Contains(t, stderr, "count-kinds: kinds = 2")

	notPlugin := filepath.Join(tmp, "not.so")
	require.NoError(t, os.WriteFile(notPlugin, []byte("not an ELF file"), 0o644))
	_, stderr, err = runProgram(t, kilnBin, "opt", in, "--load-pass-plugin", notPlugin, "--passes=dce")
	require.Error(t, err)
	require.Contains(t, stderr, "cannot load pass plugin "+notPlugin)
}
