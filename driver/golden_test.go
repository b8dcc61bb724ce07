package driver

import (
	"testing"

	"github.com/kiln-compiler/kiln/golden"
)

// TestGolden runs every case below testdata/ (see package golden).
func TestGolden(t *testing.T) {
	golden.Run(t, "../testdata/cases", "kiln", Main)
}
