package driver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProgressOnlyOnTerminals: long commands show what they are doing on
// one line of a terminal (forced here with KILN_PROGRESS=1): the passes of
// a pipeline, the budgets of a remat sweep and plan-check's replay; the
// line is cleared afterwards. On anything else (the other tests' stderr)
// nothing is written.
func TestProgressOnlyOnTerminals(t *testing.T) {
	_, quiet, code := kiln(t, "mem", "../testdata/models/mlp/model.onnx", "--train", "-O2")
	require.Equal(t, 0, code, quiet)
	require.NotContains(t, quiet, "\r")
	t.Setenv("KILN_PROGRESS", "1")
	_, stderr, code := kiln(t, "mem", "../testdata/models/mlp/model.onnx", "--train", "-O2")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "\r\033[Kpass 1/")
	require.True(t, len(stderr) >= 4 && stderr[len(stderr)-4:] == "\r\033[K", "the line is cleared: %q", stderr)
	_, stderr, code = kiln(t, "mem", "../testdata/models/mlp/model.onnx", "--passes", "autodiff", "--remat-sweep")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "remat sweep: budget 100% of the peak")
}
