package loops_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/fuse"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestFusedProducersWriteThrough: a fused convolution, batch
// normalisation and activation, and a fused matmul, bias and GELU, write
// their producers' results into the kernel's output and rewrite them in
// place: the only workspace left is the im2col chunk and per-channel
// statistics, no activation (the convolution kernel held two before, the
// matmul one).
func TestFusedProducersWriteThrough(t *testing.T) {
	src := `func @f(%x: f32[2,3,16,16], %w: f32[8,3,3,3], %g: f32[8], %b: f32[8], %m: f32[8] {state}, %v: f32[8] {state}, %a: f32[64,32], %wm: f32[32,48], %bm: f32[48]) -> (f32[2,8,16,16], f32[64,48]) {
  %c = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f32[2,8,16,16]
  %y, %rm, %rv, %sm, %si = batch_norm_train(%c, %g, %b, %m, %v) {epsilon = 1e-05, momentum = 0.9} : f32[2,8,16,16], f32[8], f32[8], f32[8], f32[8]
  %r = relu(%y) : f32[2,8,16,16]
  %h = matmul(%a, %wm) : f32[64,48]
  %hb = add(%h, %bm) : f32[64,48]
  %o = gelu(%hb) : f32[64,48]
  return %r, %o
}
`
	m := passtest.CheckPipeline(t, src, "fuse,assign", 0)
	p, err := loops.Lower(m.Funcs[0])
	require.NoError(t, err)
	fused := 0
	for _, k := range p.Kernels {
		if k.Op.Region == nil {
			continue
		}
		fused++
		for _, tb := range k.Temps {
			for _, r := range k.Op.Region.Body {
				for _, v := range r.Results {
					if v.Type.Rank() > 1 {
						require.False(t, tb.Type.Equal(v.Type), "%s keeps %s (%s) outside the plan", k.Name, tb.Name, tb.Type)
					}
				}
			}
		}
	}
	require.Equal(t, 2, fused)
}
