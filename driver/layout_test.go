package driver

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeLayoutListsEveryPackage: every Go package of the module (go
// list) has a row of the README's layout table, by its folder (`dir/`) or
// inside a braced list (`passes/{autodiff,fuse}`).
func TestReadmeLayoutListsEveryPackage(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	text := string(readme)
	start := strings.Index(text, "\n## Layout")
	require.True(t, start >= 0, "the README has a Layout section")
	table := text[start:]
	if end := strings.Index(table[1:], "\n## "); end >= 0 {
		table = table[:end+1]
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z0-9_/]+)/`").FindAllStringSubmatch(table, -1) {
		listed[m[1]] = true
	}
	for _, m := range regexp.MustCompile("`([a-z0-9_/]+)/\\{([a-z0-9_,]+)\\}`").FindAllStringSubmatch(table, -1) {
		for _, sub := range strings.Split(m[2], ",") {
			listed[m[1]+"/"+sub] = true
		}
	}
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "../...").Output()
	require.NoError(t, err)
	root, err := os.Getwd()
	require.NoError(t, err)
	root = strings.TrimSuffix(root, "/driver")
	for _, dir := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(dir, root), "/")
		if rel == "" {
			continue
		}
		require.True(t, listed[rel], "package %s/ has no row in the README's layout table", rel)
	}
}
