package parallel_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// f64 models without batch normalisation or dropout: an MLP and a CNN
// with a flatten.
var models = map[string]string{
	"mlp": `func @mlp(%x: f64[8,6], %w1: f64[6,16] {param}, %b1: f64[16] {param}, %w2: f64[16,3] {param}) -> (f64[8,3]) {
  %h = matmul(%x, %w1) : f64[8,16]
  %hb = add(%h, %b1) : f64[8,16]
  %a = tanh(%hb) : f64[8,16]
  %y = matmul(%a, %w2) : f64[8,3]
  return %y
}`,
	"cnn": `func @cnn(%x: f64[4,2,8,8], %w: f64[4,2,3,3] {param}, %fw: f64[64,5] {param}) -> (f64[4,5]) {
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f64[4,4,8,8]
  %r = relu(%c) : f64[4,4,8,8]
  %p = max_pool2d(%r) {kernel = [2, 2], strides = [2, 2]} : f64[4,4,4,4]
  %f = reshape(%p) {shape = [4, 64]} : f64[4,64]
  %y = matmul(%f, %fw) : f64[4,5]
  return %y
}`,
}

// TestDataParallelEqualsOneDevice: for sum and mean losses, with and
// without an optimizer, every rank's loss, gradients and updated
// parameters and optimizer state equal the one-device step's. Error
// model: the ranks' partial sums are added in another order, in f64 over
// a few hundred terms: 1e-12 relative.
func TestDataParallelEqualsOneDevice(t *testing.T) {
	for name, src := range models {
		for _, pipe := range []string{"autodiff{loss=sum}", "autodiff{loss=mean}", "autodiff{loss=mean},optimizer{kind=adam}", "autodiff{loss=sum},optimizer{kind=momentum}"} {
			for _, n := range []int{2, 4} {
				t.Run(fmt.Sprintf("%s/%s/dp=%d", name, pipe, n), func(t *testing.T) {
					m := passtest.Parse(t, src)
					passtest.Run(t, m, pipe)
					whole := m.Funcs[0]
					sharded := passtest.Clone(t, m)
					passtest.Run(t, sharded, fmt.Sprintf("parallel{dp=%d}", n))
					f := sharded.Funcs[0]
					require.Equal(t, n, parallel.RanksOf(f))
					args := interp.RandomArgs(whole, 3)
					want, wantArgs, err := interp.RunWithUpdates(whole, interp.CloneAll(args), interp.Options{})
					require.NoError(t, err)
					parts, err := parallel.ShardValues(f, args)
					require.NoError(t, err)
					got, gotArgs, err := interp.RunRanks(f, parts, interp.Options{})
					require.NoError(t, err)
					for r := 0; r < n; r++ {
						for i := range want {
							e := passtest.RelErr(got[r][i], want[i])
							require.LessOrEqual(t, e, 1e-12, "rank %d, result %s", r, whole.ResultName(i))
						}
						for i, a := range whole.Args {
							if a.Arg.InOut {
								e := passtest.RelErr(gotArgs[r][i], wantArgs[i])
								require.LessOrEqual(t, e, 1e-12, "rank %d, updated %s", r, a.Name)
							}
						}
					}
				})
			}
		}
	}
}

// TestDataParallelDividesActivations: each rank holds 1/n of the batch's
// activations; parameters and gradients stay whole (no ZeRO).
func TestDataParallelDividesActivations(t *testing.T) {
	m := passtest.Parse(t, models["mlp"])
	passtest.Run(t, m, "autodiff")
	whole := passtest.Clone(t, m)
	passtest.Run(t, m, "parallel{dp=4}")
	var inWhole, inRank int64
	for i, a := range m.Funcs[0].Args {
		inWhole += whole.Funcs[0].Args[i].Type.SizeBytes()
		inRank += a.Type.SizeBytes()
	}
	require.Less(t, inRank, inWhole)
	require.Equal(t, whole.Funcs[0].Args[0].Type.SizeBytes()/4, m.Funcs[0].Args[0].Type.SizeBytes())
}
