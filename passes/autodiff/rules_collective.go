package autodiff

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
)

// Gradients of collectives, for the loss summed over the ranks (each
// rank's loss counts once): the gradient of an all_reduce sum is the
// all_reduce of the gradients; of a max or min, that sum where the rank
// held the extreme (every tied rank gets it); an all_gather's is the
// reduce_scatter of its gradient, and a reduce_scatter's the all_gather.
func init() {
	group := func(op *ir.Op) ir.Attrs {
		size, stride := ir.CollectiveGroup(op)
		return ir.Attrs{"size": ir.IntAttr(size), "stride": ir.IntAttr(stride)}
	}
	rules["all_reduce"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		sum := b.one("all_reduce", group(op), grad(op), dys[0])
		if op.Attr().String("op") == "sum" {
			return []*ir.Value{sum}
		}
		held := b.one("eq", nil, grad(op), op.Operands[0], op.Results[0])
		return []*ir.Value{b.one("where", nil, grad(op), held, sum, b.scalar(sum.Type.DType, 0, "zero"))}
	}
	rules["all_gather"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		a := group(op)
		a["axis"] = ir.IntAttr(op.Attr().Int("axis"))
		return []*ir.Value{b.one("reduce_scatter", a, grad(op), dys[0])}
	}
	rules["reduce_scatter"] = func(b *builder, op *ir.Op, dys []*ir.Value, _ []bool) []*ir.Value {
		if r := op.Attr().String("op"); r != "sum" && b.err == nil {
			b.err = fmt.Errorf("%s: the gradient of a reduce_scatter by %s is not built (only a sum's)", op.Results[0].Ref(), r)
		}
		a := group(op)
		a["axis"] = ir.IntAttr(op.Attr().Int("axis"))
		return []*ir.Value{b.one("all_gather", a, grad(op), dys[0])}
	}
}
