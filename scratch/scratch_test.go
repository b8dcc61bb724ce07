//go:build unix

package scratch

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestInterrupt: Interrupt kills a running child with its process group
// (a shell and the sleep it started) and removes the registered folders
// and files; what was removed or forgotten before stays as it is.
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
	gone, err := MkdirTemp(base, "gone-")
	require.NoError(t, err)
	require.NoError(t, Remove(gone))

	done := make(chan error, 1)
	go func() { done <- Run(exec.Command("sh", "-c", "sleep 60 & wait")) }()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	Interrupt()
	select {
	case err := <-done:
		require.Error(t, err, "the child was killed")
	case <-time.After(10 * time.Second):
		t.Fatal("the child's group runs on")
	}
	require.Less(t, time.Since(start), 10*time.Second)
	for _, p := range []string{d, f.Name()} {
		_, err := os.Stat(p)
		require.True(t, os.IsNotExist(err), "%s is left", p)
	}
	_, err = os.Stat(kept.Name())
	require.NoError(t, err, "a forgotten file stays")
	left, _ := filepath.Glob(filepath.Join(base, "*"))
	require.Equal(t, []string{kept.Name()}, left)
}
