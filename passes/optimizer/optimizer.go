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
// What changes from step to step is state, not a constant of the step:
// the learning rate is the state argument optimizer.lr (f32[], role "lr",
// initially the lr option; a runtime sets it), and the number of steps
// taken is optimizer.step (f32[] as torch.optim keeps it, role "step",
// inout): Adam's updates read it (bias correction for t = step + 1), and
// the step writes step + 1 back at its end (not when dynamic loss scaling skips the step, as
// GradScaler skips optimizer.step()). Batch-norm running statistics
// (state operands of batch_norm_train) take the new values the step
// computes, as a PyTorch module in training mode updates its buffers.
//
// kind=none updates no parameter and keeps the gradients as results: a
// training step that only computes gradients still advances what PyTorch's
// forward and backward advance (the running statistics, the random
// position, and optimizer.step, which counts the steps taken).
//
// After dynamic loss scaling (precision with f16), each update also takes
// the step's grads.finite result and writes nothing when it is false, as
// GradScaler skips optimizer.step(); the updates then wait for every
// gradient to be checked.
package optimizer

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

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
		c := Config{Kind: o.Kind, Step: o.Step, KeepGrads: o.KeepGrads, AtEnd: o.Placement == "end",
			Nesterov: o.Nesterov, AMSGrad: o.AMSGrad, MaxGradNorm: o.MaxGradNorm}
		g := Group{LR: o.LR, Momentum: o.Momentum, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps}
		switch {
		case o.WeightDecay != nil:
			g.WeightDecay = *o.WeightDecay
		case c.Kind == "adamw":
			g.WeightDecay = 0.01 // PyTorch's AdamW default
		}
		groups, err := ParseGroups(o.Groups, g)
		if err != nil {
			return err
		}
		c.Groups = append([]Group{g}, groups...)
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
	Kind        string   `opt:"kind" enum:"sgd|momentum|adam|adamw|none" default:"sgd" doc:"the update rule (torch.optim semantics); none: no update, the gradients stay results and the state advances"`
	LR          float64  `opt:"lr" default:"0.001" range:"[0,inf)" doc:"learning rate (its initial value: a scheduler may start at 0)"`
	Momentum    float64  `opt:"momentum" default:"0.9" range:"[0,1)" doc:"momentum factor (kind=momentum)"`
	Beta1       float64  `opt:"beta1" default:"0.9" range:"[0,1)" doc:"Adam first-moment decay"`
	Beta2       float64  `opt:"beta2" default:"0.999" range:"[0,1)" doc:"Adam second-moment decay"`
	Eps         float64  `opt:"eps" default:"1e-08" range:"(0,inf)" doc:"Adam denominator term"`
	WeightDecay *float64 `opt:"weight-decay" default:"0; 0.01 for adamw" range:"[0,inf)" doc:"weight decay (PyTorch's defaults)"`
	Step        int64    `opt:"step" default:"0" range:"[0,inf)" doc:"the steps already taken (the initial value of optimizer.step)"`
	Nesterov    bool     `opt:"nesterov" default:"false" doc:"Nesterov momentum (kind=momentum), as SGD(nesterov=True)"`
	AMSGrad     bool     `opt:"amsgrad" default:"false" doc:"AMSGrad (kind=adam or adamw): divide by the root of the largest second moment so far"`
	MaxGradNorm float64  `opt:"max-grad-norm" default:"0" range:"[0,inf)" doc:"clip the gradients' global norm to this, as clip_grad_norm_ (0: no clipping; the updates then wait for every gradient)"`
	Groups      string   `opt:"groups" default:"" doc:"the options of parameter groups 1, 2, ... (a parameter's group is its argument's attribute group; 0 takes the options above): groups separated by ';', each KEY:VALUE pairs separated by ':' (lr, weight-decay, momentum, beta1, beta2, eps), as lr:0.01:weight-decay:0"`
	KeepGrads   bool     `opt:"keep-grads" default:"false" doc:"keep returning the gradients"`
	Placement   string   `opt:"placement" enum:"auto|early|end" default:"auto" doc:"early: each update right after its gradient; end: all updates at the end (as optimizer.step()); auto: kiln's commands run the rest of the pipeline with both and keep the plan that needs less memory (then less modelled time), the pass alone places early"`
}

// Validate checks the options that depend on each other.
func (o *options) Validate() error {
	if o.Nesterov && (o.Kind != "momentum" || o.Momentum == 0) {
		return fmt.Errorf("nesterov needs kind=momentum with a momentum above 0")
	}
	if o.AMSGrad && o.Kind != "adam" && o.Kind != "adamw" {
		return fmt.Errorf("amsgrad needs kind=adam or adamw")
	}
	groups, err := ParseGroups(o.Groups, Group{LR: o.LR, Momentum: o.Momentum, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps})
	for k, g := range groups {
		if o.Nesterov && g.Momentum == 0 {
			return fmt.Errorf("nesterov needs a momentum above 0, and group %d has none", k+1)
		}
	}
	return err
}

// Config is the optimizer and its hyper-parameters.
type Config struct {
	Kind string
	// Groups holds each parameter group's hyper-parameters: a parameter's
	// group is its argument's attribute "group" (0 where it has none).
	Groups            []Group
	Step              int64 // steps already taken
	KeepGrads, AtEnd  bool
	Nesterov, AMSGrad bool
	// MaxGradNorm, when positive, clips the gradients' global 2-norm to
	// it before the updates, as torch.nn.utils.clip_grad_norm_.
	MaxGradNorm float64
}

// Group is a parameter group's hyper-parameters (torch.optim's
// param_groups). The learning rate, the momentum and the betas are state
// (each group's optimizer.lr, optimizer.momentum, optimizer.beta1 and
// optimizer.beta2, suffixed .K for group K > 0), which a scheduler moves;
// weight decay and eps are constants of the step.
type Group struct {
	LR, Momentum      float64
	Beta1, Beta2, Eps float64
	WeightDecay       float64
}

// ParseGroups reads the groups option: groups separated by ';', each
// KEY:VALUE pairs separated by ':', every key not given taking base's.
func ParseGroups(spec string, base Group) ([]Group, error) {
	if spec == "" {
		return nil, nil
	}
	var out []Group
	for k, part := range strings.Split(spec, ";") {
		g := base
		fields := strings.Split(part, ":")
		if len(fields)%2 != 0 {
			return nil, fmt.Errorf("groups: group %d is %q, not KEY:VALUE pairs", k+1, part)
		}
		for i := 0; i < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i+1], 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return nil, fmt.Errorf("groups: group %d's %s is %q, not a number at least 0", k+1, fields[i], fields[i+1])
			}
			switch fields[i] {
			case "lr":
				g.LR = v
			case "weight-decay":
				g.WeightDecay = v
			case "momentum":
				g.Momentum = v
			case "beta1":
				g.Beta1 = v
			case "beta2":
				g.Beta2 = v
			case "eps":
				g.Eps = v
			default:
				return nil, fmt.Errorf("groups: group %d has %q, none of lr, weight-decay, momentum, beta1, beta2, eps", k+1, fields[i])
			}
		}
		if g.Momentum >= 1 || g.Beta1 >= 1 || g.Beta2 >= 1 || g.Eps <= 0 {
			return nil, fmt.Errorf("groups: group %d: eps must be above 0, momentum and the betas below 1", k+1)
		}
		out = append(out, g)
	}
	return out, nil
}

// groupState is a group's hyper-parameters as state arguments, made on
// first use.
type groupState struct {
	f     *ir.Func
	c     Config
	state map[string]*ir.Value
}

// get is the state argument of hyper-parameter what (lr, momentum, beta1,
// beta2) of group k: optimizer.WHAT, or optimizer.WHAT.K for k > 0,
// initially the group's value, read-only (a runtime sets it).
func (gs *groupState) get(what string, k int) *ir.Value {
	name := "optimizer." + what
	if k > 0 {
		name += "." + strconv.Itoa(k)
	}
	if v := gs.state[name]; v != nil {
		return v
	}
	g := gs.c.Groups[k]
	val := map[string]float64{"lr": g.LR, "momentum": g.Momentum, "beta1": g.Beta1, "beta2": g.Beta2}[what]
	// The momentum and the betas are f64, as the Python floats of
	// torch.optim: 1 - beta2 and 1 - beta2^t then match PyTorch's, where
	// 1 - f32(0.999) would be 1.3e-5 off.
	ty, role := f64Scalar, RoleHyper
	if what == "lr" {
		ty, role = f32Scalar, RoleLR
	}
	v := gs.f.AddState(name, &ir.Dense{Type: ty, Floats: []float64{val}}, false)
	v.Arg.Attrs = ir.Attrs{"role": ir.StringAttr(role)}
	gs.state[name] = v
	return v
}

// Roles of the optimizer's state arguments (the argument attribute
// "role"), which runtimes and checkpoints use to find them.
const (
	RoleLR      = ir.RoleLR
	RoleHyper   = ir.RoleHyperParameter
	RoleStep    = ir.RoleStep
	RoleMoment  = ir.RoleOptimizerState
	RoleRunning = ir.RoleRunningStat
	RoleRandom  = ir.RoleRandom
)

// randomStride is how far the random generator's position advances per
// step: past every number a random op of the step draws (each op draws
// from its own seed's stream, at most this many numbers).
const randomStride = int64(1) << 40

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
	gs := &groupState{f: f, c: c, state: map[string]*ir.Value{}}
	if len(c.Groups) == 0 {
		return 0, fmt.Errorf("the optimizer has no parameter group")
	}
	switch c.Kind { // group 0's exist even with no parameter to update, in this order
	case "sgd":
		gs.get("lr", 0)
	case "momentum":
		gs.get("lr", 0)
		gs.get("momentum", 0)
	case "adam", "adamw":
		gs.get("lr", 0)
	}
	step := f.AddState("optimizer.step", &ir.Dense{Type: f32Scalar, Floats: []float64{float64(c.Step)}}, true)
	step.Arg.Attrs = ir.Attrs{"role": ir.StringAttr(RoleStep)}
	if c.Kind == "adam" || c.Kind == "adamw" {
		gs.get("beta1", 0)
		gs.get("beta2", 0)
	}
	var params []*ir.Value
	var grads []*ir.Value
	for _, p := range f.Args {
		if c.Kind == "none" {
			break
		}
		if p.Arg.Kind != ir.ArgParam || !p.Type.DType.IsFloat() {
			continue // an integer parameter (an index buffer) has no gradient and no update
		}
		ri := f.GradResult(p)
		if ri < 0 {
			return 0, fmt.Errorf("@%s has no gradient result for param %s: run autodiff before optimizer", f.Name, p.Ref())
		}
		params = append(params, p)
		grads = append(grads, f.Results[ri].Value)
		if !c.KeepGrads {
			dropped[ri] = true
		}
	}
	if c.MaxGradNorm > 0 && len(grads) > 0 {
		var err error
		if grads, err = clipGradients(f, grads, c.MaxGradNorm); err != nil {
			return 0, err
		}
	}
	for i, p := range params {
		g := grads[i]
		if a, ok := p.Arg.Attrs["group"]; ok && a.Kind != ir.AttrInt {
			return 0, fmt.Errorf("param %s: its group attribute must be a number, not %s", p.Ref(), a)
		}
		k := int(p.Arg.Attrs.Int("group", 0))
		if k < 0 || k >= len(c.Groups) {
			return 0, fmt.Errorf("param %s is in group %d, and the optimizer has groups 0 to %d (the groups option gives groups 1 on)", p.Ref(), k, len(c.Groups)-1)
		}
		grp := c.Groups[k]
		p.Arg.InOut = true
		attrs := ir.Attrs{}
		if grp.WeightDecay != 0 {
			attrs["weight_decay"] = ir.FloatAttr(grp.WeightDecay)
		}
		operands := []*ir.Value{p, g}
		kind := "sgd_update"
		switch c.Kind {
		case "momentum":
			kind = "momentum_update"
			if c.Nesterov {
				attrs["nesterov"] = ir.BoolAttr(true)
			}
			operands = append(operands, newState(f, "momentum."+p.Name, p.Type), gs.get("lr", k), gs.get("momentum", k))
		case "adam", "adamw":
			kind = "adam_update"
			attrs["eps"] = ir.FloatAttr(grp.Eps)
			if c.Kind == "adamw" {
				attrs["decoupled"] = ir.BoolAttr(true)
			}
			operands = append(operands, newState(f, "adam.m."+p.Name, p.Type), newState(f, "adam.v."+p.Name, p.Type))
			if c.AMSGrad {
				kind = "amsgrad_update"
				operands = append(operands, newState(f, "adam.vmax."+p.Name, p.Type))
			}
			operands = append(operands, gs.get("lr", k), step, gs.get("beta1", k), gs.get("beta2", k))
		default:
			operands = append(operands, gs.get("lr", k))
		}
		if finite != nil {
			operands = append(operands, finite) // skipped when a gradient is not finite
		}
		op, err := f.NewOp(kind, operands, attrs, locOf(g), "")
		if err != nil {
			return 0, err
		}
		updates = append(updates, update{op: op})
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
	if err := advance(f, step, finite); err != nil {
		return 0, err
	}
	if err := keepRunningStats(f); err != nil {
		return 0, err
	}
	if err := advanceRandom(f); err != nil {
		return 0, err
	}
	var results []ir.Result
	for i, r := range f.Results {
		if !dropped[i] {
			results = append(results, r)
		}
	}
	f.Results = results
	return len(updates), nil
}

var (
	f32Scalar = ir.Type{DType: ir.F32, Shape: ir.Shape{}}
	f64Scalar = ir.Type{DType: ir.F64, Shape: ir.Shape{}}
)

// clipGradients appends to f the global-norm clipping of grads, as
// torch.nn.utils.clip_grad_norm_(max_norm): the norm is the root of the
// sum of every gradient's squares, and each gradient is multiplied by
// min(1, maxNorm / (norm + 1e-6)). It returns the clipped gradients, which
// depend on every gradient: the updates wait for the last.
func clipGradients(f *ir.Func, grads []*ir.Value, maxNorm float64) ([]*ir.Value, error) {
	b := &appender{f: f}
	var total *ir.Value
	for _, g := range grads {
		sq := b.op("reduce_sum", nil, g.Name+".sq", b.op("mul", nil, g.Name+".sq2", g, g))
		if sq != nil && sq.Type.DType != ir.F32 {
			sq = b.op("cast", ir.Attrs{"to": ir.TypeAttr(ir.F32)}, g.Name+".sq.f32", sq)
		}
		if total == nil {
			total = sq
		} else {
			total = b.op("add", nil, "grads.sq", total, sq)
		}
	}
	norm := b.op("sqrt", nil, "grads.norm", total)
	coef := b.op("div", nil, "grads.clip", b.constant(maxNorm, "grads.max_norm"), b.op("add", nil, "grads.norm.eps", norm, b.constant(1e-6, "grads.eps")))
	coef = b.op("min", nil, "grads.clip.coef", coef, b.constant(1, "grads.one"))
	out := make([]*ir.Value, len(grads))
	for i, g := range grads {
		c := coef
		if g.Type.DType != ir.F32 {
			c = b.op("cast", ir.Attrs{"to": ir.TypeAttr(g.Type.DType)}, g.Name+".clip.coef", coef)
		}
		out[i] = b.op("mul", nil, g.Name+".clipped", g, c)
	}
	return out, b.err
}

// appender appends ops to the end of a function's body; the first error
// sticks and later ops are not made.
type appender struct {
	f   *ir.Func
	err error
}

func (b *appender) op(kind string, attrs ir.Attrs, name string, in ...*ir.Value) *ir.Value {
	if b.err != nil {
		return nil
	}
	o, err := b.f.NewOp(kind, in, attrs, ir.Location{}, name)
	if err != nil {
		b.err = err
		return nil
	}
	b.f.Body = append(b.f.Body, o)
	return o.Results[0]
}

func (b *appender) constant(v float64, name string) *ir.Value {
	return b.op("constant", ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: f32Scalar, Floats: []float64{v}})}, name)
}

// newState adds a zero-initialised state argument updated in place.
func newState(f *ir.Func, name string, t ir.Type) *ir.Value {
	v := f.AddState(name, &ir.Dense{Type: t, Floats: []float64{0}}, true)
	v.Arg.Attrs = ir.Attrs{"role": ir.StringAttr(RoleMoment)}
	return v
}

// advance writes step + 1 back into the step count at the end of the
// step, unless finite (dynamic loss scaling's condition, or nil) is false.
func advance(f *ir.Func, step, finite *ir.Value) error {
	one, err := f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: f32Scalar, Floats: []float64{1}})}, ir.Location{}, "optimizer.one")
	if err != nil {
		return err
	}
	next, err := f.NewOp("add", []*ir.Value{step, one.Results[0]}, nil, ir.Location{}, "optimizer.step.next")
	if err != nil {
		return err
	}
	f.Body = append(f.Body, one, next)
	t := next.Results[0]
	if finite != nil {
		kept, err := f.NewOp("where", []*ir.Value{finite, t, step}, nil, ir.Location{}, "optimizer.step.kept")
		if err != nil {
			return err
		}
		f.Body = append(f.Body, kept)
		t = kept.Results[0]
	}
	w, err := f.NewOp("overwrite", []*ir.Value{step, t}, nil, ir.Location{}, "")
	if err != nil {
		return err
	}
	f.Body = append(f.Body, w)
	return nil
}

// advanceRandom gives every random op that has no key the state
// random.offset (i64[], role "rng", from 0) as its key, so that each step
// draws new numbers (dropout masks) where it drew the same ones before,
// and advances it by randomStride at the end of the step. Ops of one step
// read one position: a dropout and the dropout_grad that regenerates its
// mask draw alike.
func advanceRandom(f *ir.Func) error {
	var ops []*ir.Op
	for _, op := range f.Body {
		if ir.DrawsRandom(op) && ir.RandomKey(op) == nil {
			ops = append(ops, op)
		}
	}
	if len(ops) == 0 {
		return nil
	}
	i64 := ir.Type{DType: ir.I64, Shape: ir.Shape{}}
	key := f.AddState("random.offset", &ir.Dense{Type: i64, Ints: []int64{0}}, true)
	key.Arg.Attrs = ir.Attrs{"role": ir.StringAttr(RoleRandom)}
	for _, op := range ops {
		a := op.Attr()
		span := a.Int("offset") + op.Results[0].Type.NumElements()*max(1, a.Int("rank_size"))
		if span >= randomStride {
			return fmt.Errorf("%s: %s draws %d numbers, more than a step's share of the generator (%d)", op.Loc, op.Results[0].Ref(), span, randomStride)
		}
		op.Operands = append(op.Operands, key)
	}
	stride, err := f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: i64, Ints: []int64{randomStride}})}, ir.Location{}, "random.stride")
	if err != nil {
		return err
	}
	next, err := f.NewOp("add", []*ir.Value{key, stride.Results[0]}, nil, ir.Location{}, "random.offset.next")
	if err != nil {
		return err
	}
	w, err := f.NewOp("overwrite", []*ir.Value{key, next.Results[0]}, nil, ir.Location{}, "")
	if err != nil {
		return err
	}
	f.Body = append(f.Body, stride, next, w)
	return nil
}

// keepRunningStats writes the running statistics that ops compute (the
// op record's Running: batch_norm_train's mean and variance) back into
// their state operands, each right after the last reader of the old
// value, so that the new one dies at once. A statistic that is not a
// state argument (a constant, a computed value) is left alone. A state
// that several batch norms update (one module applied twice, or the
// slices of a microbatch split with per-slice statistics) is updated as
// PyTorch updates it, once per application in forward order (the
// schedule's order: the passes before this one keep the forward's): each batch
// norm after the first reads the statistic the one before it computed,
// and the last one's is written back. The argument's attribute updates
// says how many times a step updates it.
func keepRunningStats(f *ir.Func) error {
	type update struct {
		op     *ir.Op
		result int // the op's result holding the new statistic
	}
	chains := map[*ir.Value][]update{}
	var order []*ir.Value
	for _, op := range f.Body {
		d := op.Def()
		if d == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(d.Running)) {
			operand := op.Operands[k]
			if operand.Arg == nil || operand.Arg.Kind != ir.ArgState {
				continue
			}
			if prev := chains[operand]; len(prev) > 0 {
				// This application starts from the one before's update.
				last := prev[len(prev)-1]
				if last.op == op {
					return fmt.Errorf("%s: %s is two running statistics of one %s: which update to keep is ambiguous", op.Loc, operand.Ref(), op.Kind)
				}
				op.Operands[k] = last.op.Results[last.result]
			} else {
				order = append(order, operand)
			}
			chains[operand] = append(chains[operand], update{op, d.Running[k]})
		}
	}
	// The last reader of each value, through views of it (which share its
	// bytes): the overwrite must come after every one.
	base := map[*ir.Value]*ir.Value{}
	root := func(v *ir.Value) *ir.Value {
		for base[v] != nil {
			v = base[v]
		}
		return v
	}
	last := map[*ir.Value]int{}
	for i, op := range f.Body {
		for _, x := range op.Operands {
			last[root(x)] = i
		}
		if d := op.Def(); d != nil && d.View && len(op.Operands) > 0 {
			base[op.Results[0]] = op.Operands[0]
		}
	}
	for _, r := range f.Results {
		last[root(r.Value)] = len(f.Body) - 1
	}
	after := map[int][]*ir.Op{}
	for _, operand := range order {
		chain := chains[operand]
		final := chain[len(chain)-1]
		operand.Arg.InOut = true
		if operand.Arg.Attrs == nil {
			operand.Arg.Attrs = ir.Attrs{}
		}
		operand.Arg.Attrs["role"] = ir.StringAttr(RoleRunning)
		// How many times a step updates it (PyTorch counts forward calls in
		// num_batches_tracked): the runtime's descriptor says so.
		operand.Arg.Attrs["updates"] = ir.IntAttr(int64(len(chain)))
		w, err := f.NewOp("overwrite", []*ir.Value{operand, final.op.Results[final.result]}, nil, final.op.Loc, "")
		if err != nil {
			return err
		}
		// After the last reader of the old value and the op computing the
		// new one.
		at := max(last[operand], slices.Index(f.Body, final.op))
		after[at] = append(after[at], w)
	}
	body := make([]*ir.Op, 0, len(f.Body)+len(order))
	for i, op := range f.Body {
		body = append(body, op)
		body = append(body, after[i]...)
	}
	f.Body = body
	return nil
}

func locOf(v *ir.Value) ir.Location {
	if v.Def != nil {
		return v.Def.Loc
	}
	return ir.Location{}
}
