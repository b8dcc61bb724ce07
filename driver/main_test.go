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
	// Compiled kernels go to a cache of the tests' own, not the user's.
	cache, err := os.MkdirTemp("", "kiln-test-cache-")
	if err != nil {
		panic(err)
	}
	os.Setenv("KILN_CACHE", cache)
	code := m.Run()
	os.RemoveAll(cache)
	if fuzzExeDir != "" {
		os.RemoveAll(fuzzExeDir) // the executable FuzzExecutableReader built for this process
	}
	os.Exit(code)
}
