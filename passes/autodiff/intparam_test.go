package autodiff

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
)

// TestNoGradientForIntegerParameters: an integer parameter (an index
// buffer, as torchvision's Swin-T exports its relative_position_index) has
// no gradient result; the float parameter beside it has one.
func TestNoGradientForIntegerParameters(t *testing.T) {
	f := parseFunc(t, `func @f(%x: f32[4,3], %w: f32[3,3] {param}, %idx: i64[4] {param}) -> (f32[4,3]) {
  %h = matmul(%x, %w) : f32[4,3]
  %g = gather(%h, %idx) {axis = 0} : f32[4,3]
  return %g
}`)
	_, err := Differentiate(f, "sum", false)
	require.NoError(t, err)
	var grads []string
	for i := range f.Results {
		if f.Results[i].Role() == ir.RoleGrad {
			grads = append(grads, f.ResultName(i))
		}
	}
	require.Equal(t, []string{"grad.w"}, grads)
}
