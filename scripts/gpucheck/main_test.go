package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestPrepareAndRunEmulated: the device check end to end without a GPU:
// prepare -small writes the CNN and transformer programs, and the run
// script builds their CPU emulation (codegen/cuda/testdata), runs them
// and finds every output within its bound and every program within its
// planned device memory, in gpu_check.json.
func TestPrepareAndRunEmulated(t *testing.T) {
	if testing.Short() {
		t.Skip("the device check emulated end to end: the full run (codegen/cuda's -short tests check the programs' parts)")
	}
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		passtest.Missing(t, "%s is not installed (.ci/run installs python3-numpy)", python)
	}
	if _, err := exec.LookPath("clang++-14"); err != nil {
		passtest.Missing(t, "clang++-14 is not installed (.ci/run installs clang-14)")
	}
	t.Chdir("../..")
	dir := t.TempDir()
	require.NoError(t, prepare(dir, true, ""))
	cmd := exec.Command("sh", "scripts/gpu_check.sh", "run", dir, "--emulate", "codegen/cuda/testdata", "--jobs", "2")
	cmd.Env = append(os.Environ(), "PYTHON="+python, "TMPDIR="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	raw, err := os.ReadFile(filepath.Join(dir, "gpu_check.json"))
	require.NoError(t, err)
	var report struct {
		OK          bool `json:"ok"`
		Correctness []struct {
			Name    string `json:"name"`
			OK      bool   `json:"ok"`
			Outputs []struct {
				Error, Bound float64
			} `json:"outputs"`
			Memory *struct {
				AllocatedOK bool `json:"allocated_ok"`
			} `json:"memory"`
		} `json:"correctness"`
	}
	require.NoError(t, json.Unmarshal(raw, &report))
	require.True(t, report.OK, "%s", out)
	require.Len(t, report.Correctness, 4)
	for _, c := range report.Correctness {
		require.True(t, c.OK, c.Name)
		require.NotEmpty(t, c.Outputs, c.Name)
		require.NotNil(t, c.Memory, c.Name)
		require.True(t, c.Memory.AllocatedOK, c.Name)
	}

	// A reference 1% off fails the check.
	ref := filepath.Join(dir, "cnn_forward", "ref", "output.npy")
	x := passtest.LoadNpy(t, ref)
	for i := range x.F {
		x.F[i] *= 1.01
	}
	w, err := os.Create(ref)
	require.NoError(t, err)
	require.NoError(t, npy.Write(w, x))
	require.NoError(t, w.Close())
	cmd = exec.Command("sh", "scripts/gpu_check.sh", "run", dir, "--emulate", "codegen/cuda/testdata", "--jobs", "2")
	cmd.Env = append(os.Environ(), "PYTHON="+python, "TMPDIR="+dir)
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "cnn_forward            FAIL")
}
