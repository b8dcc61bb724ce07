//go:build unix

package driver

import "syscall"

// addressSpaceLeft is RLIMIT_AS less what the process has mapped, or 0
// when there is no such limit.
func addressSpaceLeft() int64 {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_AS, &r) != nil || r.Cur > 1<<62 { // RLIM_INFINITY is all ones
		return 0
	}
	return max(int64(r.Cur)-mappedBytes(), 1)
}
