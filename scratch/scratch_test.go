//go:build linux

package scratch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestInterrupt: Interrupt kills a running child with its process group
// (a shell and the sleep it started) and removes the registered folders
// and files; what was removed or forgotten before stays as it is. (It
// leaves the registry locked: this is the package's one test of it.)
func TestInterrupt(t *testing.T) {
	base := t.TempDir()
	d, err := MkdirTemp(base, "d-")
	require.NoError(t, err)
	f, err := CreateTemp(base, "f-")
	require.NoError(t, err)
	f.Close()
	kept, err := CreateTemp(base, "kept-")
	require.NoError(t, err)
	kept.Close()
	Forget(kept.Name())
	removed, err := MkdirTemp(base, "gone-")
	require.NoError(t, err)
	require.NoError(t, Remove(removed))

	cmd := exec.Command("sh", "-c", "sleep 61.4321 & wait")
	go Run(cmd) // it never returns: Interrupt keeps the registry locked
	time.Sleep(300 * time.Millisecond)
	Interrupt()
	require.True(t, gone(cmd.Process.Pid), "the child runs on")
	for end := time.Now().Add(5 * time.Second); running("61.4321") && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	require.False(t, running("61.4321"), "the child's group runs on")
	for _, p := range []string{d, f.Name()} {
		_, err := os.Stat(p)
		require.True(t, os.IsNotExist(err), "%s is left", p)
	}
	_, err = os.Stat(kept.Name())
	require.NoError(t, err, "a forgotten file stays")
	left, _ := filepath.Glob(filepath.Join(base, "*"))
	require.Equal(t, []string{kept.Name()}, left)
}

// gone reports whether pid has exited (reaped, or a zombie).
func gone(pid int) bool { return syscall.Kill(pid, 0) != nil || zombie(pid) }

// running reports whether a live process has marker in its command line.
func running(marker string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), marker) {
			var pid int
			fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid)
			if !gone(pid) {
				return true
			}
		}
	}
	return false
}
