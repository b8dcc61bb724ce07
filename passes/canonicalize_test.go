package passes_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestCanonicalizeKeepsTheSignOfZero: x + 0 is not x when x is -0 (the
// sum is +0), nor x - (-0); 1/(x + 0) at x = -0 is +inf before and after
// canonicalize, as in PyTorch. x + (-0) and x - 0 are x for every x, and
// go.
func TestCanonicalizeKeepsTheSignOfZero(t *testing.T) {
	m := passtest.Parse(t, `func @f(%x: f32[2]) -> (f32[2], f32[2], f32[2], f32[2]) {
  %zero = constant() {value = dense<f32[]: 0.0>} : f32[]
  %negzero = constant() {value = dense<f32[]: -0.0>} : f32[]
  %one = constant() {value = dense<f32[]: 1.0>} : f32[]
  %a = add(%x, %zero) : f32[2]
  %ra = div(%one, %a) : f32[2]
  %b = sub(%x, %negzero) : f32[2]
  %rb = div(%one, %b) : f32[2]
  %c = add(%x, %negzero) : f32[2]
  %rc = div(%one, %c) : f32[2]
  %d = sub(%x, %zero) : f32[2]
  %rd = div(%one, %d) : f32[2]
  return %ra, %rb, %rc, %rd
}`)
	x := interp.FromFloats(ir.Type{DType: ir.F32, Shape: ir.Shape{2}}, []float64{math.Copysign(0, -1), 2})
	before, err := interp.Run(m.Funcs[0], []*interp.Tensor{x}, interp.Options{})
	require.NoError(t, err)
	passtest.Run(t, m, "canonicalize,dce")
	after, err := interp.Run(m.Funcs[0], []*interp.Tensor{x}, interp.Options{})
	require.NoError(t, err)
	for i := range before {
		require.Equal(t, before[i].F, after[i].F, "result %d", i)
	}
	require.True(t, math.IsInf(after[0].F[0], 1), "1/(-0 + 0) is +inf")
	text := m.String()
	require.NotContains(t, text, "add(%x, %negzero)", "x + (-0) is x")
	require.NotContains(t, text, "sub(%x, %zero)", "x - 0 is x")
	require.Contains(t, text, "add(%x, %zero)")
	require.Contains(t, text, "sub(%x, %negzero)")
}
