package costmodel

import (
	"math/rand/v2"
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
		f, x, add := newFunc(t, 1<<20)
		op := func(kind string, attrs ir.Attrs, in ...*ir.Value) *ir.Value {
			return add(kind, attrs, in...).Results[0]
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
	require.InDelta(t, tl.CommSeconds, d.HideableComm(hidden), 1e-12, "the window is longer than the all_reduce")
	exposed := build(true)
	require.InDelta(t, d.Simulate(exposed).CommSeconds, d.ExposedComm(exposed), 1e-9)
}

// TestHideableCommIsTheWindowAfterTheFirstCollective: an all_reduce of
// the last kernel's output can overlap only the kernels after it, however
// long it is; and no schedule hides more than HideableComm.
func TestHideableCommIsTheWindowAfterTheFirstCollective(t *testing.T) {
	f, x, op := newFunc(t, 1<<20)
	y := x
	for i := 0; i < 40; i++ {
		y = op("exp", nil, y).Results[0]
	}
	g := op("all_reduce", ir.Attrs{"size": ir.IntAttr(8)}, y).Results[0]
	after := []*ir.Op{op("exp", nil, y), op("exp", nil, x)}
	z := op("add", nil, after[0].Results[0], after[1].Results[0])
	f.Results = []ir.Result{{Value: z.Results[0]}, {Value: g}}
	d := Default
	window := d.OpSeconds(after[0]) + d.OpSeconds(after[1]) + d.OpSeconds(z)
	comm := d.Simulate(f).CommSeconds
	require.Greater(t, comm, window, "the all_reduce (143 µs) outlasts the 3 kernels after it")
	require.InDelta(t, window, d.HideableComm(f), 1e-12)
	require.InDelta(t, window, comm-d.ExposedComm(f), 1e-9, "this schedule hides all it can")
}

// TestHideableCommBoundsRandomSchedules: on random schedules of kernels,
// collectives, sends, recvs and host copies, the communication that
// overlaps compute (CommSeconds − ExposedComm) never exceeds HideableComm,
// which never exceeds CommSeconds.
func TestHideableCommBoundsRandomSchedules(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	d := Default
	for it := range 2000 {
		f, x, op := newFunc(t, 1<<18)
		vals, host := []*ir.Value{x}, []*ir.Value(nil)
		for tag := range 10 + rng.IntN(40) {
			v := vals[rng.IntN(len(vals))]
			switch r := rng.IntN(10); {
			case r < 5:
				vals = append(vals, op("exp", nil, v).Results[0])
			case r < 7:
				kind := []string{"all_reduce", "broadcast"}[rng.IntN(2)]
				vals = append(vals, op(kind, ir.Attrs{"size": ir.IntAttr(int64(2 + rng.IntN(7)))}, v).Results[0])
			case r < 8 && rng.IntN(2) == 0:
				op("send", ir.Attrs{"offset": ir.IntAttr(1), "tag": ir.IntAttr(int64(tag))}, v)
			case r < 8:
				vals = append(vals, op("recv", ir.Attrs{"offset": ir.IntAttr(-1), "tag": ir.IntAttr(int64(tag)), "shape": ir.IntsAttr(1 << 18), "dtype": ir.TypeAttr(ir.F32)}).Results[0])
			case r < 9:
				host = append(host, op("swap_out", nil, v).Results[0])
			case len(host) > 0:
				vals = append(vals, op("swap_in", nil, host[rng.IntN(len(host))]).Results[0])
			}
		}
		z := vals[len(vals)-1]
		for _, v := range vals[:len(vals)-1] {
			z = op("add", nil, z, v).Results[0]
		}
		f.Results = []ir.Result{{Value: z}}
		comm := d.Simulate(f).CommSeconds
		hidden, bound := comm-d.ExposedComm(f), d.HideableComm(f)
		// Sums of the same times in other orders: a few roundings apart.
		require.LessOrEqual(t, hidden, bound+1e-9*comm+1e-15, "schedule %d", it)
		require.LessOrEqual(t, bound, comm*(1+1e-12), "schedule %d", it)
	}
}

// newFunc is an empty function of one f32 argument of n elements, and a
// builder that appends ops to it.
func newFunc(t *testing.T, n int64) (*ir.Func, *ir.Value, func(kind string, attrs ir.Attrs, in ...*ir.Value) *ir.Op) {
	f := &ir.Func{Name: "f"}
	x := &ir.Value{Name: "x", Type: ir.Type{DType: ir.F32, Shape: ir.Shape{n}}, Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
	f.Args = []*ir.Value{x}
	return f, x, func(kind string, attrs ir.Attrs, in ...*ir.Value) *ir.Op {
		o, err := f.NewOp(kind, in, attrs, ir.Location{}, kind)
		require.NoError(t, err)
		f.Body = append(f.Body, o)
		return o
	}
}
