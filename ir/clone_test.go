package ir_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

// TestCloneIsDeep: a clone prints like its original, and changing the
// clone (its ops, operands, attributes, shapes and kernel regions) leaves
// the original as it was.
func TestCloneIsDeep(t *testing.T) {
	src := `func @f(%x: f32[4], %w: f32[4] {param}) -> (loss: f32[]) {
  %k = kernel(%x, %w) : f32[4] loc("model.py":7:3) region(%a: f32[4], %b: f32[4]) {
    %m = mul(%a, %b) : f32[4]
    %r = relu(%m) : f32[4]
    yield %r
  }
  %s = reduce_sum(%k) {axes = [0]} : f32[]
  return %s
}
`
	m, err := parser.Parse("clone.kir", src)
	require.NoError(t, err)
	f := m.Funcs[0]
	before := f.String()
	g := f.Clone()
	require.Equal(t, before, g.String())

	g.Body[1].Attrs["axes"] = ir.IntsAttr(1)
	g.Body[0].Operands[0], g.Body[0].Operands[1] = g.Body[0].Operands[1], g.Body[0].Operands[0]
	g.Body[0].Region.Body[1].Kind = "tanh"
	g.Args[0].Type.Shape[0] = 8
	g.Args[1].Arg.Kind = ir.ArgData
	g.Body = g.Body[:1]
	require.Equal(t, before, f.String())
	require.NotSame(t, f.Results[0].Value, g.Results[0].Value)
	require.Same(t, g.Args[0], g.Body[0].Operands[1])
}
