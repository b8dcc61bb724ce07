package microbatch_test

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes/microbatch"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestMicrobatchBreadthZoo splits the training step of every breadth-zoo
// model in two. The split either fails with an error naming an op, or
// computes the whole-batch step's loss and gradients: compared in the
// interpreter on random inputs for every model (a dropout's slice draws
// the whole batch's mask for its rows); a model with batch normalisation
// is refused without exact-bn (its statistics span the batch) and
// compared split with it. f32 error model: the slices' partial sums are added in
// another order; relative to the whole tensor that stays within 1e-5
// (each gradient sums at most a few thousand products, unit roundoff
// 6e-8, rounding errors of random sign).
//
// How many models split is a floor, not a target: the gather along the
// batch is refused. (The recurrent models, whose time-major state is
// expanded to the batch as a constant, split since a slice of one row
// takes that constant's row instead of broadcasting to the whole batch.)
func TestMicrobatchBreadthZoo(t *testing.T) {
	paths, _ := filepath.Glob("../../testdata/models/breadth/*/model.onnx")
	require.GreaterOrEqual(t, len(paths), 25)
	split, compared, exact := 0, 0, 0
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
		err = passtest.RunErr(&ir.Module{Funcs: []*ir.Func{s}}, "microbatch{n=2}")
		var wb *microbatch.WholeBatchError
		if errors.As(err, &wb) {
			split++
			exact++
			t.Run(name+"/exact-bn", func(t *testing.T) { exactBN(t, path) })
			continue
		}
		if err != nil {
			require.Contains(t, err.Error(), "microbatch", name)
			failed = append(failed, name)
			continue
		}
		split++
		compared++
		t.Run(name, func(t *testing.T) { passtest.Equivalent(t, whole, s, 1e-5, 1, 2) })
	}
	t.Logf("%d of %d models split (%d compared with the whole batch, %d more with exact-bn); errors on %v", split, len(paths), compared, exact, failed)
	require.GreaterOrEqual(t, split, 35)
}

// exactBN compares the step of the model at path, split in two with
// exact-bn, with the whole batch's (error model as above). The batch is 4
// and the loss sums the squares of the first output: with a sum of the
// outputs, a batch norm followed by pooling and a linear layer makes the
// loss independent of everything before it (its outputs sum to the
// shift over the batch), and with two rows a normalisation after
// pooling gives ±1 whatever its input; the gradients would all be zero
// up to roundoff, which no relative bound can compare. Some gradients
// still vanish (a bias right before a normalisation, or before a 1×1
// convolution and a normalisation): what is left of them is roundoff of
// sums that cancel, relative to the terms summed, not to the sum. A
// result below 1e-6 of the largest result's norm (f32 roundoff is 6e-8;
// the gradients that do not vanish are above 1e-3 of it in these
// models) vanishes, and the split's must vanish too; the rest are
// compared within 1e-5.
func exactBN(t *testing.T, path string) {
	m, err := onnx.ImportFile(path, onnx.Options{Batch: 4})
	require.NoError(t, err)
	f := m.Funcs[0]
	y := f.Results[0].Value
	sq, err := f.NewOp("mul", []*ir.Value{y, y}, nil, ir.Location{}, "squared")
	require.NoError(t, err)
	f.Body = append(f.Body, sq)
	f.Results = f.Results[:1]
	f.Results[0].Value = sq.Results[0]
	passtest.Run(t, m, "autodiff")
	e := passtest.Clone(t, m)
	passtest.Run(t, e, "microbatch{n=2,exact-bn=true}")
	for _, seed := range []uint64{1, 2} {
		args := interp.RandomArgs(f, seed)
		want, err := interp.Run(f, interp.CloneAll(args), interp.Options{})
		require.NoError(t, err)
		got, err := interp.Run(e.Funcs[0], interp.CloneAll(args), interp.Options{})
		require.NoError(t, err)
		largest := 0.0
		for _, w := range want {
			largest = max(largest, norm(w))
		}
		for i, w := range want {
			d := 0.0
			for j := 0; j < w.Len(); j++ {
				d += (got[i].At(j) - w.At(j)) * (got[i].At(j) - w.At(j))
			}
			if vanishes := 1e-6 * largest; norm(w) < vanishes {
				require.Less(t, norm(got[i]), vanishes, "seed %d, %s vanishes", seed, f.ResultName(i))
				continue
			}
			require.LessOrEqual(t, math.Sqrt(d)/norm(w), 1e-5, "seed %d, %s", seed, f.ResultName(i))
		}
	}
}

func norm(x *interp.Tensor) float64 {
	s := 0.0
	for i := 0; i < x.Len(); i++ {
		s += x.At(i) * x.At(i)
	}
	return math.Sqrt(s)
}
