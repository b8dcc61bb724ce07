package ir

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBroadcastShapes(t *testing.T) {
	s, err := BroadcastShapes(Shape{2, 1, 3}, Shape{4, 1})
	require.NoError(t, err)
	require.Equal(t, Shape{2, 4, 3}, s)
	s, err = BroadcastShapes(Shape{}, Shape{5})
	require.NoError(t, err)
	require.Equal(t, Shape{5}, s)
	_, err = BroadcastShapes(Shape{2, 3}, Shape{4})
	require.ErrorContains(t, err, "do not broadcast")
}

func TestMatmulShape(t *testing.T) {
	cases := []struct {
		a, b Shape
		want Shape
		k    int64
	}{
		{Shape{2, 3}, Shape{3, 4}, Shape{2, 4}, 3},
		{Shape{5, 2, 3}, Shape{3, 4}, Shape{5, 2, 4}, 3},
		{Shape{1, 2, 3}, Shape{6, 3, 4}, Shape{6, 2, 4}, 3},
		{Shape{3}, Shape{3, 4}, Shape{4}, 3},
		{Shape{2, 3}, Shape{3}, Shape{2}, 3},
		{Shape{3}, Shape{3}, Shape{}, 3},
	}
	for _, c := range cases {
		s, k, err := MatmulShape(Type{F32, c.a}, Type{F32, c.b})
		require.NoError(t, err)
		require.Equal(t, c.want, s, "%v x %v", c.a, c.b)
		require.Equal(t, c.k, k)
	}
	_, _, err := MatmulShape(Type{F32, Shape{2, 3}}, Type{F32, Shape{4, 5}})
	require.Error(t, err)
}

func TestByteSizeOverflow(t *testing.T) {
	_, ok := TensorOf(F32, math.MaxInt64/4+1).Bytes()
	require.False(t, ok)
	n, ok := TensorOf(F32, math.MaxInt64/4).Bytes()
	require.True(t, ok)
	require.Equal(t, int64(math.MaxInt64/4*4), n)
	_, ok = TensorOf(I8, 1<<32, 1<<32).Bytes()
	require.False(t, ok)
	n, ok = TensorOf(Bool).Bytes()
	require.True(t, ok)
	require.Equal(t, int64(1), n)
}

func TestCostModel(t *testing.T) {
	f := &Func{Name: "f"}
	x := &Value{Name: "x", Type: TensorOf(F32, 8, 16), Arg: &ArgInfo{}, Offset: NoOffset}
	w := &Value{Name: "w", Type: TensorOf(F32, 16, 4), Arg: &ArgInfo{Kind: ArgParam}, Offset: NoOffset}
	f.Args = []*Value{x, w}
	mm, err := f.NewOp("matmul", []*Value{x, w}, nil, Location{}, "")
	require.NoError(t, err)
	require.Equal(t, Cost{FLOPs: 2 * 8 * 4 * 16, BytesRead: (128 + 64) * 4, BytesWritten: 32 * 4}, OpCost(mm))
	r, _ := f.NewOp("reshape", []*Value{mm.Results[0]}, Attrs{"shape": IntsAttr(32)}, Location{}, "")
	require.Equal(t, int64(0), OpCost(r).FLOPs)
	s, _ := f.NewOp("reduce_sum", []*Value{x}, nil, Location{}, "")
	require.Equal(t, int64(128), OpCost(s).FLOPs, "reductions count input elements")
	require.Equal(t, "matmul.1", f.UniqueName("matmul"))
}
