package microbatch

import (
	"fmt"
	"slices"

	"github.com/kiln-compiler/kiln/ir"
)

// DecomposeBatchNorm rewrites every batch_norm_train and batch_norm_grad
// of f into the sums over the batch they compute and the elementwise ops
// that use them, so that a split of f sees each statistic as a value
// folded over the batch: Shard all-reduces it where the rows read it (as
// PyTorch's SyncBatchNorm does), and SplitExact computes it in a phase of
// its own. The gradients of scale and bias are sums like any other.
func DecomposeBatchNorm(f *ir.Func) error {
	for i := 0; i < len(f.Body); i++ {
		op := f.Body[i]
		if op.Kind != "batch_norm_train" && op.Kind != "batch_norm_grad" {
			continue
		}
		e := &emitter{f: f, loc: op.Loc, pos: op.Pos}
		var outs []*ir.Value
		if op.Kind == "batch_norm_train" {
			outs = e.forward(op)
		} else {
			outs = e.backward(op)
		}
		if e.err != nil {
			return fmt.Errorf("%s: %v", loc(op), e.err)
		}
		for k, r := range op.Results {
			f.ReplaceUses(r, outs[k])
			for j := range f.Results {
				if f.Results[j].Value == r {
					f.Results[j].Value = outs[k]
				}
			}
		}
		f.Body = slices.Concat(f.Body[:i], e.ops, f.Body[i+1:])
		i += len(e.ops) - 1
	}
	return nil
}

// emitter builds the ops of one rewritten normalisation.
type emitter struct {
	f   *ir.Func
	loc ir.Location
	pos ir.Pos // the normalisation's, which its parts keep for messages
	ops []*ir.Op
	err error
}

func (e *emitter) op(kind string, attrs ir.Attrs, name string, in ...*ir.Value) *ir.Value {
	if e.err != nil {
		return in[0]
	}
	o, err := e.f.NewOp(kind, in, attrs, e.loc, name)
	if err != nil {
		e.err = err
		return in[0]
	}
	o.Pos = e.pos
	e.ops = append(e.ops, o)
	return o.Results[0]
}

func (e *emitter) scalar(d ir.DType, v float64, name string) *ir.Value {
	t := ir.Type{DType: d, Shape: ir.Shape{}}
	c := &ir.Dense{Type: t, Floats: []float64{ir.RoundTo(d, v)}}
	o, err := e.f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(c)}, e.loc, name)
	if err != nil {
		e.err = err
		return nil
	}
	o.Pos = e.pos
	e.ops = append(e.ops, o)
	return o.Results[0]
}

// layout is x's channel axis's layout: the axes summed per channel, the
// shape a per-channel value broadcasts from, and the elements per
// channel.
func (e *emitter) layout(x *ir.Value) (axes, bshape []int64, count float64) {
	s := x.Type.Shape
	count = 1
	bshape = make([]int64, len(s))
	for d := range s {
		bshape[d] = 1
		if d == 1 {
			bshape[d] = s[1]
			continue
		}
		axes = append(axes, int64(d))
		count *= float64(s[d])
	}
	return axes, bshape, count
}

// as is v in dtype d: v itself, or a cast (a batch norm of a bf16 x
// computes in its f32 parameters' dtype, as the fused op does).
func (e *emitter) as(v *ir.Value, d ir.DType, name string) *ir.Value {
	if v.Type.DType == d {
		return v
	}
	return e.op("cast", ir.Attrs{"to": ir.TypeAttr(d)}, name+"."+d.String(), v)
}

// sum is the per-channel sum of v over the batch and positions.
func (e *emitter) sum(v *ir.Value, axes []int64, name string) *ir.Value {
	return e.op("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(axes...), "keepdims": ir.BoolAttr(true)}, name, v)
}

// forward is batch_norm_train from its sums: y, the new running mean
// and variance (the unbiased batch variance unless unbiased = false),
// the saved mean and invstd.
func (e *emitter) forward(op *ir.Op) []*ir.Value {
	x, scale, bias, rm, rv := op.Operands[0], op.Operands[1], op.Operands[2], op.Operands[3], op.Operands[4]
	name := op.Results[0].Name
	d := scale.Type.DType // the statistics' dtype (a bf16 x is read into it)
	x = e.as(x, d, name+".x")
	axes, bshape, count := e.layout(x)
	a := op.Attr()
	eps, mom := a.Float("epsilon"), a.Float("momentum")
	perChannel := ir.Attrs{"shape": ir.IntsAttr(scale.Type.Shape...)}
	bcast := ir.Attrs{"shape": ir.IntsAttr(bshape...)}
	s := e.sum(x, axes, name+".sum")
	mean := e.op("mul", nil, name+".mean", s, e.scalar(d, 1/count, name+".inv_count"))
	centred := e.op("sub", nil, name+".centred", x, mean)
	q := e.sum(e.op("mul", nil, name+".sq", centred, centred), axes, name+".m2")
	variance := e.op("mul", nil, name+".var", q, e.scalar(d, 1/count, name+".inv_count"))
	invstd := e.op("div", nil, name+".invstd", e.scalar(d, 1, name+".one"),
		e.op("sqrt", nil, name+".std", e.op("add", nil, name+".var_eps", variance, e.scalar(d, eps, name+".eps"))))
	y := e.op("add", nil, name, e.op("mul", nil, name+".scaled",
		e.op("mul", nil, name+".xhat", centred, invstd), e.op("reshape", bcast, name+".scale", scale)),
		e.op("reshape", bcast, name+".bias", bias))
	y = e.as(y, op.Results[0].Type.DType, name+".y")
	unbiased := variance
	if count > 1 && a.Bool("unbiased") {
		unbiased = e.op("mul", nil, name+".unbiased", q, e.scalar(d, 1/(count-1), name+".inv_count_1"))
	}
	meanC := e.op("reshape", perChannel, op.Results[3].Name, mean)
	// ema's record tells the optimizer pass that the result is the
	// statistic's new value, to write back as it writes batch_norm_train's.
	running := func(old, batch *ir.Value, res *ir.Value) *ir.Value {
		return e.op("ema", ir.Attrs{"momentum": ir.FloatAttr(mom)}, res.Name, old, e.op("reshape", perChannel, res.Name+".batch", batch))
	}
	return []*ir.Value{y, running(rm, mean, op.Results[1]), running(rv, unbiased, op.Results[2]), meanC,
		e.op("reshape", perChannel, op.Results[4].Name, invstd)}
}

// backward is batch_norm_grad from its sums: dx, dscale and dbias.
func (e *emitter) backward(op *ir.Op) []*ir.Value {
	dy, x, scale, mean, invstd := op.Operands[0], op.Operands[1], op.Operands[2], op.Operands[3], op.Operands[4]
	name := op.Results[0].Name
	d := scale.Type.DType // the statistics' dtype (bf16 dy and x are read into it)
	dy, x = e.as(dy, d, name+".dy"), e.as(x, d, name+".x")
	axes, bshape, count := e.layout(x)
	bcast := ir.Attrs{"shape": ir.IntsAttr(bshape...)}
	perChannel := ir.Attrs{"shape": ir.IntsAttr(scale.Type.Shape...)}
	inv := e.op("reshape", bcast, name+".invstd", invstd)
	xhat := e.op("mul", nil, name+".xhat", e.op("sub", nil, name+".centred", x, e.op("reshape", bcast, name+".mean", mean)), inv)
	sdy := e.sum(dy, axes, name+".sdy")
	sdyx := e.sum(e.op("mul", nil, name+".dyx", dy, xhat), axes, name+".sdyx")
	k := e.op("mul", nil, name+".k", e.op("reshape", bcast, name+".scale", scale), inv)
	c := e.scalar(d, 1/count, name+".inv_count")
	inner := e.op("sub", nil, name+".d1", e.op("sub", nil, name+".d0", dy, e.op("mul", nil, name+".mdy", sdy, c)),
		e.op("mul", nil, name+".d2", xhat, e.op("mul", nil, name+".mdyx", sdyx, c)))
	dx := e.as(e.op("mul", nil, name, k, inner), op.Results[0].Type.DType, name+".dx")
	return []*ir.Value{dx, e.op("reshape", perChannel, op.Results[1].Name, sdyx), e.op("reshape", perChannel, op.Results[2].Name, sdy)}
}
