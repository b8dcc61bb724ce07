//go:build unix

package scratch

import (
	"os/exec"
	"syscall"
	"time"
)

// ownGroup starts cmd in a process group of its own: a terminal's ^C
// reaches kiln alone, which then ends the group (a compiled program and
// what it started) rather than leaving it to run on.
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// awaitExit waits up to a second for a killed child to be gone (reaped
// by its Run, or a zombie).
func awaitExit(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	for range 100 {
		if syscall.Kill(cmd.Process.Pid, 0) != nil || zombie(cmd.Process.Pid) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
