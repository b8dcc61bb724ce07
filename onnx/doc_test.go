package onnx

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPackageDocStatesOpsets: the package doc names the opsets the
// importer reads.
func TestPackageDocStatesOpsets(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	require.Contains(t, strings.Join(strings.Fields(string(doc)), " "), fmt.Sprintf("opsets %d to %d", minOpset, maxOpset))
}
