// Package precision is the `precision` pass: it rewrites a training step
// (from autodiff) to mixed precision. Matrix products, convolutions,
// elementwise and data-movement ops compute on, and store, the low dtype
// (bf16 or f16); reductions, softmax, normalisations, the loss and the
// optimizer updates stay in f32, as do the parameters (the f32 master
// copies, cast down where a low-precision op reads them) and the
// gradients the step returns (cast up at the end). Casts are inserted per
// use, so a cast copy lives only until its reader; fuse merges them into
// their neighbours' kernels.
//
// With f16 the backward pass runs on a scaled loss, so that small
// gradients do not flush to zero: the loss-gradient seed is the scale and
// the returned gradients are divided by it. By default the
// scale is dynamic, as torch.cuda.amp.GradScaler: a state argument
// loss_scale (initially init-scale) and a count of steps without overflow
// (loss_scale.good); the step returns grads.finite, true when every
// gradient is finite, halves the scale when one is not, and doubles it
// after growth-interval good steps in a row. The optimizer pass skips
// its updates when grads.finite is false. loss-scale=S fixes the scale.
//
// saved=bf16|f16|fp8 also narrows the values the backward pass reads from
// the forward pass: each is cast down after its last forward use and
// back up before its first backward use (fp8: e4m3 with a per-tensor
// scale, max|x|/448, which readers deciding by sign or argmax, and
// products linear in the value, read as stored). Narrowing is an
// approximation the pass makes only when allowed by name.
package precision

import (
	"fmt"
	"math"
	"sort"
	"strconv"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

// The approximations of narrower saved values: the values the backward
// pass reads, stored between the passes in a dtype narrower than the
// step computes them in. The precision pass makes one only when it is
// allowed (--allow NAME), and the budget planner chooses them beside
// recomputation, microbatches and offloading only then.
const (
	BF16Saved = "bf16-saved"
	F16Saved  = "f16-saved"
	FP8Saved  = "fp8-saved"
)

// savedApproximation is the approximation saved=dtype makes.
var savedApproximation = map[string]string{"bf16": BF16Saved, "f16": F16Saved, "fp8": FP8Saved}

func init() {
	passes.RegisterApproximation(BF16Saved, "the values the backward pass reads are stored in bf16 between the forward and backward passes (precision{saved=bf16})")
	passes.RegisterApproximation(F16Saved, "the values the backward pass reads are stored in f16 between the forward and backward passes (precision{saved=f16})")
	passes.RegisterApproximation(FP8Saved, "the values the backward pass reads are stored in fp8 e4m3 with a per-tensor scale between the forward and backward passes (precision{saved=fp8})")
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "precision",
		Summary:     "rewrite a training step to mixed precision (low-precision activations, f32 master weights, gradients and statistics)",
		Excludes:    []passes.Property{passes.Fused, passes.OptimizerStep, passes.Assigned},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		c := Config{DType: ir.F32, InitScale: o.InitScale, GrowthInterval: o.GrowthInterval}
		switch o.LossScale {
		case "auto":
		case "dynamic":
			c.Dynamic = true
		default:
			c.LossScale, _ = strconv.ParseFloat(o.LossScale, 64) // checked by Validate
		}
		switch o.DType {
		case "bf16":
			c.DType = ir.BF16
		case "f16":
			c.DType = ir.F16
		}
		switch o.Saved {
		case "bf16":
			c.Saved = ir.BF16
		case "f16":
			c.Saved = ir.F16
		case "fp8":
			c.Saved = ir.F8E4M3
		}
		auto := o.LossScale == "auto" && c.DType == ir.F16
		approx := ""
		if c.Saved != 0 && c.Saved != c.DType {
			approx = savedApproximation[o.Saved]
			if !ctx.Allows(approx) {
				return fmt.Errorf("saved=%s stores the values the backward pass reads in %s, an approximation: allow it by name (--allow %s)", o.Saved, o.Saved, approx)
			}
		}
		for _, f := range m.Funcs {
			fc := c
			fc.Dynamic = c.Dynamic || auto && lossSeed(f) != nil
			st, err := Apply(f, fc)
			if err != nil {
				return err
			}
			ctx.AddStat("casts", int64(st.Casts))
			ctx.AddStat("saved-narrowed", int64(st.Saved))
			if approx != "" && st.Saved > 0 {
				ctx.Approximate(approx, fmt.Sprintf("the backward pass of @%s reads %d saved value(s) stored in %s: %s where the step computes %s", f.Name, st.Saved, o.Saved, diag.Bytes(st.StoredBytes), diag.Bytes(st.SavedBytes)))
			}
			if c.DType != ir.F32 {
				ctx.Note(fmt.Sprintf("@%s keeps in f32 by design: %s of parameters (the master weights), %s of f32 data inputs, %s of results (the gradients and the loss), gradient partial sums (%d, %s) and statistics (%d, %s); it makes per-product %s copies of master weights (%d, %s); the rest computes in %s",
					f.Name, diag.Bytes(st.ParamBytes), diag.Bytes(st.DataBytes), diag.Bytes(st.ResultBytes),
					st.ByDesign["gradient"].Count, diag.Bytes(st.ByDesign["gradient"].Bytes), st.ByDesign["statistic"].Count, diag.Bytes(st.ByDesign["statistic"].Bytes),
					c.DType, st.ByDesign["weight copy"].Count, diag.Bytes(st.ByDesign["weight copy"].Bytes), c.DType))
			}
		}
		return nil
	}))
}

type options struct {
	DType          string  `opt:"dtype" enum:"bf16|f16|f32" default:"bf16" doc:"the dtype of activations and matrix products (f32: leave them, e.g. to use saved= alone)"`
	Saved          string  `opt:"saved" enum:"none|bf16|f16|fp8" default:"none" doc:"also store the values saved for the backward pass in this dtype (fp8: e4m3 with a per-tensor scale)"`
	LossScale      string  `opt:"loss-scale" default:"auto" doc:"dynamic (adjusted in the graph), a positive number (fixed; 1: none), or auto: dynamic with f16 on a training step, none otherwise"`
	InitScale      float64 `opt:"init-scale" default:"32768" range:"(0,inf)" doc:"the first dynamic loss scale (2^15: the seed must be finite in f16, whose largest value is 65504)"`
	GrowthInterval int64   `opt:"growth-interval" default:"2000" range:"[1,inf)" doc:"good steps in a row after which the dynamic scale doubles"`
}

// Validate checks loss-scale, which is a word or a number.
func (o *options) Validate() error {
	switch o.LossScale {
	case "auto", "dynamic":
		return nil
	}
	v, err := strconv.ParseFloat(o.LossScale, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return fmt.Errorf("option loss-scale must be auto, dynamic or a positive number, not %q", o.LossScale)
	}
	return nil
}

// Config chooses the dtypes.
type Config struct {
	DType     ir.DType // of activations: BF16, F16, or F32 (unchanged)
	Saved     ir.DType // of values saved for the backward pass (0: as DType)
	LossScale float64  // a fixed loss scale; 0 or 1: none
	// Dynamic loss scaling (LossScale is then ignored): the first scale
	// and the good steps in a row after which it doubles.
	Dynamic        bool
	InitScale      float64
	GrowthInterval int64
}

// Stats counts what the pass did: the casts it inserted, the saved values
// it narrowed and their bytes (as the step computes them, and as they are
// stored), and the bytes it keeps in f32 by design: parameters, f32 data
// inputs and results.
type Stats struct {
	Casts, Saved                       int
	SavedBytes, StoredBytes            int64
	ParamBytes, DataBytes, ResultBytes int64
	// ByDesign counts the values KeptByDesign names, by class, and their
	// bytes (each as large as it is, however briefly it lives).
	ByDesign map[string]ValueCount
}

// ValueCount is a number of values and their bytes.
type ValueCount struct {
	Count int
	Bytes int64
}

// An op computes in f32 where its record says KeepF32: reductions whose
// accuracy rests on statistics, losses and updates of arguments in place.
// Plain reductions (reduce_*, global_avg_pool) read the low dtype
// directly: their kernels accumulate in f64 and only the (small) result
// is rounded, where a cast-up copy of a large operand (the logits a loss
// sums) would cost as much memory as the f32 step.

// rewriter rebuilds a function op by op.
type rewriter struct {
	f    *ir.Func
	body []*ir.Op
	env  map[*ir.Value]*ir.Value
	st   Stats
	// early are the ops that finish the results (casts to their dtype,
	// the unscaling of gradients), which hoistUnscaling moves from the
	// end of the step to the ops they read.
	early map[*ir.Op]bool
}

func (r *rewriter) emit(kind string, operands []*ir.Value, attrs ir.Attrs, loc ir.Location, base string) *ir.Value {
	op, err := r.f.NewOp(kind, operands, attrs, loc, base)
	if err != nil {
		panic(fmt.Sprintf("precision: %v", err)) // operands were cast to types the op accepts
	}
	r.body = append(r.body, op)
	return op.Results[0]
}

// as returns v in dtype d, casting when it is a float of another dtype.
func (r *rewriter) as(v *ir.Value, d ir.DType, loc ir.Location) *ir.Value {
	if !v.Type.DType.IsFloat() || v.Type.DType == d {
		return v
	}
	if v.Def != nil && v.Def.Kind == "expand" {
		// Cast the small source and broadcast again: no full-size copy,
		// and the broadcast fuses into its reader.
		src := r.as(v.Def.Operands[0], d, loc)
		return r.emit("expand", []*ir.Value{src}, v.Def.Attrs, v.Def.Loc, v.Name+"."+d.String())
	}
	r.st.Casts++
	return r.emit("cast", []*ir.Value{v}, ir.Attrs{"to": ir.TypeAttr(d)}, loc, v.Name+"."+d.String())
}

// Apply rewrites f in place.
func Apply(f *ir.Func, c Config) (Stats, error) {
	for _, op := range f.Body {
		if op.Region != nil {
			return Stats{}, fmt.Errorf("@%s: run precision before fuse (op %s has a region)", f.Name, op.Kind)
		}
	}
	r := &rewriter{f: f, env: map[*ir.Value]*ir.Value{}, early: map[*ir.Op]bool{}}
	low := c.DType
	if low == 0 {
		low = ir.F32
	}
	seed := lossSeed(f)
	scale := c.LossScale != 0 && c.LossScale != 1
	if (scale || c.Dynamic) && seed == nil {
		return Stats{}, fmt.Errorf("@%s: loss scaling needs a training step made by autodiff (no loss.grad seed)", f.Name)
	}
	if scale || c.Dynamic {
		for _, op := range f.Body {
			if d := op.Def(); d != nil && len(d.Writes) > 0 {
				return Stats{}, fmt.Errorf("@%s: run precision before optimizer: with loss scaling, %s would read a scaled gradient", f.Name, op.Kind)
			}
		}
	}
	var dyn *dynamicScale
	if c.Dynamic {
		scale = false
		dyn = newDynamicScale(f, c)
		if !seed.Type.Equal(dyn.scale.Type) {
			return Stats{}, fmt.Errorf("@%s: the loss-gradient seed is %s, want f32[] for dynamic loss scaling", f.Name, seed.Type)
		}
	}
	gradOps := gradientProducers(f)
	forward := true
	for _, op := range f.Body {
		if ir.IsConstant(op) && op.Attrs.String("role", "") == ir.RoleLossSeed {
			forward = false
		}
		want := low
		// An accumulator chain of the forward pass (autodiff copies the
		// attribute onto the backward ops it derives, which need not).
		accumulator := forward && op.Attrs.Bool(ir.AttrAccumulator, false)
		if op.Def().KeepF32 || gradOps[op] || op.Kind == "cast" || ir.IsConstant(op) || accumulator {
			want = ir.F32
		}
		if readsFloatData(op) {
			// The first layer reads the data input as it is: the input is
			// stored in f32 for the whole step anyway, so a low copy would
			// only add memory, and its rounding is what the batch
			// statistics downstream amplify most (small_cnn's stem weight
			// gradient: 6.9e-2 from the f32 step with a bf16 copy, 0.9e-2
			// without). Its result is stored low like any activation.
			want = ir.F32
		}
		// An op that takes result_dtype (a contraction, a sum, a loss,
		// binary arithmetic) and makes a returned gradient or another
		// result of the step (the loss), computes in f32, is a contraction
		// reading an f32 data input, or is elementwise reading an f32
		// parameter, reads its operands as they
		// are (a KeepF32 op: its LowOperands) and rounds its results once
		// to result_dtype: f32 for a gradient, an accumulator or a
		// statistic, the low dtype for an activation. An op that computes in f32 reads its
		// LowOperands as they are too. No full-size cast copy of an operand
		// is made, and the kernels compute what they would from exact f32
		// copies.
		def := op.Def()
		mixed := low != ir.F32 && takesResultDType(def) && (gradOps[op] || def.KeepF32 || def.Contraction && readsFloatData(op) || def.Fusion == ir.Broadcast && readsParam(op) || f.IsResult(op.Results[0]) && op.Results[0].Type.DType.IsFloat())
		attrs := op.Attrs
		if mixed {
			result := ir.F32
			if !gradOps[op] && !accumulator && (storedLow(f, op, op.Results[0]) || want == low && !f.IsResult(op.Results[0])) {
				result = low
			}
			if f.IsResult(op.Results[0]) && op.Results[0].Type.DType.IsFloat() {
				result = op.Results[0].Type.DType // a result of the step (the loss) keeps its dtype: one rounding
			}
			attrs = attrs.Clone()
			attrs["result_dtype"] = ir.TypeAttr(result)
		}
		asIs := func(i int) bool {
			switch {
			case low == ir.F32 || op.Kind == "cast":
				return op.Kind == "cast"
			case def.KeepF32:
				return contains(def.LowOperands, i)
			}
			return mixed && !(def.InPlace && contains(def.InPlaceOperands, i))
		}
		operands := make([]*ir.Value, len(op.Operands))
		for i, x := range op.Operands {
			v := r.env[x]
			if v == nil {
				v = x // an argument
			}
			v = r.rebroadcast(v)
			if d := op.Def(); d != nil && contains(d.Writes, i) {
				operands[i] = v // written in place: the argument itself
				continue
			}
			switch {
			case asIs(i):
			case mixed && def.InPlace && contains(def.InPlaceOperands, i):
				v = r.as(v, attrs["result_dtype"].DType, op.Loc) // a gemm's C: of the result's dtype
			default:
				v = r.as(v, want, op.Loc)
			}
			operands[i] = v
		}
		if dyn != nil && op.Results[0] == seed {
			// The seed is the scale (a copy keeps its name: the backward
			// pass starts there).
			cp := r.emit("identity", []*ir.Value{dyn.scale}, ir.Attrs{"role": ir.StringAttr(ir.RoleLossSeed)}, op.Loc, "")
			cp.Name = seed.Name
			r.env[seed] = cp
			continue
		}
		if scale && seed != nil && op.Results[0] == seed {
			attrs = ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: op.Results[0].Type, Floats: []float64{c.LossScale}}), "role": ir.StringAttr(ir.RoleLossSeed)}
		}
		nop, err := f.NewOp(op.Kind, operands, attrs, op.Loc, "")
		if err != nil {
			return Stats{}, fmt.Errorf("@%s: %s: %v", f.Name, op.Kind, err)
		}
		nop.Attrs = attrs
		// Keep the names: results and gradients are found by them.
		for i, res := range nop.Results {
			res.Name = op.Results[i].Name
			r.env[op.Results[i]] = res
		}
		r.body = append(r.body, nop)
		// A large activation computed in f32 (softmax, normalisations) is
		// stored in the low dtype like every other one: readers that need
		// f32 cast it back. Gradients and the step's results keep f32.
		if want == ir.F32 && low != ir.F32 && !gradOps[op] && !op.Def().Impure && !accumulator {
			for i, res := range nop.Results {
				old := op.Results[i]
				if res.Type.DType == ir.F32 && storedLow(f, op, old) {
					r.env[old] = r.as(res, low, op.Loc)
				}
			}
		}
	}
	// The results in the order the step completes them, so that the
	// unscaling of each gradient (and the running sum that checks them)
	// can follow it at once (hoistUnscaling).
	order := make([]int, len(f.Results))
	at := map[*ir.Op]int{}
	for i, op := range r.body {
		at[op] = i
	}
	doneAt := func(i int) int {
		if v := r.env[f.Results[i].Value]; v != nil && v.Def != nil {
			return at[v.Def]
		}
		return -1
	}
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return doneAt(order[a]) < doneAt(order[b]) })
	for _, i := range order {
		old := f.Results[i].Value
		v := r.env[old]
		if v == nil {
			continue // an argument returned as it is
		}
		if w := r.as(v, old.Type.DType, ir.Location{}); w != v {
			v = w
			r.early[v.Def] = true
		}
		if scale && f.Results[i].Role() == ir.RoleGrad {
			inv := r.emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: ir.Type{DType: v.Type.DType, Shape: ir.Shape{}}, Floats: []float64{1 / c.LossScale}})}, ir.Location{}, "loss.unscale")
			v = r.emit("mul", []*ir.Value{v, inv}, nil, ir.Location{}, f.Results[i].Name+".unscaled")
			r.early[inv.Def], r.early[v.Def] = true, true
		}
		if dyn != nil && f.Results[i].Role() == ir.RoleGrad {
			v = dyn.unscale(r, v, f.Results[i].Name)
		}
		f.Results[i].Value = v
	}
	if dyn != nil {
		dyn.finish(r)
	}
	r.body = hoistUnscaling(r.body, r.early)
	f.Body = dropUnusedBroadcasts(f, r.body)
	r.body = f.Body
	if c.Saved != 0 && c.Saved != low {
		narrowSaved(r, c.Saved)
		f.Body = r.body
	}
	for _, a := range f.Args {
		switch {
		case a.Arg.Kind == ir.ArgParam && a.Type.DType == ir.F32:
			r.st.ParamBytes += a.Type.SizeBytes()
		case a.Arg.Kind == ir.ArgData && a.Type.DType.IsFloat() && a.Type.DType.Size() >= 4:
			r.st.DataBytes += a.Type.SizeBytes()
		}
	}
	for _, res := range f.Results {
		if res.Value.Type.DType == ir.F32 {
			r.st.ResultBytes += res.Value.Type.SizeBytes()
		}
	}
	r.st.ByDesign = map[string]ValueCount{}
	for v, class := range KeptByDesign(f) {
		if !f.IsResult(v) {
			c := r.st.ByDesign[class]
			r.st.ByDesign[class] = ValueCount{c.Count + 1, c.Bytes + v.Type.SizeBytes()}
		}
	}
	return r.st, ir.Verify(&ir.Module{Funcs: []*ir.Func{f}})
}

// storedLow says whether result res of op, computed in f32, is an
// activation that is stored in the low dtype: the result of a
// contraction, or one shaped like a float activation operand of op (a
// value the step computes, or a data input: a normalisation's y, the
// gradient of logits), and not a scalar or a result of the step.
// Statistics (shaped like the parameters, running statistics or reduced)
// and gradients keep f32. The rule does not depend on sizes,
// so that a model rounds the same values at every batch size.
func storedLow(f *ir.Func, op *ir.Op, res *ir.Value) bool {
	if res.Type.Rank() == 0 || f.IsResult(res) {
		return false
	}
	if op.Def().Contraction {
		return true
	}
	for _, x := range op.Operands {
		if x.Type.DType.IsFloat() && x.Type.Shape.Equal(res.Type.Shape) && (x.Def != nil || x.Arg.Kind == ir.ArgData) {
			return true
		}
	}
	return false
}

// readsParam says whether op reads a float parameter (an f32 master
// weight) directly. An elementwise op that does (a bias or positional
// embedding added, a scale multiplied) reads it as it is, with no low
// copy: the parameter is not rounded, only the result is, once.
func readsParam(op *ir.Op) bool {
	for _, x := range op.Operands {
		if x.Arg != nil && x.Arg.Kind == ir.ArgParam && x.Type.DType.IsFloat() {
			return true
		}
	}
	return false
}

// takesResultDType says whether ops of this kind take result_dtype.
func takesResultDType(d *ir.OpDef) bool {
	for _, a := range d.Attrs {
		if a.Name == ir.ResultDTypeAttr.Name {
			return true
		}
	}
	return false
}

// readsFloatData says whether op reads a data argument stored in f32 (or
// f64); a data input already in a 16-bit type is read as it is.
func readsFloatData(op *ir.Op) bool {
	for _, x := range op.Operands {
		if x.Arg != nil && x.Arg.Kind == ir.ArgData && x.Type.DType.IsFloat() && x.Type.DType.Size() >= 4 {
			return true
		}
	}
	return false
}

// lossSeed returns the loss-gradient seed of a training step made by
// autodiff (the constant loss.grad), or nil.
func lossSeed(f *ir.Func) *ir.Value {
	var seed *ir.Value
	for _, op := range f.Body {
		if ir.IsConstant(op) && op.Attrs.String("role", "") == ir.RoleLossSeed {
			seed = op.Results[0]
		}
	}
	return seed
}

// rebroadcast makes a large broadcast again right before each reader, so
// that none lives from one reader to the next (and fuse can read it as a
// matmul prologue).
func (r *rewriter) rebroadcast(v *ir.Value) *ir.Value {
	if v.Def == nil || v.Def.Kind != "expand" || v.Type.NumElements() < 1<<16 {
		return v
	}
	return r.emit("expand", v.Def.Operands, v.Def.Attrs, v.Def.Loc, v.Name)
}

// dropUnusedBroadcasts removes the expand ops whose every reader got a
// broadcast of its own.
func dropUnusedBroadcasts(f *ir.Func, body []*ir.Op) []*ir.Op {
	used := map[*ir.Value]bool{}
	for _, op := range body {
		for _, x := range op.Operands {
			used[x] = true
		}
	}
	for _, r := range f.Results {
		used[r.Value] = true
	}
	out := body[:0]
	for _, op := range body {
		if op.Kind == "expand" && !used[op.Results[0]] {
			continue
		}
		out = append(out, op)
	}
	return out
}

// gradientProducers are the ops that compute the returned gradients:
// walking back from each grad.* result through accumulations, sums and
// views to the op that makes it (the weight-gradient matmul or
// convolution). They compute in f32 from low-precision operands, so
// gradients are produced in f32, not rounded to the low dtype first.
func gradientProducers(f *ir.Func) map[*ir.Op]bool {

	out := map[*ir.Op]bool{}
	var visit func(v *ir.Value)
	visit = func(v *ir.Value) {
		op := v.Def
		if op == nil || out[op] {
			return
		}
		switch {
		case op.Kind == "add" || op.Def().Fusion == ir.Injective:
			out[op] = true
			for _, x := range op.Operands {
				visit(x)
			}
		case op.Def().Contraction || takesResultDType(op.Def()):
			out[op] = true // a product or sum over the activations
		}
	}
	for _, r := range f.Results {
		if r.Role() == ir.RoleGrad {
			visit(r.Value)
		}
	}
	return out
}

func contains(xs []int, i int) bool {
	for _, x := range xs {
		if x == i {
			return true
		}
	}
	return false
}

// narrowSaved casts each forward value the backward pass reads down to d
// after its last forward use, and back up before its first backward use.
// With fp8 (a per-tensor scale), a backward reader of a ScaleFree operand
// reads the stored bytes, and one product linear in the value alone reads
// them and has its result scaled (readScaled); only the others read the
// restored value. The backward pass starts at the loss-gradient seed.
func narrowSaved(r *rewriter, d ir.DType) {
	body := r.body
	start := -1
	for i, op := range body {
		if op.Attrs.String("role", "") == ir.RoleLossSeed && start < 0 {
			start = i
		}
	}
	if start < 0 {
		return
	}
	pos := map[*ir.Op]int{}
	for i, op := range body {
		pos[op] = i
	}
	lastForward := map[*ir.Value]int{}
	var saved []*ir.Value
	seen := map[*ir.Value]bool{}
	for i, op := range body {
		for _, x := range op.Operands {
			if x.Def == nil || pos[x.Def] >= start || !x.Type.DType.IsFloat() || x.Type.DType.Size() <= d.Size() {
				continue
			}
			if x.Type.Rank() == 0 {
				continue // scalars are not worth a cast
			}
			if x.Def.Def().KeepF32 && !storedLow(r.f, x.Def, x) {
				continue // a statistic keeps f32, as in the low-precision step
			}
			if ir.IsConstant(x.Def) {
				continue // made again at no cost: nothing to store
			}
			if i < start {
				lastForward[x] = i
			} else if !seen[x] {
				seen[x] = true
				saved = append(saved, x)
			}
		}
	}
	after := map[int][]*ir.Op{}
	restored := map[*ir.Value]*ir.Value{}
	stored, scales := map[*ir.Value]*ir.Value{}, map[*ir.Value]*ir.Value{} // fp8: the stored value and its scale
	var restoreOps = map[*ir.Value][]*ir.Op{}
	for _, v := range saved {
		at, ok := lastForward[v]
		if !ok {
			at = pos[v.Def]
		}
		r.body = nil
		var down, scale *ir.Value
		if d == ir.F8E4M3 {
			// The scale is computed in f32: in f16, 1e-30 is 0 and amax/448
			// underflows below 2.7e-5.
			var inF32 ir.Attrs
			if v.Type.DType != ir.F32 {
				inF32 = ir.Attrs{"result_dtype": ir.TypeAttr(ir.F32)}
			}
			// max|x| as max(max x, -min x): two folds of v, no
			// full-size |x| beside it.
			hi := r.emit("reduce_max", []*ir.Value{v}, inF32, v.Def.Loc, v.Name+".max")
			lo := r.emit("reduce_min", []*ir.Value{v}, inF32, v.Def.Loc, v.Name+".min")
			mx := r.emit("max", []*ir.Value{hi, r.emit("neg", []*ir.Value{lo}, nil, v.Def.Loc, v.Name+".negmin")}, nil, v.Def.Loc, v.Name+".amax")
			tiny := r.emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: mx.Type, Floats: []float64{1e-30}})}, v.Def.Loc, v.Name+".tiny")
			fp8max := r.emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: mx.Type, Floats: []float64{448}})}, v.Def.Loc, v.Name+".fp8max")
			scale = r.emit("div", []*ir.Value{r.emit("max", []*ir.Value{mx, tiny}, nil, v.Def.Loc, v.Name+".amax1"), fp8max}, nil, v.Def.Loc, v.Name+".scale")
			// One op divides and rounds to fp8 (|x|/scale <= 448: the
			// rounding saturates, as Cast does): no full-size scaled copy.
			down = r.emit("div", []*ir.Value{v, scale}, ir.Attrs{"result_dtype": ir.TypeAttr(d)}, v.Def.Loc, v.Name+".saved")
		} else {
			down = r.emit("cast", []*ir.Value{v}, ir.Attrs{"to": ir.TypeAttr(d)}, v.Def.Loc, v.Name+".saved")
		}
		after[at] = append(after[at], r.body...)
		r.body = nil
		var up *ir.Value
		if scale != nil {
			// One op reads the fp8 value and its scale and rounds once:
			// no full-size restored copy besides the unscaled one.
			up = r.emit("mul", []*ir.Value{down, scale}, ir.Attrs{"result_dtype": ir.TypeAttr(v.Type.DType)}, v.Def.Loc, v.Name+".restored")
		} else {
			up = r.emit("cast", []*ir.Value{down}, ir.Attrs{"to": ir.TypeAttr(v.Type.DType)}, v.Def.Loc, v.Name+".restored")
		}
		restoreOps[v] = r.body
		restored[v] = up
		if scale != nil {
			stored[v], scales[v] = down, scale
		}
		r.st.Saved++
		r.st.SavedBytes += v.Type.SizeBytes()
		r.st.StoredBytes += v.Type.NumElements() * int64(d.Size())
	}
	var out []*ir.Op
	placed := map[*ir.Value]bool{}
	for i, op := range body {
		var unscale *ir.Op
		if i >= start {
			for j, x := range op.Operands {
				if down := stored[x]; down != nil {
					switch {
					case contains(op.Def().ScaleFree, j):
						// It decides by comparisons a positive scale
						// keeps: it reads the stored value as it is.
						op.Operands[j] = down
						continue
					case unscale == nil && linearAlone(op, j) && takesResultDType(op.Def()):
						// Linear in x alone: it reads the stored value and
						// its result is scaled once.
						op.Operands[j] = down
						unscale = readScaled(r, op, scales[x])
						continue
					}
				}
				if up, ok := restored[x]; ok {
					if !placed[x] {
						out = append(out, restoreOps[x]...)
						placed[x] = true
					}
					op.Operands[j] = up
				}
			}
		}
		out = append(out, op)
		if unscale != nil {
			out = append(out, unscale)
		}
		out = append(out, after[i]...)
	}
	r.body = out
}

// linearAlone says whether op is linear in operand i by itself (not
// jointly with another operand, as a gemm's A with its C).
func linearAlone(op *ir.Op, i int) bool {
	d := op.Def()
	if d.Linear == nil {
		return false
	}
	for _, g := range d.Linear(op.Attr(), len(op.Operands)) {
		if len(g) == 1 && g[0] == i {
			return true
		}
	}
	return false
}

// readScaled makes op, which now reads a stored fp8 value in place of the
// value divided by scale, keep its result: op computes into a new f32
// value (result_dtype), and the returned mul, which the caller places
// right after op, multiplies it by scale and rounds once into op's old
// result, which every reader keeps.
func readScaled(r *rewriter, op *ir.Op, scale *ir.Value) *ir.Op {
	res := op.Results[0]
	op.Attrs = op.Attrs.Clone()
	// x/scale is up to 448/max|x| times x: f16 would overflow, so an f16
	// or f32 result is computed in f32 first. bf16 has f32's exponent
	// range: a bf16 result is computed in bf16 (the product still
	// accumulates in f32 and rounds once; the scale rounds again), half
	// the bytes of an f32 copy that would sit beside it at the peak.
	rawType := res.Type
	rawType.DType = ir.F32
	if res.Type.DType == ir.BF16 {
		rawType.DType = ir.BF16
	}
	op.Attrs["result_dtype"] = ir.TypeAttr(rawType.DType)
	raw := &ir.Value{Name: r.f.UniqueName(res.Name + ".fp8"), Type: rawType, Def: op, Offset: ir.NoOffset}
	op.Results[0] = raw
	var attrs ir.Attrs
	if res.Type.DType != ir.F32 {
		attrs = ir.Attrs{"result_dtype": ir.TypeAttr(res.Type.DType)}
	}
	mul, err := r.f.NewOp("mul", []*ir.Value{raw, scale}, attrs, op.Loc, res.Name)
	if err != nil {
		panic(fmt.Sprintf("precision: %v", err)) // a float times a scalar
	}
	mul.Results[0] = res
	res.Def = mul
	return mul
}

// KeptByDesign names the values of f that mixed precision keeps in f32,
// or adds, by design, apart from arguments and results: "gradient" (a
// value that makes a returned gradient: a weight-gradient product or
// sum computed in f32, the partial sums and scalings between it and the
// result), "statistic" (a normalisation's or loss's result shaped like
// the parameters or reduced), and "weight copy" (a low-precision copy of
// an f32 master weight, made for a product that reads it).
func KeptByDesign(f *ir.Func) map[*ir.Value]string {
	out := map[*ir.Value]string{}
	var visit func(v *ir.Value)
	visit = func(v *ir.Value) {
		op := v.Def
		if op == nil || out[v] != "" || v.Type.Rank() == 0 || !v.Type.DType.IsFloat() {
			return
		}
		for _, x := range op.Operands {
			if x.Type.DType == ir.F8E4M3 {
				return // a product of a stored fp8 value before its scaling: a cost of fp8
			}
		}
		out[v] = "gradient"
		d := op.Def()
		if d.Contraction || takesResultDType(d) && d.Fusion == ir.Reduction {
			return // the product or sum that makes it
		}
		switch d.Fusion {
		case ir.Elementwise, ir.Broadcast, ir.Injective:
			for _, x := range op.Operands {
				visit(x)
			}
		}
	}
	for _, r := range f.Results {
		if r.Role() == ir.RoleGrad {
			visit(r.Value)
		}
	}
	for _, op := range f.Body {
		for _, v := range op.Results {
			switch {
			case out[v] != "":
			case op.Def().KeepF32 && v.Type.DType.IsFloat() && !storedLow(f, op, v):
				out[v] = "statistic"
			case op.Kind == "cast" && op.Operands[0].Arg != nil && op.Operands[0].Arg.Kind == ir.ArgParam:
				out[v] = "weight copy"
			}
		}
	}
	return out
}
