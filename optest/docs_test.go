package optest

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/stretchr/testify/require"
)

// TestOpsDocCounts: docs/ops.md states the registry's op count and the
// differential matrix's instances as they are.
func TestOpsDocCounts(t *testing.T) {
	doc, err := os.ReadFile("../docs/ops.md")
	require.NoError(t, err)
	number := func(re string) []int {
		m := regexp.MustCompile(re).FindSubmatch(doc)
		require.NotNil(t, m, "docs/ops.md has no line matching %s", re)
		var out []int
		for _, g := range m[1:] {
			n, err := strconv.Atoi(string(g))
			require.NoError(t, err)
			out = append(out, n)
		}
		return out
	}
	covered := map[string]bool{}
	for _, in := range allInstances() {
		covered[in.op] = true
	}
	require.Equal(t, []int{len(ir.OpNames())}, number(`registered from `+"`ir/ops_\\*\\.go`"+`: (\d+) ops`), "the op count")
	require.Equal(t, []int{len(allInstances()), len(covered), len(ir.OpNames())},
		number(`(\d+) instances covering every op without a region \((\d+) of the (\d+)\)`), "TestDifferential's instances")
}
