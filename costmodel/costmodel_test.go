package costmodel

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
)

// TestCollectiveSeconds: the ring formulas at p = 4 for 1 MB, against
// the alpha-beta terms written out.
func TestCollectiveSeconds(t *testing.T) {
	d := Device{CommBW: 1e9, CommLatency: 1e-5}
	n := int64(1_000_000)
	require.InDelta(t, 6*1e-5+2*0.75*1e-3, d.CollectiveSeconds("all_reduce", n, 4), 1e-12)
	require.InDelta(t, 3*1e-5+0.75*1e-3, d.CollectiveSeconds("reduce_scatter", n, 4), 1e-12)
	require.InDelta(t, 3*1e-5+3*1e-3, d.CollectiveSeconds("all_gather", n, 4), 1e-12)
	require.InDelta(t, 3*1e-5+1e-3, d.CollectiveSeconds("broadcast", n, 4), 1e-12)
	require.Zero(t, d.CollectiveSeconds("all_reduce", n, 1))
	// An all_reduce costs a reduce_scatter and an all_gather of its part.
	require.InDelta(t, d.CollectiveSeconds("reduce_scatter", n, 4)+d.CollectiveSeconds("all_gather", n/4, 4), d.CollectiveSeconds("all_reduce", n, 4), 1e-12)
}

// TestCommOverlapsCompute: an all_reduce whose result nothing reads until
// the end overlaps the compute after it; one read at once is exposed.
func TestCommOverlapsCompute(t *testing.T) {
	build := func(readAtOnce bool) *ir.Func {
		f := &ir.Func{Name: "f"}
		x := &ir.Value{Name: "x", Type: ir.Type{DType: ir.F32, Shape: ir.Shape{1 << 20}}, Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
		f.Args = []*ir.Value{x}
		op := func(kind string, attrs ir.Attrs, in ...*ir.Value) *ir.Value {
			o, err := f.NewOp(kind, in, attrs, ir.Location{}, kind)
			require.NoError(t, err)
			f.Body = append(f.Body, o)
			return o.Results[0]
		}
		g := op("all_reduce", ir.Attrs{"size": ir.IntAttr(8)}, x)
		y := x
		if readAtOnce {
			y = g
		}
		for i := 0; i < 40; i++ {
			y = op("exp", nil, y)
		}
		z := op("add", nil, y, g)
		f.Results = []ir.Result{{Value: z}}
		return f
	}
	d := Default
	hidden := build(false)
	tl := d.Simulate(hidden)
	require.Positive(t, tl.CommSeconds)
	require.Less(t, d.ExposedComm(hidden), 0.01*tl.CommSeconds, "the all_reduce hides behind 40 kernels (240 µs against its 143 µs)")
	exposed := build(true)
	require.InDelta(t, d.Simulate(exposed).CommSeconds, d.ExposedComm(exposed), 1e-9)
}
