package liveness

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

func parse(t *testing.T, src string) *ir.Func {
	m, err := parser.Parse("t.kir", src)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	return m.Funcs[0]
}

func TestLiveBytesViewsAndInPlace(t *testing.T) {
	f := parse(t, `func @f(%x: f32[4], %w: f32[4] {param}) -> (f32[2,2], f32[4]) {
  %a = mul(%x, %w) : f32[4]
  %b = relu(%a) : f32[4]
  %c = exp(%b) : f32[4]
  %d = add(%b, %c) : f32[4]
  %r = reshape(%d) {shape = [2, 2]} : f32[2,2]
  %e = neg(%x) : f32[4]
  return %r, %e
}
`)
	info := Analyze(f)
	require.Equal(t, int64(16), info.ParamBytes)
	require.Equal(t, int64(16), info.InputBytes)
	// a and b share one buffer (relu in place over a dying a); c is new;
	// d is written over c (b is still used by d? no: b dies at d, so d may
	// reuse b or c: the first eligible operand, b); r is a view of d.
	bA, bB, bC, bD, bR := info.BufferOf[f.Body[0].Results[0]], info.BufferOf[f.Body[1].Results[0]], info.BufferOf[f.Body[2].Results[0]], info.BufferOf[f.Body[3].Results[0]], info.BufferOf[f.Body[4].Results[0]]
	require.Same(t, bA, bB)
	require.NotSame(t, bB, bC)
	require.Same(t, bB, bD)
	require.Same(t, bD, bR)
	// neg(x): x is an argument, never overwritten.
	require.NotSame(t, info.BufferOf[f.Args[0]], info.BufferOf[f.Body[5].Results[0]])
	require.Equal(t, []int64{48, 48, 64, 64, 48, 64}, info.Live)
	require.Equal(t, int64(64), info.Peak)
	require.Equal(t, 2, info.PeakAt)

	noInPlace := AnalyzeWith(f, Options{NoInPlace: true})
	require.Equal(t, int64(80), noInPlace.Peak)
}

func TestUnusedValuesAndResults(t *testing.T) {
	f := parse(t, `func @f(%x: f32[8]) -> (f32[8]) {
  %dead = exp(%x) : f32[8]
  %y = neg(%x) : f32[8]
  %z = sqrt(%x) : f32[8]
  return %y
}
`)
	info := Analyze(f)
	// dead lives only at its op; y lives to the end; z at its op.
	require.Equal(t, []int64{64, 64, 96}, info.Live)
	require.Len(t, info.Largest(10), 2)
	require.Equal(t, 2, info.PeakAt)
}

// TestGemmNotInPlaceOverAnotherOperand: gemm may write over its C operand
// when C dies there, but not when C is also A or B (a residual layer's
// backward, dy + dy·Wᵀ): the product reads A's rows and B's columns while
// it writes, so the result needs its own buffer.
func TestGemmNotInPlaceOverAnotherOperand(t *testing.T) {
	f := parse(t, `func @f(%h: f32[8,8], %w: f32[8,8] {param}) -> (f32[8,8], f32[8,8]) {
  %t = tanh(%h) : f32[8,8]
  %y = gemm(%t, %w, %t) : f32[8,8]
  %u = tanh(%h) : f32[8,8]
  %c = neg(%u) : f32[8,8]
  %z = gemm(%h, %w, %c) : f32[8,8]
  return %y, %z
}
`)
	info := Analyze(f)
	by := map[string]*ir.Value{}
	f.Walk(func(op *ir.Op) {
		for _, r := range op.Results {
			by[r.Name] = r
		}
	})
	require.NotSame(t, info.BufferOf[by["t"]], info.BufferOf[by["y"]], "gemm over its A")
	require.Same(t, info.BufferOf[by["c"]], info.BufferOf[by["z"]], "gemm over a C that only it reads")
}
