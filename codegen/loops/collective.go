package loops

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
)

// Collective is a step that exchanges a buffer among the ranks of a
// group (ir.GroupOf): the backends call their runtime (MPI for the LLVM
// backend). In is laid out as Outer × D × Inner around the op's axis (D
// the axis's extent in In; Outer = 1 and Inner = the element count for
// ops without an axis); Out is the op's result. Reduce is sum, max or
// min; Root is broadcast's root within the group.
type Collective struct {
	Kind               string
	Reduce             string
	In, Out            *Buffer
	Outer, D, Inner    int64
	Size, Stride, Root int64
}

// Collectives lower as copies on a group of one rank; across ranks, as a
// Collective step on the operand in a buffer of its own.
func init() {
	for _, name := range []string{"all_reduce", "reduce_scatter", "all_gather", "broadcast"} {
		stageRules[name] = func(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
			size, stride := ir.CollectiveGroup(op)
			if size == 1 {
				b.store(out[0], in[0].At)
				return nil
			}
			x := in[0]
			switch x.Type.DType {
			case ir.F32, ir.F64, ir.I64:
			default:
				return fmt.Errorf("%s of %s: compiled collectives carry f32, f64 and i64 tensors", op.Kind, x.Type)
			}
			src := x.Buf
			if src == nil || src.Storage == Const {
				src = b.temp("c", x.Type)
				b.store(src, x.At)
			}
			c := &Collective{Kind: op.Kind, In: src, Out: out[0], Outer: 1, D: 1, Inner: x.Type.NumElements(), Size: size, Stride: stride}
			a := op.Attr()
			switch op.Kind {
			case "all_reduce":
				c.Reduce = a.String("op")
			case "reduce_scatter", "all_gather":
				ax, err := ir.NormalizeAxis(a.Int("axis"), len(x.Type.Shape))
				if err != nil {
					return err
				}
				c.Outer, _ = x.Type.Shape[:ax].NumElements()
				c.D = x.Type.Shape[ax]
				c.Inner, _ = x.Type.Shape[ax+1:].NumElements()
				c.Reduce = "sum"
			case "broadcast":
				c.Root = a.Int("root")
			}
			b.add(c)
			return nil
		}
	}
}
