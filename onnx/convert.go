package onnx

import (
	"math"
	"math/big"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// converter turns one ONNX node into Kiln ops (or import-time constants)
// and returns an entry for each of the node's outputs.
type converter func(im *importer, n *node, in []entry) ([]entry, error)

var converters = map[string]converter{}

// many is an arity without an upper bound.
const many = 1 << 30

// arity is each ONNX operator's input count [min, max] from the operator
// specification; the first min inputs are required (not empty). A node
// outside it is an error that names the node.
var arity = map[string][2]int{
	"MatMul": {2, 2}, "GlobalAveragePool": {1, 1}, "Max": {1, many}, "Min": {1, many}, "Sum": {1, many},
	"Identity": {1, 1}, "Softmax": {1, 1}, "LogSoftmax": {1, 1}, "Conv": {2, 3}, "BatchNormalization": {5, 5},
	"Gemm": {2, 3}, "MaxPool": {1, 1}, "AveragePool": {1, 1}, "LayerNormalization": {2, 3}, "Dropout": {1, 3},
	"SoftmaxCrossEntropyLoss": {2, 3}, "NegativeLogLikelihoodLoss": {2, 3}, "Reshape": {2, 2}, "Transpose": {1, 1}, "Flatten": {1, 1}, "Concat": {1, many},
	"Split": {1, 2}, "Slice": {3, 5}, "Gather": {2, 2}, "Squeeze": {1, 2}, "Unsqueeze": {1, 2}, "Expand": {2, 2},
	"Pad": {1, 4}, "ReduceSum": {1, 2}, "ReduceMean": {1, 2}, "ReduceMax": {1, 2}, "Cast": {1, 1}, "Constant": {0, 0},
	"ConstantOfShape": {1, 1}, "Shape": {1, 1}, "Size": {1, 1}, "Range": {3, 3},
	"PRelu": {2, 2}, "Clip": {1, 3}, "Shrink": {1, 1}, "Tile": {2, 2}, "InstanceNormalization": {3, 3},
	"ReduceMin": {1, 2}, "ReduceL1": {1, 2}, "ReduceL2": {1, 2}, "ReduceSumSquare": {1, 2}, "ReduceLogSum": {1, 2},
	"ReduceLogSumExp": {1, 2}, "ConvTranspose": {2, 3},
}

// legacyArity is the input count of operators whose inputs were
// attributes before an opset.
var legacyArity = map[string]struct {
	before int64
	arity  [2]int
}{
	"Slice": {10, [2]int{1, 1}}, "Pad": {11, [2]int{1, 1}}, "Clip": {11, [2]int{1, 1}},
	"Squeeze": {13, [2]int{1, 1}}, "Unsqueeze": {13, [2]int{1, 1}}, "Split": {13, [2]int{1, 1}},
	"Dropout": {12, [2]int{1, 1}},
}

// simple maps ONNX ops to Kiln ops with the same operands and no attributes.
var simple = map[string]string{"MatMul": "matmul", "GlobalAveragePool": "global_avg_pool"}

func init() {
	for onnxName, kind := range simple {
		converters[onnxName] = func(im *importer, n *node, in []entry) ([]entry, error) {
			return im.emit(kind, in, nil)
		}
	}
	// Ops whose record names their ONNX operator: same operands, and each
	// declared attribute read from the ONNX attribute of the same name.
	for _, kind := range ir.OpNames() {
		d := ir.Lookup(kind)
		if d.ONNX == "" {
			continue
		}
		arity[d.ONNX] = [2]int{d.MinOperands, d.MaxOperands}
		converters[d.ONNX] = func(im *importer, n *node, in []entry) ([]entry, error) {
			if d.ONNX == "Pow" && in[0].typ().DType != in[1].typ().DType {
				return im.powMixed(in)
			}
			attrs := ir.Attrs{}
			for _, spec := range d.Attrs {
				a := attr(n, spec.Name)
				if a == nil {
					continue
				}
				switch spec.Kind {
				case ir.AttrFloat:
					attrs[spec.Name] = ir.FloatAttr(f32(float64(a.F)))
				case ir.AttrInt:
					attrs[spec.Name] = ir.IntAttr(a.I)
				case ir.AttrBool:
					attrs[spec.Name] = ir.BoolAttr(a.I != 0)
				case ir.AttrString:
					attrs[spec.Name] = ir.StringAttr(string(a.S))
				case ir.AttrList:
					attrs[spec.Name] = ir.IntsAttr(a.Ints...)
				default:
					return nil, im.errorf("attribute %s of %s cannot be imported", spec.Name, n.OpType)
				}
			}
			if im.opset < 7 && attrInt(n, "broadcast", 0) == 1 {
				b, err := im.legacyBroadcast(n, in[0], in[1])
				if err != nil {
					return nil, err
				}
				in = []entry{in[0], b}
			}
			return im.emit(kind, in, attrs)
		}
	}
	for onnxName, kind := range map[string]string{"Max": "max", "Min": "min", "Sum": "add"} {
		converters[onnxName] = func(im *importer, n *node, in []entry) ([]entry, error) {
			acc := []entry{in[0]}
			for _, e := range in[1:] {
				var err error
				if acc, err = im.emit(kind, []entry{acc[0], e}, nil); err != nil {
					return nil, err
				}
			}
			return acc, nil
		}
	}
	converters["Identity"] = func(im *importer, n *node, in []entry) ([]entry, error) { return in, nil }
	for onnxName, kind := range map[string]string{"Softmax": "softmax", "LogSoftmax": "log_softmax"} {
		converters[onnxName] = func(im *importer, n *node, in []entry) ([]entry, error) {
			if im.opset >= 13 {
				return im.emit(kind, in, ir.Attrs{"axis": ir.IntAttr(attrInt(n, "axis", -1))})
			}
			// Before opset 13 the input is coerced to 2-D at axis (default
			// 1) and normalised over the second dimension.
			s := in[0].typ().Shape
			ax, err := ir.NormalizeAxis(attrInt(n, "axis", 1), len(s))
			if err != nil {
				return nil, im.errorf("%v", err)
			}
			x, err := im.reshapeTo(in[0], coerced2D(s, ax))
			if err != nil {
				return nil, err
			}
			if x, err = im.one(kind, ir.Attrs{"axis": ir.IntAttr(1)}, x); err != nil {
				return nil, err
			}
			x, err = im.reshapeTo(x, s)
			return []entry{x}, err
		}
	}
	converters["BatchNormalization"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		eps := ir.FloatAttr(f32(attrFloat(n, "epsilon", 1e-5)))
		// Training mode: the training_mode attribute from opset 14; before
		// it, the running statistics as outputs (opsets 7-13), or
		// is_test=0 (opset 6).
		training := attrInt(n, "training_mode", 0) == 1
		if im.opset < 14 {
			training = len(n.Outputs) > 1 && n.Outputs[1] != ""
		}
		if im.opset < 7 {
			training = attrInt(n, "is_test", 0) == 0
		}
		if training && im.opt.Eval {
			// The running statistics as they are (the outputs a training
			// graph gives their new values).
			y, err := im.emit("batch_norm_infer", in, ir.Attrs{"epsilon": eps})
			if err != nil {
				return nil, err
			}
			return append(y, in[3], in[4]), nil
		}
		if training {
			a := ir.Attrs{"epsilon": eps, "momentum": ir.FloatAttr(f32(attrFloat(n, "momentum", 0.9)))}
			if !im.unbiased {
				a["unbiased"] = ir.BoolAttr(false)
			}
			return im.emit("batch_norm_train", in, a)
		}
		return im.emit("batch_norm_infer", in, ir.Attrs{"epsilon": eps})
	}
	converters["Gemm"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		a := ir.Attrs{}
		if v := attrFloat(n, "alpha", 1); v != 1 {
			a["alpha"] = ir.FloatAttr(f32(v))
		}
		if v := attrFloat(n, "beta", 1); v != 1 {
			a["beta"] = ir.FloatAttr(f32(v))
		}
		if attrInt(n, "transA", 0) == 1 {
			a["trans_a"] = ir.BoolAttr(true)
		}
		if attrInt(n, "transB", 0) == 1 {
			a["trans_b"] = ir.BoolAttr(true)
		}
		return im.emit("gemm", present(in), a)
	}
	converters["LayerNormalization"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.emit("layer_norm", present(in), ir.Attrs{"axis": ir.IntAttr(attrInt(n, "axis", -1)), "epsilon": ir.FloatAttr(f32(attrFloat(n, "epsilon", 1e-5)))})
	}
	converters["Dropout"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		ratio, err := im.constFloat(in, 1, 0.5, "the dropout ratio")
		if err != nil {
			return nil, err
		}
		training, err := im.constFloat(in, 2, 0, "training_mode")
		if err != nil {
			return nil, err
		}
		if im.opt.Eval {
			training = 0
		}
		if training == 0 || ratio == 0 {
			// The mask keeps every element: a splat, never a tensor of the
			// input's size (which may be far larger than memory).
			mt := ir.Type{DType: ir.Bool, Shape: in[0].typ().Shape}
			if len(n.Outputs) < 2 || n.Outputs[1] == "" {
				return []entry{in[0]}, nil
			}
			if mt.NumElements() <= foldLimit {
				mask := interp.New(mt)
				for i := range mask.I {
					mask.I[i] = 1
				}
				return []entry{in[0], {k: mask}}, nil
			}
			op, err := im.f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: mt, Ints: []int64{1}})}, im.loc(), n.Outputs[1])
			if err != nil {
				return nil, err
			}
			im.f.Body = append(im.f.Body, op)
			return []entry{in[0], {v: op.Results[0]}}, nil
		}
		im.seeds++
		seed := attrInt(n, "seed", im.seeds)
		return im.emit("dropout", in[:1], ir.Attrs{"ratio": ir.FloatAttr(f32(ratio)), "seed": ir.IntAttr(seed)})
	}
	// SoftmaxCrossEntropyLoss without its options is Kiln's fused op;
	// with any (ignore_index, which PyTorch always writes, class weights,
	// reduction none, the log_prob output) it is log_softmax followed by
	// NegativeLogLikelihoodLoss, written out as ops (nllLoss).
	converters["SoftmaxCrossEntropyLoss"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		r := attrString(n, "reduction", "mean")
		if r != "mean" && r != "sum" && r != "none" {
			return nil, im.errorf("reduction=%s is not one of mean, sum, none", r)
		}
		weighted := len(in) > 2 && !in[2].missing()
		if !weighted && attr(n, "ignore_index") == nil && r != "none" && (len(n.Outputs) < 2 || n.Outputs[1] == "") {
			return im.emit("softmax_cross_entropy", in[:2], ir.Attrs{"reduction": ir.StringAttr(r)})
		}
		if in[0].typ().Rank() < 2 {
			return nil, im.errorf("scores %s need a batch and a class dimension", in[0].typ())
		}
		logp, err := im.one("log_softmax", ir.Attrs{"axis": ir.IntAttr(1)}, in[0])
		if err != nil {
			return nil, err
		}
		loss, err := im.nllLoss(n, append([]entry{logp}, in[1:]...), r)
		if err != nil {
			return nil, err
		}
		return []entry{loss, logp}, nil
	}
	converters["NegativeLogLikelihoodLoss"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		r := attrString(n, "reduction", "mean")
		if r != "mean" && r != "sum" && r != "none" {
			return nil, im.errorf("reduction=%s is not one of mean, sum, none", r)
		}
		loss, err := im.nllLoss(n, in, r)
		if err != nil {
			return nil, err
		}
		return []entry{loss}, nil
	}

	// Shape ops.
	converters["Reshape"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		shape, err := im.constInts(in, 1, "the target shape")
		if err != nil {
			return nil, err
		}
		src := in[0].typ().Shape
		total := in[0].typ().NumElements()
		known, infer := int64(1), -1
		for i, d := range shape {
			switch {
			case d == 0 && attrInt(n, "allowzero", 0) == 0:
				if i >= len(src) {
					return nil, im.errorf("shape entry 0 at %d has no input dimension to copy", i)
				}
				shape[i] = src[i]
			case d == -1:
				if infer >= 0 {
					return nil, im.errorf("more than one -1 in shape %v", shape)
				}
				infer = i
				continue
			case d < 0:
				return nil, im.errorf("invalid shape entry %d", d)
			}
			known *= shape[i]
		}
		if infer >= 0 {
			if known == 0 || total%known != 0 {
				return nil, im.errorf("cannot infer -1 in %v for %d elements", shape, total)
			}
			shape[infer] = total / known
		}
		return im.emit("reshape", in[:1], ir.Attrs{"shape": ir.IntsAttr(shape...)})
	}
	converters["Transpose"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		perm := attrInts(n, "perm")
		if perm == nil {
			r := in[0].typ().Rank()
			for i := r - 1; i >= 0; i-- {
				perm = append(perm, int64(i))
			}
		}
		return im.emit("transpose", in, ir.Attrs{"perm": ir.IntsAttr(perm...)})
	}
	converters["Flatten"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.emit("flatten", in, ir.Attrs{"axis": ir.IntAttr(attrInt(n, "axis", 1))})
	}
	converters["Concat"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.emit("concat", present(in), ir.Attrs{"axis": ir.IntAttr(attrInt(n, "axis", 0))})
	}
	converters["Split"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		axis := attrInt(n, "axis", 0)
		sizes, err := im.constInts(in, 1, "the split sizes")
		if err != nil {
			return nil, err
		}
		if sizes == nil {
			sizes = attrInts(n, "split")
		}
		if sizes == nil {
			ax, err := ir.NormalizeAxis(axis, in[0].typ().Rank())
			if err != nil {
				return nil, im.errorf("%v", err)
			}
			parts := int64(len(n.Outputs))
			d := in[0].typ().Shape[ax]
			each := (d + parts - 1) / parts
			for rest := d; rest > 0; rest -= each {
				sizes = append(sizes, min(each, rest))
			}
		}
		return im.emit("split", in[:1], ir.Attrs{"axis": ir.IntAttr(axis), "sizes": ir.IntsAttr(sizes...)})
	}
	converters["Slice"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		a := ir.Attrs{}
		if im.opset < 10 {
			for _, name := range []string{"starts", "ends", "axes"} {
				if v := attrInts(n, name); v != nil {
					a[name] = ir.IntsAttr(v...)
				}
			}
			return im.emit("slice", in, a)
		}
		for i, name := range []string{"starts", "ends", "axes", "steps"} {
			v, err := im.constInts(in, i+1, name)
			if err != nil {
				return nil, err
			}
			if v != nil {
				a[name] = ir.IntsAttr(v...)
			}
		}
		return im.emit("slice", in[:1], a)
	}
	converters["Gather"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.emit("gather", in, ir.Attrs{"axis": ir.IntAttr(attrInt(n, "axis", 0))})
	}
	converters["Squeeze"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		axes, err := im.constInts(in, 1, "the axes")
		if err != nil {
			return nil, err
		}
		if im.opset < 13 {
			axes = attrInts(n, "axes")
		}
		a := ir.Attrs{}
		if axes != nil {
			a["axes"] = ir.IntsAttr(axes...)
		}
		return im.emit("squeeze", in[:1], a)
	}
	converters["Unsqueeze"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		axes, err := im.constInts(in, 1, "the axes")
		if err != nil {
			return nil, err
		}
		if im.opset < 13 {
			axes = attrInts(n, "axes")
		}
		return im.emit("unsqueeze", in[:1], ir.Attrs{"axes": ir.IntsAttr(axes...)})
	}
	converters["Expand"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		shape, err := im.constInts(in, 1, "the shape")
		if err != nil {
			return nil, err
		}
		return im.emit("expand", in[:1], ir.Attrs{"shape": ir.IntsAttr(shape...)})
	}
	for onnxName, kind := range map[string]string{"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min"} {
		converters[onnxName] = func(im *importer, n *node, in []entry) ([]entry, error) {
			return im.reduce(n, kind, in, attrInt(n, "keepdims", 1) == 1)
		}
	}
	converters["Cast"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		to, ok := dtypeOf(attrInt(n, "to", 0))
		if !ok {
			return nil, im.errorf("cast to %s: %s", onnxTypeName(attrInt(n, "to", 0)), unreadableType(attrInt(n, "to", 0)))
		}
		a := ir.Attrs{"to": ir.TypeAttr(to)}
		if im.opset >= 19 && attrInt(n, "saturate", 1) == 0 && (to == ir.F8E4M3 || to == ir.F8E5M2) {
			a["saturate"] = ir.BoolAttr(false)
		}
		return im.emit("cast", in, a)
	}

	// Constants and shape arithmetic, evaluated at import.
	converters["Constant"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		a := n.Attrs
		if len(a) != 1 {
			return nil, im.errorf("a Constant needs exactly one value attribute")
		}
		var k *interp.Tensor
		switch a[0].Name {
		case "value":
			if a[0].T == nil {
				return nil, im.errorf("value is not a tensor")
			}
			var err error
			if k, err = im.decodeTensor(a[0].T); err != nil {
				return nil, im.errorf("%v", err)
			}
		case "value_float":
			k = interp.FromFloats(ir.TensorOf(ir.F32), []float64{float64(a[0].F)})
		case "value_floats":
			vals := make([]float64, len(a[0].Floats))
			for i, v := range a[0].Floats {
				vals[i] = float64(v)
			}
			k = interp.FromFloats(ir.TensorOf(ir.F32, int64(len(vals))), vals)
		case "value_int":
			k = interp.FromInts(ir.TensorOf(ir.I64), []int64{a[0].I})
		case "value_ints":
			k = interp.FromInts(ir.TensorOf(ir.I64, int64(len(a[0].Ints))), a[0].Ints)
		default:
			return nil, im.errorf("constant attribute %q is not supported", a[0].Name)
		}
		return []entry{{k: k}}, nil
	}
	converters["ConstantOfShape"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		shape, err := im.constInts(in, 0, "the shape")
		if err != nil {
			return nil, err
		}
		val := interp.FromFloats(ir.TensorOf(ir.F32, 1), []float64{0})
		if a := attr(n, "value"); a != nil && a.T != nil {
			if val, err = im.decodeTensor(a.T); err != nil {
				return nil, im.errorf("%v", err)
			}
		}
		t := ir.Type{DType: val.Type.DType, Shape: ir.Shape(shape)}
		if n, ok := t.Shape.NumElements(); !ok || n > foldLimit {
			return nil, im.errorf("ConstantOfShape of shape %v is too large to fold at import", shape)
		}
		k := interp.New(t)
		for i := range k.F {
			k.F[i] = val.F[0]
		}
		for i := range k.I {
			k.I[i] = val.I[0]
		}
		return []entry{{k: k}}, nil
	}
	converters["Shape"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		s := in[0].typ().Shape
		r := int64(len(s))
		start, end := attrInt(n, "start", 0), attrInt(n, "end", r)
		if start < 0 {
			start += r
		}
		if end < 0 {
			end += r
		}
		start, end = max(0, min(start, r)), max(0, min(end, r))
		dims := append([]int64{}, s[start:max(start, end)]...)
		return []entry{{k: interp.FromInts(ir.TensorOf(ir.I64, int64(len(dims))), dims)}}, nil
	}
	converters["Size"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return []entry{{k: interp.FromInts(ir.TensorOf(ir.I64), []int64{in[0].typ().NumElements()})}}, nil
	}
	converters["Range"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		for i := 0; i < 3; i++ {
			if in[i].k == nil {
				return nil, im.needConstant(in[i], "Range's start, limit and delta")
			}
			if in[i].k.Len() != 1 {
				return nil, im.errorf("Range needs scalar start, limit and delta")
			}
		}
		t := ir.Type{DType: in[0].k.Type.DType, Shape: ir.Shape{0}}
		if !t.DType.IsFloat() {
			// Integers exactly: ceil((limit - start) / delta) elements.
			start, limit, delta := in[0].k.I[0], in[1].k.I[0], in[2].k.I[0]
			if delta == 0 {
				return nil, im.errorf("Range delta is 0")
			}
			count := int64(0)
			if span := new(big.Int).Sub(big.NewInt(limit), big.NewInt(start)); span.Sign() == big.NewInt(delta).Sign() && span.Sign() != 0 {
				q, r := new(big.Int).QuoRem(span, big.NewInt(delta), new(big.Int))
				if r.Sign() != 0 {
					q.Add(q, big.NewInt(1))
				}
				if !q.IsInt64() || q.Int64() > foldLimit {
					return nil, im.errorf("Range of %s elements is too large to fold", q)
				}
				count = q.Int64()
			}
			vals := make([]int64, count)
			for i := range vals {
				vals[i] = start + int64(i)*delta
			}
			t.Shape[0] = count
			return []entry{{k: interp.FromInts(t, vals)}}, nil
		}
		start, limit, delta := in[0].k.At(0), in[1].k.At(0), in[2].k.At(0)
		if delta == 0 {
			return nil, im.errorf("Range delta is 0")
		}
		count := int64(0)
		if c := math.Ceil((limit - start) / delta); c > 0 {
			if c > foldLimit {
				return nil, im.errorf("Range of %g elements is too large to fold", c)
			}
			count = int64(c)
		}
		// Element i is start + i·delta, each operation rounded to the
		// type it computes in: T, or f32 for f16 and bf16 from opset 27
		// with stash_type 1 (the default), whose result is then cast.
		work := t.DType
		if (work == ir.F16 || work == ir.BF16) && im.opset >= 27 && attrInt(n, "stash_type", 1) == 1 {
			work = ir.F32
		}
		vals := make([]float64, count)
		for i := range vals {
			step := ir.RoundTo(work, ir.RoundTo(work, float64(i))*delta)
			vals[i] = ir.RoundTo(t.DType, ir.RoundTo(work, start+step))
		}
		t.Shape[0] = count
		return []entry{{k: interp.FromFloats(t, vals)}}, nil
	}
}

// reduce applies a Kiln reduction with the node's axes: an attribute
// (ReduceSum before opset 13, the others before 18) or the second input.
// No axes means all of them, or nothing with noop_with_empty_axes.
func (im *importer) reduce(n *node, kind string, in []entry, keepdims bool) ([]entry, error) {
	axes := attrInts(n, "axes")
	if len(in) > 1 {
		var err error
		if axes, err = im.constInts(in, 1, "the axes"); err != nil {
			return nil, err
		}
	}
	a := ir.Attrs{"keepdims": ir.BoolAttr(keepdims)}
	if len(axes) > 0 {
		a["axes"] = ir.IntsAttr(axes...)
	} else if attrInt(n, "noop_with_empty_axes", 0) == 1 {
		return in[:1], nil
	}
	return im.emit(kind, in[:1], a)
}

// nllLoss is NegativeLogLikelihoodLoss of in = (log-probabilities
// [N,C,d...], labels [N,d...], optional class weights [C]) as the ONNX
// spec defines it: each position's loss is -w[label] * input[label], 0
// where the label is ignore_index; "mean" divides the sum by the sum of
// the weights taken (the count of labels not ignored, without weights).
// Labels outside [0, C) that are not ignored are an error when the step
// runs (gather's index check).
func (im *importer) nllLoss(n *node, in []entry, reduction string) (entry, error) {
	x, labels := in[0], in[1]
	xt, lt := x.typ(), labels.typ()
	if xt.Rank() < 2 || lt.Rank() != xt.Rank()-1 || lt.Shape[0] != xt.Shape[0] || !lt.Shape[1:].Equal(xt.Shape[2:]) || lt.DType.IsFloat() {
		return entry{}, im.errorf("labels %s do not index the classes of %s", lt, xt)
	}
	valid := entry{}
	safe := labels
	var err error
	if a := attr(n, "ignore_index"); a != nil {
		ignore := scalarConst(lt.DType, float64(attrInt(n, "ignore_index", 0)))
		if valid, err = im.one("ne", nil, labels, ignore); err != nil {
			return entry{}, err
		}
		if safe, err = im.one("where", nil, valid, labels, scalarConst(lt.DType, 0)); err != nil {
			return entry{}, err
		}
	}
	idx, err := im.one("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(1)}, safe)
	if err != nil {
		return entry{}, err
	}
	// A label counts from 0: -1 is out of range (PyTorch raises), not the
	// last class.
	picked, err := im.one("gather_elements", ir.Attrs{"axis": ir.IntAttr(1), ir.AttrNegative: ir.BoolAttr(false)}, x, idx)
	if err != nil {
		return entry{}, err
	}
	if picked, err = im.one("squeeze", ir.Attrs{"axes": ir.IntsAttr(1)}, picked); err != nil {
		return entry{}, err
	}
	// w: each position's weight (its class's, 0 where ignored), or nil
	// when every position weighs 1.
	var w *entry
	if len(in) > 2 && !in[2].missing() {
		if in[2].typ().Rank() != 1 || in[2].typ().Shape[0] != xt.Shape[1] {
			return entry{}, im.errorf("class weights %s must have one entry per class (%d)", in[2].typ(), xt.Shape[1])
		}
		g, err := im.one("gather", ir.Attrs{"axis": ir.IntAttr(0), ir.AttrNegative: ir.BoolAttr(false)}, in[2], safe)
		if err != nil {
			return entry{}, err
		}
		w = &g
	}
	if valid.v != nil || valid.k != nil {
		ones := scalarConst(xt.DType, 1)
		if w != nil {
			ones = *w
		}
		g, err := im.one("where", nil, valid, ones, scalarConst(xt.DType, 0))
		if err != nil {
			return entry{}, err
		}
		w = &g
	}
	loss, err := im.one("neg", nil, picked)
	if err != nil {
		return entry{}, err
	}
	if w != nil {
		if loss, err = im.one("mul", nil, loss, *w); err != nil {
			return entry{}, err
		}
	}
	if reduction == "none" {
		return loss, nil
	}
	all := func(e entry) (entry, error) {
		axes := make([]int64, e.typ().Rank())
		for i := range axes {
			axes[i] = int64(i)
		}
		return im.one("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(axes...), "keepdims": ir.BoolAttr(false)}, e)
	}
	sum, err := all(loss)
	if err != nil || reduction == "sum" {
		return sum, err
	}
	if w == nil {
		return im.one("div", nil, sum, scalarConst(xt.DType, float64(lt.NumElements())))
	}
	total, err := all(*w)
	if err != nil {
		return entry{}, err
	}
	return im.one("div", nil, sum, total)
}

// present drops trailing missing optional inputs.
func present(in []entry) []entry {
	for len(in) > 0 && in[len(in)-1].missing() {
		in = in[:len(in)-1]
	}
	return in
}

// coerced2D is the 2-D shape that operators before opset 13 (Softmax,
// Hardmax) view s as: [product of the axes before ax, product of the rest].
func coerced2D(s ir.Shape, ax int) ir.Shape {
	outer, inner := int64(1), int64(1)
	for i, d := range s {
		if i < ax {
			outer *= d
		} else {
			inner *= d
		}
	}
	return ir.Shape{outer, inner}
}
