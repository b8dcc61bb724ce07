// Package scratch holds what one kiln process makes for a while and must
// not leave behind when it is interrupted: temporary folders and files,
// and child processes (clang, compiled programs, mpirun, plugins). Kiln's
// signal handler calls Interrupt, which kills the children still running
// (their whole process groups) and removes the folders and files still
// registered.
package scratch

import (
	"bytes"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"
)

var (
	mu       sync.Mutex
	paths    = map[string]bool{}
	children = map[*exec.Cmd]bool{}
)

// MkdirTemp makes a temporary folder as os.MkdirTemp does and registers
// it; Remove removes it.
func MkdirTemp(dir, pattern string) (string, error) {
	d, err := os.MkdirTemp(dir, pattern)
	if err == nil {
		track(d)
	}
	return d, err
}

// CreateTemp creates a temporary file as os.CreateTemp does and registers
// it; Remove removes it, Forget keeps it (once renamed into place).
func CreateTemp(dir, pattern string) (*os.File, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err == nil {
		track(f.Name())
	}
	return f, err
}

func track(path string) {
	mu.Lock()
	paths[path] = true
	mu.Unlock()
}

// Forget stops tracking path.
func Forget(path string) {
	mu.Lock()
	delete(paths, path)
	mu.Unlock()
}

// Remove removes path and what it holds, and stops tracking it.
func Remove(path string) error {
	Forget(path)
	return os.RemoveAll(path)
}

// Run runs cmd to completion in a process group of its own (unless cmd
// already asks for one), which Interrupt kills while it runs.
func Run(cmd *exec.Cmd) error {
	_, err := runWithin(cmd, 0)
	return err
}

// runWithin is Run, killing cmd's process group when it runs past limit
// (0: no limit); late says that it did.
func runWithin(cmd *exec.Cmd, limit time.Duration) (late bool, err error) {
	ownGroup(cmd)
	mu.Lock() // KillStrays never sees a child started but not yet known
	if err := cmd.Start(); err != nil {
		mu.Unlock()
		return false, err
	}
	children[cmd] = true
	mu.Unlock()
	var killed atomic.Bool
	if limit > 0 {
		t := time.AfterFunc(limit, func() {
			mu.Lock()
			if children[cmd] { // still running
				killed.Store(true)
				killGroup(cmd)
			}
			mu.Unlock()
		})
		defer t.Stop()
	}
	err = cmd.Wait()
	mu.Lock()
	delete(children, cmd)
	mu.Unlock()
	return killed.Load(), err
}

// CombinedOutput is cmd's standard output and error together, as
// (*exec.Cmd).CombinedOutput, run by Run.
func CombinedOutput(cmd *exec.Cmd) ([]byte, error) {
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := Run(cmd)
	return b.Bytes(), err
}

// CombinedOutputWithin is CombinedOutput, ending cmd with its process
// group (the compilers a driver starts included) when it runs past limit
// (0: no limit); timedOut says that it did.
func CombinedOutputWithin(cmd *exec.Cmd, limit time.Duration) (out []byte, timedOut bool, err error) {
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	timedOut, err = runWithin(cmd, limit)
	return b.Bytes(), timedOut, err
}

// Output is cmd's standard output, as (*exec.Cmd).Output, run by Run.
func Output(cmd *exec.Cmd) ([]byte, error) {
	var b bytes.Buffer
	cmd.Stdout = &b
	err := Run(cmd)
	return b.Bytes(), err
}

// Interrupt kills every child still running, with its process group,
// and removes every registered folder and file; then what those children
// left behind (KillStrays). It keeps the registry locked: the process
// must exit right after, and whatever else runs meanwhile waits at its
// next use of the registry instead of starting a child or making a file
// nothing would remove.
func Interrupt() {
	mu.Lock()
	for c := range children {
		killGroup(c)
	}
	for p := range paths {
		os.RemoveAll(p)
	}
	for c := range children {
		awaitExit(c) // its orphans are ours once it is gone
	}
	killStrays()
}
