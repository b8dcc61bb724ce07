//go:build unix

package scratch

import (
	"os/exec"
	"syscall"
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

func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
