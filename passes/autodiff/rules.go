package autodiff

import (
	"github.com/kiln-compiler/kiln/ir"
)

// HasRule reports whether autodiff can differentiate ops of kind name.
func HasRule(name string) bool { return rules[name] != nil }

// rule returns the gradient of each operand (nil where need is false or
// the gradient is zero) from the gradients of the results (nil for a
// result that does not reach the loss).
type rule func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value

var rules = map[string]rule{}

// grad names the value built for the gradient of an op's operand.
func grad(op *ir.Op) string { return op.Results[0].Name + ".bwd" }

// zerosOr returns dy, or zeros of type t when dy is nil.
func zerosOr(b *builder, dy *ir.Value, t ir.Type) *ir.Value {
	if dy != nil {
		return dy
	}
	return b.constant(t, 0, "zeros")
}

func init() {
	x := func(op *ir.Op, i int) *ir.Value { return op.Operands[i] }
	y := func(op *ir.Op) *ir.Value { return op.Results[0] }

	// Ops whose record gives their derivative: NAME_grad(dy, saved), with
	// the input or output saved as the record says. Piecewise-constant
	// ops have a zero gradient.
	for _, name := range ir.OpNames() {
		d := ir.Lookup(name)
		switch {
		case d.Deriv != nil:
			fromOutput := d.Deriv.FromOutput
			rules[name] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
				saved := x(op, 0)
				if fromOutput {
					saved = y(op)
				}
				return []*ir.Value{b.one(op.Kind+"_grad", op.Attrs.Clone(), grad(op), dys[0], saved)}
			}
		case d.Grad == ir.GradZero:
			rules[name] = func(_ *builder, op *ir.Op, _ []*ir.Value, _ []bool) []*ir.Value {
				return make([]*ir.Value, len(op.Operands))
			}
		}
	}
	rules["identity"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value { return dys }
	rules["round"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		switch {
		case !op.Attrs.Bool(ir.AttrStraightThrough, false):
			return make([]*ir.Value, 1)
		case b.straightThrough:
			b.throughRounds++
			return dys
		}
		b.zeroRounds++
		return make([]*ir.Value, 1)
	}
	rules["neg"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("neg", nil, grad(op), dys[0])}
	}
	rules["abs"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("mul", nil, grad(op), dys[0], b.one("sign", nil, grad(op), x(op, 0)))}
	}
	rules["exp"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("mul", nil, grad(op), dys[0], y(op))}
	}
	rules["log"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("div", nil, grad(op), dys[0], x(op, 0))}
	}
	rules["sqrt"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		two := b.one("add", nil, grad(op), y(op), y(op))
		return []*ir.Value{b.one("div", nil, grad(op), dys[0], two)}
	}
	rules["reciprocal"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		yy := b.one("mul", nil, grad(op), y(op), y(op))
		return []*ir.Value{b.one("neg", nil, grad(op), b.one("mul", nil, grad(op), dys[0], yy))}
	}
	rules["cast"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("cast", ir.Attrs{"to": ir.TypeAttr(x(op, 0).Type.DType)}, grad(op), dys[0])}
	}

	// Broadcasting binary ops.
	rules["add"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := make([]*ir.Value, 2)
		for i := range out {
			if need[i] {
				out[i] = b.sumTo(dys[0], x(op, i).Type.Shape, grad(op))
			}
		}
		return out
	}
	rules["sub"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := []*ir.Value{b.sumTo(dys[0], x(op, 0).Type.Shape, grad(op)), nil}
		if need[1] {
			out[1] = b.sumTo(b.one("neg", nil, grad(op), dys[0]), x(op, 1).Type.Shape, grad(op))
		}
		return out
	}
	rules["mul"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := make([]*ir.Value, 2)
		for i := 0; i < 2; i++ {
			if need[i] {
				out[i] = b.sumTo(b.one("mul", nil, grad(op), dys[0], x(op, 1-i)), x(op, i).Type.Shape, grad(op))
			}
		}
		return out
	}
	rules["div"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := make([]*ir.Value, 2)
		q := b.one("div", nil, grad(op), dys[0], x(op, 1))
		if need[0] {
			out[0] = b.sumTo(q, x(op, 0).Type.Shape, grad(op))
		}
		if need[1] {
			out[1] = b.sumTo(b.one("neg", nil, grad(op), b.one("mul", nil, grad(op), q, y(op))), x(op, 1).Type.Shape, grad(op))
		}
		return out
	}
	minmax := func(cmp string) rule {
		return func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
			mask := b.one(cmp, nil, grad(op), x(op, 0), x(op, 1))
			zero := b.scalar(dys[0].Type.DType, 0, "zero")
			return []*ir.Value{
				b.sumTo(b.one("where", nil, grad(op), mask, dys[0], zero), x(op, 0).Type.Shape, grad(op)),
				b.sumTo(b.one("where", nil, grad(op), mask, zero, dys[0]), x(op, 1).Type.Shape, grad(op)),
			}
		}
	}
	rules["max"] = minmax("ge")
	rules["min"] = minmax("le")
	rules["pow"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := make([]*ir.Value, 2)
		a, e := x(op, 0), x(op, 1)
		if need[0] {
			em1 := b.one("sub", nil, grad(op), e, b.scalar(e.Type.DType, 1, "one"))
			d := b.one("mul", nil, grad(op), e, b.one("pow", nil, grad(op), a, em1))
			out[0] = b.sumTo(b.one("mul", nil, grad(op), dys[0], d), a.Type.Shape, grad(op))
		}
		if need[1] {
			d := b.one("mul", nil, grad(op), y(op), b.one("log", nil, grad(op), a))
			out[1] = b.sumTo(b.one("mul", nil, grad(op), dys[0], d), e.Type.Shape, grad(op))
		}
		return out
	}
	rules["where"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		zero := b.scalar(dys[0].Type.DType, 0, "zero")
		out := make([]*ir.Value, 3)
		if need[1] {
			out[1] = b.sumTo(b.one("where", nil, grad(op), x(op, 0), dys[0], zero), x(op, 1).Type.Shape, grad(op))
		}
		if need[2] {
			out[2] = b.sumTo(b.one("where", nil, grad(op), x(op, 0), zero, dys[0]), x(op, 2).Type.Shape, grad(op))
		}
		return out
	}

	// Linear algebra.
	rules["matmul"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		a, w := x(op, 0), x(op, 1)
		a2, w2 := a, w
		if a.Type.Rank() == 1 {
			a2 = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(1, a.Type.Shape[0])}, grad(op), a)
		}
		if w.Type.Rank() == 1 {
			w2 = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(w.Type.Shape[0], 1)}, grad(op), w)
		}
		full, _, _ := ir.MatmulShape(a2.Type, w2.Type)
		dy := dys[0]
		if !dy.Type.Shape.Equal(full) {
			dy = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(full...)}, grad(op), dy)
		}
		out := make([]*ir.Value, 2)
		if w2.Type.Rank() == 2 && a2.Type.Rank() >= 2 && w2.Type.NumElements() > 0 {
			// A weight matrix (a Linear layer): both gradients are gemms
			// with transposed operands over the batch folded into rows, so
			// no transposed copy of the weight or the activation is made.
			k, n := w2.Type.Shape[0], w2.Type.Shape[1]
			rows := dy.Type.NumElements() / n
			flat := func(v *ir.Value, cols int64) *ir.Value {
				if v.Type.Rank() == 2 && v.Type.Shape[0] == rows {
					return v
				}
				return b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(rows, cols)}, grad(op), v)
			}
			if need[0] {
				da := b.one("gemm", ir.Attrs{"trans_b": ir.BoolAttr(true)}, grad(op), flat(dy, n), w2)
				shape := append(dy.Type.Shape[:len(dy.Type.Shape)-1:len(dy.Type.Shape)-1], k)
				if !da.Type.Shape.Equal(shape) {
					da = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(shape...)}, grad(op), da)
				}
				out[0] = b.sumTo(da, a2.Type.Shape, grad(op))
				if !a2.Type.Shape.Equal(a.Type.Shape) {
					out[0] = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(a.Type.Shape...)}, grad(op), out[0])
				}
			}
			if need[1] {
				av := a2
				if !a2.Type.Shape[:a2.Type.Rank()-1].Equal(dy.Type.Shape[:dy.Type.Rank()-1]) {
					// a broadcast against dy's batch: spread it first.
					av = b.one("expand", ir.Attrs{"shape": ir.IntsAttr(append(dy.Type.Shape[:dy.Type.Rank()-1:dy.Type.Rank()-1], k)...)}, grad(op), a2)
				}
				out[1] = b.one("gemm", ir.Attrs{"trans_a": ir.BoolAttr(true)}, grad(op), flat(av, k), flat(dy, n))
				if !w2.Type.Shape.Equal(w.Type.Shape) {
					out[1] = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(w.Type.Shape...)}, grad(op), out[1])
				}
			}
			return out
		}
		back := func(g *ir.Value, to, orig *ir.Value) *ir.Value {
			g = b.sumTo(g, to.Type.Shape, grad(op))
			if !to.Type.Shape.Equal(orig.Type.Shape) {
				g = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(orig.Type.Shape...)}, grad(op), g)
			}
			return g
		}
		if need[0] {
			out[0] = back(b.one("matmul", nil, grad(op), dy, swapLast(b, w2, grad(op))), a2, a)
		}
		if need[1] {
			if w2.Type.Rank() == 2 && a2.Type.Rank() > 2 {
				// w is shared by every batch: fold the batch into the rows
				// instead of materialising one weight gradient per batch.
				k, n := a2.Type.Shape[a2.Type.Rank()-1], dy.Type.Shape[dy.Type.Rank()-1]
				rows := a2.Type.NumElements() / k
				a3 := b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(rows, k)}, grad(op), a2)
				d3 := b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(rows, n)}, grad(op), dy)
				out[1] = back(b.one("matmul", nil, grad(op), swapLast(b, a3, grad(op)), d3), w2, w)
			} else {
				out[1] = back(b.one("matmul", nil, grad(op), swapLast(b, a2, grad(op)), dy), w2, w)
			}
		}
		return out
	}
	rules["gemm"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		ta, tb := op.Attr().Bool("trans_a"), op.Attr().Bool("trans_b")
		alpha := op.Attr().Float("alpha")
		attrs := func(tA, tB bool) ir.Attrs {
			a := ir.Attrs{}
			if tA {
				a["trans_a"] = ir.BoolAttr(true)
			}
			if tB {
				a["trans_b"] = ir.BoolAttr(true)
			}
			if alpha != 1 {
				a["alpha"] = ir.FloatAttr(alpha)
			}
			return a
		}
		A, B, dy := x(op, 0), x(op, 1), dys[0]
		out := make([]*ir.Value, len(op.Operands))
		if need[0] {
			if !ta {
				out[0] = b.one("gemm", attrs(false, !tb), grad(op), dy, B)
			} else {
				out[0] = b.one("gemm", attrs(tb, true), grad(op), B, dy)
			}
		}
		if need[1] {
			if !tb {
				out[1] = b.one("gemm", attrs(!ta, false), grad(op), A, dy)
			} else {
				out[1] = b.one("gemm", attrs(true, ta), grad(op), dy, A)
			}
		}
		if len(op.Operands) == 3 && need[2] {
			g := dy
			if beta := op.Attr().Float("beta"); beta != 1 {
				g = b.one("mul", nil, grad(op), dy, b.scalar(dy.Type.DType, beta, "beta"))
			}
			out[2] = b.sumTo(g, x(op, 2).Type.Shape, grad(op))
		}
		return out
	}
	rules["conv2d"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := make([]*ir.Value, len(op.Operands))
		base := ir.Attrs{}
		for _, k := range []string{"strides", "pads", "dilations", "groups"} {
			if v, ok := op.Attrs[k]; ok {
				base[k] = v
			}
		}
		if need[0] {
			a := base.Clone()
			a["input_shape"] = ir.IntsAttr(x(op, 0).Type.Shape...)
			out[0] = b.one("conv2d_grad_input", a, grad(op), dys[0], x(op, 1))
		}
		if need[1] {
			a := base.Clone()
			a["weight_shape"] = ir.IntsAttr(x(op, 1).Type.Shape...)
			out[1] = b.one("conv2d_grad_weight", a, grad(op), dys[0], x(op, 0))
		}
		if len(op.Operands) == 3 && need[2] {
			out[2] = b.one("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(0, 2, 3)}, grad(op), dys[0])
		}
		return out
	}

	// conv2d_grad_input is a transposed convolution (ONNX ConvTranspose):
	// linear in dy and in w, so its gradients are the convolution of the
	// incoming gradient with w, and the weight gradient of that
	// convolution.
	rules["conv2d_grad_input"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := make([]*ir.Value, 2)
		base := ir.Attrs{}
		for _, k := range []string{"strides", "pads", "dilations", "groups"} {
			if v, ok := op.Attrs[k]; ok {
				base[k] = v
			}
		}
		if need[0] {
			out[0] = b.one("conv2d", base, grad(op), dys[0], x(op, 1))
		}
		if need[1] {
			a := base.Clone()
			a["weight_shape"] = ir.IntsAttr(x(op, 1).Type.Shape...)
			out[1] = b.one("conv2d_grad_weight", a, grad(op), x(op, 0), dys[0])
		}
		return out
	}

	// Pooling and normalisation.
	rules["max_pool2d"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("max_pool2d_grad", op.Attrs.Clone(), grad(op), dys[0], x(op, 0))}
	}
	rules["avg_pool2d"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		a := op.Attrs.Clone()
		a["input_shape"] = ir.IntsAttr(x(op, 0).Type.Shape...)
		return []*ir.Value{b.one("avg_pool2d_grad", a, grad(op), dys[0])}
	}
	rules["global_avg_pool"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		xs := x(op, 0).Type
		area := xs.NumElements() / y(op).Type.NumElements()
		e := b.one("expand", ir.Attrs{"shape": ir.IntsAttr(xs.Shape...)}, grad(op), dys[0])
		return []*ir.Value{b.one("mul", nil, grad(op), e, b.scalar(xs.DType, 1/float64(area), "inv_area"))}
	}
	rules["batch_norm_train"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		if dys[0] == nil {
			return make([]*ir.Value, 5)
		}
		r := b.emit("batch_norm_grad", []*ir.Value{dys[0], x(op, 0), x(op, 1), op.Results[3], op.Results[4]}, nil, grad(op))
		return []*ir.Value{r[0], r[1], r[2], nil, nil}
	}
	rules["batch_norm_infer"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		xv, scale, mean, variance := x(op, 0), x(op, 1), x(op, 3), x(op, 4)
		dt := xv.Type.DType
		bshape := make([]int64, xv.Type.Rank())
		for i := range bshape {
			bshape[i] = 1
		}
		bshape[1] = xv.Type.Shape[1]
		asB := func(v *ir.Value) *ir.Value {
			return b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(bshape...)}, grad(op), v)
		}
		inv := b.one("reciprocal", nil, grad(op), b.one("sqrt", nil, grad(op),
			b.one("add", nil, grad(op), variance, b.scalar(dt, op.Attr().Float("epsilon"), "eps"))))
		axes := []int64{0}
		for i := 2; i < xv.Type.Rank(); i++ {
			axes = append(axes, int64(i))
		}
		out := make([]*ir.Value, 5)
		if need[0] {
			out[0] = b.one("mul", nil, grad(op), dys[0], asB(b.one("mul", nil, grad(op), scale, inv)))
		}
		if need[1] {
			xhat := b.one("mul", nil, grad(op), b.one("sub", nil, grad(op), xv, asB(mean)), asB(inv))
			out[1] = b.one("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(axes...)}, grad(op), b.one("mul", nil, grad(op), dys[0], xhat))
		}
		if need[2] || need[3] {
			out[2] = b.one("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(axes...)}, grad(op), dys[0])
		}
		if need[3] {
			// d/dmean = -scale·inv, summed over the channel
			out[3] = b.one("neg", nil, grad(op), b.one("mul", nil, grad(op), b.one("mul", nil, grad(op), scale, inv), out[2]))
			if !need[2] {
				out[2] = nil
			}
		}
		if need[4] {
			// d/dvar = -scale·(x - mean)·inv³/2, summed over the channel
			xhat := b.one("mul", nil, grad(op), b.one("sub", nil, grad(op), xv, asB(mean)), asB(inv))
			sdx := b.one("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(axes...)}, grad(op), b.one("mul", nil, grad(op), dys[0], xhat))
			k := b.one("mul", nil, grad(op), b.one("mul", nil, grad(op), scale, b.one("mul", nil, grad(op), inv, inv)), b.scalar(dt, -0.5, "half"))
			out[4] = b.one("mul", nil, grad(op), k, sdx)
		}
		return out
	}
	rules["layer_norm"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		if dys[0] == nil {
			return make([]*ir.Value, len(op.Operands))
		}
		a := ir.Attrs{}
		for _, k := range []string{"axis", "center"} {
			if v, ok := op.Attrs[k]; ok {
				a[k] = v
			}
		}
		r := b.emit("layer_norm_grad", []*ir.Value{dys[0], x(op, 0), x(op, 1), op.Results[1], op.Results[2]}, a, grad(op))
		return r[:len(op.Operands)]
	}
	for _, kind := range []string{"softmax", "log_softmax"} {
		rules[kind] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
			return []*ir.Value{b.one(op.Kind+"_grad", op.Attrs.Clone(), grad(op), dys[0], y(op))}
		}
	}
	rules["dropout"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		if dys[0] == nil {
			return []*ir.Value{nil}
		}
		// The mask is regenerated from the seed, not saved: a hash per
		// element instead of a byte per element living through the
		// forward and backward passes.
		a := ir.Attrs{"seed": op.Attrs["seed"]}
		for _, k := range []string{"ratio", "offset"} {
			if v, ok := op.Attrs[k]; ok {
				a[k] = v
			}
		}
		if key := ir.RandomKey(op); key != nil {
			return []*ir.Value{b.one("dropout_grad", a, grad(op), dys[0], key)}
		}
		return []*ir.Value{b.one("dropout_grad", a, grad(op), dys[0])}
	}
	rules["softmax_cross_entropy"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		// A mean's 1/count scales dloss once, so that each sample's
		// gradient is its own (the sum form): a slice of the samples then
		// computes its rows of the whole gradient.
		dl := dys[0]
		if op.Attr().String("reduction") == "mean" {
			n := x(op, 1).Type.NumElements()
			dl = b.one("mul", nil, grad(op), dl, b.scalar(dl.Type.DType, 1/float64(max(n, 1)), "inv_count"))
		}
		return []*ir.Value{b.one("softmax_cross_entropy_grad", ir.Attrs{"reduction": ir.StringAttr("sum")}, grad(op), dl, x(op, 0), x(op, 1)), nil}
	}

	// Reductions.
	keepShape := func(op *ir.Op) ir.Shape {
		axes, _ := ir.ReduceAxes(op.Attr(), x(op, 0).Type.Rank())
		return ir.ReducedShape(x(op, 0).Type.Shape, axes, true)
	}
	spread := func(b *builder, op *ir.Op, dy *ir.Value) *ir.Value {
		k := keepShape(op)
		if !dy.Type.Shape.Equal(k) {
			dy = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(k...)}, grad(op), dy)
		}
		return b.one("expand", ir.Attrs{"shape": ir.IntsAttr(x(op, 0).Type.Shape...)}, grad(op), dy)
	}
	rules["reduce_sum"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{spread(b, op, dys[0])}
	}
	rules["reduce_mean"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		n := x(op, 0).Type.NumElements() / max(y(op).Type.NumElements(), 1)
		return []*ir.Value{b.one("mul", nil, grad(op), spread(b, op, dys[0]), b.scalar(dys[0].Type.DType, 1/float64(n), "inv_count"))}
	}
	// reduce_max and reduce_min: the gradient goes to every element equal
	// to the extreme (all of them on a tie).
	rules["reduce_max"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		k := keepShape(op)
		yk := y(op)
		if !yk.Type.Shape.Equal(k) {
			yk = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(k...)}, grad(op), yk)
		}
		mask := b.one("eq", nil, grad(op), x(op, 0), yk)
		return []*ir.Value{b.one("where", nil, grad(op), mask, spread(b, op, dys[0]), b.scalar(dys[0].Type.DType, 0, "zero"))}
	}
	rules["reduce_min"] = rules["reduce_max"]
	rules["sum_to"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("expand", ir.Attrs{"shape": ir.IntsAttr(x(op, 0).Type.Shape...)}, grad(op), dys[0])}
	}

	// Shape ops.
	for _, kind := range []string{"reshape", "flatten", "squeeze", "unsqueeze"} {
		rules[kind] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
			return []*ir.Value{b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(x(op, 0).Type.Shape...)}, grad(op), dys[0])}
		}
	}
	rules["transpose"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		perm := op.Attr().Ints("perm")
		inv := make([]int64, len(perm))
		for i, p := range perm {
			inv[p] = int64(i)
		}
		return []*ir.Value{b.one("transpose", ir.Attrs{"perm": ir.IntsAttr(inv...)}, grad(op), dys[0])}
	}
	rules["expand"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.sumTo(dys[0], x(op, 0).Type.Shape, grad(op))}
	}
	rules["concat"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), y(op).Type.Rank())
		out := make([]*ir.Value, len(op.Operands))
		off := int64(0)
		for i, v := range op.Operands {
			size := v.Type.Shape[ax]
			if need[i] {
				out[i] = b.one("slice", ir.Attrs{"axes": ir.IntsAttr(int64(ax)), "starts": ir.IntsAttr(off), "ends": ir.IntsAttr(off + size)}, grad(op), dys[0])
			}
			off += size
		}
		return out
	}
	rules["split"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		parts := make([]*ir.Value, len(dys))
		for i, d := range dys {
			parts[i] = zerosOr(b, d, op.Results[i].Type)
		}
		return []*ir.Value{b.one("concat", ir.Attrs{"axis": op.Attrs["axis"]}, grad(op), parts...)}
	}
	rules["slice"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		a := op.Attrs.Clone()
		a["input_shape"] = ir.IntsAttr(x(op, 0).Type.Shape...)
		return []*ir.Value{b.one("slice_grad", a, grad(op), dys[0])}
	}
	rules["gather_elements"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		a := indexing(op, ir.Attrs{"axis": ir.IntAttr(op.Attr().Int("axis")), "data_shape": ir.IntsAttr(x(op, 0).Type.Shape...)})
		return []*ir.Value{b.one("gather_elements_grad", a, grad(op), dys[0], x(op, 1)), nil}
	}
	rules["gather_grad"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("gather", indexing(op, ir.Attrs{"axis": ir.IntAttr(op.Attr().Int("axis"))}), grad(op), dys[0], x(op, 1)), nil}
	}
	rules["gather_elements_grad"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.one("gather_elements", indexing(op, ir.Attrs{"axis": ir.IntAttr(op.Attr().Int("axis"))}), grad(op), dys[0], x(op, 1)), nil}
	}
	rules["lerp_gather"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		xv := x(op, 0)
		out := []*ir.Value{nil, nil, nil, nil}
		if need[0] {
			a := ir.Attrs{"axis": ir.IntAttr(op.Attr().Int("axis")), "data_shape": ir.IntsAttr(xv.Type.Shape...)}
			out[0] = b.one("lerp_gather_grad", a, grad(op), dys[0], x(op, 1), x(op, 2), x(op, 3))
		}
		if len(need) > 3 && need[3] {
			out[3] = lerpWeightGrad(b, op, xv, dys[0])
		}
		return out
	}
	rules["lerp_gather_grad"] = func(b *builder, op *ir.Op, dys []*ir.Value, need []bool) []*ir.Value {
		out := []*ir.Value{b.one("lerp_gather", ir.Attrs{"axis": ir.IntAttr(op.Attr().Int("axis"))}, grad(op), dys[0], x(op, 1), x(op, 2), x(op, 3)), nil, nil, nil}
		if len(need) > 3 && need[3] {
			out[3] = lerpWeightGrad(b, op, dys[0], x(op, 0))
		}
		return out
	}
	rules["gather"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		a := indexing(op, ir.Attrs{"data_shape": ir.IntsAttr(x(op, 0).Type.Shape...)})
		if v, ok := op.Attrs["axis"]; ok {
			a["axis"] = v
		}
		return []*ir.Value{b.one("gather_grad", a, grad(op), dys[0], x(op, 1)), nil}
	}
	rules["pad"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		pads := op.Attr().Ints("pads")
		neg := make([]int64, len(pads))
		for i, p := range pads {
			neg[i] = -p
		}
		return []*ir.Value{b.one("pad", ir.Attrs{"pads": ir.IntsAttr(neg...)}, grad(op), dys[0])}
	}
}

// indexing is a with op's "negative" (how the gathers read an index
// below 0) where op sets it: a gradient reads the indices as the op did.
func indexing(op *ir.Op, a ir.Attrs) ir.Attrs {
	if v, ok := op.Attrs[ir.AttrNegative]; ok {
		a[ir.AttrNegative] = v
	}
	return a
}

// swapLast transposes the last two dimensions of v.
func swapLast(b *builder, v *ir.Value, base string) *ir.Value {
	r := v.Type.Rank()
	perm := make([]int64, r)
	for i := range perm {
		perm[i] = int64(i)
	}
	perm[r-1], perm[r-2] = perm[r-2], perm[r-1]
	return b.one("transpose", ir.Attrs{"perm": ir.IntsAttr(perm...)}, base, v)
}

// lerpWeightGrad is the gradient of lerp_gather's (or its gradient's)
// weights: dw[k] = Σ dy · (data[hi[k]] − data[lo[k]]) over the positions
// whose axis coordinate is k, where data is lerp_gather's input (or the
// gradient flowing into lerp_gather_grad's result) and dy the tensor of
// the interpolation's shape.
func lerpWeightGrad(b *builder, op *ir.Op, data, dy *ir.Value) *ir.Value {
	axis := ir.IntAttr(op.Attr().Int("axis"))
	lo, hi, w := op.Operands[1], op.Operands[2], op.Operands[3]
	g1 := b.one("gather", ir.Attrs{"axis": axis}, grad(op), data, hi)
	g0 := b.one("gather", ir.Attrs{"axis": axis}, grad(op), data, lo)
	m := b.one("mul", nil, grad(op), dy, b.one("sub", nil, grad(op), g1, g0))
	ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), data.Type.Rank())
	keep := make(ir.Shape, data.Type.Rank())
	for i := range keep {
		keep[i] = 1
	}
	keep[ax] = w.Type.Shape[0]
	return b.one("reshape", ir.Attrs{"shape": ir.IntsAttr(w.Type.Shape...)}, grad(op), b.sumTo(m, keep, grad(op)))
}
