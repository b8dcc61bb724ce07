// Package autodiff is the `autodiff` pass: reverse-mode differentiation
// that rewrites a forward function into a training step returning the
// loss and one gradient per param argument. The backward ops are ordinary
// ops appended after the forward ones, so saved forward values are plain
// SSA values that later passes (liveness, remat, swap) see.
package autodiff

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "autodiff",
		Summary:     "turn each forward function into a training step returning loss and grad.<param> for every param",
		Excludes:    []passes.Property{passes.TrainingStep, passes.Fused, passes.OptimizerStep},
		Establishes: []passes.Property{passes.TrainingStep},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		ste := ctx.Allows(STE)
		through, zero := 0, 0
		for _, f := range m.Funcs {
			r, err := differentiate(f, o.Loss, o.KeepOutputs, ste)
			if err != nil {
				return err
			}
			ctx.AddStat("backward-ops", int64(r.ops))
			through += r.throughRounds
			zero += r.zeroRounds
		}
		if through > 0 {
			ctx.Approximate(STE, fmt.Sprintf("the gradient passes straight through %d fake-quantisation round(s)", through))
		}
		if zero > 0 {
			ctx.Note(fmt.Sprintf("the gradient through %d fake-quantisation round(s) is 0, round's derivative: --allow %s passes it straight through, as PyTorch's fake quantisation trains", zero, STE))
		}
		return nil
	}))
}

// STE is the approximation that passes the gradient of a fake
// quantiser's round (ir.AttrStraightThrough) through unchanged.
const STE = "ste"

func init() {
	passes.RegisterApproximation(STE, "the gradient passes unchanged through the round of a fake quantiser (ONNX QuantizeLinear feeding DequantizeLinear), the straight-through estimate PyTorch's fake quantisation trains with, where round's derivative is 0")
}

type options struct {
	Loss        string `opt:"loss" enum:"sum|mean|none" default:"sum" doc:"loss from the first result when it is not a scalar: its sum or mean; none requires a scalar"`
	KeepOutputs bool   `opt:"keep-outputs" default:"false" doc:"also return the forward results after the gradients"`
}

// builder appends new ops to the function.
type builder struct {
	f   *ir.Func
	loc ir.Location
	err error
	n   int
	// straightThrough: fake quantisers' rounds pass the gradient
	// through (the ste approximation); the counts say how many rounds
	// did and how many gave 0 instead.
	straightThrough           bool
	throughRounds, zeroRounds int
}

// emit appends an op and returns its results; the first error sticks and
// later calls return placeholders.
func (b *builder) emit(kind string, operands []*ir.Value, attrs ir.Attrs, base string) []*ir.Value {
	if b.err != nil {
		return make([]*ir.Value, 8)
	}
	op, err := b.f.NewOp(kind, operands, attrs, b.loc, base)
	if err != nil {
		b.err = fmt.Errorf("building the gradient: %v", err)
		return make([]*ir.Value, 8)
	}
	b.f.Body = append(b.f.Body, op)
	b.n++
	return op.Results
}

func (b *builder) one(kind string, attrs ir.Attrs, base string, operands ...*ir.Value) *ir.Value {
	return b.emit(kind, operands, attrs, base)[0]
}

// constant emits a splat constant of type t.
func (b *builder) constant(t ir.Type, v float64, base string) *ir.Value {
	d := &ir.Dense{Type: t}
	if t.DType.IsFloat() {
		d.Floats = []float64{ir.RoundTo(t.DType, v)}
	} else {
		d.Ints = []int64{int64(v)}
	}
	return b.one("constant", ir.Attrs{"value": ir.DenseAttr(d)}, base)
}

// seed emits the loss-gradient seed d loss / d loss = 1 of type t, marked
// with its role so that later passes (mixed precision) find it and CSE
// and folding keep it.
func (b *builder) seed(t ir.Type) *ir.Value {
	d := &ir.Dense{Type: t, Floats: []float64{1}}
	return b.one("constant", ir.Attrs{"value": ir.DenseAttr(d), "role": ir.StringAttr(ir.RoleLossSeed)}, "loss.grad")
}

// scalar emits a rank-0 constant of dtype d.
func (b *builder) scalar(d ir.DType, v float64, base string) *ir.Value {
	return b.constant(ir.Type{DType: d, Shape: ir.Shape{}}, v, base)
}

// sumTo reduces g to shape s when broadcasting made it larger.
func (b *builder) sumTo(g *ir.Value, s ir.Shape, base string) *ir.Value {
	if g == nil || g.Type.Shape.Equal(s) {
		return g
	}
	return b.one("sum_to", ir.Attrs{"shape": ir.IntsAttr(s...)}, base, g)
}

// Differentiate rewrites f into its training step and returns the number
// of backward ops it added.
func Differentiate(f *ir.Func, lossMode string, keepOutputs bool) (int, error) {
	r, err := differentiate(f, lossMode, keepOutputs, false)
	return r.ops, err
}

// differentiation is what differentiate built: the backward ops, and
// the fake quantisers' rounds the gradient passed straight through or
// stopped at.
type differentiation struct{ ops, throughRounds, zeroRounds int }

// differentiate is Differentiate; with straightThrough, the rounds of
// fake quantisers pass the gradient through unchanged.
func differentiate(f *ir.Func, lossMode string, keepOutputs, straightThrough bool) (differentiation, error) {
	if len(f.Results) == 0 {
		return differentiation{}, fmt.Errorf("@%s has no result to differentiate", f.Name)
	}
	forward := append([]*ir.Op(nil), f.Body...)
	outputs := append([]ir.Result(nil), f.Results...)
	b := &builder{f: f, straightThrough: straightThrough}
	out := f.Results[0].Value
	if !out.Type.DType.IsFloat() {
		return differentiation{}, fmt.Errorf("@%s: the first result %s is %s; a loss must be floating-point", f.Name, out.Ref(), out.Type)
	}
	loss := out
	if out.Type.NumElements() != 1 {
		switch lossMode {
		case "sum":
			loss = b.one("reduce_sum", nil, "loss", out)
		case "mean":
			loss = b.one("reduce_mean", nil, "loss", out)
		default:
			return differentiation{}, fmt.Errorf("@%s: loss=none needs a scalar first result, got %s", f.Name, out.Type)
		}
	} else if out.Type.Rank() > 0 {
		loss = b.one("reshape", ir.Attrs{"shape": ir.IntsAttr()}, "loss", out)
	}
	if b.err != nil {
		return differentiation{}, b.err
	}

	// Values that depend on a param carry gradients.
	requires := map[*ir.Value]bool{}
	for _, a := range f.Args {
		if a.Arg.Kind == ir.ArgParam && a.Type.DType.IsFloat() {
			requires[a] = true
		}
	}
	for _, op := range forward {
		dep := false
		for _, v := range op.Operands {
			dep = dep || requires[v]
		}
		for _, r := range op.Results {
			if dep && r.Type.DType.IsFloat() {
				requires[r] = true
			}
		}
	}
	// Ops the loss depends on.
	contributes := map[*ir.Value]bool{loss: true, out: true}
	for i := len(forward) - 1; i >= 0; i-- {
		op := forward[i]
		live := false
		for _, r := range op.Results {
			live = live || contributes[r]
		}
		if live {
			for _, v := range op.Operands {
				contributes[v] = true
			}
		}
	}

	grads := map[*ir.Value]*ir.Value{}
	accumulate := func(v, g *ir.Value) {
		if g == nil || !requires[v] {
			return
		}
		if !g.Type.Equal(v.Type) {
			b.err = fmt.Errorf("internal error: gradient of %s has type %s, want %s", v.Ref(), g.Type, v.Type)
			return
		}
		if prev, ok := grads[v]; ok {
			g = b.one("add", nil, v.Name+".grad", prev, g)
		}
		grads[v] = g
	}
	if out.Def != nil {
		b.loc = out.Def.Loc
	}
	if loss != out {
		// d loss / d out of a sum or mean is a broadcast of the seed.
		seed := b.seed(ir.Type{DType: loss.Type.DType, Shape: ir.Shape{}})
		g := seed
		if lossMode == "mean" {
			g = b.one("mul", nil, out.Name+".grad", seed, b.scalar(loss.Type.DType, 1/float64(out.Type.NumElements()), "mean.scale"))
		}
		if out.Type.Rank() > 0 {
			g = b.one("expand", ir.Attrs{"shape": ir.IntsAttr(out.Type.Shape...)}, out.Name+".grad", g)
		}
		if requires[out] {
			grads[out] = g
		}
	} else if requires[out] {
		grads[out] = b.seed(out.Type)
	}

	for i := len(forward) - 1; i >= 0 && b.err == nil; i-- {
		op := forward[i]
		dys := make([]*ir.Value, len(op.Results))
		any := false
		for j, r := range op.Results {
			dys[j] = grads[r]
			any = any || dys[j] != nil
		}
		if !any {
			continue
		}
		need := make([]bool, len(op.Operands))
		needAny := false
		for j, v := range op.Operands {
			need[j] = requires[v] && contributes[v]
			needAny = needAny || need[j]
		}
		if !needAny {
			continue
		}
		rule := rules[op.Kind]
		if d := op.Def(); rule == nil && d != nil && d.Grad == ir.GradZero {
			// Piecewise constant, registered after the rules were made
			// (an op a plugin adds).
			rule = func(_ *builder, op *ir.Op, _ []*ir.Value, _ []bool) []*ir.Value {
				return make([]*ir.Value, len(op.Operands))
			}
		}
		if rule == nil {
			where := ""
			if !op.Loc.IsUnknown() {
				where = " at " + op.Loc.String()
			} else if op.Pos.IsValid() {
				where = " at " + op.Pos.String()
			}
			return differentiation{}, fmt.Errorf("op %s defining %s%s is not differentiable, but it lies on the path from a param to the loss", op.Kind, op.Results[0].Ref(), where)
		}
		b.loc = op.Loc
		gs := rule(b, op, dys, need)
		for j, g := range gs {
			if j < len(need) && need[j] {
				accumulate(op.Operands[j], g)
			}
		}
	}
	if b.err != nil {
		return differentiation{}, b.err
	}
	b.loc = ir.Location{}
	results := []ir.Result{{Name: "loss", Value: loss, Attrs: ir.Attrs{"role": ir.StringAttr(ir.RoleLoss)}}}
	for _, a := range f.Args {
		if a.Arg.Kind != ir.ArgParam || !a.Type.DType.IsFloat() {
			continue // an integer parameter (an index buffer) has no gradient
		}
		g := grads[a]
		if g == nil {
			g = b.constant(a.Type, 0, a.Name+".grad")
		}
		results = append(results, ir.Result{Name: "grad." + a.Name, Value: g,
			Attrs: ir.Attrs{"role": ir.StringAttr(ir.RoleGrad), "param": ir.StringAttr(a.Name)}})
	}
	if keepOutputs {
		results = append(results, outputs...)
	}
	if b.err != nil {
		return differentiation{}, b.err
	}
	f.Results = results
	return differentiation{ops: b.n, throughRounds: b.throughRounds, zeroRounds: b.zeroRounds}, nil
}
