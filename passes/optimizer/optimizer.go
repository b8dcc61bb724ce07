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
	"github.com/kiln-compiler/kiln/passes/precision"
)

func init() {
	passes.MustRegister(&passes.Pass{
		Name:    "optimizer",
		Summary: "append the optimizer step: in-place parameter updates placed right after each gradient is final",
		Options: []passes.Option{
			{Name: "kind", Kind: passes.EnumOption, Enum: []string{"sgd", "momentum", "adam", "adamw"}, Default: "sgd", Doc: "the update rule (torch.optim semantics)"},
			{Name: "lr", Kind: passes.FloatOption, Default: "0.001", Doc: "learning rate"},
			{Name: "momentum", Kind: passes.FloatOption, Default: "0.9", Doc: "momentum factor (kind=momentum)"},
			{Name: "beta1", Kind: passes.FloatOption, Default: "0.9", Doc: "Adam first-moment decay"},
			{Name: "beta2", Kind: passes.FloatOption, Default: "0.999", Doc: "Adam second-moment decay"},
			{Name: "eps", Kind: passes.FloatOption, Default: "1e-08", Doc: "Adam denominator term"},
			{Name: "weight-decay", Kind: passes.FloatOption, Default: "-1", Doc: "weight decay (default 0, and 0.01 for adamw as in PyTorch)"},
			{Name: "step", Kind: passes.IntOption, Default: "1", Doc: "Adam step number t for bias correction"},
			{Name: "keep-grads", Kind: passes.BoolOption, Default: "false", Doc: "keep returning the gradients"},
			{Name: "placement", Kind: passes.EnumOption, Enum: []string{"early", "end"}, Default: "early", Doc: "early: each update right after its gradient; end: all updates at the end (as optimizer.step())"},
		},
		Run: func(ctx *passes.Context, m *ir.Module) error {
			c := Config{Kind: ctx.String("kind"), LR: ctx.Float("lr"), Momentum: ctx.Float("momentum"),
				Beta1: ctx.Float("beta1"), Beta2: ctx.Float("beta2"), Eps: ctx.Float("eps"),
				WeightDecay: ctx.Float("weight-decay"), Step: ctx.Int("step"),
				KeepGrads: ctx.Bool("keep-grads"), AtEnd: ctx.String("placement") == "end"}
			if c.WeightDecay < 0 {
				c.WeightDecay = 0
				if c.Kind == "adamw" {
					c.WeightDecay = 0.01
				}
			}
			for _, f := range m.Funcs {
				n, err := Apply(f, c)
				if err != nil {
					return err
				}
				ctx.AddStat("updates", int64(n))
			}
			return nil
		},
	})
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

// Apply adds the updates to a training step (results "grad.<param>") and
// returns how many parameters it updates.
func Apply(f *ir.Func, c Config) (int, error) {
	grads := map[string]int{}
	var finite *ir.Value // dynamic loss scaling's condition, if any
	for i, r := range f.Results {
		grads[r.Name] = i
		if r.Name == precision.FiniteResult && r.Value.Type.DType == ir.Bool && r.Value.Type.Rank() == 0 {
			finite = r.Value
		}
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
		ri, ok := grads["grad."+p.Name]
		if !ok {
			return 0, fmt.Errorf("@%s has no result grad.%s: run autodiff before optimizer", f.Name, p.Name)
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
