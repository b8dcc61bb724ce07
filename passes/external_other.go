//go:build !unix

package passes

import "os/exec"

// ownProcessGroup: outside Unix a plugin's children are not tracked.
func ownProcessGroup(*exec.Cmd) {}

func killProcessGroup(*exec.Cmd) {}
