package microbatch_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestMicrobatchBreadthZoo splits the training step of every breadth-zoo
// model in two. The split either fails with an error naming an op, or
// computes the whole-batch step's loss and gradients: compared in the
// interpreter on random inputs for every model without batch
// normalisation or dropout (whose statistics and masks are per slice on
// purpose). f32 error model: the slices' partial sums are added in
// another order; relative to the whole tensor that stays within 1e-5
// (each gradient sums at most a few thousand products, unit roundoff
// 6e-8, rounding errors of random sign).
//
// How many models split is a floor, not a target: the rest are recurrent
// models whose time-major state is expanded to the batch as a constant.
func TestMicrobatchBreadthZoo(t *testing.T) {
	paths, _ := filepath.Glob("../../testdata/models/breadth/*/model.onnx")
	require.GreaterOrEqual(t, len(paths), 25)
	split, compared := 0, 0
	var failed []string
	for _, path := range paths {
		name := filepath.Base(filepath.Dir(path))
		batch := int64(2)
		if strings.HasSuffix(name, "_dynamic") {
			batch = 4
		}
		m, err := onnx.ImportFile(path, onnx.Options{Batch: batch})
		require.NoError(t, err, name)
		passtest.Run(t, m, "autodiff")
		whole := m.Funcs[0]
		if whole.Args[0].Type.Shape[0]%2 != 0 {
			continue
		}
		s := whole.Clone()
		if err := passtest.RunErr(&ir.Module{Funcs: []*ir.Func{s}}, "microbatch{n=2}"); err != nil {
			require.Contains(t, err.Error(), "microbatch", name)
			failed = append(failed, name)
			continue
		}
		split++
		random := false
		for _, op := range whole.Body {
			random = random || op.Kind == "batch_norm_train" || op.Kind == "dropout"
		}
		if random {
			continue
		}
		compared++
		t.Run(name, func(t *testing.T) { passtest.Equivalent(t, whole, s, 1e-5, 1, 2) })
	}
	t.Logf("%d of %d models split (%d compared with the whole batch); errors on %v", split, len(paths), compared, failed)
	require.GreaterOrEqual(t, split, 32)
}
