package loops

import (
	"fmt"
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

// accessor computes one result of an op at an index of its shape.
type accessor func(idx []Expr) Expr

// elementRule lowers an op whose every result element is an expression of
// a few operand elements (no reduction): such ops are computed where their
// results are read, which is how a fused kernel keeps them out of memory.
type elementRule func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error)

var elementRules = map[string]elementRule{}

func unaryExpr(op *ir.Op, x Expr) Expr {
	a := op.Attrs
	if x.Kind() == I64 {
		switch op.Kind {
		case "neg":
			return sub(Int{0}, x)
		case "abs":
			return sel(cmp("lt", x, Int{0}), sub(Int{0}, x), x)
		case "sign":
			return sel(cmp("gt", x, Int{0}), Int{1}, sel(cmp("lt", x, Int{0}), Int{-1}, Int{0}))
		}
		return x
	}
	one, zero := like(x, 1), like(x, 0)
	switch op.Kind {
	case "relu":
		return sel(cmp("gt", x, zero), x, zero)
	case "neg", "abs", "exp", "log", "sqrt", "tanh", "erf":
		return un(op.Kind, x)
	case "sign":
		return sel(cmp("gt", x, zero), one, sel(cmp("lt", x, zero), like(x, -1), x))
	case "reciprocal":
		return div(one, x)
	case "sigmoid":
		return sigmoidE(x)
	case "identity":
		return x
	case "silu":
		return mul(x, sigmoidE(x))
	case "hard_swish":
		return div(mul(x, maxE(minE(add(x, like(x, 3)), like(x, 6)), zero)), like(x, 6))
	case "gelu":
		if a.String("approximate", "none") == "tanh" {
			u := mul(like(x, 0.7978845608028654), add(x, mul(like(x, 0.044715), mul(x, mul(x, x)))))
			return mul(mul(like(x, 0.5), x), add(one, un("tanh", u)))
		}
		return mul(mul(like(x, 0.5), x), add(one, un("erf", mul(x, like(x, 0.7071067811865476)))))
	case "hard_sigmoid":
		v := add(mul(like(x, a.Float("alpha", 0.2)), x), like(x, a.Float("beta", 0.5)))
		return maxE(minE(v, one), zero)
	}
	return nil
}

// unaryGradExpr is f'(s) for the *_grad ops (s: the saved value).
func unaryGradExpr(op *ir.Op, s Expr) Expr {
	one, zero := like(s, 1), like(s, 0)
	switch op.Kind {
	case "relu_grad":
		return sel(cmp("gt", s, zero), one, zero)
	case "sigmoid_grad":
		return mul(s, sub(one, s))
	case "tanh_grad":
		return sub(one, mul(s, s))
	case "erf_grad":
		return mul(like(s, 2/math.Sqrt(math.Pi)), un("exp", un("neg", mul(s, s))))
	case "silu_grad":
		sg := sigmoidE(s)
		return mul(sg, add(one, mul(s, sub(one, sg))))
	case "hard_swish_grad":
		return sel(cmp("lt", s, like(s, -3)), zero, sel(cmp("gt", s, like(s, 3)), one, div(add(mul(like(s, 2), s), like(s, 3)), like(s, 6))))
	case "gelu_grad":
		if op.Attrs.String("approximate", "none") == "tanh" {
			c := like(s, 0.7978845608028654)
			u := mul(c, add(s, mul(like(s, 0.044715), mul(s, mul(s, s)))))
			t := un("tanh", u)
			left := mul(like(s, 0.5), add(one, t))
			right := mul(mul(mul(like(s, 0.5), s), sub(one, mul(t, t))), mul(c, add(one, mul(like(s, 3*0.044715), mul(s, s)))))
			return add(left, right)
		}
		cdf := mul(like(s, 0.5), add(one, un("erf", mul(s, like(s, 0.7071067811865476)))))
		return add(cdf, div(mul(s, un("exp", mul(like(s, -0.5), mul(s, s)))), like(s, math.Sqrt(2*math.Pi))))
	case "hard_sigmoid_grad":
		al, be := op.Attrs.Float("alpha", 0.2), op.Attrs.Float("beta", 0.5)
		v := add(mul(like(s, al), s), like(s, be))
		return sel(and(cmp("gt", v, zero), cmp("lt", v, one)), like(s, al), zero)
	}
	return nil
}

func binaryExpr(kind string, a, b Expr) Expr {
	k := wider(a.Kind(), b.Kind())
	a, b = conv(a, k), conv(b, k)
	if k == I64 {
		switch kind {
		case "div":
			zero := cmp("eq", b, Int{0})
			return sel(zero, Int{0}, div(a, sel(zero, Int{1}, b)))
		case "max":
			return sel(cmp("gt", a, b), a, b)
		case "min":
			return sel(cmp("lt", a, b), a, b)
		case "pow":
			return conv(bin("pow", conv(a, F64), conv(b, F64)), I64)
		}
	}
	return bin(kind, a, b)
}

func init() {
	for _, name := range []string{"relu", "neg", "abs", "sign", "exp", "log", "sqrt", "reciprocal", "tanh", "sigmoid",
		"identity", "erf", "silu", "hard_swish", "gelu", "hard_sigmoid"} {
		elementRules[name] = func(op *ir.Op, in []Tensor, _ []ir.Type) ([]accessor, error) {
			return []accessor{func(idx []Expr) Expr { return unaryExpr(op, in[0].At(idx)) }}, nil
		}
	}
	for _, name := range []string{"relu_grad", "sigmoid_grad", "tanh_grad", "erf_grad", "silu_grad", "hard_swish_grad", "gelu_grad", "hard_sigmoid_grad"} {
		elementRules[name] = func(op *ir.Op, in []Tensor, _ []ir.Type) ([]accessor, error) {
			return []accessor{func(idx []Expr) Expr { return mul(in[0].At(idx), unaryGradExpr(op, in[1].At(idx))) }}, nil
		}
	}
	for _, name := range []string{"add", "sub", "mul", "div", "max", "min", "pow"} {
		elementRules[name] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
			s := out[0].Shape
			k := ComputeKind(out[0].DType)
			return []accessor{func(idx []Expr) Expr {
				a := conv(in[0].At(bcast(idx, in[0].Type.Shape, s)), k)
				b := conv(in[1].At(bcast(idx, in[1].Type.Shape, s)), k)
				return binaryExpr(op.Kind, a, b)
			}}, nil
		}
	}
	for _, name := range []string{"eq", "ne", "lt", "le", "gt", "ge"} {
		elementRules[name] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
			s := out[0].Shape
			return []accessor{func(idx []Expr) Expr {
				a, b := in[0].At(bcast(idx, in[0].Type.Shape, s)), in[1].At(bcast(idx, in[1].Type.Shape, s))
				if a.Kind() != b.Kind() || a.Kind() == Bool {
					a, b = conv(a, F64), conv(b, F64)
				}
				return cmp(op.Kind, a, b)
			}}, nil
		}
	}
	elementRules["where"] = func(_ *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		s := out[0].Shape
		k := ComputeKind(out[0].DType)
		return []accessor{func(idx []Expr) Expr {
			c := conv(in[0].At(bcast(idx, in[0].Type.Shape, s)), Bool)
			return sel(c, conv(in[1].At(bcast(idx, in[1].Type.Shape, s)), k), conv(in[2].At(bcast(idx, in[2].Type.Shape, s)), k))
		}}, nil
	}
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
	elementRules["cast"] = func(_ *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		k := ComputeKind(out[0].DType)
		return []accessor{func(idx []Expr) Expr {
			x := in[0].At(idx)
			if x.Kind().IsFloat() && k == I64 {
				// NaN and infinities become 0; the rest truncates.
				big := like(x, 9.2e18)
				ok := and(cmp("lt", un("abs", x), big), cmp("eq", x, x))
				return sel(ok, conv(sel(ok, x, like(x, 0)), I64), Int{0})
			}
			return conv(x, k)
		}}, nil
	}
	elementRules["dropout"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		ratio := op.Attrs.Float("ratio", 0.5)
		keep := dropoutKeep(op, out[0].Shape)
		return []accessor{
			func(idx []Expr) Expr {
				x := in[0].At(idx)
				return sel(keep(idx), mul(x, like(x, 1/(1-ratio))), like(x, 0))
			},
			keep,
		}, nil
	}
	elementRules["dropout_grad"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		scale := 1 / (1 - op.Attrs.Float("ratio", 0.5))
		keep := dropoutKeep(op, out[0].Shape)
		if len(in) == 2 {
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
		perm := op.Attrs.Ints("perm", nil)
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
		ax, _ := ir.NormalizeAxis(op.Attrs.Int("axis", 0), out[0].Rank())
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
					e = sel(cmp("lt", idx[ax], Int{off}), e, v)
				}
				off += w
			}
			return e
		}}, nil
	}
	elementRules["split"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		ax, _ := ir.NormalizeAxis(op.Attrs.Int("axis", 0), in[0].Type.Rank())
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
		sl, err := ir.SliceOf(in[0].Type.Shape, op.Attrs)
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
		sl, err := ir.SliceOf(out[0].Shape, op.Attrs)
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
					ok = and(ok, cmp("eq", rem(d, Int{sl.Step[i]}), Int{0}))
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
		ax, _ := ir.NormalizeAxis(op.Attrs.Int("axis", 0), data.Type.Rank())
		ir_ := ind.Type.Rank()
		d := data.Type.Shape[ax]
		return []accessor{func(idx []Expr) Expr {
			j := conv(ind.At(idx[ax:ax+ir_]), I64)
			j = clamp(sel(cmp("lt", j, Int{0}), add(j, Int{d}), j), d)
			src := append(append(append([]Expr(nil), idx[:ax]...), j), idx[ax+ir_:]...)
			return data.At(src)
		}}, nil
	}
	elementRules["pad"] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
		pads := op.Attrs.Ints("pads", nil)
		x := in[0]
		v := op.Attrs.Float("value", 0)
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
		eps := op.Attrs.Float("epsilon", 1e-5)
		return []accessor{func(idx []Expr) Expr {
			x := in[0].At(idx)
			c := idx[1:2]
			k := div(in[1].At(c), un("sqrt", add(in[4].At(c), like(x, eps))))
			return add(mul(sub(x, in[3].At(c)), k), in[2].At(c))
		}}, nil
	}
}

// errUnsupported names an op the backend cannot compile.
func errUnsupported(op *ir.Op) error {
	return fmt.Errorf("the LLVM backend has no lowering for op %q", op.Kind)
}

// dropoutKeep is dropout's mask at an index of a tensor of shape s: the
// counter-based RNG of the op's seed and ratio (interp.DropoutKeep).
func dropoutKeep(op *ir.Op, s ir.Shape) accessor {
	ratio := op.Attrs.Float("ratio", 0.5)
	seed := uint64(op.Attrs.Int("seed", 0))
	return func(idx []Expr) Expr {
		i := flatten(idx, s)
		h := &Mix{X: &Binary{Op: "xor", A: Int{int64(seed * 0x9E3779B97F4A7C15)}, B: &Mix{X: add(i, Int{0x632BE59BD9B4E019})}}}
		u := mul(conv(&Binary{Op: "shr", A: h, B: Int{11}}, F64), Float{V: 1.0 / (1 << 53), K: F64})
		return cmp("ge", u, Float{V: ratio, K: F64})
	}
}
