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
//
// A send (In, nil Out) or recv (Out, nil In) moves its buffer to or from
// rank r+Peer, matched by Tag.
type Collective struct {
	Kind               string
	Reduce             string
	In, Out            *Buffer
	Outer, D, Inner    int64
	Size, Stride, Root int64
	Peer, Tag          int64
}

// Collectives lower as copies on a group of one rank; across ranks, as a
// Collective step on the operand in a buffer of its own.
func init() {
	stageRules["send"] = func(b *builder, op *ir.Op, in []Tensor, _ []*Buffer) error {
		x := in[0]
		src := x.Buf
		if src == nil || src.Storage == Const {
			src = b.temp("c", x.Type)
			b.store(src, x.At)
		}
		a := op.Attr()
		b.add(&Collective{Kind: "send", In: src, Outer: 1, D: 1, Inner: x.Type.NumElements(), Peer: a.Int("offset"), Tag: a.Int("tag")})
		return nil
	}
	stageRules["recv"] = func(b *builder, op *ir.Op, _ []Tensor, out []*Buffer) error {
		a := op.Attr()
		b.add(&Collective{Kind: "recv", Out: out[0], Outer: 1, D: 1, Inner: out[0].Type.NumElements(), Peer: a.Int("offset"), Tag: a.Int("tag")})
		return nil
	}
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
				if op.Kind == "reduce_scatter" {
					c.Reduce = a.String("op")
				}
				if c.Outer > 1 {
					return contiguous(b, op, c, FromBuffer(src), out[0], ax)
				}
			case "broadcast":
				c.Root = a.Int("root")
			}
			b.add(c)
			return nil
		}
	}
}

// contiguous lowers a reduce_scatter or all_gather along a dimension
// with leading elements (Outer > 1) as one over contiguous parts, as
// NCCL's and MPI's calls exchange them: the operand's parts are packed
// rank-major before a reduce_scatter ([size, outer, d, inner] with
// d = D/size: each rank receives its part in its own layout), and an
// all_gather's [size, outer, d, inner] result is unpacked after it.
func contiguous(b *builder, op *ir.Op, c *Collective, x Tensor, out *Buffer, ax int) error { // x in a buffer
	s := x.Type.Shape
	lead, trail := s[:ax], s[ax+1:]
	index := func(o, j, i Expr) []Expr { // x's index of outer o, axis j, inner i
		return append(append(unflatten(o, lead), j), unflatten(i, trail)...)
	}
	if op.Kind == "reduce_scatter" {
		d := c.D / c.Size
		packed := b.temp("c", ir.Type{DType: x.Type.DType, Shape: ir.Shape{c.Size, c.Outer, d, c.Inner}})
		b.store(packed, func(idx []Expr) Expr {
			return x.At(index(idx[1], add(mul(idx[0], Int{V: d}), idx[2]), idx[3]))
		})
		c.In, c.Outer, c.D, c.Inner = packed, 1, c.Size, c.Outer*d*c.Inner
		b.add(c)
		return nil
	}
	d := c.D
	gathered := b.temp("c", ir.Type{DType: x.Type.DType, Shape: ir.Shape{c.Size, c.Outer, d, c.Inner}})
	c.In, c.Out, c.Outer, c.D, c.Inner = x.Buf, gathered, 1, 1, c.Outer*d*c.Inner
	b.add(c)
	g := FromBuffer(gathered)
	b.store(out, func(idx []Expr) Expr {
		o := flatten(idx[:ax], lead)
		i := flatten(idx[ax+1:], trail)
		j := idx[ax]
		return g.At([]Expr{div(j, Int{V: d}), o, rem(j, Int{V: d}), i})
	})
	return nil
}
