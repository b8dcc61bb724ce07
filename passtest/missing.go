package passtest

import (
	"os"
	"testing"
)

// Missing reports a tool or data set that a test needs and this machine
// lacks: a failure under CI (.ci/run installs everything the tests need,
// and sets CI), a skip elsewhere.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}
