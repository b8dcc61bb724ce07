package passes_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpNameComparisonsAreListed: docs/passes.md's table of comparisons
// of a Kind with a string literal outside ir/ and the tests states each
// file's count (rows sum their files) and the total, as the code has them.
func TestOpNameComparisonsAreListed(t *testing.T) {
	comparison := regexp.MustCompile(`\.Kind (==|!=) "`)
	counts := map[string]int{}
	total := 0
	require.NoError(t, filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, "../"))
		if d.IsDir() {
			if rel == "ir" || strings.HasPrefix(d.Name(), ".") && path != ".." || rel == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := len(comparison.FindAllIndex(src, -1)); n > 0 {
			counts[rel] = n
			total += n
		}
		return nil
	}))

	doc, err := os.ReadFile("../docs/passes.md")
	require.NoError(t, err)
	text := string(doc)
	section := text[strings.Index(text, "## Op names outside the registry"):]
	m := regexp.MustCompile(`There are (\d+) such comparisons`).FindStringSubmatch(section)
	require.NotNil(t, m, "docs/passes.md states the total")
	stated, _ := strconv.Atoi(m[1])
	require.Equal(t, total, stated, "the total in docs/passes.md")
	listed := map[string]bool{}
	row := regexp.MustCompile("^\\| (`[^|]+`) \\| (\\d+) \\|")
	file := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(section, "\n") {
		r := row.FindStringSubmatch(line)
		if r == nil {
			continue
		}
		want, _ := strconv.Atoi(r[2])
		got := 0
		for _, f := range file.FindAllStringSubmatch(r[1], -1) {
			listed[f[1]] = true
			got += counts[f[1]]
		}
		require.Equal(t, got, want, "docs/passes.md's row %s", r[1])
	}
	for f, n := range counts {
		require.True(t, listed[f], "%s compares a Kind with a string %d times and has no row in docs/passes.md", f, n)
	}
}
