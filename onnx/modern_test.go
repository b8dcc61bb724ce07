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
