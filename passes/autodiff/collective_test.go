package autodiff

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
)

// TestCollectiveGradientsAcrossRanks: on two ranks, the gradient autodiff
// builds on each rank for its own parameter equals the central finite
// difference of the loss summed over the ranks (each rank's loss = sum of
// its output), through an all_gather, a reduce_scatter and a max
// all_reduce. Error model: central differences in f64 with h = 1e-6 are
// exact to about 1e-9 here; 1e-6 relative leaves room.
func TestCollectiveGradientsAcrossRanks(t *testing.T) {
	src := `func @f(%x: f64[2,3], %w: f64[3,3] {param}) -> (f64[2,3]) {
  %h = matmul(%x, %w) : f64[2,3]
  %t = tanh(%h) : f64[2,3]
  %g = all_gather(%t) {size = 2, axis = 0} : f64[4,3]
  %s = mul(%g, %g) : f64[4,3]
  %r = reduce_scatter(%s) {size = 2, axis = 0} : f64[2,3]
  %a = all_reduce(%r) {size = 2, op = "max"} : f64[2,3]
  %m = all_reduce(%t) {size = 2} : f64[2,3]
  %p = mul(%a, %m) : f64[2,3]
  %y = add(%p, %h) : f64[2,3]
  return %y
}`
	fwd := parseFunc(t, src)
	step := parseFunc(t, src)
	_, err := Differentiate(step, "sum", false)
	require.NoError(t, err)
	args := [][]*interp.Tensor{interp.RandomArgs(fwd, 1), interp.RandomArgs(fwd, 2)}
	res, _, err := interp.RunRanks(step, args, interp.Options{})
	require.NoError(t, err)
	loss := func() float64 {
		out, _, err := interp.RunRanks(fwd, args, interp.Options{})
		require.NoError(t, err)
		s := 0.0
		for _, o := range out {
			for _, v := range o[0].F {
				s += v
			}
		}
		return s
	}
	require.InDelta(t, loss(), res[0][0].F[0]+res[1][0].F[0], 1e-9, "the ranks' losses add up")
	for r := range args {
		w := args[r][1]
		g := res[r][1]
		for i := range w.F {
			orig := w.F[i]
			h := 1e-6
			w.F[i] = orig + h
			up := loss()
			w.F[i] = orig - h
			down := loss()
			w.F[i] = orig
			fd := (up - down) / (2 * h)
			require.InDelta(t, fd, g.F[i], 1e-6*math.Max(1, math.Abs(fd)), "rank %d: d loss / d w[%d]", r, i)
		}
	}
}
