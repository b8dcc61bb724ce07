// Package optimizer is the `optimizer` pass: it appends the optimizer
// step to a training step made by autodiff. Each parameter is updated in
// place (it becomes an inout argument) as soon as its gradient is final
// and the parameter is read for the last time, so the gradient dies right
// there instead of living to the end of the step; momentum buffers and
// Adam moments are new state arguments, also updated in place, starting
// at zero. Gradients stop being results unless keep-grads=true.
//
// The update rules follow torch.optim: sgd (p -= lr·(g + wd·p)),
// momentum (buf = μ·buf + g'; p -= lr·buf; dampening 0, no Nesterov),
// adam (L2 weight decay added to the gradient) and adamw (decoupled
// decay p *= 1 - lr·wd), both with bias correction for step t.
//
// After dynamic loss scaling (precision with f16), each update also takes
// the step's grads.finite result and writes nothing when it is false, as
// GradScaler skips optimizer.step(); the updates then wait for every
// gradient to be checked.
package optimizer

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "optimizer",
		Summary:     "append the optimizer step: in-place parameter updates placed right after each gradient is final",
		Requires:    []passes.Property{passes.TrainingStep},
		Excludes:    []passes.Property{passes.OptimizerStep, passes.Fused},
		Establishes: []passes.Property{passes.OptimizerStep},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		c := Config{Kind: o.Kind, LR: o.LR, Momentum: o.Momentum, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps,
			Step: o.Step, KeepGrads: o.KeepGrads, AtEnd: o.Placement == "end"}
		switch {
		case o.WeightDecay != nil:
			c.WeightDecay = *o.WeightDecay
		case c.Kind == "adamw":
			c.WeightDecay = 0.01 // PyTorch's AdamW default
		}
		for _, f := range m.Funcs {
			n, err := Apply(f, c)
			if err != nil {
				return err
			}
			ctx.AddStat("updates", int64(n))
		}
		return nil
	}))
}

type options struct {
	Kind        string   `opt:"kind" enum:"sgd|momentum|adam|adamw" default:"sgd" doc:"the update rule (torch.optim semantics)"`
	LR          float64  `opt:"lr" default:"0.001" range:"(0,inf)" doc:"learning rate"`
	Momentum    float64  `opt:"momentum" default:"0.9" range:"[0,1)" doc:"momentum factor (kind=momentum)"`
	Beta1       float64  `opt:"beta1" default:"0.9" range:"[0,1)" doc:"Adam first-moment decay"`
	Beta2       float64  `opt:"beta2" default:"0.999" range:"[0,1)" doc:"Adam second-moment decay"`
	Eps         float64  `opt:"eps" default:"1e-08" range:"(0,inf)" doc:"Adam denominator term"`
	WeightDecay *float64 `opt:"weight-decay" default:"0; 0.01 for adamw" range:"[0,inf)" doc:"weight decay (PyTorch's defaults)"`
	Step        int64    `opt:"step" default:"1" range:"[1,inf)" doc:"Adam step number t for bias correction"`
	KeepGrads   bool     `opt:"keep-grads" default:"false" doc:"keep returning the gradients"`
	Placement   string   `opt:"placement" enum:"auto|early|end" default:"auto" doc:"early: each update right after its gradient; end: all updates at the end (as optimizer.step()); auto: kiln's commands run the rest of the pipeline with both and keep the plan that needs less memory (then less modelled time), the pass alone places early"`
}

// Config is the optimizer and its hyper-parameters.
type Config struct {
	Kind              string
	LR, Momentum      float64
	Beta1, Beta2, Eps float64
	WeightDecay       float64
	Step              int64
	KeepGrads, AtEnd  bool
}

// Apply adds the updates to a training step (its results with the role
// grad) and returns how many parameters it updates.
func Apply(f *ir.Func, c Config) (int, error) {
	var finite *ir.Value // dynamic loss scaling's condition, if any
	if i := f.ResultWithRole(ir.RoleGradsFinite); i >= 0 {
		finite = f.Results[i].Value
	}
	type update struct {
		op    *ir.Op
		after int // insert after this body position
	}
	var updates []update
	dropped := map[int]bool{}
	for _, p := range f.Args {
		if p.Arg.Kind != ir.ArgParam {
			continue
		}
		ri := f.GradResult(p)
		if ri < 0 {
			return 0, fmt.Errorf("@%s has no gradient result for param %s: run autodiff before optimizer", f.Name, p.Ref())
		}
		g := f.Results[ri].Value
		p.Arg.InOut = true
		attrs := ir.Attrs{"lr": ir.FloatAttr(c.LR)}
		if c.WeightDecay != 0 {
			attrs["weight_decay"] = ir.FloatAttr(c.WeightDecay)
		}
		operands := []*ir.Value{p, g}
		kind := "sgd_update"
		switch c.Kind {
		case "momentum":
			kind = "momentum_update"
			attrs["momentum"] = ir.FloatAttr(c.Momentum)
			operands = append(operands, newState(f, "momentum."+p.Name, p.Type))
		case "adam", "adamw":
			kind = "adam_update"
			attrs["beta1"], attrs["beta2"], attrs["eps"], attrs["step"] = ir.FloatAttr(c.Beta1), ir.FloatAttr(c.Beta2), ir.FloatAttr(c.Eps), ir.IntAttr(c.Step)
			if c.Kind == "adamw" {
				attrs["decoupled"] = ir.BoolAttr(true)
			}
			operands = append(operands, newState(f, "adam.m."+p.Name, p.Type), newState(f, "adam.v."+p.Name, p.Type))
		}
		if finite != nil {
			operands = append(operands, finite) // skipped when a gradient is not finite
		}
		op, err := f.NewOp(kind, operands, attrs, locOf(g), "")
		if err != nil {
			return 0, err
		}
		updates = append(updates, update{op: op})
		if !c.KeepGrads {
			dropped[ri] = true
		}
	}
	// Place each update after the last op reading its parameter or
	// producing its gradient or condition (or at the end).
	pos := map[*ir.Op]int{}
	last := map[*ir.Value]int{}
	for i, op := range f.Body {
		pos[op] = i
		for _, v := range op.Operands {
			last[v] = i
		}
	}
	at := map[int][]*ir.Op{}
	for _, u := range updates {
		after := len(f.Body) - 1
		if !c.AtEnd {
			after = -1
			for _, v := range u.op.Operands {
				if l, ok := last[v]; ok && l > after {
					after = l
				}
				if v.Def != nil && pos[v.Def] > after {
					after = pos[v.Def]
				}
			}
		}
		at[after] = append(at[after], u.op)
	}
	body := make([]*ir.Op, 0, len(f.Body)+len(updates))
	body = append(body, at[-1]...)
	for i, op := range f.Body {
		body = append(body, op)
		body = append(body, at[i]...)
	}
	f.Body = body
	var results []ir.Result
	for i, r := range f.Results {
		if !dropped[i] {
			results = append(results, r)
		}
	}
	f.Results = results
	return len(updates), nil
}

// newState adds a zero-initialised state argument updated in place.
func newState(f *ir.Func, name string, t ir.Type) *ir.Value {
	return f.AddState(name, &ir.Dense{Type: t, Floats: []float64{0}}, true)
}

func locOf(v *ir.Value) ir.Location {
	if v.Def != nil {
		return v.Def.Loc
	}
	return ir.Location{}
}
