package loops

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// accessor computes one result of an op at an index of its shape.
type accessor func(idx []Expr) Expr

// elementRule lowers an op whose every result element is an expression of
// a few operand elements (no reduction): such ops are computed where their
// results are read, which is how a fused kernel keeps them out of memory.
type elementRule func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error)

var elementRules = map[string]elementRule{}

// Every op whose record has a Scalar lowers through scalarRule: the
// loop lowering has no semantics of its own for them.
func init() {
	for _, name := range ir.OpNames() {
		if ir.Lookup(name).Scalar != nil && elementRules[name] == nil {
			elementRules[name] = scalarRule
		}
	}
}

// scalarRule computes each result element by translating the op's scalar
// expression. Floats compute in f64 where an operand or the result is
// f64, in f32 otherwise.
func scalarRule(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
	types := make([]ir.Type, len(in))
	kinds := make([]scalar.Kind, len(in))
	fk := ComputeKind(out[0].DType)
	for i, t := range in {
		types[i], kinds[i] = t.Type, ir.KindOf(t.Type.DType)
		if t.Type.DType == ir.F64 {
			fk = F64
		}
	}
	if !fk.IsFloat() {
		fk = F32
	}
	t, err := scalar.Resolve(op.Def().Scalar(op.Attr(), types, out[0]), kinds, ir.KindOf(out[0].DType))
	if err != nil {
		return nil, err
	}
	s := out[0].Shape
	return []accessor{func(idx []Expr) Expr {
		ops := make([]Expr, len(in))
		for i, x := range in {
			ops[i] = x.At(bcast(idx, x.Type.Shape, s))
		}
		return lowerScalar(t, ops, fk)
	}}, nil
}

// kindIn is the loop kind of a scalar kind, with floats in fk.
func kindIn(k scalar.Kind, fk Kind) Kind {
	switch k {
	case scalar.Int:
		return I64
	case scalar.Uint:
		return U64
	case scalar.Bool:
		return Bool
	}
	return fk
}

// lowerScalar translates a resolved scalar expression over the operands'
// loop expressions.
func lowerScalar(t *scalar.Typed, ops []Expr, fk Kind) Expr {
	k := kindIn(t.Kind, fk)
	switch t.Node {
	case scalar.Operand:
		return conv(ops[t.Index], k)
	case scalar.Const:
		switch k {
		case I64:
			return Int{scalar.SaturatingInt(t.Value)}
		case U64:
			return &Convert{To: U64, X: Int{scalar.SaturatingUint(t.Value)}}
		case Bool:
			return BoolConst{t.Value != 0}
		}
		return fconst(k, t.Value)
	case scalar.Convert:
		return conv(lowerScalar(t.Args[0], ops, fk), k)
	case scalar.Select:
		return sel(lowerScalar(t.Args[0], ops, fk), lowerScalar(t.Args[1], ops, fk), lowerScalar(t.Args[2], ops, fk))
	}
	ak := kindIn(t.ArgKind, fk)
	args := make([]Expr, len(t.Args))
	for i, a := range t.Args {
		args[i] = conv(lowerScalar(a, ops, fk), ak)
	}
	p := t.Prim
	switch {
	case p.Arity() == 1:
		return un(p, args[0])
	case p.IsCompare():
		return cmp(p, args[0], args[1])
	case ak == I64:
		return intBinary(p, args[0], args[1])
	case ak == U64 && (p == scalar.Div || p == scalar.Rem):
		// Unsigned: only a zero divisor needs care.
		zero := cmp(scalar.Eq, args[1], conv(Int{0}, U64))
		return sel(zero, conv(Int{0}, U64), bin(p, args[0], sel(zero, conv(Int{1}, U64), args[1])))
	}
	return bin(p, args[0], args[1])
}

// intBinary is a binary primitive on i64 operands, defined everywhere as
// scalar.Prim documents: division and remainder by 0 give 0 (and by -1
// never trap), pow goes through f64.
func intBinary(p scalar.Prim, a, b Expr) Expr {
	switch p {
	case scalar.Div:
		zero, minus := cmp(scalar.Eq, b, Int{0}), cmp(scalar.Eq, b, Int{-1})
		safe := sel(zero, Int{1}, sel(minus, Int{1}, b))
		return sel(zero, Int{0}, sel(minus, sub(Int{0}, a), div(a, safe)))
	case scalar.Rem:
		bad := &Binary{Op: scalar.Or, A: cmp(scalar.Eq, b, Int{0}), B: cmp(scalar.Eq, b, Int{-1})}
		return sel(bad, Int{0}, rem(a, sel(bad, Int{1}, b)))
	}
	return bin(p, a, b) // Pow on integers: backends call a helper (interp.IntPow)
}

func init() {
	elementRules["constant"] = func(op *ir.Op, _ []Tensor, out []ir.Type) ([]accessor, error) {
		d := op.Attrs["value"].Dense
		k := ComputeKind(out[0].DType)
		if d.IsSplat() || d.AllEqual() {
			var v Expr
			if k.IsFloat() {
				v = fconst(k, d.Float(0))
			} else if k == Bool {
				v = BoolConst{d.Int(0) != 0}
			} else {
				v = Int{d.Int(0)}
			}
			return []accessor{func([]Expr) Expr { return v }}, nil
		}
		b := &Buffer{Name: "const", Type: out[0], Storage: Const, Data: d}
		return []accessor{func(idx []Expr) Expr { return &Load{Buf: b, Index: idx} }}, nil
	}
	elementRules["dropout"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		ratio := op.Attr().Float("ratio")
		keep := dropoutKeep(op, in, out[0].Shape)
		return []accessor{
			func(idx []Expr) Expr {
				x := in[0].At(idx)
				return sel(keep(idx), mul(x, like(x, 1/(1-ratio))), like(x, 0))
			},
			keep,
		}, nil
	}
	elementRules["random_uniform"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		seed := uint64(op.Attr().Int("seed"))
		s := out[0].Shape
		return []accessor{func(idx []Expr) Expr { return uniform(seed, counter(op, in, flatten(idx, s))) }}, nil
	}
	elementRules["dropout_grad"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		scale := 1 / (1 - op.Attr().Float("ratio"))
		keep := dropoutKeep(op, in, out[0].Shape)
		if len(in) == 2 && ir.RandomKey(op) == nil {
			keep = func(idx []Expr) Expr { return conv(in[1].At(idx), Bool) }
		}
		return []accessor{func(idx []Expr) Expr {
			g := in[0].At(idx)
			return sel(keep(idx), mul(g, like(g, scale)), like(g, 0))
		}}, nil
	}
	for _, name := range []string{"reshape", "flatten", "squeeze", "unsqueeze", "swap_out", "swap_in"} {
		elementRules[name] = func(_ *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
			v := view(in[0], out[0].Shape)
			return []accessor{v.At}, nil
		}
	}
	elementRules["transpose"] = func(op *ir.Op, in []Tensor, _ []ir.Type) ([]accessor, error) {
		perm := op.Attr().Ints("perm")
		return []accessor{func(idx []Expr) Expr {
			src := make([]Expr, len(perm))
			for i, p := range perm {
				src[p] = idx[i]
			}
			return in[0].At(src)
		}}, nil
	}
	elementRules["expand"] = func(_ *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		return []accessor{func(idx []Expr) Expr { return in[0].At(bcast(idx, in[0].Type.Shape, out[0].Shape)) }}, nil
	}
	elementRules["concat"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), out[0].Rank())
		k := ComputeKind(out[0].DType)
		return []accessor{func(idx []Expr) Expr {
			var e Expr
			off := int64(0)
			for _, t := range in {
				w := t.Type.Shape[ax]
				src := append([]Expr(nil), idx...)
				src[ax] = clamp(sub(idx[ax], Int{off}), w)
				v := conv(t.At(src), k)
				if e == nil {
					e = v
				} else {
					e = sel(cmp(scalar.Lt, idx[ax], Int{off}), e, v)
				}
				off += w
			}
			return e
		}}, nil
	}
	elementRules["split"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), in[0].Type.Rank())
		var res []accessor
		off := int64(0)
		for _, t := range out {
			o := off
			res = append(res, func(idx []Expr) Expr {
				src := append([]Expr(nil), idx...)
				src[ax] = add(idx[ax], Int{o})
				return in[0].At(src)
			})
			off += t.Shape[ax]
		}
		return res, nil
	}
	elementRules["slice"] = func(op *ir.Op, in []Tensor, _ []ir.Type) ([]accessor, error) {
		sl, err := ir.SliceOf(in[0].Type.Shape, op.Attr())
		if err != nil {
			return nil, err
		}
		return []accessor{func(idx []Expr) Expr {
			src := make([]Expr, len(idx))
			for i := range idx {
				src[i] = add(Int{sl.Start[i]}, mul(idx[i], Int{sl.Step[i]}))
			}
			return in[0].At(src)
		}}, nil
	}
	elementRules["slice_grad"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		sl, err := ir.SliceOf(out[0].Shape, op.Attr())
		if err != nil {
			return nil, err
		}
		return []accessor{func(idx []Expr) Expr {
			src := make([]Expr, len(idx))
			var ok Expr
			for i := range idx {
				d := sub(idx[i], Int{sl.Start[i]})
				q := div(d, Int{sl.Step[i]})
				if sl.Step[i] != 1 {
					ok = and(ok, cmp(scalar.Eq, rem(d, Int{sl.Step[i]}), Int{0}))
				}
				ok = and(ok, inRange(q, sl.Out[i]))
				src[i] = clamp(q, sl.Out[i])
			}
			g := in[0].At(src)
			if ok == nil {
				return g
			}
			return sel(ok, g, like(g, 0))
		}}, nil
	}
	elementRules["gather"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		data, ind := in[0], in[1]
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), data.Type.Rank())
		ir_ := ind.Type.Rank()
		d := data.Type.Shape[ax]
		return []accessor{func(idx []Expr) Expr {
			j := conv(ind.At(idx[ax:ax+ir_]), I64)
			j = indexInto(j, d, op.Attr().Bool(ir.AttrNegative))
			src := append(append(append([]Expr(nil), idx[:ax]...), j), idx[ax+ir_:]...)
			return data.At(src)
		}}, nil
	}
	elementRules["gather_elements"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		data, ind := in[0], in[1]
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), data.Type.Rank())
		d := data.Type.Shape[ax]
		return []accessor{func(idx []Expr) Expr {
			j := conv(ind.At(idx), I64)
			j = indexInto(j, d, op.Attr().Bool(ir.AttrNegative))
			src := append([]Expr(nil), idx...)
			src[ax] = j
			return data.At(src)
		}}, nil
	}
	elementRules["pad"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		pads := op.Attr().Ints("pads")
		x := in[0]
		v := op.Attr().Float("value")
		return []accessor{func(idx []Expr) Expr {
			src := make([]Expr, len(idx))
			var ok Expr
			for i := range idx {
				p := sub(idx[i], Int{pads[i]})
				if pads[i] != 0 || x.Type.Shape[i] != out[0].Shape[i] {
					ok = and(ok, inRange(p, x.Type.Shape[i]))
					p = clamp(p, x.Type.Shape[i])
				}
				src[i] = p
			}
			e := x.At(src)
			if ok == nil {
				return e
			}
			return sel(ok, e, like(e, v))
		}}, nil
	}
	elementRules["batch_norm_infer"] = func(op *ir.Op, in []Tensor, _ []ir.Type) ([]accessor, error) {
		eps := op.Attr().Float("epsilon")
		return []accessor{func(idx []Expr) Expr {
			x := in[0].At(idx)
			c := idx[1:2]
			k := div(in[1].At(c), un(scalar.Sqrt, add(in[4].At(c), like(x, eps))))
			return add(mul(sub(x, in[3].At(c)), k), in[2].At(c))
		}}, nil
	}
}

// errUnsupported names an op the backend cannot compile.
func errUnsupported(op *ir.Op) error {
	return fmt.Errorf("the LLVM backend has no lowering for op %q", op.Kind)
}

// dropoutKeep is dropout's mask at an index of a tensor of shape s: the
// counter-based RNG of the op's seed and ratio, at the op's offset plus
// the flat index (interp.DropoutKeep).
func dropoutKeep(op *ir.Op, in []Tensor, s ir.Shape) accessor {
	ratio := op.Attr().Float("ratio")
	seed := uint64(op.Attr().Int("seed"))
	return func(idx []Expr) Expr {
		return cmp(scalar.Ge, uniform(seed, counter(op, in, flatten(idx, s))), Float{V: ratio, K: F64})
	}
}

// counter is the number a random op draws for element i of its result:
// i past the op's key operand (if any) and offset, and on a data-parallel
// rank past the ranks before it in its group (ir.RandomOffset).
func counter(op *ir.Op, in []Tensor, i Expr) Expr {
	if ir.RandomKey(op) != nil {
		i = add(i, conv(in[len(in)-1].At(nil), I64))
	}
	a := op.Attr()
	if off := a.Int("offset"); off != 0 {
		i = add(i, Int{off})
	}
	if per := a.Int("rank_offset"); per != 0 && a.Int("rank_size") > 1 {
		i = add(i, mul(&RankIndex{Size: a.Int("rank_size"), Stride: a.Int("rank_stride")}, Int{per}))
	}
	return i
}

// uniform is element i of the counter-based sequence of seed, in f64
// (interp.Uniform).
func uniform(seed uint64, i Expr) Expr {
	h := &Mix{X: &Binary{Op: scalar.Xor, A: Int{int64(seed * 0x9E3779B97F4A7C15)}, B: &Mix{X: add(i, Int{0x632BE59BD9B4E019})}}}
	return mul(conv(&Binary{Op: scalar.Shr, A: h, B: Int{11}}, F64), Float{V: 1.0 / (1 << 53), K: F64})
}

// HasLowering reports whether ops of kind name lower to loops (fused
// kernels lower through their bodies).
func HasLowering(name string) bool { return elementRules[name] != nil || stageRules[name] != nil }
