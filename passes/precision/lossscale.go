package precision

import (
	"github.com/kiln-compiler/kiln/ir"
)

// FiniteResult names the bool result of a step with dynamic loss
// scaling: true when every gradient is finite. The optimizer pass makes
// its updates conditional on it.
const FiniteResult = "grads.finite"

// dynamicScale builds the ops of dynamic loss scaling: the seed is the
// scale state, each returned gradient is divided by the scale and
// summed (a sum is finite exactly when every element is: sums accumulate
// in f64), and at the end of the step the scale and the count of good
// steps are updated in place:
//
//	finite:  good+1 == growth-interval ? (scale*2, 0) : (scale, good+1)
//	else:    (scale/2, 0)
type dynamicScale struct {
	c           Config
	scale, good *ir.Value // the state arguments
	total       *ir.Value // the sum of the unscaled gradients so far
}

func newDynamicScale(f *ir.Func, c Config) *dynamicScale {
	scalar := ir.Type{DType: ir.F32, Shape: ir.Shape{}}
	return &dynamicScale{
		c:     c,
		scale: f.AddState("loss_scale", &ir.Dense{Type: scalar, Floats: []float64{c.InitScale}}, true),
		good:  f.AddState("loss_scale.good", &ir.Dense{Type: scalar, Floats: []float64{0}}, true),
	}
}

// constant emits an f32 scalar.
func (d *dynamicScale) constant(r *rewriter, x float64, name string) *ir.Value {
	t := ir.Type{DType: ir.F32, Shape: ir.Shape{}}
	return r.emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: t, Floats: []float64{x}})}, ir.Location{}, name)
}

// unscale returns the gradient g (f32) divided by the scale (a power of
// two: exact), and adds its sum to the finiteness check's.
func (d *dynamicScale) unscale(r *rewriter, g *ir.Value, name string) *ir.Value {
	u := r.emit("div", []*ir.Value{g, d.scale}, nil, ir.Location{}, name+".unscaled")
	sum := r.emit("reduce_sum", []*ir.Value{u}, nil, ir.Location{}, name+".sum")
	if d.total == nil {
		d.total = sum
	} else {
		d.total = r.emit("add", []*ir.Value{d.total, sum}, nil, ir.Location{}, "grads.sum")
	}
	for _, v := range []*ir.Value{u, sum, d.total} {
		r.early[v.Def] = true
	}
	return u
}

// finish adds the finiteness check, the result grads.finite and the
// in-place updates of the scale state.
func (d *dynamicScale) finish(r *rewriter) {
	zero := d.constant(r, 0, "loss_scale.zero")
	total := d.total
	if total == nil {
		total = zero // no gradient: nothing can overflow
	}
	// x*0 is 0 for finite x and NaN for infinities and NaN.
	probe := r.emit("mul", []*ir.Value{total, zero}, nil, ir.Location{}, "grads.probe")
	finite := r.emit("eq", []*ir.Value{probe, zero}, nil, ir.Location{}, "grads.finite")

	good1 := r.emit("add", []*ir.Value{d.good, d.constant(r, 1, "loss_scale.one")}, nil, ir.Location{}, "loss_scale.good1")
	grow := r.emit("ge", []*ir.Value{good1, d.constant(r, float64(d.c.GrowthInterval), "loss_scale.interval")}, nil, ir.Location{}, "loss_scale.grow")
	doubled := r.emit("mul", []*ir.Value{d.scale, d.constant(r, 2, "loss_scale.growth")}, nil, ir.Location{}, "loss_scale.doubled")
	halved := r.emit("mul", []*ir.Value{d.scale, d.constant(r, 0.5, "loss_scale.backoff")}, nil, ir.Location{}, "loss_scale.halved")
	kept := r.emit("where", []*ir.Value{grow, doubled, d.scale}, nil, ir.Location{}, "loss_scale.kept")
	next := r.emit("where", []*ir.Value{finite, kept, halved}, nil, ir.Location{}, "loss_scale.next")
	counted := r.emit("where", []*ir.Value{grow, zero, good1}, nil, ir.Location{}, "loss_scale.counted")
	nextGood := r.emit("where", []*ir.Value{finite, counted, zero}, nil, ir.Location{}, "loss_scale.good.next")
	for _, w := range [][2]*ir.Value{{d.scale, next}, {d.good, nextGood}} {
		op, err := r.f.NewOp("overwrite", w[:], nil, ir.Location{}, "")
		if err != nil {
			panic("precision: " + err.Error())
		}
		r.body = append(r.body, op)
	}
	r.f.Results = append(r.f.Results, ir.Result{Name: FiniteResult, Value: finite, Attrs: ir.Attrs{"role": ir.StringAttr(ir.RoleGradsFinite)}})
}

// hoistUnscaling moves each op of early (a result's cast to its dtype,
// a gradient's unscaling, the running sum that checks them) from
// the end of the step to right after the last op it reads, so that a
// scaled gradient is freed as soon as it is complete instead of living
// beside its final copy to the end of the step. An op that reads only
// arguments (a fixed scale's constant) goes right before its first reader.
func hoistUnscaling(body []*ir.Op, early map[*ir.Op]bool) []*ir.Op {
	pos := map[*ir.Op]int{}
	for i, op := range body {
		pos[op] = i
	}
	var rest []*ir.Op
	after := map[*ir.Op][]*ir.Op{}
	lazy := map[*ir.Op]bool{}     // reads only arguments: placed by its readers
	placed := map[*ir.Op]*ir.Op{} // a hoisted op and the op it follows
	for _, op := range body {
		if !early[op] {
			rest = append(rest, op)
			continue
		}
		var at *ir.Op
		for _, x := range op.Operands {
			def := x.Def
			if p, ok := placed[def]; ok {
				def = p // follows a hoisted op: goes where that one went
			}
			if lazy[def] {
				continue // emitted right before this op
			}
			if def != nil && (at == nil || pos[def] > pos[at]) {
				at = def
			}
		}
		if at == nil {
			lazy[op] = true
			continue
		}
		placed[op] = at
		after[at] = append(after[at], op)
	}
	var out []*ir.Op
	var emit func(op *ir.Op)
	emit = func(op *ir.Op) {
		for _, x := range op.Operands {
			if lazy[x.Def] {
				delete(lazy, x.Def)
				emit(x.Def)
			}
		}
		out = append(out, op)
		for _, h := range after[op] {
			emit(h)
		}
	}
	for _, op := range rest {
		emit(op)
	}
	for _, op := range body { // read by nothing
		if lazy[op] {
			out = append(out, op)
		}
	}
	return out
}
