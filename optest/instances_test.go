package optest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
)

// model says how closely compiled code must match the interpreter on an
// instance (the error models are stated in differential_test.go).
type model uint8

const (
	modelScalar   model = iota + 1 // elementwise: running error analysis of the op's scalar expression
	modelExact                     // data movement, maxima, integer results: bit for bit
	modelSum                       // sums of products: (K+2)·u·Σ|terms| per element
	modelRelative                  // statistics (normalisations, softmax, losses, updates): relative tensor error
)

// instance is one use of an op: operand types and attributes.
type instance struct {
	op    string
	in    []ir.Type
	attrs ir.Attrs
	model model
	// k is the number of terms summed into one result element (modelSum).
	k int64
	// large fills float operands with large logits (±1e5, 1e9) instead of
	// the edge values.
	large bool
}

func (in instance) String() string {
	var ts []string
	for _, t := range in.in {
		ts = append(ts, t.String())
	}
	s := in.op + "(" + strings.Join(ts, ", ") + ")"
	if len(in.attrs) > 0 {
		var kv []string
		for _, k := range in.attrs.Keys() {
			kv = append(kv, k+"="+in.attrs[k].String())
		}
		s += "{" + strings.Join(kv, ",") + "}"
	}
	if in.large {
		s += "[large]"
	}
	return s
}

// ty parses a type written as in the text format: f32[2,3].
func ty(s string) ir.Type {
	name, dims, _ := strings.Cut(strings.TrimSuffix(s, "]"), "[")
	d, ok := ir.ParseDType(name)
	if !ok {
		panic("optest: bad dtype in " + s)
	}
	t := ir.Type{DType: d, Shape: ir.Shape{}}
	for _, d := range strings.Split(dims, ",") {
		if d == "" {
			continue
		}
		n, err := strconv.ParseInt(d, 10, 64)
		if err != nil {
			panic("optest: bad shape in " + s)
		}
		t.Shape = append(t.Shape, n)
	}
	return t
}

func tys(ss ...string) []ir.Type {
	out := make([]ir.Type, len(ss))
	for i, s := range ss {
		out[i] = ty(s)
	}
	return out
}

var ints = ir.IntsAttr

// allInstances lists the instances of every op: generated for the ops
// with scalar semantics (every dtype their records accept, broadcasting,
// edge values pairwise), written out for the rest.
func allInstances() []instance {
	out := scalarInstances()
	return append(out, handInstances()...)
}

// scalarInstances covers every op with a Scalar: unary ops on a vector of
// edge and random values; binary ops on [n,1] against [1,n] so that every
// pair of values meets; each in f32 and f64, and in i64 and i32 where the
// op takes integers.
func scalarInstances() []instance {
	var out []instance
	for _, name := range ir.OpNames() {
		d := ir.Lookup(name)
		if d.Scalar == nil {
			continue
		}
		switch name {
		case "cast":
			for _, from := range []string{"f32", "f64", "i64", "i32", "i8", "bool"} {
				for _, to := range []string{"f32", "f64", "f16", "bf16", "i64", "i32", "i8", "bool"} {
					out = append(out, instance{op: name, in: tys(from + "[64]"), attrs: ir.Attrs{"to": ir.TypeAttr(ty(to + "[]").DType)}, model: modelScalar})
				}
			}
			continue
		case "where":
			for _, dt := range []string{"f32", "f64", "i64"} {
				out = append(out, instance{op: name, in: tys("bool[8,1,1]", dt+"[1,8,1]", dt+"[1,1,8]"), model: modelScalar})
			}
			continue
		}
		for _, dt := range []string{"f32", "f64", "i64", "i32", "bool"} {
			var in []ir.Type
			switch d.MinOperands {
			case 1:
				in = tys(dt + "[64]")
			case 2:
				in = tys(dt+"[48,1]", dt+"[1,48]")
				if strings.HasSuffix(name, "_grad") {
					in = tys(dt+"[48]", dt+"[48]") // (dy, saved)
				}
			default:
				panic(fmt.Sprintf("optest: %s has %d operands", name, d.MinOperands))
			}
			attrVariants := []ir.Attrs{nil}
			switch strings.TrimSuffix(name, "_grad") {
			case "gelu":
				attrVariants = append(attrVariants, ir.Attrs{"approximate": ir.StringAttr("tanh")})
			case "hard_sigmoid":
				attrVariants = append(attrVariants, ir.Attrs{"alpha": ir.FloatAttr(0.3), "beta": ir.FloatAttr(0.4)})
			case "elu", "leaky_relu", "celu":
				attrVariants = append(attrVariants, ir.Attrs{"alpha": ir.FloatAttr(0.5)})
			case "selu":
				attrVariants = append(attrVariants, ir.Attrs{"alpha": ir.FloatAttr(0.5), "gamma": ir.FloatAttr(2)})
			case "clip":
				attrVariants = []ir.Attrs{{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(6)}, {"lo": ir.FloatAttr(-0.5)}}
			case "mod":
				attrVariants = append(attrVariants, ir.Attrs{"fmod": ir.BoolAttr(true)})
			}
			for _, a := range attrVariants {
				if _, err := d.InferTypes(in, a); err != nil {
					continue // the op does not take this dtype
				}
				out = append(out, instance{op: name, in: in, attrs: a, model: modelScalar})
			}
		}
	}
	return out
}

// handInstances are the ops without scalar semantics.
func handInstances() []instance {
	conv := ir.Attrs{"pads": ints(1, 0, 1, 2), "strides": ints(2, 1), "dilations": ints(1, 2)}
	grouped := ir.Attrs{"groups": ir.IntAttr(2), "pads": ints(1, 1, 1, 1)}
	with := func(a ir.Attrs, k string, v ir.Attr) ir.Attrs {
		b := a.Clone()
		b[k] = v
		return b
	}
	pool := ir.Attrs{"kernel": ints(3, 2), "strides": ints(2, 1), "pads": ints(1, 0, 1, 1)}
	ceil := ir.Attrs{"kernel": ints(3, 3), "strides": ints(2, 2), "ceil_mode": ir.BoolAttr(true), "count_include_pad": ir.BoolAttr(true)}
	return []instance{
		{op: "constant", attrs: ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: ty("f32[3]"), Floats: []float64{1, -0.5, 3e38}})}, model: modelExact},
		{op: "constant", attrs: ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: ty("i64[2,2]"), Ints: []int64{7}})}, model: modelExact},

		{op: "reshape", in: tys("f32[2,3,4]"), attrs: ir.Attrs{"shape": ints(6, 4)}, model: modelExact},
		{op: "transpose", in: tys("f32[2,3,4]"), attrs: ir.Attrs{"perm": ints(2, 0, 1)}, model: modelExact},
		{op: "transpose", in: tys("i64[3,5]"), attrs: ir.Attrs{"perm": ints(1, 0)}, model: modelExact},
		{op: "flatten", in: tys("f32[2,3,4]"), attrs: ir.Attrs{"axis": ir.IntAttr(2)}, model: modelExact},
		{op: "squeeze", in: tys("f32[2,1,4,1]"), attrs: ir.Attrs{"axes": ints(1)}, model: modelExact},
		{op: "squeeze", in: tys("f32[2,1,4,1]"), model: modelExact},
		{op: "unsqueeze", in: tys("f32[2,4]"), attrs: ir.Attrs{"axes": ints(0, -1)}, model: modelExact},
		{op: "expand", in: tys("f32[3,1]"), attrs: ir.Attrs{"shape": ints(2, 3, 4)}, model: modelExact},
		{op: "sum_to", in: tys("f32[2,3,4]"), attrs: ir.Attrs{"shape": ints(3, 1)}, model: modelSum, k: 8},
		{op: "concat", in: tys("f32[2,3]", "f32[2,1]", "f32[2,2]"), attrs: ir.Attrs{"axis": ir.IntAttr(-1)}, model: modelExact},
		{op: "split", in: tys("f32[5,2]"), attrs: ir.Attrs{"axis": ir.IntAttr(0), "sizes": ints(2, 3)}, model: modelExact},
		{op: "slice", in: tys("f32[6,7]"), attrs: ir.Attrs{"starts": ints(1, -1), "ends": ints(5, -8), "steps": ints(2, -2)}, model: modelExact},
		{op: "slice_grad", in: tys("f32[2,4]"), attrs: ir.Attrs{"starts": ints(1, -1), "ends": ints(5, -8), "steps": ints(2, -2), "input_shape": ints(6, 7)}, model: modelExact},
		{op: "gather", in: tys("f32[5,3]", "i64[2,2]"), attrs: ir.Attrs{"axis": ir.IntAttr(0)}, model: modelExact},
		{op: "gather", in: tys("f32[2,5]", "i32[4]"), attrs: ir.Attrs{"axis": ir.IntAttr(1)}, model: modelExact},
		{op: "gather_grad", in: tys("f32[2,2,3]", "i64[2,2]"), attrs: ir.Attrs{"axis": ir.IntAttr(0), "data_shape": ints(5, 3)}, model: modelSum, k: 4},
		{op: "lerp_gather", in: tys("f32[2,5,3]", "i64[7]", "i64[7]", "f32[7]"), attrs: ir.Attrs{"axis": ir.IntAttr(1)}, model: modelScalar},
		{op: "lerp_gather", in: tys("f64[4,2]", "i64[3]", "i64[3]", "f64[3]"), attrs: ir.Attrs{"axis": ir.IntAttr(0)}, model: modelScalar},
		{op: "lerp_gather_grad", in: tys("f32[2,7,3]", "i64[7]", "i64[7]", "f32[7]"), attrs: ir.Attrs{"axis": ir.IntAttr(1), "data_shape": ints(2, 5, 3)}, model: modelSum, k: 14},
		{op: "gather_elements", in: tys("f32[5,3]", "i64[4,2]"), attrs: ir.Attrs{"axis": ir.IntAttr(0)}, model: modelExact},
		{op: "gather_elements", in: tys("f32[2,6,3]", "i32[2,4,3]"), attrs: ir.Attrs{"axis": ir.IntAttr(-2)}, model: modelExact},
		{op: "gather_elements_grad", in: tys("f32[4,3]", "i64[4,3]"), attrs: ir.Attrs{"axis": ir.IntAttr(1), "data_shape": ints(4, 5)}, model: modelSum, k: 4},
		{op: "pad", in: tys("f32[3,4]"), attrs: ir.Attrs{"pads": ints(1, -1, 2, 1), "value": ir.FloatAttr(-2)}, model: modelExact},

		{op: "matmul", in: tys("f32[2,3,7]", "f32[7,5]"), model: modelSum, k: 7},
		{op: "matmul", in: tys("f32[7]", "f32[2,7,3]"), model: modelSum, k: 7},
		{op: "matmul", in: tys("f64[9,33]", "f64[33,6]"), model: modelSum, k: 33},
		{op: "gemm", in: tys("f32[6,4]", "f32[5,6]", "f32[5]"), attrs: ir.Attrs{"trans_a": ir.BoolAttr(true), "trans_b": ir.BoolAttr(true), "alpha": ir.FloatAttr(0.5), "beta": ir.FloatAttr(2)}, model: modelSum, k: 7},
		{op: "gemm", in: tys("f32[4,6]", "f32[6,5]"), model: modelSum, k: 6},
		{op: "reduce_sum", in: tys("f32[3,4,5]"), attrs: ir.Attrs{"axes": ints(0, 2), "keepdims": ir.BoolAttr(true)}, model: modelSum, k: 15},
		{op: "reduce_sum", in: tys("i64[3,4]"), model: modelExact},
		{op: "reduce_mean", in: tys("f32[3,4,5]"), attrs: ir.Attrs{"axes": ints(1)}, model: modelSum, k: 4},
		{op: "reduce_max", in: tys("f32[3,4,5]"), attrs: ir.Attrs{"axes": ints(-1)}, model: modelExact},
		{op: "reduce_min", in: tys("f32[3,4,5]"), attrs: ir.Attrs{"axes": ints(-1)}, model: modelExact},

		{op: "conv2d", in: tys("f32[2,3,7,6]", "f32[4,3,3,2]", "f32[4]"), attrs: conv, model: modelSum, k: 19},
		{op: "conv2d", in: tys("f32[1,4,5,5]", "f32[6,2,3,3]"), attrs: grouped, model: modelSum, k: 18},
		{op: "conv2d_grad_input", in: tys("f32[2,4,4,6]", "f32[4,3,3,2]"), attrs: with(conv, "input_shape", ints(2, 3, 7, 6)), model: modelSum, k: 24},
		{op: "conv2d_grad_input", in: tys("f32[1,6,5,5]", "f32[6,2,3,3]"), attrs: with(grouped, "input_shape", ints(1, 4, 5, 5)), model: modelSum, k: 27},
		{op: "conv2d_grad_weight", in: tys("f32[2,4,4,6]", "f32[2,3,7,6]"), attrs: with(conv, "weight_shape", ints(4, 3, 3, 2)), model: modelSum, k: 48},
		{op: "conv2d_grad_weight", in: tys("f32[1,6,5,5]", "f32[1,4,5,5]"), attrs: with(grouped, "weight_shape", ints(6, 2, 3, 3)), model: modelSum, k: 25},
		{op: "max_pool2d", in: tys("f32[2,3,7,6]"), attrs: pool, model: modelExact},
		{op: "max_pool2d", in: tys("f32[1,2,6,6]"), attrs: ceil, model: modelExact},
		{op: "avg_pool2d", in: tys("f32[2,3,7,6]"), attrs: pool, model: modelSum, k: 6},
		{op: "avg_pool2d", in: tys("f32[1,2,6,6]"), attrs: ceil, model: modelSum, k: 9},
		{op: "max_pool2d_grad", in: tys("f32[2,3,4,6]", "f32[2,3,7,6]"), attrs: pool, model: modelSum, k: 6},
		{op: "avg_pool2d_grad", in: tys("f32[2,3,4,6]"), attrs: with(pool, "input_shape", ints(2, 3, 7, 6)), model: modelSum, k: 6},
		{op: "avg_pool2d_grad", in: tys("f32[1,2,3,3]"), attrs: with(ceil, "input_shape", ints(1, 2, 6, 6)), model: modelSum, k: 4},
		{op: "global_avg_pool", in: tys("f32[2,3,4,5]"), model: modelSum, k: 20},

		{op: "batch_norm_train", in: tys("f32[4,3,2,2]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"), attrs: ir.Attrs{"epsilon": ir.FloatAttr(1e-3), "momentum": ir.FloatAttr(0.8)}, model: modelRelative},
		{op: "batch_norm_infer", in: tys("f32[4,3,2,2]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"), model: modelRelative},
		{op: "batch_norm_grad", in: tys("f32[4,3,2,2]", "f32[4,3,2,2]", "f32[3]", "f32[3]", "f32[3]"), model: modelRelative},
		{op: "layer_norm", in: tys("f32[3,2,8]", "f32[2,8]", "f32[2,8]"), attrs: ir.Attrs{"axis": ir.IntAttr(1)}, model: modelRelative},
		{op: "layer_norm", in: tys("f32[4,16]", "f32[16]"), model: modelRelative},
		{op: "layer_norm", in: tys("f32[3,2,8]", "f32[2,8]", "f32[2,8]"), attrs: ir.Attrs{"axis": ir.IntAttr(1), "center": ir.BoolAttr(false)}, model: modelRelative},
		{op: "layer_norm_grad", in: tys("f32[4,16]", "f32[4,16]", "f32[16]", "f32[4,1]", "f32[4,1]"), attrs: ir.Attrs{"center": ir.BoolAttr(false)}, model: modelRelative},
		{op: "layer_norm_grad", in: tys("f32[3,2,8]", "f32[3,2,8]", "f32[2,8]", "f32[3,1,1]", "f32[3,1,1]"), attrs: ir.Attrs{"axis": ir.IntAttr(1)}, model: modelRelative},
		{op: "softmax", in: tys("f32[3,10]"), model: modelRelative},
		{op: "softmax", in: tys("f32[2,5,3]"), attrs: ir.Attrs{"axis": ir.IntAttr(1)}, model: modelRelative},
		{op: "softmax", in: tys("f32[4,6]"), model: modelRelative, large: true},
		{op: "log_softmax", in: tys("f32[3,10]"), model: modelRelative},
		{op: "log_softmax", in: tys("f32[4,6]"), model: modelRelative, large: true},
		{op: "softmax_grad", in: tys("f32[3,10]", "f32[3,10]"), model: modelRelative},
		{op: "log_softmax_grad", in: tys("f32[3,10]", "f32[3,10]"), model: modelRelative},
		{op: "softmax_cross_entropy", in: tys("f32[4,7]", "i64[4]"), model: modelRelative},
		{op: "softmax_cross_entropy", in: tys("f32[2,5,3]", "i32[2,3]"), attrs: ir.Attrs{"reduction": ir.StringAttr("sum")}, model: modelRelative},
		{op: "softmax_cross_entropy", in: tys("f32[4,6]", "i64[4]"), model: modelRelative, large: true},
		{op: "softmax_cross_entropy_grad", in: tys("f32[]", "f32[4,7]", "i64[4]"), model: modelRelative},
		{op: "softmax_cross_entropy_grad", in: tys("f32[]", "f32[4,6]", "i64[4]"), model: modelRelative, large: true},

		{op: "dropout", in: tys("f32[4,8]"), attrs: ir.Attrs{"ratio": ir.FloatAttr(0.3), "seed": ir.IntAttr(11)}, model: modelScalar},
		{op: "dropout_grad", in: tys("f32[4,8]"), attrs: ir.Attrs{"ratio": ir.FloatAttr(0.3), "seed": ir.IntAttr(11)}, model: modelScalar},
		{op: "dropout_grad", in: tys("f32[4,8]", "bool[4,8]"), attrs: ir.Attrs{"ratio": ir.FloatAttr(0.25)}, model: modelScalar},
		{op: "random_uniform", attrs: ir.Attrs{"shape": ints(3, 5), "seed": ir.IntAttr(3)}, model: modelScalar},
		{op: "random_uniform", attrs: ir.Attrs{"shape": ints(7), "dtype": ir.TypeAttr(ir.F64)}, model: modelScalar},

		{op: "sgd_update", in: tys("f32[10]", "f32[10]", "f32[]"), attrs: ir.Attrs{"weight_decay": ir.FloatAttr(0.01)}, model: modelRelative},
		{op: "sgd_update", in: tys("f32[10]", "f32[10]", "f32[]", "bool[]"), model: modelRelative},
		{op: "momentum_update", in: tys("f32[10]", "f32[10]", "f32[10]", "f32[]", "f32[]"), model: modelRelative},
		{op: "momentum_update", in: tys("f32[10]", "f32[10]", "f32[10]", "f32[]", "f32[]", "bool[]"), attrs: ir.Attrs{"nesterov": ir.BoolAttr(true), "weight_decay": ir.FloatAttr(0.01)}, model: modelRelative},
		{op: "adam_update", in: tys("f32[10]", "f32[10]", "f32[10]", "f32[10]", "f32[]", "f32[]", "f32[]", "f32[]"), attrs: ir.Attrs{"weight_decay": ir.FloatAttr(0.1)}, model: modelRelative},
		{op: "adam_update", in: tys("f32[10]", "f32[10]", "f32[10]", "f32[10]", "f32[]", "f32[]", "f32[]", "f32[]"), attrs: ir.Attrs{"decoupled": ir.BoolAttr(true), "weight_decay": ir.FloatAttr(0.1)}, model: modelRelative},
		{op: "amsgrad_update", in: tys("f32[10]", "f32[10]", "f32[10]", "f32[10]", "f32[10]", "f32[]", "f32[]", "f32[]", "f32[]", "bool[]"), attrs: ir.Attrs{"decoupled": ir.BoolAttr(true), "weight_decay": ir.FloatAttr(0.1)}, model: modelRelative},
		{op: "overwrite", in: tys("f32[10]", "f32[10]"), model: modelExact},

		{op: "swap_out", in: tys("f32[3,4]"), model: modelExact},
		{op: "swap_in", in: tys("f32[3,4]"), model: modelExact},

		// Collectives on one rank are copies (interp's RunRanks tests run
		// them across ranks).
		{op: "all_reduce", in: tys("f32[3,4]"), model: modelExact},
		{op: "all_reduce", in: tys("f32[6]"), attrs: ir.Attrs{"op": ir.StringAttr("max")}, model: modelExact},
		{op: "reduce_scatter", in: tys("f32[4,2]"), attrs: ir.Attrs{"axis": ir.IntAttr(1)}, model: modelExact},
		{op: "all_gather", in: tys("f32[2,3]"), model: modelExact},
		{op: "broadcast", in: tys("f32[5]"), model: modelExact},
	}
}
