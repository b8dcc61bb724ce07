//go:build linux

package scratch

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER.
const prSetChildSubreaper = 36

// AdoptOrphans makes this process the reaper of its descendants: a
// process a child started and left behind (even in a session of its own,
// by setsid) becomes this process's child when its parent exits, so that
// KillStrays can end it.
func AdoptOrphans() {
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e == 0 {
		mu.Lock()
		adopting = true
		mu.Unlock()
	}
}

// adopting is set once AdoptOrphans has made this process a reaper: only
// then are its unknown children strays (a test process runs children of
// its own).
var adopting bool

// KillStrays kills this process's children that no Run started and that
// are still running: what a finished child left behind (AdoptOrphans made
// them ours).
func KillStrays() {
	mu.Lock()
	defer mu.Unlock()
	killStrays()
}

// killStrays is KillStrays with mu held.
func killStrays() {
	if !adopting {
		return
	}
	known := map[int]bool{}
	for c := range children {
		if c.Process != nil {
			known[c.Process.Pid] = true
		}
	}
	self := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		raw, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(raw)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		pid, _ := strconv.Atoi(strings.Fields(s)[0])
		if ppid == self && !known[pid] {
			syscall.Kill(pid, syscall.SIGKILL)
			reap(pid)
		}
	}
}

// reap waits, up to a second, for a killed stray to exit and collects it
// (no Run waits for it: it would stay a zombie while kiln runs).
func reap(pid int) {
	for range 100 {
		if got, err := syscall.Wait4(pid, nil, syscall.WNOHANG, nil); got == pid || err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// zombie reports whether pid has exited and waits to be collected.
func zombie(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(raw)
	end := strings.LastIndexByte(s, ')')
	return end >= 0 && len(s) > end+2 && s[end+2] == 'Z'
}
