package llvm_test

import (
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// TestConvsOverImageChunks: this backend multiplies a convolution whose
// per-image product is narrow (14², 196 columns) and whose whole batch's
// im2col (3.6 MiB) passes the default bound over chunks of images (4 of
// the batch's 16: 784 columns, each chunk's im2col stored in turn), the
// weight gradient accumulating chunk by chunk, and the results are the
// interpreter's. Error model: f32 sums of at most K terms (the weight
// gradient's 16 · 196 positions) differ from the interpreter's by at
// most K·2⁻²⁴ relative to the result's norm.
func TestConvsOverImageChunks(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%x: f32[16,32,14,14], %w: f32[16,32,3,3], %dy: f32[16,16,14,14]) -> (y: f32[16,16,14,14], dx: f32[16,32,14,14], dw: f32[16,32,3,3]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f32[16,16,14,14]
  %dx = conv2d_grad_input(%dy, %w) {input_shape = [16, 32, 14, 14], pads = [1, 1, 1, 1]} : f32[16,32,14,14]
  %dw = conv2d_grad_weight(%dy, %x) {pads = [1, 1, 1, 1], weight_shape = [16, 32, 3, 3]} : f32[16,32,3,3]
  return %y, %dx, %dw
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	f := m.Funcs[0]
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	// The forward and weight-gradient kernels loop over 4 chunks of 4
	// images, each a product of 4 · 196 columns (the weight gradient's
	// contraction); the input gradient keeps one product per image.
	for i, k := range p.Kernels[:3] {
		chunks, extent := 0, int64(0)
		walkStages(k.Steps, 0, func(s *loops.Stage, loopsAround int64) {
			if s.Matmul != nil {
				chunks = int(loopsAround)
				extent = s.Extents[1]
				if i == 2 {
					extent = s.Matmul.Extent
				}
			}
		})
		want := []int{4, 16, 4}[i]
		require.Equal(t, want, chunks, "kernel %s: chunks of images", k.Name)
		require.Equal(t, []int64{784, 196, 784}[i], extent, "kernel %s: columns (contraction) of its product", k.Name)
	}
	args := interp.RandomArgs(f, 3)
	want, err := interp.Run(f, cloneAll(args), interp.Options{})
	require.NoError(t, err)
	got, _, err := llvm.Run(p, args)
	require.NoError(t, err)
	for i, K := range []float64{288, 144, 3136} {
		e := passtest.RelErr(got[i], want[i])
		require.LessOrEqual(t, e, K*0x1p-24, "result %s", f.ResultName(i))
	}
}

// walkStages calls fn for every stage in steps with the product of the
// extents of the loops around it (times outer).
func walkStages(steps []loops.Step, outer int64, fn func(*loops.Stage, int64)) {
	if outer == 0 {
		outer = 1
	}
	for _, s := range steps {
		switch s := s.(type) {
		case *loops.Loop:
			walkStages(s.Body, outer*s.Extent, fn)
		case *loops.Stage:
			fn(s, outer)
		}
	}
}
