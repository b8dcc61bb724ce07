//go:build linux

package driver

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

// TestInterruptLeavesNothing: kiln ended by SIGINT, SIGTERM or SIGHUP
// while a compiled program runs, or while clang builds one, exits with
// 128 plus the signal's number, ends the program (no process runs on
// from its folder) and removes its temporary folders; an executable
// ended while it writes a result removes the .tmp file.
func TestInterruptLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kiln and runs it under signals (the full run)")
	}
	needClang(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "kiln")
	build := exec.Command("go", "build", "-o", bin, "../cmd/kiln")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	// A step of 40 products of 1024x1024 matrices: seconds of work.
	var b strings.Builder
	b.WriteString("func @slow(%x: f32[1024,1024]) -> (f32[1024,1024]) {\n  %y0 = matmul(%x, %x) : f32[1024,1024]\n")
	for i := 1; i < 40; i++ {
		fmt.Fprintf(&b, "  %%y%d = matmul(%%y%d, %%x) : f32[1024,1024]\n", i, i-1)
	}
	b.WriteString("  return %y39\n}\n")
	src := filepath.Join(dir, "slow.kir")
	require.NoError(t, os.WriteFile(src, []byte(b.String()), 0o644))

	for _, c := range []struct {
		sig  syscall.Signal
		args []string
		// ready reports that the moment to interrupt has come.
		ready func(tmp string) bool
	}{
		{syscall.SIGINT, []string{"run", src, "--backend", "llvm", "--output-dir", filepath.Join(dir, "out")}, programRuns},
		{syscall.SIGTERM, []string{"run", src, "--backend", "llvm", "--output-dir", filepath.Join(dir, "out")}, programRuns},
		{syscall.SIGHUP, []string{"compile", src, "--emit", "exe", "-o", filepath.Join(dir, "slow")}, func(tmp string) bool {
			m, _ := filepath.Glob(filepath.Join(tmp, "kiln-build-*", "program.*.ll"))
			return len(m) > 0
		}},
	} {
		t.Run(c.sig.String()+" "+c.args[0], func(t *testing.T) {
			tmp := t.TempDir()
			cmd := exec.Command(bin, c.args...)
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			deadline := time.Now().Add(2 * time.Minute)
			for !c.ready(tmp) {
				require.True(t, time.Now().Before(deadline), "the moment to interrupt never came: %s", stderr.String())
				time.Sleep(20 * time.Millisecond)
			}
			require.NoError(t, cmd.Process.Signal(c.sig))
			err := cmd.Wait()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, stderr.String())
			require.Equal(t, 128+int(c.sig), ee.ExitCode(), stderr.String())
			// A killed child is gone once reaped (by init, kiln having
			// exited): a loaded machine may take a moment.
			for end := time.Now().Add(10 * time.Second); len(processesIn(tmp)) > 0 && time.Now().Before(end); {
				time.Sleep(50 * time.Millisecond)
			}
			require.Empty(t, processesIn(tmp), "processes run on from kiln's temporary folder")
			left, err := os.ReadDir(tmp)
			require.NoError(t, err)
			require.Empty(t, left, "kiln left its temporary files")
		})
	}

	// The executable, blocked opening its result (a FIFO stands at the
	// .tmp path), ended by SIGTERM: the .tmp is gone.
	small := filepath.Join(dir, "g.kir")
	require.NoError(t, os.WriteFile(small, []byte("func @g(%x: f32[2]) -> (f32[2]) {\n  %y = neg(%x) : f32[2]\n  return %y\n}\n"), 0o644))
	exe := filepath.Join(dir, "g")
	_, stderr, code := kiln(t, "compile", small, "-O1", "--emit", "exe", "-o", exe)
	require.Equal(t, 0, code, stderr)
	x := filepath.Join(dir, "x.npy")
	require.NoError(t, os.WriteFile(x, npyImage(`{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }`, 1, 1, 2), 0o644))
	res := filepath.Join(dir, "res")
	require.NoError(t, os.Mkdir(res, 0o755))
	fifo := filepath.Join(res, "result0.npy.tmp")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	run := exec.Command(exe, "--input", "x="+x, "--output-dir", res)
	require.NoError(t, run.Start())
	time.Sleep(500 * time.Millisecond) // it blocks opening the FIFO
	require.NoError(t, run.Process.Signal(syscall.SIGTERM))
	require.Error(t, run.Wait())
	_, err = os.Lstat(fifo)
	require.True(t, os.IsNotExist(err), "the executable left %s", fifo)
}

// programRuns reports that a compiled program runs from a folder under
// tmp.
func programRuns(tmp string) bool {
	for _, p := range processesIn(tmp) {
		if strings.HasSuffix(p, "/program") {
			return true
		}
	}
	return false
}

// processesIn lists the processes whose executable or working folder
// lies under dir.
func processesIn(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		for _, link := range []string{"exe", "cwd"} {
			if target, err := os.Readlink(filepath.Join(p, link)); err == nil && strings.HasPrefix(target, dir+"/") {
				out = append(out, p+" "+target)
			}
		}
	}
	return out
}
