package driver

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestONNXInputEverywhere: mem, run and compile read ONNX directly, by
// extension or by content (standard input), and take --batch; a model
// exported with a symbolic batch re-derives its shape arithmetic, and
// --batch on a .kir input is a usage error.
func TestONNXInputEverywhere(t *testing.T) {
	model := "../testdata/models/breadth/hf_decoder_dynamic/model.onnx"
	data, err := os.ReadFile(model)
	require.NoError(t, err)
	kiln := func(stdin []byte, args ...string) (string, string, int) {
		var out, errb strings.Builder
		code := Main(args, bytes.NewReader(stdin), &out, &errb)
		return out.String(), errb.String(), code
	}
	out, stderr, code := kiln(data, "mem", "-", "--batch", "3")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "inputs")
	out3, _, _ := kiln(nil, "opt", model, "--batch", "3")
	out5, stderr, code := kiln(nil, "opt", model, "--batch", "5")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out3, "i64[3,8]")
	require.Contains(t, out5, "i64[5,8]")
	require.Contains(t, out5, "f32[5,8,40]")
	dir := t.TempDir()
	_, stderr, code = kiln(nil, "run", model, "--batch", "4", "--output-dir", dir)
	require.Equal(t, 0, code, stderr)
	_, stderr, code = kiln(nil, "compile", model, "--batch", "4", "-O1", "--target", "llvm", "-o", dir+"/m.ll")
	require.Equal(t, 0, code, stderr)
	_, stderr, code = kiln(nil, "mem", "../testdata/models/mlp/model.onnx", "--batch", "-2")
	require.Equal(t, 2, code, stderr)
	require.NoError(t, os.WriteFile(dir+"/f.kir", []byte("func @f(%x: f32[2]) -> (f32[2]) {\n  return %x\n}\n"), 0o644))
	_, stderr, code = kiln(nil, "mem", dir+"/f.kir", "--batch", "2")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--batch and --data-inputs apply to ONNX input only")
}
