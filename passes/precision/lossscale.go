package precision

import (
	"github.com/kiln-compiler/kiln/ir"
)

// FiniteResult names the bool result of a step with dynamic loss
// scaling: true when every gradient is finite. The optimizer pass makes
// its updates conditional on it.
const FiniteResult = "grads.finite"

// dynamicScale builds the ops of dynamic loss scaling: the seed is the
// scale state, each returned gradient is multiplied by 1/scale and
// summed (a sum is finite exactly when every element is: sums accumulate
// in f64), and at the end of the step the scale and the count of good
// steps are updated in place:
//
//	finite:  good+1 == growth-interval ? (scale*2, 0) : (scale, good+1)
//	else:    (scale/2, 0)
type dynamicScale struct {
	c           Config
	scale, good *ir.Value // the state arguments
	inv         *ir.Value // 1/scale, made at the first gradient
	sums        []*ir.Value
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

// unscale returns the gradient g (f32) divided by the scale, and keeps
// its sum for the finiteness check.
func (d *dynamicScale) unscale(r *rewriter, g *ir.Value, name string) *ir.Value {
	if d.inv == nil {
		d.inv = r.emit("reciprocal", []*ir.Value{d.scale}, nil, ir.Location{}, "loss_scale.inv")
	}
	u := r.emit("mul", []*ir.Value{g, d.inv}, nil, ir.Location{}, name+".unscaled")
	d.sums = append(d.sums, r.emit("reduce_sum", []*ir.Value{u}, nil, ir.Location{}, name+".sum"))
	return u
}

// finish adds the finiteness check, the result grads.finite and the
// in-place updates of the scale state.
func (d *dynamicScale) finish(r *rewriter) {
	zero := d.constant(r, 0, "loss_scale.zero")
	total := zero
	for _, s := range d.sums {
		total = r.emit("add", []*ir.Value{total, s}, nil, ir.Location{}, "grads.sum")
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
