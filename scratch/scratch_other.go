//go:build !unix

package scratch

import "os/exec"

func ownGroup(cmd *exec.Cmd) {}

func awaitExit(cmd *exec.Cmd) {}

func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		cmd.Process.Kill()
	}
}
