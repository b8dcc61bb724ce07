package onnx

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// TestCumProd26: the specification's examples: [1, 2, 3] gives [1, 2, 6];
// exclusive [1, 1, 2]; reverse [6, 6, 3]; both [6, 3, 1]; and along the
// second axis of a 2x5 matrix (four scan rounds).
func TestCumProd26(t *testing.T) {
	x := &ir.Dense{Type: ir.TensorOf(ir.F32, 3), Floats: []float64{1, 2, 3}}
	for _, c := range []struct {
		exclusive, reverse int64
		want               []float64
	}{{0, 0, []float64{1, 2, 6}}, {1, 0, []float64{1, 1, 2}}, {0, 1, []float64{6, 6, 3}}, {1, 1, []float64{6, 3, 1}}} {
		out := runInits(t, tGraph{opset: 26,
			nodes: []tNode{{op: "CumProd", name: "/p", inputs: []string{"x", "a"}, outputs: []string{"y"},
				ints: map[string][]int64{"exclusive": {c.exclusive}, "reverse": {c.reverse}}}},
			inits:   [][]byte{encTensorRaw("x", 1, x), encTensorI64("a", nil, []int64{0})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{3})}})
		require.Equal(t, c.want, out[0].F, "exclusive %d reverse %d", c.exclusive, c.reverse)
	}
	m := &ir.Dense{Type: ir.TensorOf(ir.F32, 2, 5), Floats: []float64{1, 2, 3, 4, 5, 2, 2, 2, 2, -1}}
	out := runInits(t, tGraph{opset: 26,
		nodes:   []tNode{{op: "CumProd", name: "/p", inputs: []string{"x", "a"}, outputs: []string{"y"}}},
		inits:   [][]byte{encTensorRaw("x", 1, m), encTensorI64("a", nil, []int64{-1})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2, 5})}})
	require.Equal(t, []float64{1, 2, 6, 24, 120, 2, 4, 8, 16, -16}, out[0].F)
}

// TestCenterCropPad18: a 5x4 input to 3x6: rows 1..3 kept (the centred
// window), columns padded by 1 on each side.
func TestCenterCropPad18(t *testing.T) {
	x := &ir.Dense{Type: ir.TensorOf(ir.F32, 5, 4)}
	for i := range 20 {
		x.Floats = append(x.Floats, float64(i))
	}
	out := runInits(t, tGraph{opset: 18,
		nodes:   []tNode{{op: "CenterCropPad", name: "/c", inputs: []string{"x", "s"}, outputs: []string{"y"}}},
		inits:   [][]byte{encTensorRaw("x", 1, x), encTensorI64("s", []int64{2}, []int64{3, 6})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{3, 6})}})
	require.Equal(t, []float64{0, 4, 5, 6, 7, 0, 0, 8, 9, 10, 11, 0, 0, 12, 13, 14, 15, 0}, out[0].F)
}

// TestRMSNormalizationAndSwish: RMSNormalization-23 over the last two
// axes (axis = -2) against x / sqrt(mean(x²) + eps) · scale, and
// Swish-24 with alpha 1.5 against x · sigmoid(1.5 x).
func TestRMSNormalizationAndSwish(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	x, scale := randDense(rng, 2, 3, 4), randDense(rng, 3, 4)
	out := runInits(t, tGraph{opset: 24,
		nodes: []tNode{{op: "RMSNormalization", name: "/rms", inputs: []string{"x", "s"}, outputs: []string{"y"}, ints: map[string][]int64{"axis": {-2}}, floats: map[string]float32{"epsilon": 0.01}},
			{op: "Swish", name: "/sw", inputs: []string{"x"}, outputs: []string{"z"}, floats: map[string]float32{"alpha": 1.5}}},
		inits:   [][]byte{encTensorRaw("x", 1, x), encTensorRaw("s", 1, scale)},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2, 3, 4}), encValueInfo("z", 1, []int64{2, 3, 4})}})
	for b := range 2 {
		ms := 0.0
		for i := range 12 {
			ms += x.Floats[b*12+i] * x.Floats[b*12+i] / 12
		}
		for i := range 12 {
			want := x.Floats[b*12+i] / math.Sqrt(ms+float64(float32(0.01))) * scale.Floats[i]
			require.InDelta(t, want, out[0].F[b*12+i], 1e-6*(1+math.Abs(want)))
		}
	}
	for i, v := range x.Floats {
		want := v / (1 + math.Exp(-1.5*v))
		require.InDelta(t, want, out[1].F[i], 1e-6)
	}
}

// TestCol2Im18: the specification's example (a 1x5x5 image from 5
// columns of 1x5 blocks: the identity arrangement), and overlapping 2x2
// blocks with stride 1 on a 3x3 image of 2 channels against im2col's
// adjoint summed with loops.
func TestCol2Im18(t *testing.T) {
	x := &ir.Dense{Type: ir.TensorOf(ir.F32, 1, 5, 5)}
	for i := range 25 {
		x.Floats = append(x.Floats, float64(i+1))
	}
	out := runInits(t, tGraph{opset: 18,
		nodes:   []tNode{{op: "Col2Im", name: "/c", inputs: []string{"x", "img", "blk"}, outputs: []string{"y"}}},
		inits:   [][]byte{encTensorRaw("x", 1, x), encTensorI64("img", []int64{2}, []int64{5, 5}), encTensorI64("blk", []int64{2}, []int64{1, 5})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 5, 5})}})
	want := make([]float64, 25) // y[0, 0, h, w] = x[0, w, h]
	for h := range 5 {
		for w := range 5 {
			want[h*5+w] = x.Floats[w*5+h]
		}
	}
	require.Equal(t, want, out[0].F)

	rng := rand.New(rand.NewPCG(4, 2))
	cols := randDense(rng, 1, 2*4, 4) // C = 2, 2x2 blocks, 2x2 positions
	out = runInits(t, tGraph{opset: 18,
		nodes:   []tNode{{op: "Col2Im", name: "/c", inputs: []string{"x", "img", "blk"}, outputs: []string{"y"}}},
		inits:   [][]byte{encTensorRaw("x", 1, cols), encTensorI64("img", []int64{2}, []int64{3, 3}), encTensorI64("blk", []int64{2}, []int64{2, 2})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 2, 3, 3})}})
	want = make([]float64, 18)
	for c := range 2 {
		for i := range 2 {
			for j := range 2 {
				for oh := range 2 {
					for ow := range 2 {
						want[c*9+(oh+i)*3+ow+j] += cols.Floats[(c*4+i*2+j)*4+oh*2+ow]
					}
				}
			}
		}
	}
	for i := range want {
		require.InDelta(t, want[i], out[0].F[i], 1e-6)
	}
}

// TestRandomOperators: RandomNormal(mean 2, scale 3) of 20000 numbers has
// a sample mean within 5 standard errors of 2 and a sample variance
// within 5 standard errors of 9 (the variance of a normal sample variance
// is 2σ⁴/(n-1)); RandomUniformLike lies in [low, high); two nodes
// without a seed draw different numbers.
func TestRandomOperators(t *testing.T) {
	const count = 20000
	m, err := Import(encModel(tGraph{opset: 17,
		nodes: []tNode{{op: "RandomNormal", name: "/n", outputs: []string{"z"}, ints: map[string][]int64{"shape": {count}}, floats: map[string]float32{"mean": 2, "scale": 3}},
			{op: "RandomUniformLike", name: "/u", inputs: []string{"z"}, outputs: []string{"u"}, floats: map[string]float32{"low": -1, "high": 4}},
			{op: "RandomUniformLike", name: "/v", inputs: []string{"z"}, outputs: []string{"v"}}},
		outputs: [][]byte{encValueInfo("z", 1, []int64{count}), encValueInfo("u", 1, []int64{count}), encValueInfo("v", 1, []int64{count})}}), Options{Name: "m.onnx"})
	require.NoError(t, err)
	out, err := interp.Run(m.Funcs[0], nil, interp.Options{})
	require.NoError(t, err)
	mean, sq := 0.0, 0.0
	for _, v := range out[0].F {
		mean += v / count
	}
	for _, v := range out[0].F {
		sq += (v - mean) * (v - mean) / (count - 1)
	}
	require.InDelta(t, 2, mean, 5*3/math.Sqrt(count))
	require.InDelta(t, 9, sq, 5*math.Sqrt(2*81.0/(count-1)))
	for _, v := range out[1].F {
		require.True(t, v >= -1 && v < 4, "%g outside [-1, 4)", v)
	}
	require.NotEqual(t, out[1].F[:10], out[2].F[:10], "unseeded nodes draw different numbers")
}

// TestHostileNodesRefused: nodes that used to panic the importer or
// allocate without bound are errors naming the node: a zero stride with
// auto_pad, an EyeLike or Col2Im whose constant's size overflows int64, a
// past_key that is not 4-D, a per-row zero point on a 1-D MatMulInteger
// operand, a batch-first RNN of rank 5. A causal Attention over 4096
// positions folds no [4096, 4096] band.
func TestHostileNodesRefused(t *testing.T) {
	vi := func(name string, elem int64, dims ...int64) []byte { return encValueInfo(name, elem, dims) }
	for name, c := range map[string]struct {
		g    tGraph
		want string
	}{
		"stride 0": {tGraph{nodes: []tNode{{op: "MaxPool", name: "/p", inputs: []string{"x"}, outputs: []string{"y"}, ints: map[string][]int64{"kernel_shape": {2, 2}, "strides": {0, 0}}, strs: map[string]string{"auto_pad": "SAME_UPPER"}}},
			inputs: [][]byte{vi("x", 1, 1, 1, 4, 4)}, outputs: [][]byte{vi("y", 1, 1, 1, 4, 4)}}, "must be at least 1"},
		"eyelike 2^64": {tGraph{nodes: []tNode{{op: "EyeLike", name: "/e", inputs: []string{"x"}, outputs: []string{"y"}}},
			inputs: [][]byte{vi("x", 1, 1<<32, 1<<32)}, outputs: [][]byte{vi("y", 1, 1<<32, 1<<32)}}, "too large"},
		"past_key rank 1": {tGraph{opset: 23, nodes: []tNode{{op: "Attention", name: "/a", inputs: []string{"q", "k", "v", "", "pk", "pv"}, outputs: []string{"y"}}},
			inputs: [][]byte{vi("q", 1, 1, 1, 2, 4), vi("k", 1, 1, 1, 2, 4), vi("v", 1, 1, 1, 2, 4), vi("pk", 1, 3), vi("pv", 1, 3)}, outputs: [][]byte{vi("y", 1, 1, 1, 2, 4)}}, "must be [batch, heads, past, head size]"},
		"zero point of a vector": {tGraph{opset: 10, nodes: []tNode{{op: "MatMulInteger", name: "/m", inputs: []string{"a", "b", "za"}, outputs: []string{"y"}}},
			inputs: [][]byte{vi("a", 2, 2), vi("b", 2, 2, 2), vi("za", 2, 2)}, outputs: [][]byte{vi("y", 6, 2)}}, "does not fit"},
		"rnn rank 5": {tGraph{opset: 14, nodes: []tNode{{op: "RNN", name: "/r", inputs: []string{"x", "w", "r"}, outputs: []string{"y"}, ints: map[string][]int64{"layout": {1}, "hidden_size": {2}}}},
			inputs: [][]byte{vi("x", 1, 1, 2, 3, 4, 5), vi("w", 1, 1, 2, 5), vi("r", 1, 1, 2, 2)}, outputs: [][]byte{vi("y", 1, 1)}}, "are 3-D"},
	} {
		_, err := Import(encModel(c.g), Options{Name: "m.onnx"})
		require.ErrorContains(t, err, c.want, name)
	}
	const s = 4096
	m, err := Import(encModel(tGraph{opset: 23,
		nodes:   []tNode{{op: "Attention", name: "/a", inputs: []string{"q", "k", "v"}, outputs: []string{"y"}, ints: map[string][]int64{"is_causal": {1}}}},
		inputs:  [][]byte{vi("q", 1, 1, 1, s, 2), vi("k", 1, 1, 1, s, 2), vi("v", 1, 1, 1, s, 2)},
		outputs: [][]byte{vi("y", 1, 1, 1, s, 2)}}), Options{Name: "m.onnx"})
	require.NoError(t, err)
	m.Funcs[0].Walk(func(op *ir.Op) {
		if op.Kind == "constant" {
			require.LessOrEqual(t, op.Attrs["value"].Dense.Type.NumElements(), int64(s), "a folded constant of %s", op.Attrs["value"].Dense.Type)
		}
	})
}

// TestQuantizedProductScales: QLinearMatMul's per-row a_scale scales rows
// and its per-column b_scale columns (a_scale [1, 10] on [[1, 2], [3, 4]]
// times the identity gives [[1, 2], [30, 40]]); BitShift by the type's
// width or more gives 0 both ways, folded at import too; a Cast from
// int32 to fp8 saturates (100000 to 57344) unless saturate = 0, where
// e4m3 gives NaN.
func TestQuantizedProductScales(t *testing.T) {
	u8 := func(name string, dims []int64, v ...int64) []byte {
		return encTensorRaw(name, 2, &ir.Dense{Type: ir.TensorOf(ir.U8, dims...), Ints: v})
	}
	f := func(name string, dims []int64, v ...float64) []byte {
		return encTensorRaw(name, 1, &ir.Dense{Type: ir.TensorOf(ir.F32, dims...), Floats: v})
	}
	for _, c := range []struct {
		as, bs []byte
		want   []int64
	}{
		{f("as", []int64{2}, 1, 10), f("bs", nil, 1), []int64{1, 2, 30, 40}},
		{f("as", nil, 1), f("bs", []int64{2}, 1, 10), []int64{1, 20, 3, 40}},
	} {
		got := runInits(t, tGraph{opset: 10,
			nodes: []tNode{{op: "QLinearMatMul", name: "/q", inputs: []string{"a", "as", "az", "b", "bs", "bz", "ys", "yz"}, outputs: []string{"y"}}},
			inits: [][]byte{u8("a", []int64{2, 2}, 1, 2, 3, 4), c.as, u8("az", nil, 0), u8("b", []int64{2, 2}, 1, 0, 0, 1), c.bs, u8("bz", nil, 0),
				f("ys", nil, 1), u8("yz", nil, 0)},
			outputs: [][]byte{encValueInfo("y", 2, []int64{2, 2})}})
		require.Equal(t, c.want, got[0].I)
	}
	for dir, want := range map[string][]int64{"RIGHT": {0, 0, 50, 200}, "LEFT": {0, 0, 32, 200}} {
		m, err := Import(encModel(tGraph{opset: 11,
			nodes:   []tNode{{op: "BitShift", name: "/s", inputs: []string{"x", "y"}, outputs: []string{"z"}, strs: map[string]string{"direction": dir}}},
			inits:   [][]byte{u8("x", []int64{4}, 200, 200, 200, 200), u8("y", []int64{4}, 8, 200, 2, 0)},
			outputs: [][]byte{encValueInfo("z", 2, []int64{4})}}), Options{Name: "m.onnx"})
		require.NoError(t, err, dir)
		got, err := interp.Run(m.Funcs[0], nil, interp.Options{})
		require.NoError(t, err)
		require.Equal(t, want, got[0].I, dir)
	}
	for sat, want := range map[int64][]float64{1: {57344, -57344, 448}, 0: {math.Inf(1), math.Inf(-1), 448}} {
		m, err := Import(encModel(tGraph{opset: 19,
			nodes: []tNode{{op: "Cast", name: "/c", inputs: []string{"x"}, outputs: []string{"y"}, ints: map[string][]int64{"to": {19}, "saturate": {sat}}},
				{op: "Cast", name: "/e", inputs: []string{"x"}, outputs: []string{"e"}, ints: map[string][]int64{"to": {17}, "saturate": {sat}}},
				{op: "Cast", name: "/b", inputs: []string{"y"}, outputs: []string{"z"}, ints: map[string][]int64{"to": {1}}},
				{op: "Cast", name: "/eb", inputs: []string{"e"}, outputs: []string{"ez"}, ints: map[string][]int64{"to": {1}}}},
			inits:   [][]byte{encTensorRaw("x", 6, &ir.Dense{Type: ir.TensorOf(ir.I32, 3), Ints: []int64{100000, -100000, 448}})},
			outputs: [][]byte{encValueInfo("z", 1, []int64{3}), encValueInfo("ez", 1, []int64{3})}}), Options{Name: "m.onnx"})
		require.NoError(t, err)
		got, err := interp.Run(m.Funcs[0], nil, interp.Options{})
		require.NoError(t, err)
		require.Equal(t, want, got[0].F, "e5m2, saturate %d", sat)
		if sat == 0 {
			require.True(t, math.IsNaN(got[1].F[0]) && math.IsNaN(got[1].F[1]), "e4m3 without saturation: %v", got[1].F)
		} else {
			require.Equal(t, []float64{448, -448, 448}, got[1].F)
		}
	}
}

// TestReduceMinMaxIntegers: ReduceMin and ReduceMax of u8 (where -x
// wraps), of i64 holding INT64_MIN (where -x overflows) and of bool (all,
// any).
func TestReduceMinMaxIntegers(t *testing.T) {
	for _, c := range []struct {
		dt  int64
		d   *ir.Dense
		min []int64
		max []int64
	}{
		{2, &ir.Dense{Type: ir.TensorOf(ir.U8, 2, 3), Ints: []int64{200, 3, 255, 0, 9, 8}}, []int64{3, 0}, []int64{255, 9}},
		{7, &ir.Dense{Type: ir.TensorOf(ir.I64, 2, 3), Ints: []int64{math.MinInt64, 5, -1, math.MaxInt64, 0, 2}}, []int64{math.MinInt64, 0}, []int64{5, math.MaxInt64}},
		{9, &ir.Dense{Type: ir.TensorOf(ir.Bool, 2, 3), Ints: []int64{1, 1, 1, 0, 1, 0}}, []int64{1, 0}, []int64{1, 1}},
	} {
		for op, want := range map[string][]int64{"ReduceMin": c.min, "ReduceMax": c.max} {
			out := runInits(t, tGraph{opset: 13,
				nodes:   []tNode{{op: op, name: "/r", inputs: []string{"x"}, outputs: []string{"y"}, ints: map[string][]int64{"axes": {1}, "keepdims": {0}}}},
				inits:   [][]byte{encTensorRaw("x", c.dt, c.d)},
				outputs: [][]byte{encValueInfo("y", c.dt, []int64{2})}})
			require.Equal(t, want, out[0].I, "%s of %s", op, c.d.Type)
		}
	}
}
