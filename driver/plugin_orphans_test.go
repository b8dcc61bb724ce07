//go:build linux

package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPluginLeavesNoProcess: a plugin that starts a process in a session
// of its own (setsid: outside its process group) and exits 0 leaves no
// process behind once kiln returns: kiln adopts its orphans and ends them.
func TestPluginLeavesNoProcess(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	const marker = "299.4321"
	// The detached process is in its own session before the plugin exits.
	require.NoError(t, os.WriteFile(filepath.Join(bin, "kiln-pass-detach"), []byte(`#!/bin/sh
setsid sh -c 'touch "$0"; exec sleep `+marker+`' "$KILN_TEST_STARTED" </dev/null >/dev/null 2>&1 &
while [ ! -e "$KILN_TEST_STARTED" ]; do sleep 0.01; done
cat
`), 0o755))
	src := filepath.Join(dir, "in.kir")
	require.NoError(t, os.WriteFile(src, []byte("func @f(%x: f32[4]) -> (f32[4]) {\n  %a = relu(%x) : f32[4]\n  return %a\n}\n"), 0o644))
	cmd := exec.Command(os.Args[0], "opt", src, "--plugin-dir", bin, "--passes=ext:detach")
	cmd.Env = append(os.Environ(), "KILN_TEST_AS_KILN=1", "KILN_TEST_STARTED="+filepath.Join(dir, "started"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	alive := func() bool {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), marker) {
				return true
			}
		}
		return false
	}
	for end := time.Now().Add(5 * time.Second); alive() && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	require.False(t, alive(), "the plugin's detached process runs on")
}
