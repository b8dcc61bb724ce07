package plancheck_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-compiler/kiln/plancheck"
)

// FuzzPlan: no plan.json, however malformed, makes plan-check panic or
// report an internal error; it is accepted or rejected with a message.
// The seed is a real plan (with swaps) beside its kernels and module.
func FuzzPlan(f *testing.F) {
	dir := plan(f, smallCNN, swapped)
	files := map[string][]byte{}
	for _, name := range []string{"kernels.cu", "module.kir", "kiln_cuda.h", "plan.json"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			f.Fatal(err)
		}
		files[name] = b
	}
	f.Add(files["plan.json"])
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		tmp := t.TempDir()
		for name, b := range files {
			if name == "plan.json" {
				b = raw
			}
			if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		lp, err := plancheck.LoadDir(tmp)
		if err == nil {
			_, err = plancheck.CheckPlan(lp, 1)
		}
		if err != nil && strings.Contains(err.Error(), "internal error") {
			t.Fatalf("internal error: %v", err)
		}
	})
}
