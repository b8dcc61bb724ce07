package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// TestPythonEntry runs python/tests/test_memory.py (kiln.memory on a
// torchvision ResNet-18 and a small GPT built in torch) and
// python/tests/test_compile.py (kiln.compile: the GPT's training step and
// the ResNet's forward pass compiled, against torch) and
// python/tests/test_train.py (training in-process: optimizers, state,
// checkpoints, Fashion-MNIST against torch) and python/tests/test_runtime.py
// (failed steps change nothing, threads, closed steps, checkpoint files,
// a property test against torch) and python/tests/test_trainer.py (losses
// as PyTorch writes them, the module trained in place, eval, any batch,
// optimizers and schedulers, checkpoints, two epochs of Fashion-MNIST) and
// python/tests/test_package.py (pip install ./python, the README's example)
// with a kiln binary
// built from this tree, under Debian's system Python, which .ci/run
// provides with python3-torch and python3-torchvision.
func TestPythonEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("exports, plans and compiles torch models (about a minute)")
	}
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import torch, torchvision").Run(); err != nil {
		passtest.Missing(t, "Debian's python3-torch and python3-torchvision are not installed: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "kiln")
	build := exec.Command("go", "build", "-o", bin, "../cmd/kiln")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	for _, script := range []string{"test_memory.py", "test_compile.py", "test_train.py", "test_runtime.py", "test_trainer.py", "test_package.py"} {
		cmd := exec.Command(python, filepath.Join(root, "python", "tests", script))
		cmd.Dir = filepath.Join(root, "python", "tests")
		cmd.Env = append(os.Environ(), "KILN="+bin, "PYTHONPATH="+filepath.Join(root, "python"))
		out, err = cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", script, out)
		require.Contains(t, string(out), "\nok\n", script)
	}
}
