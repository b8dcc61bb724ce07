package onnx

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	"github.com/kiln-compiler/kiln/passtest"
)

// handMade is a small graph with shape arithmetic to fold, an initializer
// and a batch-norm whose statistics inputs become state.
func handMade() []byte {
	return encModel(tGraph{
		nodes: []tNode{
			{op: "Shape", name: "/shape", inputs: []string{"x"}, outputs: []string{"s"}},
			{op: "Constant", name: "/c0", outputs: []string{"idx"}, tensor: encTensorI64("", nil, []int64{0})},
			{op: "Gather", name: "/g", inputs: []string{"s", "idx"}, outputs: []string{"n"}, ints: map[string][]int64{"axis": {0}}},
			{op: "Unsqueeze", name: "/u", inputs: []string{"n", "zero"}, outputs: []string{"n1"}},
			{op: "Constant", name: "/c1", outputs: []string{"minus1"}, tensor: encTensorI64("", []int64{1}, []int64{-1})},
			{op: "Concat", name: "/cat", inputs: []string{"n1", "minus1"}, outputs: []string{"shape"}, ints: map[string][]int64{"axis": {0}}},
			{op: "Conv", name: "/conv", inputs: []string{"x", "w"}, outputs: []string{"c"}, ints: map[string][]int64{"pads": {1, 1, 1, 1}}},
			{op: "BatchNormalization", name: "/bn", inputs: []string{"c", "g", "b", "rm", "rv"}, outputs: []string{"bn", "rm_out", "rv_out"}, ints: map[string][]int64{"training_mode": {1}}, floats: map[string]float32{"epsilon": 1e-5, "momentum": 0.9}},
			{op: "Relu", name: "/relu", inputs: []string{"bn"}, outputs: []string{"r"}},
			{op: "Reshape", name: "/reshape", inputs: []string{"r", "shape"}, outputs: []string{"flat"}},
			{op: "Gemm", name: "/fc", inputs: []string{"flat", "fcw"}, outputs: []string{"out"}, ints: map[string][]int64{"transB": {1}}},
		},
		inits: [][]byte{
			encTensorI64("zero", []int64{1}, []int64{0}),
			encTensorF32("fcw", []int64{3, 32}, make([]float32, 96)),
		},
		inputs: [][]byte{
			encValueInfo("x", 1, []int64{2, 1, 4, 4}),
			encValueInfo("w", 1, []int64{2, 1, 3, 3}),
			encValueInfo("g", 1, []int64{2}), encValueInfo("b", 1, []int64{2}),
			encValueInfo("rm", 1, []int64{2}), encValueInfo("rv", 1, []int64{2}),
		},
		outputs: [][]byte{encValueInfo("out", 1, []int64{2, 3})},
	})
}

func TestImportHandMade(t *testing.T) {
	m, err := Import(handMade(), Options{Name: "hand.onnx"})
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	text := m.String()
	require.Contains(t, text, `func @test_graph(%x: f32[2,1,4,4], %w: f32[2,1,3,3] {param}, %g: f32[2] {param}, %b: f32[2] {param}, %rm: f32[2] {state}, %rv: f32[2] {state}, %fcw: f32[3,32] {param, init = dense<f32[3,32]: 0.0>})`)
	require.Contains(t, text, `%flat = reshape(%r) {shape = [2, 32]}`, "the shape subgraph folds to a constant")
	require.NotContains(t, text, "gather", "shape arithmetic leaves no ops")
	require.Contains(t, text, `loc("hand.onnx":"/conv")`)
	require.Equal(t, "out", m.Funcs[0].Results[0].Name)

	m2, err := Import(handMade(), Options{Name: "hand.onnx", Batch: 4, DataInputs: []string{"x"}})
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m2))
	require.Contains(t, m2.String(), "%x: f32[4,1,4,4]")
	require.Contains(t, m2.String(), "shape = [4, 32]", "--batch flows through folded shape arithmetic")

	_, err = Import(handMade(), Options{DataInputs: []string{"nope"}})
	require.ErrorContains(t, err, `--data-inputs names "nope"`)
}

func TestUnsupportedOpsAreListed(t *testing.T) {
	data := encModel(tGraph{
		nodes: []tNode{
			{op: "Frobnicate", inputs: []string{"x"}, outputs: []string{"a"}},
			{op: "Frobnicate", inputs: []string{"a"}, outputs: []string{"b"}},
			{op: "Blorp", inputs: []string{"b"}, outputs: []string{"c"}},
			{op: "Relu", inputs: []string{"c"}, outputs: []string{"d"}},
		},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2})},
		outputs: [][]byte{encValueInfo("d", 1, []int64{2})},
	})
	_, err := Import(data, Options{Name: "m.onnx"})
	require.EqualError(t, err, "m.onnx: unsupported ONNX ops: Blorp (1), Frobnicate (2)")
	// Below opset 6 a graph of operators unchanged since opset 1 reads
	// as at opset 6; Relu changed at opset 6 (consumed_inputs went).
	relu := []tNode{{op: "Relu", name: "/r", inputs: []string{"x"}, outputs: []string{"y"}}}
	_, err = Import(encModel(tGraph{opset: 5, nodes: relu, inputs: [][]byte{encValueInfo("x", 1, []int64{2})}, outputs: [][]byte{encValueInfo("y", 1, []int64{2})}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: default-domain opset 5 is not supported (Kiln reads opsets 6 to 28, and below 6 graphs of operators unchanged since opset 1; node "/r" is Relu)`)
	_, err = Import(encModel(tGraph{opset: 1, nodes: []tNode{{op: "Softsign", name: "/s", inputs: []string{"x"}, outputs: []string{"y"}}}, inputs: [][]byte{encValueInfo("x", 1, []int64{2})}, outputs: [][]byte{encValueInfo("y", 1, []int64{2})}}), Options{Name: "m.onnx"})
	require.NoError(t, err)
	_, err = Import(encModel(tGraph{opset: 29, inputs: [][]byte{encValueInfo("x", 1, []int64{2})}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, "m.onnx: default-domain opset 29 is not supported (Kiln reads opsets 6 to 28)")
	data = encModel(tGraph{
		nodes:   []tNode{{op: "NonZero", name: "/nz", inputs: []string{"x"}, outputs: []string{"d"}}},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2})},
		outputs: [][]byte{encValueInfo("d", 7, []int64{1, 2})},
	})
	_, err = Import(data, Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/nz" (NonZero): its result's shape depends on the data; Kiln plans static shapes and tensors of numbers`)
}

func TestNodeErrorsNameTheNode(t *testing.T) {
	data := encModel(tGraph{
		nodes:   []tNode{{op: "MatMul", name: "/bad/MatMul", inputs: []string{"x", "y"}, outputs: []string{"z"}}},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 3}), encValueInfo("y", 1, []int64{4, 5})},
		outputs: [][]byte{encValueInfo("z", 1, []int64{2, 5})},
	})
	_, err := Import(data, Options{Name: "m.onnx"})
	require.ErrorContains(t, err, `m.onnx: node "/bad/MatMul" (MatMul): matmul: matmul contraction mismatch`)
}

// TestTruncatedModelsFailCleanly cuts a model at every length: each prefix
// is an error or a smaller valid model, never a panic.
func TestTruncatedModelsFailCleanly(t *testing.T) {
	data := handMade()
	for n := 0; n < len(data); n++ {
		m, err := Import(data[:n], Options{Name: "cut.onnx"})
		if err == nil {
			require.NoError(t, ir.Verify(m), "prefix %d", n)
		}
	}
	garbled := append([]byte(nil), data...)
	for i := 7; i < len(garbled); i += 13 {
		garbled[i] ^= 0x5a
		if m, err := Import(garbled, Options{}); err == nil {
			_ = ir.Verify(m)
		}
	}
}

func FuzzImport(f *testing.F) {
	f.Add(handMade())
	for _, p := range zooFiles() {
		if b, err := os.ReadFile(p); err == nil && len(b) < 100000 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Import(data, Options{Name: "fuzz.onnx"})
		if err == nil {
			_ = ir.Verify(m)
		}
	})
}

func zooFiles() []string {
	files, _ := filepath.Glob("../testdata/models/*.onnx")
	small, _ := filepath.Glob("../testdata/models/*/model.onnx")
	return append(files, small...)
}

// TestZooImports imports every committed model, verifies it and round-trips
// it through the text format.
func TestZooImports(t *testing.T) {
	files := zooFiles()
	require.NotEmpty(t, files)
	for _, path := range files {
		m, err := ImportFile(path, Options{})
		require.NoError(t, err, path)
		require.NoError(t, ir.Verify(m), path)
		text := m.String()
		m2, err := parser.Parse(path, text)
		require.NoError(t, err, path)
		require.Empty(t, ir.Diff(m, m2), path)
	}
}

func loadNpy(t *testing.T, path string) *interp.Tensor {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	x, err := npy.Read(bytes.NewReader(b))
	require.NoError(t, err)
	return x
}

// TestSmallModelsMatchPyTorch runs the small zoo models with their real
// weights and compares outputs, and gradients after autodiff, with the
// values PyTorch computed (committed .npy files).
func TestSmallModelsMatchPyTorch(t *testing.T) {
	dirs, _ := filepath.Glob("../testdata/models/*/model.onnx")
	require.NotEmpty(t, dirs, "the small models are committed under testdata/models")
	for _, path := range dirs {
		dir := filepath.Dir(path)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m, err := ImportFile(path, Options{})
			require.NoError(t, err)
			f := m.Funcs[0]
			args := make([]*interp.Tensor, len(f.Args))
			for i, a := range f.Args {
				switch {
				case a.Arg.Kind == ir.ArgData:
					args[i] = loadNpy(t, filepath.Join(dir, "input.npy"))
				case a.Arg.Init != nil:
					args[i] = interp.FromDense(a.Arg.Init)
				default:
					t.Fatalf("argument %s has no value", a.Name)
				}
			}
			out, err := interp.Run(f, args, interp.Options{})
			require.NoError(t, err)
			want := loadNpy(t, filepath.Join(dir, "output.npy"))
			require.LessOrEqual(t, passtest.RelErr(out[0], want), 1e-4, "output")

			pipe, err := passes.ParsePipeline("autodiff", nil)
			require.NoError(t, err)
			require.NoError(t, (&passes.Manager{Inst: passes.Instrumentation{VerifyEach: true}}).Run(m, pipe))
			res, err := interp.Run(f, args, interp.Options{})
			require.NoError(t, err)
			checked, meaningful := 0, 0
			for i := 1; i < len(f.Results); i++ {
				name := f.ResultName(i)
				file := filepath.Join(dir, name+".npy")
				if _, err := os.Stat(file); err != nil {
					t.Fatalf("no PyTorch gradient %s for %s", file, name)
				}
				g := loadNpy(t, file)
				if maxAbs(g) < 1e-5 && maxAbs(res[i]) < 1e-5 {
					// Mathematically zero (a conv bias followed by batch norm):
					// both sides are rounding noise, where relative error means nothing.
					checked++
					continue
				}
				require.LessOrEqual(t, passtest.RelErr(res[i], g), 1e-4, name)
				checked++
				meaningful++
			}
			// Reference gradients that are all zero prove nothing (an MLP
			// ending in softmax has zero gradients of sum(output)).
			require.Greater(t, 2*meaningful, checked, "most PyTorch gradients must be non-zero")
			require.True(t, strings.HasPrefix(f.ResultName(1), "grad."))
		})
	}
}

func maxAbs(x *interp.Tensor) float64 {
	m := 0.0
	for i := 0; i < x.Len(); i++ {
		m = max(m, x.At(i), -x.At(i))
	}
	return m
}

// TestExternalData: initializer values may live in a separate file.
func TestExternalData(t *testing.T) {
	dir := t.TempDir()
	raw := make([]byte, 0, 16)
	for _, v := range []float32{1, 2, 3, 4} {
		raw = protowire.AppendFixed32(raw, math.Float32bits(v))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "weights.bin"), append([]byte("pad!"), raw...), 0o644))
	var init []byte
	init = appendVarint(init, 1, 4)
	init = appendVarint(init, 2, 1)
	init = appendString(init, 8, "w")
	for _, kv := range [][2]string{{"location", "weights.bin"}, {"offset", "4"}, {"length", "16"}} {
		init = appendMsg(init, 13, appendString(appendString(nil, 1, kv[0]), 2, kv[1]))
	}
	init = appendVarint(init, 14, 1)
	model := encModel(tGraph{
		nodes:   []tNode{{op: "Mul", name: "/mul", inputs: []string{"x", "w"}, outputs: []string{"y"}}},
		inits:   [][]byte{init},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{4})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{4})},
	})
	path := filepath.Join(dir, "m.onnx")
	require.NoError(t, os.WriteFile(path, model, 0o644))
	m, err := ImportFile(path, Options{})
	require.NoError(t, err)
	require.Contains(t, m.String(), "%w: f32[4] {param, init = dense<f32[4]: [1.0, 2.0, 3.0, 4.0]>}")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "weights.bin"), raw[:8], 0o644))
	_, err = ImportFile(path, Options{})
	require.ErrorContains(t, err, "external data range")

	// A symbolic link that leads out of the model's folder is refused
	// (one read /etc/passwd into the weights).
	outside := filepath.Join(t.TempDir(), "secret.bin")
	require.NoError(t, os.WriteFile(outside, append([]byte("pad!"), raw...), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "weights.bin")))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "weights.bin")))
	_, err = ImportFile(path, Options{})
	require.ErrorContains(t, err, "resolves outside the model's folder")
}

// TestRecordMappedOps: ops whose record names an ONNX operator import
// with their attributes (defaults where the node gives none) and no
// converter of their own; softplus and elu were added as one record each.
func TestRecordMappedOps(t *testing.T) {
	model := encModel(tGraph{
		nodes: []tNode{
			{op: "Softplus", name: "/sp", inputs: []string{"x"}, outputs: []string{"a"}},
			{op: "Elu", name: "/elu", inputs: []string{"a"}, outputs: []string{"b"}, floats: map[string]float32{"alpha": 0.5}},
			{op: "Elu", name: "/elu1", inputs: []string{"b"}, outputs: []string{"c"}},
			{op: "HardSigmoid", name: "/hs", inputs: []string{"c"}, outputs: []string{"y"}, floats: map[string]float32{"beta": 0.25}},
		},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 3})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2, 3})},
	})
	m, err := Import(model, Options{Name: "m.onnx"})
	require.NoError(t, err)
	text := m.String()
	require.Contains(t, text, `%a = softplus(%x) : f32[2,3] loc("m.onnx":"/sp")`)
	require.Contains(t, text, `%b = elu(%a) {alpha = 0.5} : f32[2,3]`)
	require.Contains(t, text, `%c = elu(%b) : f32[2,3]`)
	require.Contains(t, text, `%y = hard_sigmoid(%c) {beta = 0.25} : f32[2,3]`)
	x := interp.FromFloats(ir.TensorOf(ir.F32, 2, 3), []float64{-30, -1, 0, 0.5, 2, 40})
	res, err := interp.Run(m.Funcs[0], []*interp.Tensor{x}, interp.Options{})
	require.NoError(t, err)
	for i, v := range x.F {
		sp := math.Log1p(math.Exp(v))
		if v > 20 {
			sp = v
		}
		e := sp
		if e <= 0 {
			e = 0.5 * math.Expm1(e)
		}
		if e <= 0 {
			e = math.Expm1(e)
		}
		want := math.Max(0, math.Min(1, 0.2*e+0.25))
		require.InDelta(t, want, res[0].F[i], 1e-6, "x = %g", v)
	}
}

// TestNodesWithoutInputs: every supported operator, given no inputs or an
// empty first input, is an error that names the node (it used to be a nil
// pointer dereference for Add, Relu, MatMul, Conv, Reshape, ...).
func TestNodesWithoutInputs(t *testing.T) {
	for op := range converters {
		a := arity[op]
		for _, inputs := range [][]string{nil, {""}, {"", "x"}} {
			if a[0] == 0 && len(inputs) == 0 {
				continue // Constant takes none
			}
			model := encModel(tGraph{
				nodes:   []tNode{{op: op, name: "/bad", inputs: inputs, outputs: []string{"y"}}},
				inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 3})},
				outputs: [][]byte{encValueInfo("y", 1, []int64{2, 3})},
			})
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("%s with inputs %q: panic %v", op, inputs, r)
					}
				}()
				_, err := Import(model, Options{Name: "m.onnx"})
				require.Error(t, err, "%s with inputs %q", op, inputs)
				require.Contains(t, err.Error(), `node "/bad" (`+op+`)`, "%s with inputs %q", op, inputs)
			}()
		}
	}
}

// TestIntegerDivisionByZero: shape arithmetic that divides by zero is an
// error naming the node, not a silent 0.
func TestIntegerDivisionByZero(t *testing.T) {
	model := encModel(tGraph{
		nodes: []tNode{
			{op: "Shape", name: "/shape", inputs: []string{"x"}, outputs: []string{"s"}},
			{op: "Div", name: "/div", inputs: []string{"s", "zero"}, outputs: []string{"q"}},
			{op: "Reshape", name: "/reshape", inputs: []string{"x", "q"}, outputs: []string{"y"}},
		},
		inits:   [][]byte{encTensorI64("zero", []int64{2}, []int64{1, 0})},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 3})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2, 3})},
	})
	_, err := Import(model, Options{Name: "m.onnx"})
	require.ErrorContains(t, err, `m.onnx: node "/div" (Div): integer division by zero`)
}

// TestDuplicateGraphOutputs: an output listed twice is an error naming it
// (the last one used to win).
func TestDuplicateGraphOutputs(t *testing.T) {
	model := encModel(tGraph{
		nodes:   []tNode{{op: "Relu", name: "/relu", inputs: []string{"x"}, outputs: []string{"y"}}},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2}), encValueInfo("y", 1, []int64{2})},
	})
	_, err := Import(model, Options{Name: "m.onnx"})
	require.ErrorContains(t, err, `m.onnx: graph output "y" is listed twice`)
}

// TestModelDeclarationsAreChecked: an unknown operator domain is an error
// naming it; a shape or element type that Kiln computes differently from
// what the model declares (for an output or a value_info) is an error
// naming the node.
func TestModelDeclarationsAreChecked(t *testing.T) {
	x := [][]byte{encValueInfo("x", 1, []int64{2, 3})}
	relu := []tNode{{op: "Relu", name: "/r", inputs: []string{"x"}, outputs: []string{"y"}}, {op: "Relu", name: "/s", inputs: []string{"y"}, outputs: []string{"z"}}}
	_, err := Import(encModel(tGraph{nodes: relu, inputs: x, outputs: [][]byte{encValueInfo("z", 1, []int64{2, 3})}, domains: map[string]int64{"com.example.custom": 1}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: operator domain "com.example.custom" (version 1) is not supported; Kiln reads the default ONNX domain`)
	_, err = Import(encModel(tGraph{nodes: relu, inputs: x, outputs: [][]byte{encValueInfo("z", 1, []int64{2, 4})}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/s" (Relu), output "z": the model declares shape [2,4], Kiln computes [2,3]`)
	_, err = Import(encModel(tGraph{nodes: relu, inputs: x, outputs: [][]byte{encValueInfo("z", 1, []int64{2, 3})}, info: [][]byte{encValueInfo("y", 1, []int64{3, 2})}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/r" (Relu), output "y": the model declares shape [3,2], Kiln computes [2,3]`)
	_, err = Import(encModel(tGraph{nodes: relu, inputs: x, outputs: [][]byte{encValueInfo("z", 11, []int64{2, 3})}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/s" (Relu), output "z": the model declares element type f64, Kiln computes f32`)
	_, err = Import(encModel(tGraph{opset: 17, nodes: []tNode{{op: "Gelu", name: "/g", inputs: []string{"x"}, outputs: []string{"z"}}}, inputs: x, outputs: [][]byte{encValueInfo("z", 1, []int64{2, 3})}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/g" (Gelu): Gelu was added to ONNX in opset 20, and the model declares opset 17`)
	// A dimension left unknown matches anything.
	_, err = Import(encModel(tGraph{nodes: relu, inputs: x, outputs: [][]byte{encValueInfo("z", 1, []int64{-1, 3})}}), Options{Name: "m.onnx"})
	require.NoError(t, err)
}

// TestMalformedGraphsRefused: what the ONNX checker rejects, Kiln refuses
// naming the input, node or value (it used to read the second of two
// inputs with one name, let the last of two nodes writing one value win,
// and report a negative dimension as a symbolic one).
func TestMalformedGraphsRefused(t *testing.T) {
	x := encValueInfo("x", 1, []int64{2, 3})
	relu := []tNode{{op: "Relu", name: "/r", inputs: []string{"x"}, outputs: []string{"y"}}}
	y := [][]byte{encValueInfo("y", 1, []int64{2, 3})}
	_, err := Import(encModel(tGraph{nodes: relu, inputs: [][]byte{x, encValueInfo("x", 1, []int64{4})}, outputs: y}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: graph input "x" is declared twice; an ONNX value has one definition`)
	two := append(relu, tNode{op: "Neg", name: "/n", inputs: []string{"x"}, outputs: []string{"y"}})
	_, err = Import(encModel(tGraph{nodes: two, inputs: [][]byte{x}, outputs: y}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/n" (Neg): output "y" is already defined by node "/r" (Relu); an ONNX value has one definition`)
	over := []tNode{{op: "Relu", name: "/r", inputs: []string{"x"}, outputs: []string{"x"}}}
	_, err = Import(encModel(tGraph{nodes: over, inputs: [][]byte{x}, outputs: [][]byte{x}}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/r" (Relu): output "x" is already defined by a graph input or initializer; an ONNX value has one definition`)
	_, err = Import(encModel(tGraph{nodes: relu, inputs: [][]byte{encValueInfo("x", 1, []int64{2, -3})}, outputs: y}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: value "x" declares dimension 1 as -3; a dimension is a size of 0 or more, or a symbolic name`)
	_, err = Import(encModel(tGraph{nodes: relu, inputs: [][]byte{x}, inits: [][]byte{encTensorI64("k", []int64{1}, []int64{1}), encTensorI64("k", []int64{1}, []int64{2})}, outputs: y}), Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: initializer "k" is given twice`)
}

// TestSliceEndsKeepInt64: PyTorch writes x[:, 1:] as ends = INT64_MAX; it
// must stay INT64_MAX (not pass through a float64 and wrap to INT64_MIN).
func TestSliceEndsKeepInt64(t *testing.T) {
	data := encModel(tGraph{
		nodes:   []tNode{{op: "Slice", name: "/s", inputs: []string{"x", "st", "en", "ax"}, outputs: []string{"y"}}},
		inits:   [][]byte{encTensorI64("st", []int64{1}, []int64{1}), encTensorI64("en", []int64{1}, []int64{math.MaxInt64}), encTensorI64("ax", []int64{1}, []int64{1})},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 6}), encValueInfo("st", 7, []int64{1}), encValueInfo("en", 7, []int64{1}), encValueInfo("ax", 7, []int64{1})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2, 5})},
	})
	m, err := Import(data, Options{Name: "m.onnx"})
	require.NoError(t, err)
	require.Equal(t, "f32[2,5]", m.Funcs[0].Results[0].Value.Type.String())
	require.Contains(t, m.String(), "ends = [9223372036854775807]")
}

// TestDocsListEveryOperator: docs/onnx.md's table names every operator
// the importer reads.
func TestDocsListEveryOperator(t *testing.T) {
	b, err := os.ReadFile("../docs/onnx.md")
	require.NoError(t, err)
	doc := string(b)
	table := doc[strings.Index(doc, "## Operators"):]
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(table, func(r rune) bool { return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') }) {
		words[w] = true
	}
	for key := range converters {
		name := key[strings.LastIndex(key, ".")+1:] // the operator of "domain.type"
		require.True(t, words[name], "docs/onnx.md does not list %s", key)
	}
}

// TestIfNeedsAnImportTimeCondition: an If whose condition is known only
// at run time is an error naming the node.
func TestIfNeedsAnImportTimeCondition(t *testing.T) {
	data := encModel(tGraph{
		nodes:   []tNode{{op: "If", name: "/if", inputs: []string{"c"}, outputs: []string{"y"}}},
		inputs:  [][]byte{encValueInfo("c", 9, []int64{})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2})},
	})
	_, err := Import(data, Options{Name: "m.onnx"})
	require.EqualError(t, err, `m.onnx: node "/if" (If): its condition is known only at run time; Kiln inlines an If whose condition the static shapes decide`)
}

// TestEinsumForms: explicit and implicit outputs, one operand (transpose,
// sums), two (matmul, outer product, batched contraction), "..." and
// diagonals, checked against direct sums.
func TestEinsumForms(t *testing.T) {
	a := []float32{1, 2, 3, 4, 5, 6}     // [2,3]
	b := []float32{1, -1, 2, 0.5, 3, -2} // [3,2]
	for _, c := range []struct {
		eq   string
		in   [][]int64 // shapes (a's values, then b's, reshaped)
		want []float64
		out  []int64
	}{
		{"ij->ji", [][]int64{{2, 3}}, []float64{1, 4, 2, 5, 3, 6}, []int64{3, 2}},
		{"ij->", [][]int64{{2, 3}}, []float64{21}, []int64{}},
		{"ij->j", [][]int64{{2, 3}}, []float64{5, 7, 9}, []int64{3}},
		{"ij", [][]int64{{2, 3}}, []float64{1, 2, 3, 4, 5, 6}, []int64{2, 3}},
		{"ij,jk", [][]int64{{2, 3}, {3, 2}}, []float64{1*1 + 2*2 + 3*3, 1*-1 + 2*0.5 + 3*-2, 4*1 + 5*2 + 6*3, 4*-1 + 5*0.5 + 6*-2}, []int64{2, 2}},
		{"ij,jk->ki", [][]int64{{2, 3}, {3, 2}}, []float64{14, 32, -6, -13.5}, []int64{2, 2}},
		{"i,j->ij", [][]int64{{3}, {2}}, []float64{1, -1, 2, -2, 3, -3}, []int64{3, 2}},
		{"...j,j->...", [][]int64{{2, 3}, {3}}, []float64{1*1 + 2*-1 + 3*2, 4*1 + 5*-1 + 6*2}, []int64{2}},
	} {
		var inputs [][]byte
		var names []string
		vals := [][]float32{a, b}
		var inits [][]byte
		for i, shape := range c.in {
			name := fmt.Sprintf("x%d", i)
			names = append(names, name)
			n := int64(1)
			for _, d := range shape {
				n *= d
			}
			inits = append(inits, encTensorF32(name, shape, vals[i][:n]))
			inputs = append(inputs, encValueInfo(name, 1, shape))
		}
		data := encModel(tGraph{
			nodes:   []tNode{{op: "Einsum", name: "/e", inputs: names, outputs: []string{"y"}, strs: map[string]string{"equation": c.eq}}},
			inits:   inits,
			inputs:  inputs,
			outputs: [][]byte{encValueInfo("y", 1, c.out)},
		})
		res := runInitialized(t, data, c.eq)
		require.Equal(t, len(c.want), res[0].Len(), c.eq)
		for i, w := range c.want {
			require.InDelta(t, w, res[0].At(i), 1e-6, "%s element %d", c.eq, i)
		}
	}
	// Diagonals: x = [[1,2,3],[4,5,6],[7,8,9]] (one operand, or the
	// second with a = [[1,2,3],[4,5,6]] first).
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, c := range []struct {
		eq   string
		two  bool
		want []float64
		out  []int64
	}{
		{"ii->i", false, []float64{1, 5, 9}, []int64{3}},
		{"ii", false, []float64{15}, []int64{}},
		{"ii->", false, []float64{15}, []int64{}},
		{"ij,jj->i", true, []float64{1*1 + 2*5 + 3*9, 4*1 + 5*5 + 6*9}, []int64{2}},
		{"ij,jj->ij", true, []float64{1, 10, 27, 4, 25, 54}, []int64{2, 3}},
	} {
		names, inputs, inits := []string{"x"}, [][]byte{encValueInfo("x", 1, []int64{3, 3})}, [][]byte{encTensorF32("x", []int64{3, 3}, x)}
		if c.two {
			names = []string{"a", "x"}
			inputs = append([][]byte{encValueInfo("a", 1, []int64{2, 3})}, inputs...)
			inits = append([][]byte{encTensorF32("a", []int64{2, 3}, a)}, inits...)
		}
		data := encModel(tGraph{
			nodes:   []tNode{{op: "Einsum", name: "/d", inputs: names, outputs: []string{"y"}, strs: map[string]string{"equation": c.eq}}},
			inits:   inits,
			inputs:  inputs,
			outputs: [][]byte{encValueInfo("y", 1, c.out)},
		})
		res := runInitialized(t, data, c.eq)
		require.Equal(t, c.want, res[0].F, c.eq)
	}
}

// runInitialized imports a model whose every argument is an initializer
// and runs it on their values.
func runInitialized(t *testing.T, data []byte, what string) []*interp.Tensor {
	t.Helper()
	m, err := Import(data, Options{Name: "m.onnx"})
	require.NoError(t, err, what)
	f := m.Funcs[0]
	args := make([]*interp.Tensor, len(f.Args))
	for i, arg := range f.Args {
		args[i] = interp.FromDense(arg.Arg.Init)
	}
	res, err := interp.Run(f, args, interp.Options{})
	require.NoError(t, err, what)
	return res
}

// TestReviewedEdgeCases: inputs a review found mishandled. A 1-D
// ConvTranspose converts; an Einsum index in capitals is not confused
// with the axes under "..."; a kernel_shape that disagrees with the
// weight and a OneHot depth beyond the fold limit are errors.
func TestReviewedEdgeCases(t *testing.T) {
	convT := encModel(tGraph{
		nodes:   []tNode{{op: "ConvTranspose", name: "/ct", inputs: []string{"x", "w"}, outputs: []string{"y"}, ints: map[string][]int64{"strides": {2}}}},
		inits:   [][]byte{encTensorF32("w", []int64{2, 3, 3}, make([]float32, 18))},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 2, 5}), encValueInfo("w", 1, []int64{2, 3, 3})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 3, 11})},
	})
	_, err := Import(convT, Options{Name: "m.onnx"})
	require.NoError(t, err)
	einsum := encModel(tGraph{
		nodes:   []tNode{{op: "Einsum", name: "/e", inputs: []string{"x", "w"}, outputs: []string{"y"}, strs: map[string]string{"equation": "Ij,jk"}}},
		inits:   [][]byte{encTensorF32("w", []int64{3, 4}, make([]float32, 12))},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 3}), encValueInfo("w", 1, []int64{3, 4})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2, 4})},
	})
	_, err = Import(einsum, Options{Name: "m.onnx"})
	require.NoError(t, err)
	badKernel := encModel(tGraph{
		nodes:   []tNode{{op: "Conv", name: "/c", inputs: []string{"x", "w"}, outputs: []string{"y"}, ints: map[string][]int64{"kernel_shape": {1, 1}}}},
		inits:   [][]byte{encTensorF32("w", []int64{1, 1, 3, 3}, make([]float32, 9))},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 5, 5}), encValueInfo("w", 1, []int64{1, 1, 3, 3})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 3, 3})},
	})
	_, err = Import(badKernel, Options{Name: "m.onnx"})
	require.ErrorContains(t, err, "kernel_shape [1 1] does not match the weight's spatial dimensions [3 3]")
	oneHot := encModel(tGraph{
		nodes:   []tNode{{op: "OneHot", name: "/o", inputs: []string{"i", "d", "v"}, outputs: []string{"y"}}},
		inits:   [][]byte{encTensorI64("d", []int64{}, []int64{1 << 40}), encTensorF32("v", []int64{2}, []float32{0, 1})},
		inputs:  [][]byte{encValueInfo("i", 7, []int64{2}), encValueInfo("d", 7, []int64{}), encValueInfo("v", 1, []int64{2})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{2, 1 << 40})},
	})
	_, err = Import(oneHot, Options{Name: "m.onnx"})
	require.ErrorContains(t, err, "the depth must be one integer from 1 to")
}

// TestScatterWithoutReductionNeedsDistinctIndices: ScatterElements with
// reduction none and an index that hits one element twice is an error
// (ONNX leaves the result undefined).
func TestScatterWithoutReductionNeedsDistinctIndices(t *testing.T) {
	data := encModel(tGraph{
		nodes:   []tNode{{op: "ScatterElements", name: "/s", inputs: []string{"x", "i", "u"}, outputs: []string{"y"}, ints: map[string][]int64{"axis": {1}}}},
		inits:   [][]byte{encTensorI64("i", []int64{1, 2}, []int64{0, 0})},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 3}), encValueInfo("i", 7, []int64{1, 2}), encValueInfo("u", 1, []int64{1, 2})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 3})},
	})
	_, err := Import(data, Options{Name: "m.onnx", DataInputs: []string{"x", "u"}})
	require.EqualError(t, err, `m.onnx: node "/s" (ScatterElements): the indices hit one element twice; without a reduction ONNX leaves the result undefined`)
}

// TestTopKWithTies: equal values (-inf included) come out lowest index
// first, each index once.
func TestTopKWithTies(t *testing.T) {
	data := encModel(tGraph{
		nodes: []tNode{{op: "TopK", name: "/t", inputs: []string{"x", "k"}, outputs: []string{"v", "i"}}},
		inits: [][]byte{encTensorI64("k", []int64{1}, []int64{4}),
			encTensorF32("x", []int64{1, 5}, []float32{2, float32(math.Inf(-1)), 2, float32(math.Inf(-1)), 7})},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 5}), encValueInfo("k", 7, []int64{1})},
		outputs: [][]byte{encValueInfo("v", 1, []int64{1, 4}), encValueInfo("i", 7, []int64{1, 4})},
	})
	m, err := Import(data, Options{Name: "m.onnx"})
	require.NoError(t, err)
	f := m.Funcs[0]
	args := []*interp.Tensor{interp.FromDense(f.Args[0].Arg.Init)}
	res, err := interp.Run(f, args, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, []float64{7, 2, 2, math.Inf(-1)}, res[0].F)
	require.Equal(t, []int64{4, 0, 2, 1}, res[1].I)
}

// TestGatherND: indices address data's leading axes; an index out of
// range is an error naming the node, and a negative one counts from the
// end.
func TestGatherND(t *testing.T) {
	vals := make([]float32, 12)
	for i := range vals {
		vals[i] = float32(i)
	}
	model := func(idx []int64) []byte {
		return encModel(tGraph{
			nodes:   []tNode{{op: "GatherND", name: "/g", inputs: []string{"x", "i"}, outputs: []string{"y"}}},
			inits:   [][]byte{encTensorF32("x", []int64{2, 2, 3}, vals), encTensorI64("i", []int64{2, 2}, idx)},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 2, 3}), encValueInfo("i", 7, []int64{2, 2})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{2, 3})},
		})
	}
	m, err := Import(model([]int64{1, 0, 0, -1}), Options{Name: "m.onnx"})
	require.NoError(t, err)
	f := m.Funcs[0]
	res, err := interp.Run(f, []*interp.Tensor{interp.FromDense(f.Args[0].Arg.Init)}, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, []float64{6, 7, 8, 3, 4, 5}, res[0].F)
	_, err = Import(model([]int64{2, 0, 0, 0}), Options{Name: "m.onnx"})
	require.ErrorContains(t, err, `node "/g" (GatherND)`)
	require.ErrorContains(t, err, "out of range")
}

// TestOperandsAsGraphInputs: a Reduce's axes given as a graph input is an
// error naming the input and the way to give it; with its value in
// Options.Values the graph is specialised to it (the input is no longer
// an argument), and a value of another type is refused.
func TestOperandsAsGraphInputs(t *testing.T) {
	data := encModel(tGraph{opset: 18,
		nodes:   []tNode{{op: "ReduceSum", name: "/sum", inputs: []string{"x", "axes"}, outputs: []string{"y"}}},
		inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 3}), encValueInfo("axes", 7, []int64{1})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 3})}})
	_, err := Import(data, Options{Name: "m.onnx"})
	var need *NeedsValueError
	require.ErrorAs(t, err, &need)
	require.Equal(t, []string{"axes"}, need.Inputs)
	require.EqualError(t, err, `m.onnx: node "/sum" (ReduceSum): Kiln needs the axes when it imports the model (static shapes), from graph input "axes": give its value with --input axes=FILE.npy`)
	axes := interp.FromInts(ir.Type{DType: ir.I64, Shape: ir.Shape{1}}, []int64{0})
	m, err := Import(data, Options{Name: "m.onnx", Value: valuesOf(map[string]*interp.Tensor{"axes": axes})})
	require.NoError(t, err)
	f := m.Funcs[0]
	require.Len(t, f.Args, 1)
	require.Equal(t, "x", f.Args[0].Name)
	x := interp.New(ir.Type{DType: ir.F32, Shape: ir.Shape{2, 3}})
	copy(x.F, []float64{1, 2, 3, 10, 20, 30})
	got, err := interp.Run(f, []*interp.Tensor{x}, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, []float64{11, 22, 33}, got[0].F)
	wrong := interp.FromInts(ir.Type{DType: ir.I32, Shape: ir.Shape{1}}, []int64{0})
	_, err = Import(data, Options{Name: "m.onnx", Value: valuesOf(map[string]*interp.Tensor{"axes": wrong})})
	require.EqualError(t, err, `m.onnx: input "axes" is i64[1], but the value given for it is i32[1]`)
}

func valuesOf(m map[string]*interp.Tensor) func(string) (*interp.Tensor, error) {
	return func(name string) (*interp.Tensor, error) { return m[name], nil }
}

// TestRange27: from opset 27 Range takes f16 and bf16 and computes them in
// f32 (stash_type 1, the default) before the cast; with stash_type 0 in
// the type itself. From 2 by 0.71484375 (exact in bf16), element 3 is
// 4.14453125 in f32, 4.15625 in bf16; in bf16 arithmetic 3·0.71484375 =
// 2.14453125 rounds to 2.140625 first, and 2 + 2.140625 = 4.140625 to
// 4.125 (ties to even).
func TestRange27(t *testing.T) {
	scalar := func(name string, v float64) tNode {
		return tNode{op: "Constant", name: name, outputs: []string{name}, tensor: encTensorRaw(name, 16, &ir.Dense{Type: ir.TensorOf(ir.BF16), Floats: []float64{v}})}
	}
	for _, c := range []struct {
		stash int64
		last  float64
	}{{1, 4.15625}, {0, 4.125}} {
		m, err := Import(encModel(tGraph{opset: 27,
			nodes: []tNode{scalar("s", 2), scalar("l", 4.5), scalar("d", 0.71484375),
				{op: "Range", name: "/r", inputs: []string{"s", "l", "d"}, outputs: []string{"y"}, ints: map[string][]int64{"stash_type": {c.stash}}}},
			outputs: [][]byte{encValueInfo("y", 16, []int64{4})}}), Options{Name: "m.onnx"})
		require.NoError(t, err)
		got, err := interp.Run(m.Funcs[0], nil, interp.Options{})
		require.NoError(t, err)
		require.Equal(t, []float64{2, 2.71875, 3.4375, c.last}, got[0].F, "stash_type %d", c.stash)
	}
}

// TestCastSaturate: Cast to a float8 type reads saturate (opset 19 on,
// default 1): saturate = 0 becomes the cast's saturate = false; values
// follow ONNX's table (e5m2 saturates at 57344, or overflows to inf).
func TestCastSaturate(t *testing.T) {
	for _, c := range []struct {
		sat  int64
		want []float64
	}{{1, []float64{57344, -57344, 1024}}, {0, []float64{math.Inf(1), math.Inf(-1), 1024}}} {
		m, err := Import(encModel(tGraph{opset: 19,
			nodes: []tNode{{op: "Cast", name: "/c", inputs: []string{"x"}, outputs: []string{"y"}, ints: map[string][]int64{"to": {19}, "saturate": {c.sat}}},
				{op: "Cast", name: "/back", inputs: []string{"y"}, outputs: []string{"z"}, ints: map[string][]int64{"to": {1}}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{3})},
			outputs: [][]byte{encValueInfo("z", 1, []int64{3})}}), Options{Name: "m.onnx"})
		require.NoError(t, err)
		require.Equal(t, c.sat == 0, strings.Contains(m.String(), "saturate = false"))
		x := interp.FromFloats(ir.TensorOf(ir.F32, 3), []float64{math.Inf(1), -70000, 1000})
		got, err := interp.Run(m.Funcs[0], []*interp.Tensor{x}, interp.Options{})
		require.NoError(t, err)
		require.Equal(t, c.want, got[0].F, "saturate %d", c.sat)
	}
}

// TestScatterReductionsWithDuplicates: ScatterElements and ScatterND
// with reduction mul, max and min combine every update of an element in
// index order, duplicates included (opset 18): x = [1, 2, 3] with
// updates 4, 5, -6 at elements 0, 0, 2.
func TestScatterReductionsWithDuplicates(t *testing.T) {
	for _, c := range []struct {
		op, reduction string
		want          []float64
	}{
		{"ScatterElements", "mul", []float64{20, 2, -18}},
		{"ScatterElements", "max", []float64{5, 2, 3}},
		{"ScatterElements", "min", []float64{1, 2, -6}},
		{"ScatterND", "mul", []float64{20, 2, -18}},
		{"ScatterND", "max", []float64{5, 2, 3}},
		{"ScatterND", "min", []float64{1, 2, -6}},
	} {
		idxDims := []int64{3}
		if c.op == "ScatterND" {
			idxDims = []int64{3, 1}
		}
		data := encModel(tGraph{
			nodes:   []tNode{{op: c.op, name: "/s", inputs: []string{"x", "i", "u"}, outputs: []string{"y"}, strs: map[string]string{"reduction": c.reduction}}},
			inits:   [][]byte{encTensorI64("i", idxDims, []int64{0, 0, 2})},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{3}), encValueInfo("i", 7, idxDims), encValueInfo("u", 1, []int64{3})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{3})},
			opset:   18,
		})
		m, err := Import(data, Options{Name: "m.onnx"})
		require.NoError(t, err, "%s %s", c.op, c.reduction)
		f := m.Funcs[0]
		vals := map[string][]float64{"x": {1, 2, 3}, "u": {4, 5, -6}}
		var args []*interp.Tensor
		for _, a := range f.Args {
			args = append(args, interp.FromFloats(a.Type, vals[a.Name]))
		}
		res, err := interp.Run(f, args, interp.Options{})
		require.NoError(t, err)
		require.Equal(t, c.want, res[0].F, "%s %s", c.op, c.reduction)
	}
}

// TestTfIdfVectorizerModes: unigrams 1 and 3 and the bigram (1, 2) with
// one skip allowed, in rows [1 2 1 3], [3 3 0 1] and [1 5 2 0] (whose
// bigram is found two apart): TF counts, IDF gives the weight where a
// count is positive, TFIDF the count times the weight.
func TestTfIdfVectorizerModes(t *testing.T) {
	x := []int64{1, 2, 1, 3, 3, 3, 0, 1, 1, 5, 2, 0}
	tf := []float64{2, 1, 1, 1, 2, 0, 1, 0, 1}
	w := []float64{0.5, 2, 4}
	for _, mode := range []string{"TF", "IDF", "TFIDF"} {
		data := encModel(tGraph{
			nodes: []tNode{{op: "TfIdfVectorizer", name: "/v", inputs: []string{"x"}, outputs: []string{"y"},
				strs: map[string]string{"mode": mode},
				ints: map[string][]int64{"min_gram_length": {1}, "max_gram_length": {2}, "max_skip_count": {1},
					"ngram_counts": {0, 2}, "ngram_indexes": {0, 1, 2}, "pool_int64s": {1, 3, 1, 2}},
				floatLists: map[string][]float32{"weights": {0.5, 2, 4}}}},
			inputs:  [][]byte{encValueInfo("x", 7, []int64{3, 4})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{3, 3})},
		})
		m, err := Import(data, Options{Name: "m.onnx"})
		require.NoError(t, err, mode)
		res, err := interp.Run(m.Funcs[0], []*interp.Tensor{interp.FromInts(ir.TensorOf(ir.I64, 3, 4), x)}, interp.Options{})
		require.NoError(t, err, mode)
		want := make([]float64, len(tf))
		for i, c := range tf {
			switch mode {
			case "TF":
				want[i] = c
			case "IDF":
				if c > 0 {
					want[i] = w[i%3]
				}
			case "TFIDF":
				want[i] = c * w[i%3]
			}
		}
		require.Equal(t, want, res[0].F, mode)
	}
}

// TestMaxPoolIndicesAndUnpool: with overlapping windows (kernel 2,
// stride 1) on [[1 9 2] [3 4 5] [6 7 8]], MaxPool's indices are those of
// the first maximum of each window, 9's twice ([1 1 7 8]; storage_order
// 1 counts columns first: [3 3 5 8]), and MaxUnpool of the pooled values
// puts each back once, 9 included, with zeros elsewhere.
func TestMaxPoolIndicesAndUnpool(t *testing.T) {
	for _, c := range []struct {
		order int64
		idx   []int64
	}{{0, []int64{1, 1, 7, 8}}, {1, []int64{3, 3, 5, 8}}} {
		window := map[string][]int64{"kernel_shape": {2, 2}, "strides": {1, 1}}
		pool := map[string][]int64{"kernel_shape": {2, 2}, "strides": {1, 1}, "storage_order": {c.order}}
		nodes := []tNode{{op: "MaxPool", name: "/p", inputs: []string{"x"}, outputs: []string{"y", "i"}, ints: pool}}
		outputs := [][]byte{encValueInfo("y", 1, []int64{1, 1, 2, 2}), encValueInfo("i", 7, []int64{1, 1, 2, 2})}
		if c.order == 0 {
			nodes = append(nodes, tNode{op: "MaxUnpool", name: "/u", inputs: []string{"y", "i"}, outputs: []string{"z"}, ints: window})
			outputs = append(outputs, encValueInfo("z", 1, []int64{1, 1, 3, 3}))
		}
		data := encModel(tGraph{nodes: nodes, inputs: [][]byte{encValueInfo("x", 1, []int64{1, 1, 3, 3})}, outputs: outputs})
		m, err := Import(data, Options{Name: "m.onnx"})
		require.NoError(t, err)
		x := interp.FromFloats(ir.TensorOf(ir.F32, 1, 1, 3, 3), []float64{1, 9, 2, 3, 4, 5, 6, 7, 8})
		res, err := interp.Run(m.Funcs[0], []*interp.Tensor{x}, interp.Options{})
		require.NoError(t, err)
		require.Equal(t, []float64{9, 9, 7, 8}, res[0].F)
		require.Equal(t, c.idx, res[1].I, "storage_order %d", c.order)
		if c.order == 0 {
			require.Equal(t, []float64{0, 9, 0, 0, 0, 0, 0, 7, 8}, res[2].F)
		}
	}
}

// TestDetWithPivotingAndGradient: Det needs row swaps ([[0 1] [1 0]]
// is -1), is 0 for a singular matrix, and 20 for a 3×3 one whose
// gradient (after autodiff) is its cofactor matrix.
func TestDetWithPivotingAndGradient(t *testing.T) {
	for _, c := range []struct {
		n    int64
		a    []float32
		det  float64
		grad []float64
	}{
		{2, []float32{0, 1, 1, 0}, -1, []float64{0, -1, -1, 0}},
		{2, []float32{1, 2, 2, 4}, 0, []float64{4, -2, -2, 1}},
		{3, []float32{2, 1, 3, 4, 1, 6, 8, 5, 2}, 20, []float64{-28, 40, 12, 13, -20, -2, 3, 0, -2}},
	} {
		data := encModel(tGraph{
			nodes:   []tNode{{op: "Det", name: "/d", inputs: []string{"a"}, outputs: []string{"y"}}},
			inits:   [][]byte{encTensorF32("a", []int64{c.n, c.n}, c.a)},
			inputs:  [][]byte{encValueInfo("a", 1, []int64{c.n, c.n})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{})},
		})
		m, err := Import(data, Options{Name: "m.onnx"})
		require.NoError(t, err)
		pipe, err := passes.ParsePipeline("autodiff", nil)
		require.NoError(t, err)
		require.NoError(t, (&passes.Manager{Inst: passes.Instrumentation{VerifyEach: true}}).Run(m, pipe))
		f := m.Funcs[0]
		res, err := interp.Run(f, []*interp.Tensor{interp.FromDense(f.Args[0].Arg.Init)}, interp.Options{})
		require.NoError(t, err)
		require.InDelta(t, c.det, res[0].F[0], 1e-5, "det of %v", c.a)
		require.Equal(t, "grad.a", f.ResultName(1))
		for i, g := range c.grad {
			require.InDelta(t, g, res[1].F[i], 1e-4, "gradient of det %v, element %d", c.a, i)
		}
	}
}

// TestRecurrentSequenceLengths: with sequence_lens [3, 1], the first
// batch element runs as without them, and the second stops after one
// step: its outputs from step 1 on are zero and its final state is its
// first step's (forward), or, reversed, it runs step 0 alone, as a
// forward run of that one step does. LSTM, GRU and RNN alike.
func TestRecurrentSequenceLengths(t *testing.T) {
	const seq, batch, in, hidden = 3, 2, 2, 2
	for _, c := range []struct {
		op    string
		gates int64
	}{{"LSTM", 4}, {"GRU", 3}, {"RNN", 1}} {
		g := c.gates * hidden
		vals := func(n int64, seed float32) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(math.Sin(float64(seed) + float64(i)*0.7))
			}
			return v
		}
		run := func(direction string, lens []int64, x []float32, steps int64) []*interp.Tensor {
			names := []string{"x", "w", "r", "", ""}
			inits := [][]byte{encTensorF32("w", []int64{1, g, in}, vals(g*in, 1)), encTensorF32("r", []int64{1, g, hidden}, vals(g*hidden, 2))}
			inputs := [][]byte{encValueInfo("x", 1, []int64{steps, batch, in}), encValueInfo("w", 1, []int64{1, g, in}), encValueInfo("r", 1, []int64{1, g, hidden})}
			if lens != nil {
				names[4] = "l"
				inits = append(inits, encTensorI64("l", []int64{batch}, lens))
				inputs = append(inputs, encValueInfo("l", 7, []int64{batch}))
			} else {
				names = names[:3]
			}
			data := encModel(tGraph{
				nodes:   []tNode{{op: c.op, name: "/r", inputs: names, outputs: []string{"y", "h"}, ints: map[string][]int64{"hidden_size": {hidden}}, strs: map[string]string{"direction": direction}}},
				inits:   inits,
				inputs:  inputs,
				outputs: [][]byte{encValueInfo("y", 1, []int64{steps, 1, batch, hidden}), encValueInfo("h", 1, []int64{1, batch, hidden})},
			})
			m, err := Import(data, Options{Name: "m.onnx"})
			require.NoError(t, err, c.op)
			f := m.Funcs[0]
			var args []*interp.Tensor
			for _, a := range f.Args {
				if a.Arg.Init != nil {
					args = append(args, interp.FromDense(a.Arg.Init))
				} else {
					xs := make([]float64, len(x))
					for i, v := range x {
						xs[i] = float64(v)
					}
					args = append(args, interp.FromFloats(a.Type, xs))
				}
			}
			res, err := interp.Run(f, args, interp.Options{})
			require.NoError(t, err, c.op)
			return res
		}
		x := vals(seq*batch*in, 3)
		full := run("forward", nil, x, seq)
		cut := run("forward", []int64{3, 1}, x, seq)
		for tt := 0; tt < seq; tt++ {
			for j := 0; j < hidden; j++ {
				require.InDelta(t, full[0].F[(tt*batch+0)*hidden+j], cut[0].F[(tt*batch+0)*hidden+j], 1e-6, "%s: element 0 runs whole", c.op)
				if tt > 0 {
					require.Zero(t, cut[0].F[(tt*batch+1)*hidden+j], "%s: element 1 outputs zero after its length", c.op)
				}
			}
		}
		for j := 0; j < hidden; j++ {
			require.InDelta(t, cut[0].F[1*hidden+j], cut[1].F[1*hidden+j], 1e-6, "%s: element 1's final state is its first step's", c.op)
		}
		rev := run("reverse", []int64{3, 1}, x, seq)
		one := run("forward", nil, x[:batch*in], 1)
		for j := 0; j < hidden; j++ {
			require.InDelta(t, one[1].F[1*hidden+j], rev[1].F[1*hidden+j], 1e-6, "%s reversed: element 1 runs step 0 alone", c.op)
			require.InDelta(t, one[0].F[1*hidden+j], rev[0].F[1*hidden+j], 1e-6, "%s reversed: element 1's output at step 0", c.op)
		}
	}
}

// TestOperatorsMatchPyTorch runs the single-operator references that
// scripts/export_ops.py exported (testdata/ops/NAME) and compares the
// output and the gradients of sum(output), with respect to the input and
// every parameter, with PyTorch's (autodiff allowed the approximations
// NAME/allow lists, as PyTorch's gradients make them). Error model: f32 sums of at most a
// few hundred products, each relative error at most K·2⁻²⁴ with K ≤ 512
// (3e-5), bounded here by 1e-4 relative to the largest element.
func TestOperatorsMatchPyTorch(t *testing.T) {
	dirs, _ := filepath.Glob("../testdata/ops/*/model.onnx")
	require.NotEmpty(t, dirs, "the operator references are committed under testdata/ops")
	for _, path := range dirs {
		dir := filepath.Dir(path)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m, err := ImportFile(path, Options{})
			require.NoError(t, err)
			f := m.Funcs[0]
			x := loadNpy(t, filepath.Join(dir, "input.npy"))
			args := make([]*interp.Tensor, len(f.Args))
			for i, a := range f.Args {
				if a.Arg.Kind == ir.ArgData {
					// The input becomes a parameter, so that autodiff
					// gives its gradient too.
					a.Arg.Kind, a.Arg.Init, a.Name = ir.ArgParam, &ir.Dense{Type: x.Type, Floats: x.F}, "input"
				}
				args[i] = interp.FromDense(a.Arg.Init)
			}
			out, err := interp.Run(f, args, interp.Options{})
			require.NoError(t, err)
			require.LessOrEqual(t, passtest.RelErr(out[0], loadNpy(t, filepath.Join(dir, "output.npy"))), 1e-4, "output")
			// The approximations the reference's gradients make (allow:
			// one name a line), which autodiff must be allowed to make.
			var allow []string
			if b, err := os.ReadFile(filepath.Join(dir, "allow")); err == nil {
				allow = strings.Fields(string(b))
			}
			pipe, err := passes.ParsePipeline("autodiff", nil)
			require.NoError(t, err)
			require.NoError(t, (&passes.Manager{Inst: passes.Instrumentation{VerifyEach: true}, Allow: allow}).Run(m, pipe))
			res, err := interp.Run(f, args, interp.Options{})
			require.NoError(t, err)
			require.Greater(t, len(f.Results), 1, "the gradient of the input")
			for i := 1; i < len(f.Results); i++ {
				name := f.ResultName(i)
				require.LessOrEqual(t, passtest.RelErr(res[i], loadNpy(t, filepath.Join(dir, name+".npy"))), 1e-4, name)
			}
		})
	}
}

// TestFakeQuantGradientWithoutSTE: without --allow ste, the gradient
// through a fake quantiser is round's derivative, 0: the first layer
// before it and the quantised weight get none, the autodiff pass says so
// in a note and makes no approximation; with it, it records the
// approximation for each round.
func TestFakeQuantGradientWithoutSTE(t *testing.T) {
	dir := "../testdata/ops/fake_quant"
	for _, allow := range [][]string{nil, {"ste"}} {
		m, err := ImportFile(filepath.Join(dir, "model.onnx"), Options{})
		require.NoError(t, err)
		f := m.Funcs[0]
		args := make([]*interp.Tensor, len(f.Args))
		for i, a := range f.Args {
			if a.Arg.Kind == ir.ArgData {
				args[i] = loadNpy(t, filepath.Join(dir, "input.npy"))
			} else {
				args[i] = interp.FromDense(a.Arg.Init)
			}
		}
		pipe, err := passes.ParsePipeline("autodiff", nil)
		require.NoError(t, err)
		mg := &passes.Manager{Allow: allow}
		require.NoError(t, mg.Run(m, pipe))
		res, err := interp.Run(f, args, interp.Options{})
		require.NoError(t, err)
		run := mg.Runs[0]
		nonzero := map[string]bool{}
		for i := 1; i < len(f.Results); i++ {
			for j := 0; j < res[i].Len(); j++ {
				if res[i].At(j) != 0 {
					nonzero[f.ResultName(i)] = true
				}
			}
		}
		if allow == nil {
			require.False(t, nonzero["grad.a.weight"], "no gradient passes round")
			require.False(t, nonzero["grad.b.weight"], "no gradient passes round")
			require.True(t, nonzero["grad.b.bias"])
			require.Empty(t, run.Approximations)
			require.Len(t, run.Notes, 1)
			require.Contains(t, run.Notes[0], "2 fake-quantisation round(s) is 0")
		} else {
			require.True(t, nonzero["grad.a.weight"] && nonzero["grad.b.weight"])
			require.Equal(t, []passes.Approximation{{Name: "ste", What: "the gradient passes straight through 2 fake-quantisation round(s)"}}, run.Approximations)
		}
	}
}

// TestBF16ValueGivenAsBits: a bf16 graph input that a node needs at
// import (Pad's constant value) may be given as its uint16 bits, as a
// .npy file holds bf16 (numpy has none); it is read as bf16, not
// refused as a uint16.
func TestBF16ValueGivenAsBits(t *testing.T) {
	data := encModel(tGraph{
		nodes:   []tNode{{op: "Pad", name: "/p", inputs: []string{"x", "pads", "v"}, outputs: []string{"y"}}},
		inits:   [][]byte{encTensorI64("pads", []int64{2}, []int64{1, 0})},
		inputs:  [][]byte{encValueInfo("x", 16, []int64{2}), encValueInfo("pads", 7, []int64{2}), encValueInfo("v", 16, []int64{})},
		outputs: [][]byte{encValueInfo("y", 16, []int64{3})},
		opset:   13,
	})
	bits := interp.FromInts(ir.TensorOf(ir.U16), []int64{int64(ir.BFloat16Bits(2.5))})
	m, err := Import(data, Options{Name: "m.onnx", Value: func(name string) (*interp.Tensor, error) {
		if name == "v" {
			return bits, nil
		}
		return nil, nil
	}})
	require.NoError(t, err)
	res, err := interp.Run(m.Funcs[0], []*interp.Tensor{interp.FromFloats(ir.TensorOf(ir.BF16, 2), []float64{1, -1})}, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, []float64{2.5, 1, -1}, res[0].F)
}

// TestHostileOperatorAttributes: attributes and shapes a review found
// crashing or hanging the new converters are errors naming the node.
func TestHostileOperatorAttributes(t *testing.T) {
	tfidf := func(maxN int64, indexes []int64) []byte {
		return encModel(tGraph{
			nodes: []tNode{{op: "TfIdfVectorizer", name: "/v", inputs: []string{"x"}, outputs: []string{"y"}, strs: map[string]string{"mode": "TF"},
				ints: map[string][]int64{"min_gram_length": {1}, "max_gram_length": {maxN}, "max_skip_count": {0},
					"ngram_counts": {0}, "ngram_indexes": indexes, "pool_int64s": {1, 2}}}},
			inputs:  [][]byte{encValueInfo("x", 7, []int64{4})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{2})},
		})
	}
	for _, c := range []struct {
		name, want string
		model      []byte
	}{
		{"tfidf wide", "ngram_indexes holds 1125899906842624", tfidf(1, []int64{0, 1 << 50})},
		{"tfidf wrap", "ngram_indexes holds 9223372036854775807", tfidf(1, []int64{0, math.MaxInt64})},
		{"scatter shape", "do not fit data", encModel(tGraph{
			nodes:   []tNode{{op: "ScatterElements", name: "/s", inputs: []string{"x", "i", "u"}, outputs: []string{"y"}, ints: map[string][]int64{"axis": {1}}}},
			inits:   [][]byte{encTensorI64("i", []int64{3, 1}, []int64{0, 1, 0})},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{2, 2}), encValueInfo("i", 7, []int64{3, 1}), encValueInfo("u", 1, []int64{3, 1})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{2, 2})},
		})},
		{"roialign scalar rois", "must be [R, 4] floats", encModel(tGraph{
			nodes:   []tNode{{op: "RoiAlign", name: "/r", inputs: []string{"x", "rois", "b"}, outputs: []string{"y"}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 4, 4}), encValueInfo("rois", 1, []int64{}), encValueInfo("b", 7, []int64{1})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 1, 1})},
			opset:   16,
		})},
		{"roialign samples", "beyond the limit", encModel(tGraph{
			nodes:   []tNode{{op: "RoiAlign", name: "/r", inputs: []string{"x", "rois", "b"}, outputs: []string{"y"}, ints: map[string][]int64{"sampling_ratio": {1 << 50}}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 4, 4}), encValueInfo("rois", 1, []int64{1, 4}), encValueInfo("b", 7, []int64{1})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 1, 1})},
			opset:   16,
		})},
		{"mel overflow", "beyond the fold limit", encModel(tGraph{
			nodes:   []tNode{{op: "MelWeightMatrix", name: "/m", inputs: []string{"n", "d", "s", "lo", "hi"}, outputs: []string{"y"}}},
			inits:   [][]byte{encTensorI64("n", nil, []int64{1 << 61}), encTensorI64("d", nil, []int64{6}), encTensorI64("s", nil, []int64{8000})},
			inputs:  [][]byte{encValueInfo("n", 7, nil), encValueInfo("d", 7, nil), encValueInfo("s", 7, nil), encValueInfo("lo", 1, nil), encValueInfo("hi", 1, nil)},
			outputs: [][]byte{encValueInfo("y", 1, []int64{4, 1 << 61})},
			opset:   17,
		})},
		{"averagepool indices", "AveragePool has one output", encModel(tGraph{
			nodes:   []tNode{{op: "AveragePool", name: "/p", inputs: []string{"x"}, outputs: []string{"y", "i"}, ints: map[string][]int64{"kernel_shape": {2, 2}}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 2, 2})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 1, 1}), encValueInfo("i", 7, []int64{1, 1, 1, 1})},
		})},
	} {
		edges := map[string]*interp.Tensor{"lo": interp.FromFloats(ir.TensorOf(ir.F32), []float64{0}), "hi": interp.FromFloats(ir.TensorOf(ir.F32), []float64{4000})}
		_, err := Import(c.model, Options{Name: "m.onnx", Value: valuesOf(edges)})
		require.Error(t, err, c.name)
		require.Contains(t, err.Error(), c.want, c.name)
		require.Contains(t, err.Error(), `node "/`, c.name)
	}
	// max_gram_length far beyond the pool's lengths ends at them.
	_, err := Import(tfidf(math.MaxInt64, []int64{0, 1}), Options{Name: "m.onnx"})
	require.NoError(t, err)
}

// TestReviewedOperatorValues: a zero-extent roi with sampling_ratio 0
// takes no sample (0, as ONNX's reference); ScatterElements adds into
// int64 data; u64 reduce_mean divides unsigned.
func TestReviewedOperatorValues(t *testing.T) {
	roi := encModel(tGraph{
		nodes: []tNode{{op: "RoiAlign", name: "/r", inputs: []string{"x", "rois", "b"}, outputs: []string{"y"}, strs: map[string]string{"mode": "max"}}},
		inits: [][]byte{encTensorI64("b", []int64{1}, []int64{0})},
		// The rois are a graph input whose value is given at import.
		inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 4, 4}), encValueInfo("rois", 1, []int64{1, 4}), encValueInfo("b", 7, []int64{1})},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 1, 1})},
		opset:   16,
	})
	rois := interp.FromFloats(ir.TensorOf(ir.F32, 1, 4), []float64{1, 1, 1, 1})
	m, err := Import(roi, Options{Name: "m.onnx", DataInputs: []string{"x"}, Value: func(name string) (*interp.Tensor, error) {
		if name == "rois" {
			return rois, nil
		}
		return nil, nil
	}})
	require.NoError(t, err)
	x := make([]float64, 16)
	for i := range x {
		x[i] = float64(i + 1)
	}
	f := m.Funcs[0]
	var args []*interp.Tensor
	for _, a := range f.Args {
		if a.Arg.Init != nil {
			args = append(args, interp.FromDense(a.Arg.Init))
		} else {
			args = append(args, interp.FromFloats(a.Type, x))
		}
	}
	res, err := interp.Run(f, args, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, []float64{0}, res[0].F, "a zero-extent roi takes no sample")

	scatter := encModel(tGraph{
		nodes:   []tNode{{op: "ScatterElements", name: "/s", inputs: []string{"x", "i", "u"}, outputs: []string{"y"}, strs: map[string]string{"reduction": "add"}}},
		inits:   [][]byte{encTensorI64("i", []int64{3}, []int64{0, 0, 2})},
		inputs:  [][]byte{encValueInfo("x", 7, []int64{3}), encValueInfo("i", 7, []int64{3}), encValueInfo("u", 7, []int64{3})},
		outputs: [][]byte{encValueInfo("y", 7, []int64{3})},
		opset:   16,
	})
	m, err = Import(scatter, Options{Name: "m.onnx"})
	require.NoError(t, err)
	f = m.Funcs[0]
	vals := map[string][]int64{"x": {1, 2, 3}, "u": {10, 20, -30}}
	args = nil
	for _, a := range f.Args {
		if a.Arg.Init != nil {
			args = append(args, interp.FromDense(a.Arg.Init))
		} else {
			args = append(args, interp.FromInts(a.Type, vals[a.Name]))
		}
	}
	res, err = interp.Run(f, args, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, []int64{31, 2, -27}, res[0].I)

	mean, err := parser.Parse("m.kir", `func @f(%x: u64[2]) -> (u64[]) {
  %m = reduce_mean(%x) {axes = [0]} : u64[]
  return %m
}
`)
	require.NoError(t, err)
	res, err = interp.Run(mean.Funcs[0], []*interp.Tensor{interp.FromInts(ir.TensorOf(ir.U64, 2), []int64{math.MinInt64, 2})}, interp.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(1<<62+1), res[0].I[0], "(2^63 + 2) / 2 unsigned")
}

// TestCropAndResizeWithScales: tf_crop_and_resize with scales takes the
// resized length as the input's times the scale, unrounded (ONNX's
// reference): from 5 elements, scale 1.5 and roi [0.2, 0.8], output 1
// reads source 0.8 + 0.6·4/6.5 of the ramp 0, 1, ..., 4 (linear), and a
// source outside the input gives extrapolation_value.
func TestCropAndResizeWithScales(t *testing.T) {
	for _, c := range []struct {
		roi  []float32
		want []float64
	}{
		{[]float32{0, 0, 0, 0.2, 1, 1, 1, 0.8}, []float64{0.8, 0.8 + 0.6*4/6.5, 0.8 + 2*0.6*4/6.5}},
		{[]float32{0, 0, 0, -0.5, 1, 1, 1, 0.5}, []float64{-7, -7, -7}},
	} {
		data := encModel(tGraph{
			nodes: []tNode{{op: "Resize", name: "/r", inputs: []string{"x", "roi", "scales"}, outputs: []string{"y"},
				strs:   map[string]string{"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"},
				floats: map[string]float32{"extrapolation_value": -7}}},
			inputs:  [][]byte{encValueInfo("x", 1, []int64{1, 1, 1, 5}), encValueInfo("roi", 1, []int64{8}), encValueInfo("scales", 1, []int64{4})},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 1, 1, 7})},
			opset:   13,
		})
		roi := make([]float64, 8)
		for i, v := range c.roi {
			roi[i] = float64(v)
		}
		scales := interp.FromFloats(ir.TensorOf(ir.F32, 4), []float64{1, 1, 1, 1.5})
		m, err := Import(data, Options{Name: "m.onnx", Value: valuesOf(map[string]*interp.Tensor{
			"roi": interp.FromFloats(ir.TensorOf(ir.F32, 8), roi), "scales": scales})})
		require.NoError(t, err)
		f := m.Funcs[0]
		var args []*interp.Tensor
		for _, a := range f.Args {
			args = append(args, interp.FromFloats(a.Type, []float64{0, 1, 2, 3, 4}))
		}
		res, err := interp.Run(f, args, interp.Options{})
		require.NoError(t, err)
		for i, w := range c.want {
			require.InDelta(t, w, res[0].F[i], 1e-6, "roi %v, output %d", c.roi, i)
		}
	}
}
