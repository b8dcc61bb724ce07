package driver

import (
	"os"
	"testing"
)

// TestMain lets a test run this binary as kiln itself (KILN_TEST_AS_KILN=1,
// kiln's arguments after the program name): in a process of its own,
// under limits or signals the test sets.
func TestMain(m *testing.M) {
	if os.Getenv("KILN_TEST_AS_KILN") == "1" {
		Run()
	}
	code := m.Run()
	if fuzzExeDir != "" {
		os.RemoveAll(fuzzExeDir) // the executable FuzzExecutableReader built for this process
	}
	os.Exit(code)
}
