package parser

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-compiler/kiln/golden"
)

// seedSources returns the .kir inputs of the golden cases, valid and
// invalid, as a fuzzing seed corpus.
func seedSources() []string {
	var out []string
	filepath.WalkDir("../testdata", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".kir"):
			out = append(out, string(b))
		case strings.HasSuffix(path, ".txtar"):
			for _, f := range golden.Parse(b).Files {
				if strings.HasSuffix(f.Name, ".kir") {
					out = append(out, string(f.Data))
				}
			}
		}
		return nil
	})
	return out
}
