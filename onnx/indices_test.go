package onnx

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// runWith imports data and runs it on the given arguments (by position).
func runWith(t *testing.T, data []byte, args ...*interp.Tensor) ([]*interp.Tensor, error) {
	t.Helper()
	m, err := Import(data, Options{Name: "m.onnx"})
	require.NoError(t, err)
	return interp.Run(m.Funcs[0], args, interp.Options{})
}

func i64s(v ...int64) *interp.Tensor {
	return interp.FromInts(ir.TensorOf(ir.I64, int64(len(v))), v)
}

// TestIndicesCountFromZero: the indices that ONNX defines from 0 are not
// read from the end when negative. A cross-entropy label of -1 with
// ignore_index set (PyTorch always sets it) is out of range, as PyTorch
// says ("Target -1 is out of bounds"), not class C-1; the ignored label
// itself contributes nothing. RoiAlign's batch index -1 and MaxUnpool's
// index -1 are out of range rather than the last image or element.
func TestIndicesCountFromZero(t *testing.T) {
	scores := interp.FromFloats(ir.TensorOf(ir.F32, 3, 4), []float64{1, 2, 3, 4, 0, 0, 0, 0, 4, 3, 2, 1})
	for _, op := range []string{"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"} {
		data := encModel(tGraph{
			nodes:   []tNode{{op: op, name: "/loss", inputs: []string{"x", "y"}, outputs: []string{"l"}, ints: map[string][]int64{"ignore_index": {-100}}, strs: map[string]string{"reduction": "sum"}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{3, 4}), encValueInfo("y", 7, []int64{3})},
			outputs: [][]byte{encValueInfo("l", 1, []int64{})},
		})
		_, err := runWith(t, data, scores, i64s(3, -1, 0))
		require.ErrorContains(t, err, "index -1 is out of range", op)
		_, err = runWith(t, data, scores, i64s(3, 4, 0))
		require.ErrorContains(t, err, "index 4 is out of range", op)
		ignored, err := runWith(t, data, scores, i64s(3, -100, 0))
		require.NoError(t, err, op)
		whole, err := runWith(t, data, scores, i64s(3, 3, 0))
		require.NoError(t, err, op)
		// Row 1's scores are all 0: its term is ln 4 under softmax, 0 for
		// NLL (the scores are the log-probabilities); ignored, it is 0.
		term := 0.0
		if op == "SoftmaxCrossEntropyLoss" {
			term = 1.3862943611198906
		}
		require.InDelta(t, whole[0].F[0]-term, ignored[0].F[0], 1e-6, op)
	}

	// MaxUnpool of a 1x1x2x2 pooled tensor into 1x1x4x4 (kernel 2, stride 2).
	unpool := encModel(tGraph{
		nodes:   []tNode{{op: "MaxUnpool", name: "/u", inputs: []string{"y", "i"}, outputs: []string{"z"}, ints: map[string][]int64{"kernel_shape": {2, 2}, "strides": {2, 2}}}},
		inputs:  [][]byte{encValueInfo("y", 1, []int64{1, 1, 2, 2}), encValueInfo("i", 7, []int64{1, 1, 2, 2})},
		outputs: [][]byte{encValueInfo("z", 1, []int64{1, 1, 4, 4})},
	})
	y := interp.FromFloats(ir.TensorOf(ir.F32, 1, 1, 2, 2), []float64{1, 2, 3, 4})
	idx := func(v ...int64) *interp.Tensor { return interp.FromInts(ir.TensorOf(ir.I64, 1, 1, 2, 2), v) }
	res, err := runWith(t, unpool, y, idx(0, 3, 8, 15))
	require.NoError(t, err)
	require.Equal(t, []float64{1, 0, 0, 2, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 4}, res[0].F)
	_, err = runWith(t, unpool, y, idx(0, 3, 8, -1))
	require.ErrorContains(t, err, "index -1 is out of range")

	// RoiAlign over a batch of 2 images: batch index -1 names none.
	roi := encModel(tGraph{
		nodes: []tNode{{op: "RoiAlign", name: "/r", inputs: []string{"x", "rois", "b"}, outputs: []string{"y"},
			ints: map[string][]int64{"output_height": {1}, "output_width": {1}, "sampling_ratio": {1}}}},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 1, 2, 2}), encValueInfo("rois", 1, []int64{1, 4}), encValueInfo("b", 7, []int64{1})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 1, 1})},
	})
	x := interp.FromFloats(ir.TensorOf(ir.F32, 2, 1, 2, 2), []float64{1, 1, 1, 1, 5, 5, 5, 5})
	box := interp.FromFloats(ir.TensorOf(ir.F32, 1, 4), []float64{0, 0, 1, 1})
	res, err = runWith(t, roi, x, box, i64s(1))
	require.NoError(t, err)
	require.InDelta(t, 5, res[0].F[0], 1e-6, "image 1")
	_, err = runWith(t, roi, x, box, i64s(-1))
	require.ErrorContains(t, err, "out of range")
	_, err = runWith(t, roi, x, box, i64s(2))
	require.ErrorContains(t, err, "out of range")
}
