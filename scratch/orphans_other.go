//go:build !linux

package scratch

// AdoptOrphans does nothing here: only Linux lets a process adopt its
// orphaned descendants.
func AdoptOrphans() {}

// KillStrays does nothing here (see AdoptOrphans).
func KillStrays() {}

func killStrays() {}

func zombie(pid int) bool { return false }
