package onnx

import (
	"math"
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

// TestRefusalsSayWhatIsWrong: attributes whose arithmetic would overflow
// (a dilation of 2^63-1 made a 4x4 convolution declare 6 rows) and values
// outside their domain are refused with a message about the value itself,
// naming the node.
func TestRefusalsSayWhatIsWrong(t *testing.T) {
	conv := func(op string, ints map[string][]int64, wshape []int64) []byte {
		n := int64(1)
		for _, d := range wshape {
			n *= d
		}
		return encModel(tGraph{
			nodes:   []tNode{{op: op, name: "/c", inputs: []string{"x", "w"}, outputs: []string{"y"}, ints: ints}},
			inits:   [][]byte{encTensorF32("w", wshape, make([]float32, n))},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 4, 4}), encValueInfo("w", 1, wshape)},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 2, 2})},
		})
	}
	for _, c := range []struct {
		name, want string
		model      []byte
	}{
		{"conv dilation 2^63-1", "spans more than 2^40 elements", conv("Conv", map[string][]int64{"dilations": {math.MaxInt64, 1}}, []int64{1, 1, 3, 3})},
		{"conv dilation 2^62", "spans more than 2^40 elements", conv("Conv", map[string][]int64{"dilations": {1 << 62, 1}}, []int64{1, 1, 3, 3})},
		{"conv pads", "pads", conv("Conv", map[string][]int64{"pads": {1 << 62, 0, 0, 0}}, []int64{1, 1, 3, 3})},
		{"convtranspose dilation", "spans more than 2^40 elements", conv("ConvTranspose", map[string][]int64{"dilations": {math.MaxInt64 / 2, 1}}, []int64{1, 1, 3, 3})},
		{"maxpool dilation", "spans more than 2^40 elements", encModel(tGraph{
			nodes:   []tNode{{op: "MaxPool", name: "/p", inputs: []string{"x"}, outputs: []string{"y"}, ints: map[string][]int64{"kernel_shape": {2, 2}, "dilations": {math.MaxInt64, 1}}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 4, 4})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 2, 2})},
		})},
		{"random negative shape", "shape [-3,4] has a negative dimension", encModel(tGraph{
			nodes:   []tNode{{op: "RandomUniform", name: "/r", outputs: []string{"y"}, ints: map[string][]int64{"shape": {-3, 4}}}},
			outputs: [][]byte{encValueInfo("y", 1, []int64{3, 4})},
		})},
		{"rotary negative", "rotary_embedding_dim -2 must be even and at most the head size", encModel(tGraph{opset: 23,
			nodes: []tNode{{op: "RotaryEmbedding", name: "/rope", inputs: []string{"x", "c", "s", "p"}, outputs: []string{"y"},
				ints: map[string][]int64{"rotary_embedding_dim": {-2}}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 2, 3, 4}), encValueInfo("c", 1, []int64{5, 2}), encValueInfo("s", 1, []int64{5, 2}), encValueInfo("p", 7, []int64{1, 3})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 2, 3, 4})},
		})},
		{"col2im negative block", "must be positive", encModel(tGraph{opset: 18,
			nodes:   []tNode{{op: "Col2Im", name: "/c", inputs: []string{"x", "img", "blk"}, outputs: []string{"y"}}},
			inits:   [][]byte{encTensorI64("img", []int64{2}, []int64{4, 4}), encTensorI64("blk", []int64{2}, []int64{-1, -1})},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 49})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 4, 4})},
		})},
	} {
		_, err := Import(c.model, Options{Name: "m.onnx"})
		require.Error(t, err, c.name)
		require.Contains(t, err.Error(), c.want, c.name)
		require.Contains(t, err.Error(), `node "/`, c.name)
	}

	// A Resize whose scales are a float initializer (onnx-simplifier and
	// tf2onnx write them so) reads them as the constant they are; the
	// initializer is no parameter of the step.
	resize := func(share bool) []byte {
		nodes := []tNode{{op: "Resize", name: "/r", inputs: []string{"x", "", "scales"}, outputs: []string{"y"}, strs: map[string]string{"mode": "nearest"}}}
		outputs := [][]byte{encValueInfo("y", 1, []int64{1, 1, 2, 8})}
		if share {
			nodes = append(nodes, tNode{op: "Mul", name: "/m", inputs: []string{"scales", "scales"}, outputs: []string{"z"}})
			outputs = append(outputs, encValueInfo("z", 1, []int64{4}))
		}
		return encModel(tGraph{opset: 13, nodes: nodes,
			inits:   [][]byte{encTensorF32("scales", []int64{4}, []float32{1, 1, 1, 2})},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 2, 4})},
			outputs: outputs,
		})
	}
	m, err := Import(resize(false), Options{Name: "m.onnx"})
	require.NoError(t, err)
	require.Len(t, m.Funcs[0].Args, 1, "the scales are no argument")
	x := interp.FromFloats(ir.TensorOf(ir.F32, 1, 1, 2, 4), []float64{1, 2, 3, 4, 5, 6, 7, 8})
	res, err := interp.Run(m.Funcs[0], []*interp.Tensor{x}, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, []float64{1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8}, res[0].F)
	_, err = Import(resize(true), Options{Name: "m.onnx"})
	require.ErrorContains(t, err, `reads initializer "scales" as a constant`)
}

// TestEvalReadsTrainingGraphs: Options.Eval reads a graph exported in
// training mode as its module's eval mode: the batch norm normalises with
// the running statistics it is given (and gives them back unchanged), the
// dropout passes its input through, and the parameters keep their names.
func TestEvalReadsTrainingGraphs(t *testing.T) {
	data := encModel(tGraph{
		nodes: []tNode{
			{op: "BatchNormalization", name: "/bn", inputs: []string{"x", "g", "b", "rm", "rv"}, outputs: []string{"y", "rm_out", "rv_out"},
				ints: map[string][]int64{"training_mode": {1}}, floats: map[string]float32{"epsilon": 0, "momentum": 0.9}},
			{op: "Dropout", name: "/d", inputs: []string{"y", "ratio", "mode"}, outputs: []string{"z"}, ints: map[string][]int64{"seed": {1}}},
		},
		inits: [][]byte{encTensorF32("g", []int64{2}, []float32{2, 3}), encTensorF32("b", []int64{2}, []float32{1, -1}),
			encTensorF32("rm", []int64{2}, []float32{0.5, 1}), encTensorF32("rv", []int64{2}, []float32{4, 9}),
			encTensorF32("ratio", nil, []float32{0.5}), encTensorRaw("mode", 9, &ir.Dense{Type: ir.TensorOf(ir.Bool), Ints: []int64{1}})},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 2, 1, 1})},
		outputs: [][]byte{encValueInfo("z", 1, []int64{1, 2, 1, 1})},
		opset:   15,
	})
	m, err := Import(data, Options{Name: "m.onnx", Eval: true})
	require.NoError(t, err)
	f := m.Funcs[0]
	var kinds, names []string
	for _, op := range f.Body {
		kinds = append(kinds, op.Kind)
	}
	for _, a := range f.Args {
		names = append(names, a.Name)
	}
	require.Equal(t, []string{"batch_norm_infer"}, kinds, "no batch statistics, no dropout")
	require.Equal(t, []string{"x", "g", "b", "rm", "rv"}, names)
	args := []*interp.Tensor{interp.FromFloats(ir.TensorOf(ir.F32, 1, 2, 1, 1), []float64{2.5, 7})}
	for _, a := range f.Args[1:] {
		args = append(args, interp.FromDense(a.Arg.Init))
	}
	res, err := interp.Run(f, args, interp.Options{})
	require.NoError(t, err)
	// (2.5 - 0.5) / 2 * 2 + 1 = 3; (7 - 1) / 3 * 3 - 1 = 5.
	require.InDeltaSlice(t, []float64{3, 5}, res[0].F, 1e-6)
}
