// Package microbatch is the `microbatch` pass (gradient accumulation): it
// splits a training step into n slices of the batch that run one after
// another, each through the whole forward and backward, and accumulates
// their gradients, so that the activations of one slice are live at a
// time.
package microbatch

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "microbatch",
		Summary:     "run a training step as n sequential slices of the batch, accumulating the gradients (gradient accumulation)",
		Requires:    []passes.Property{passes.TrainingStep},
		Excludes:    []passes.Property{passes.Fused, passes.Assigned},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		for _, f := range m.Funcs {
			split := Split
			if o.ExactBN {
				split = SplitExact
			}
			st, err := split(f, o.N)
			if err != nil {
				return err
			}
			ctx.AddStat("microbatches", int64(o.N))
			ctx.AddStat("batch", st.Batch)
			switch {
			case st.Phases > 0:
				ctx.AddStat("phases", int64(st.Phases))
				ctx.Stat("note", fmt.Sprintf("batch normalisation (%d ops) takes the whole batch's statistics: each slice runs in %d phases", st.BatchNorms, st.Phases))
			case st.BatchNorms > 0:
				ctx.Stat("note", fmt.Sprintf("batch normalisation (%d ops) takes its statistics per microbatch of %d, as PyTorch does under gradient accumulation (exact-bn=true keeps the whole batch's)", st.BatchNorms, st.Batch/int64(o.N)))
			}
		}
		return nil
	}))
}

type options struct {
	N       int  `opt:"n" default:"2" range:"[1,inf)" doc:"number of slices of the batch (it must divide the batch)"`
	ExactBN bool `opt:"exact-bn" default:"false" doc:"keep the whole batch's statistics in batch normalisation: the slices run in three phases per batch norm, recomputing their forward up to it (about L/2 extra forwards for L norms)"`
}

// Stats is what Split did.
type Stats struct {
	Batch      int64 // the batch that was split
	BatchNorms int   // batch_norm_train ops, whose statistics are now per slice
	Dropouts   int   // dropout ops, which now draw a mask per slice
	Phases     int   // SplitExact: the passes over the slices
	Kept       int64 // SplitExact: the most bytes one phase reads from the last and keeps for the next, all slices
}

// Split rewrites the training step f (autodiff ran; the optimizer may
// have) into n slices of its batch. On error f is unchanged.
//
// The batch is dimension 0 of the first data argument; every data
// argument with that leading dimension is sliced. An op is per-slice when
// it reads a sliced value, or when it reads the loss seed and its result
// is not a scalar (the seed's expansion to the output's shape); the rest
// (parameters, constants) runs once. Per-slice ops are copied for each
// slice with their types inferred again; shape attributes that carry the
// batch (expand, reshape, the input_shape of gradient ops) are divided by
// n, and a copy whose shape does not follow is an error naming the op.
//
// In-place updates (the optimizer's) run once after the slices, reading
// the running sums of the gradients.
//
// Results: gradients are summed over the slices in a running sum (the
// constants autodiff derived from the whole batch, such as a mean's 1/B,
// stay, so the sum is the whole batch's gradient); a loss made by
// reduce_sum is summed and one made by reduce_mean averaged; other
// results are joined along their sliced dimension. Dropout draws each
// slice's mask from its own seed. Batch normalisation in training mode
// takes each slice's statistics.
func Split(f *ir.Func, n int) (Stats, error) { return split(f, n, 0, nil, false) }

// Origin is where an op of a split step comes from: the op of the whole
// step it copies for slice Slice (Op is nil for the slice of a batch
// argument; a running sum's add has the op that made the slice's value).
type Origin struct {
	Op    *ir.Op
	Slice int64
}

// SplitTraced is Split, returning the origin of every op it made for a
// slice; the ops before and after the slices (parameter-only work, the
// updates, the results' joins) have none.
func SplitTraced(f *ir.Func, n int) (Stats, map[*ir.Op]Origin, error) {
	trace := map[*ir.Op]Origin{}
	st, err := split(f, n, 0, trace, false)
	return st, trace, err
}

// Shard rewrites the training step f into the step of one of n ranks
// that share its batch (data parallelism): the batch arguments hold 1/n
// of the batch (rank r gets rows r·B/n to (r+1)·B/n), and every rank
// runs the same function. Where Split sums the slices, Shard all-reduces
// over the n ranks: gradients and a summed loss are summed, a mean loss
// averaged, and results joined along the batch are all-gathered, so that
// every rank returns the whole step's results and in-place updates see
// the whole batch's gradients. Sharded arguments carry shard = 0. On
// error f is unchanged.
func Shard(f *ir.Func, n int) (Stats, error) { return split(f, n, n, nil, false) }

// ShardMicro is Shard on ranks ranks, each of which runs its part of the
// batch as m microbatches (Split) before the all-reduces.
func ShardMicro(f *ir.Func, ranks, m int) (Stats, error) { return ShardMicroTraced(f, ranks, m, nil) }

// ShardMicroTraced is ShardMicro recording in trace (when not nil) the
// origin of every op it made for a slice, as SplitTraced does.
func ShardMicroTraced(f *ir.Func, ranks, m int, trace map[*ir.Op]Origin) (Stats, error) {
	return ShardMasks(f, ranks, m, trace, false)
}

// ShardMasks is ShardMicroTraced; with exactDropout (and no microbatches
// beside the ranks) each rank's dropouts draw its rows of the whole
// batch's mask: every rank draws the whole mask (the dropout of ones of
// the whole batch's shape) and keeps its rows with a reduce_scatter by
// max over identical tensors, so the ranks' step equals the one-device
// step, at the cost of a mask-sized exchange per dropout and per
// gradient. Without it each rank draws a mask for its rows as a slice
// does, from the same counter: the ranks' masks repeat one another.
func ShardMasks(f *ir.Func, ranks, m int, trace map[*ir.Op]Origin, exactDropout bool) (Stats, error) {
	if ranks == 1 {
		return split(f, m, 0, trace, false)
	}
	if exactDropout && m > 1 {
		return Stats{}, fmt.Errorf("microbatch: exact dropout masks beside microbatches on each rank are not built")
	}
	return split(f, ranks*m, ranks, trace, exactDropout)
}

// split cuts f's batch into n slices: on one device (ranks = 0), or on
// ranks ranks that run n/ranks slices each. A non-nil trace gets the
// origin of each op made for a slice.
func split(f *ir.Func, n int, ranks int, trace map[*ir.Op]Origin, exactDropout bool) (Stats, error) {
	record := func(op *ir.Op, o Origin) {
		if trace != nil {
			trace[op] = o
		}
	}
	for _, op := range f.Body {
		if ir.IsPointToPoint(op.Kind) {
			return Stats{}, fmt.Errorf("%s: microbatch: @%s is a pipeline stage (it has %ss), whose microbatches parallel{pp, microbatches} makes", loc(op), f.Name, op.Kind)
		}
	}
	if n == 1 {
		return Stats{}, nil
	}
	s := &splitter{f: f, n: int64(n), sliced: map[*ir.Value]cut{}, ranks: int64(ranks), exactDropout: exactDropout}
	if err := s.findBatch(); err != nil {
		return Stats{}, err
	}
	st := Stats{Batch: s.batch}
	perSlice := s.classify()
	perVal := map[*ir.Value]bool{}
	for op := range perSlice {
		for _, r := range op.Results {
			perVal[r] = true
		}
	}
	// Ops that stay whole run before the slices, unless they read a
	// slice's value (an optimizer update reading a gradient): those run
	// after the slices on the running sums.
	var before, after []*ir.Op
	summed := map[*ir.Value]bool{} // per-slice values whose sum over the slices is read
	for _, op := range f.Body {
		switch {
		case perSlice[op]:
			switch op.Kind {
			case "batch_norm_train":
				st.BatchNorms++
			case "dropout":
				st.Dropouts++
			}
		case slices.ContainsFunc(op.Operands, func(v *ir.Value) bool { return perVal[v] }):
			after = append(after, op)
			for _, v := range op.Operands {
				if perVal[v] {
					summed[v] = true
				}
			}
		default:
			before = append(before, op)
		}
	}
	for _, r := range f.Results {
		if role := r.Role(); (role == ir.RoleGrad || role == ir.RoleLoss) && perVal[r.Value] {
			summed[r.Value] = true
		}
	}
	body := before
	used := map[*ir.Value]bool{} // values some op reads
	for _, op := range f.Body {
		for _, x := range op.Operands {
			used[x] = true
		}
	}
	sum := map[*ir.Value]*ir.Value{}     // running sums
	parts := map[*ir.Value][]*ir.Value{} // per-slice results to join
	slices := s.n
	shardArgs := map[*ir.Value]*ir.Value{} // with ranks: each batch argument as one rank holds it
	if ranks > 0 {
		slices = s.n / int64(ranks) // this rank's
		for _, a := range s.args {
			info := *a.Arg
			info.Attrs = a.Arg.Attrs.Clone()
			if info.Attrs == nil {
				info.Attrs = ir.Attrs{}
			}
			info.Attrs["shard"] = ir.IntAttr(0) // the rank's part of dimension 0
			na := &ir.Value{Name: a.Name, Type: a.Type, Index: a.Index, Offset: ir.NoOffset, Arg: &info}
			na.Type.Shape = append(ir.Shape{s.batch / int64(ranks)}, a.Type.Shape[1:]...)
			shardArgs[a] = na
		}
	}
	var summedOrder []*ir.Value // the summed values, as their sums begin
	for k := int64(0); k < slices; k++ {
		m := map[*ir.Value]*ir.Value{}
		for _, a := range s.args {
			size := s.batch / s.n
			src := a
			if ranks > 0 {
				src = shardArgs[a]
				if slices == 1 {
					m[a] = src
					s.sliced[src] = cut{dim: 0, inner: 1}
					continue
				}
			}
			op, err := f.NewOp("slice", []*ir.Value{src}, ir.Attrs{
				"starts": ir.IntsAttr(k * size), "ends": ir.IntsAttr((k + 1) * size), "axes": ir.IntsAttr(0),
			}, ir.Location{}, fmt.Sprintf("%s.mb%d", a.Name, k))
			if err != nil {
				return st, err
			}
			body = append(body, op)
			record(op, Origin{Slice: k})
			m[a] = op.Results[0]
			s.sliced[op.Results[0]] = cut{dim: 0, inner: 1}
		}
		// Values summed over the slices join their running sums as soon
		// as a slice has made them, so one slice's copy is live at a time.
		for _, op := range f.Body {
			if !perSlice[op] {
				continue
			}
			c, pre, err := s.copyOp(op, m, k)
			if err != nil {
				return st, err
			}
			body = append(append(body, pre...), c)
			for _, p := range append(pre, c) {
				record(p, Origin{op, k})
			}
			for i, r := range op.Results {
				if i >= len(c.Results) {
					continue // an exact dropout's mask, which nothing reads
				}
				v := c.Results[i]
				m[r] = v
				if f.IsResult(r) && !summed[r] {
					parts[r] = append(parts[r], v)
				}
				if !summed[r] {
					continue
				}
				if ranks > 0 && slices == 1 {
					ar, err := f.NewOp("all_reduce", []*ir.Value{v}, ir.Attrs{"size": ir.IntAttr(int64(ranks))}, op.Loc, r.Name+".allreduce")
					if err != nil {
						return st, err
					}
					body = append(body, ar)
					sum[r] = ar.Results[0]
					continue
				}
				if sum[r] == nil {
					sum[r] = v
					summedOrder = append(summedOrder, r)
					continue
				}
				if acc := accumulateInto(f, c, sum[r], used[r], r.Name+".acc"); acc != nil {
					// The product adds the running sum as it stores, over
					// the sum's buffer: no second gradient-sized buffer.
					body[len(body)-1] = acc
					record(acc, Origin{op, k})
					sum[r] = acc.Results[0]
					continue
				}
				add, err := f.NewOp("add", []*ir.Value{sum[r], v}, nil, op.Loc, r.Name+".acc")
				if err != nil {
					return st, fmt.Errorf("%s: microbatch: accumulating %s: %v", loc(op), r.Ref(), err)
				}
				body = append(body, add)
				record(add, Origin{op, k})
				sum[r] = add.Results[0]
			}
		}
	}
	if ranks > 0 && slices > 1 {
		// The rank's sums over its slices, summed over the ranks.
		for _, r := range summedOrder {
			ar, err := f.NewOp("all_reduce", []*ir.Value{sum[r]}, ir.Attrs{"size": ir.IntAttr(int64(ranks))}, r.Def.Loc, r.Name+".allreduce")
			if err != nil {
				return st, err
			}
			body = append(body, ar)
			sum[r] = ar.Results[0]
		}
	}
	// f itself changes only once nothing can fail: the caller may keep it.
	results := make([]*ir.Value, len(f.Results))
	var tail []*ir.Op // the results' combining ops, after the updates
	for i, r := range f.Results {
		v := r.Value
		switch role := r.Role(); {
		case !perVal[v]:
		case role == ir.RoleLoss:
			v = sum[v]
			switch kind := r.Value.Def.Kind; kind {
			case "reduce_sum":
			case "reduce_mean":
				t := ir.Type{DType: v.Type.DType, Shape: ir.Shape{}}
				inv := &ir.Dense{Type: t, Floats: []float64{ir.RoundTo(t.DType, 1/float64(s.n))}}
				c, err := f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(inv)}, v.Def.Loc, r.Value.Name+".inv_n")
				if err != nil {
					return st, err
				}
				mean, err := f.NewOp("mul", []*ir.Value{v, c.Results[0]}, nil, v.Def.Loc, r.Value.Name+".mean")
				if err != nil {
					return st, err
				}
				tail = append(tail, c, mean)
				v = mean.Results[0]
			default:
				return st, fmt.Errorf("%s: microbatch: the loss is made by %s; only a reduce_sum or reduce_mean loss can be split into microbatches", loc(r.Value.Def), kind)
			}
		case role == ir.RoleGrad:
			v = sum[v]
		case role != "":
			return st, fmt.Errorf("microbatch: result %s has role %q, which cannot be combined across microbatches", r.Value.Ref(), role)
		default:
			ps := parts[v]
			c, ok := cut{}, false
			if len(ps) > 0 {
				c, ok = s.sliced[ps[0]]
			}
			if !ok {
				if len(ps) == 0 {
					return st, fmt.Errorf("%s: microbatch: result %s is computed from the batch and also read by an in-place update; it cannot be both joined and summed", loc(v.Def), v.Ref())
				}
				return st, fmt.Errorf("%s: microbatch: result %s is computed from the batch but does not follow it (%s per slice, %s whole)", loc(v.Def), v.Ref(), ps[0].Type, v.Type)
			}
			axis := ir.Attrs{"axis": ir.IntAttr(int64(c.dim))}
			if len(ps) > 1 {
				op, err := f.NewOp("concat", ps, axis, v.Def.Loc, v.Name+".join")
				if err != nil {
					return st, err
				}
				tail = append(tail, op)
				ps = op.Results
			}
			v = ps[0]
			if ranks > 0 {
				if c.inner != 1 {
					return st, fmt.Errorf("%s: parallel: result %s holds the batch inside dimension %d, which an all_gather cannot join", loc(v.Def), v.Ref(), c.dim)
				}
				op, err := f.NewOp("all_gather", ps, ir.Attrs{"axis": ir.IntAttr(int64(c.dim)), "size": ir.IntAttr(int64(ranks))}, v.Def.Loc, r.Value.Name+".gathered")
				if err != nil {
					return st, err
				}
				tail = append(tail, op)
				v = op.Results[0]
			}
		}
		if !v.Type.Equal(r.Value.Type) {
			return st, fmt.Errorf("%s: microbatch: result %s comes out as %s across the slices, not %s", loc(r.Value.Def), r.Value.Ref(), v.Type, r.Value.Type)
		}
		results[i] = v
	}
	for _, op := range after {
		for i, v := range op.Operands {
			if w, ok := sum[v]; ok {
				op.Operands[i] = w
			}
		}
		body = append(body, op)
	}
	for i, v := range results {
		f.Results[i].Value = v
	}
	for i, a := range f.Args {
		if na := shardArgs[a]; na != nil {
			f.Args[i] = na
		}
	}
	f.Body = append(body, tail...)
	passes.RemoveDeadOps(f)
	return st, nil
}

type splitter struct {
	f            *ir.Func
	ranks        int64 // > 0: Shard's ranks
	exactDropout bool  // ranks draw their rows of the whole batch's masks (ShardMasks)
	users        map[*ir.Value]int
	n            int64
	batch        int64
	args         []*ir.Value
	sliced       map[*ir.Value]cut // per-slice values that hold 1/n of the whole in one dimension
}

// cut says where a per-slice value is cut: in dimension dim, whose whole
// extent is outer·batch·inner (the batch's digits of that dimension's
// index lie above inner: a [B·H, T, d] attention tensor has inner H).
type cut struct {
	dim   int
	inner int64
}

// findBatch picks the batch and the data arguments to slice.
func (s *splitter) findBatch() error {
	for _, a := range s.f.Args {
		if a.Arg.Kind != ir.ArgData || len(a.Type.Shape) == 0 {
			continue
		}
		if s.batch == 0 {
			s.batch = a.Type.Shape[0]
		}
		if a.Type.Shape[0] == s.batch {
			s.args = append(s.args, a)
		}
	}
	switch {
	case s.batch == 0:
		return fmt.Errorf("microbatch: @%s has no data argument with a batch dimension to split", s.f.Name)
	case s.batch%s.n != 0:
		return fmt.Errorf("microbatch: the batch of @%s (%d, dimension 0 of %s) is not divisible by n=%d", s.f.Name, s.batch, s.args[0].Ref(), s.n)
	}
	return nil
}

// classify marks the ops that run once per slice.
func (s *splitter) classify() map[*ir.Op]bool {
	data := map[*ir.Value]bool{}
	seed := map[*ir.Value]bool{}
	for _, a := range s.args {
		data[a] = true
	}
	per := map[*ir.Op]bool{}
	perVal := map[*ir.Value]bool{}
	for _, op := range s.f.Body {
		d, sd, p := false, op.Attrs.String("role", "") == ir.RoleLossSeed, false
		for _, v := range op.Operands {
			d = d || data[v]
			sd = sd || seed[v]
			p = p || perVal[v]
		}
		for _, r := range op.Results {
			data[r], seed[r] = d, sd
			p = p || d || sd && len(r.Type.Shape) > 0
		}
		if d := op.Def(); d != nil && len(d.Writes) > 0 {
			p = false // in-place updates run once, after the slices, on the sums
		}
		if p {
			per[op] = true
			for _, r := range op.Results {
				perVal[r] = true
			}
		}
	}
	return per
}

// shapeAttrs are the attributes that may hold the shape of a tensor that
// carries the batch (weight_shape never does).
var shapeAttrs = []string{"shape", "input_shape", "data_shape", "output_shape"}

// copyOp copies a per-slice op for slice k, reading m's values.
func (s *splitter) copyOp(op *ir.Op, m map[*ir.Value]*ir.Value, k int64) (*ir.Op, []*ir.Op, error) {
	d := op.Def()
	if d == nil {
		return nil, nil, fmt.Errorf("%s: microbatch: unknown op %s", loc(op), op.Kind)
	}
	operands := make([]*ir.Value, len(op.Operands))
	slicedIn, perSliceIn := false, false
	for i, v := range op.Operands {
		operands[i] = v
		if w, ok := m[v]; ok {
			operands[i] = w
			perSliceIn = true
		}
		_, ok := s.sliced[operands[i]]
		slicedIn = slicedIn || ok
	}
	attrs := op.Attrs.Clone()
	if op.Kind == "dropout" || op.Kind == "dropout_grad" && len(op.Operands) == 1 {
		if s.exactDropout {
			if c, pre, ok, err := s.rankMask(op, operands[0]); ok || err != nil {
				return c, pre, err
			}
		}
		s.sliceMask(op, attrs, operands[0], k)
	}
	type try struct {
		operands []*ir.Value
		attrs    ir.Attrs
		pre      []*ir.Op // slices of whole operands the copy reads
	}
	var tries []try
	switch {
	case op.Kind == "reshape" && slicedIn:
		// The batch's digits of the flat index stay where they are: the
		// target dimension that holds them shrinks.
		a, ok := s.reshapeTarget(op, operands[0])
		if !ok {
			break
		}
		tries = append(tries, try{operands, a, nil})
	case slicedIn:
		// Shape entries that match a cut operand's; none; the same with
		// whole operands cut where a cut operand is (a parameter expanded
		// to the batch); then any entry n divides.
		for _, a := range s.patches(attrs, operands, true) {
			tries = append(tries, try{operands, a, nil})
		}
		tries = append(tries, try{operands, attrs, nil})
		if cutOps, pre, ok := s.cutWhole(op, operands, k); ok {
			tries = append(tries, try{cutOps, attrs, pre})
		}
		for _, a := range s.patches(attrs, operands, false) {
			tries = append(tries, try{operands, a, nil})
		}
	case perSliceIn: // a slice's sum over its rows (a gradient's part)
		tries = append(tries, try{operands, attrs, nil})
		for _, a := range s.patches(attrs, operands, false) {
			tries = append(tries, try{operands, a, nil})
		}
	default: // the seed's expansion: only shape attributes carry the batch
		for _, a := range s.patches(attrs, operands, false) {
			tries = append(tries, try{operands, a, nil})
		}
		tries = append(tries, try{operands, attrs, nil})
	}
	for _, t := range tries {
		in := make([]ir.Type, len(t.operands))
		for i, v := range t.operands {
			in[i] = v.Type
		}
		types, err := d.InferTypes(in, t.attrs)
		if err != nil {
			continue
		}
		dims, ok := s.follows(op, types)
		if !ok || s.broadcastsCut(op, t.operands, dims) {
			continue
		}
		if err := s.acrossBatch(op, t.operands, dims); err != nil {
			return nil, nil, err
		}
		c := &ir.Op{Kind: op.Kind, Operands: t.operands, Attrs: t.attrs, Loc: op.Loc}
		for i, ty := range types {
			r := &ir.Value{Name: s.f.UniqueName(fmt.Sprintf("%s.mb%d", op.Results[i].Name, k)), Type: ty, Def: c, Index: i, Offset: ir.NoOffset}
			c.Results = append(c.Results, r)
			if dims[i] >= 0 {
				s.sliced[r] = s.resultCut(op, t.operands, i, dims[i])
			}
		}
		return c, t.pre, nil
	}
	var ts []string
	for _, v := range operands {
		ts = append(ts, v.Type.String())
	}
	return nil, nil, fmt.Errorf("%s: microbatch: %s (%s) cannot run on a slice of the batch of %d: on operands %s no shape of its result follows the batch (whole: %s)",
		loc(op), op.Results[0].Ref(), op.Kind, s.batch/s.n, strings.Join(ts, ", "), op.Results[0].Type)
}

// sliceMask makes the mask a dropout (or the gradient that draws it
// again) copied for slice k of x draws: the whole batch's rows of the
// slice when they are a contiguous run of the whole tensor (the batch's
// digits outermost: the counter starts at the slice's first element, so
// the split step draws what the whole step draws), else a mask of the
// slice's own, from a seed of its own (the same for the dropout and its
// gradient).
func (s *splitter) sliceMask(op *ir.Op, attrs ir.Attrs, x *ir.Value, k int64) {
	whole := op.Operands[0].Type.Shape
	c, ok := s.sliced[x]
	before, _ := whole[:max(c.dim, 0)].NumElements()
	if ok && before == 1 && whole[c.dim] == s.batch*c.inner {
		local, _ := x.Type.Shape.NumElements()
		attrs["offset"] = ir.IntAttr(op.Attr().Int("offset") + k*local)
		return
	}
	attrs["seed"] = ir.IntAttr(op.Attrs["seed"].Int*s.n + k + 1)
}

// rankMask is a dropout (or the gradient that draws its mask again) of
// the rank's rows x of the batch with the whole batch's mask: the whole
// mask's scale drawn on every rank, the rank's rows kept by a
// reduce_scatter by max (identical tensors: exact), times x. ok is false
// where the rows are not one block of the cut dimension, or the
// dropout's mask is read (the copy would have none).
func (s *splitter) rankMask(op *ir.Op, x *ir.Value) (*ir.Op, []*ir.Op, bool, error) {
	c, ok := s.sliced[x]
	whole := op.Operands[0].Type
	if !ok || whole.Shape[c.dim] != s.batch*c.inner || op.Kind == "dropout" && s.readers()[op.Results[1]] > 0 {
		return nil, nil, false, nil
	}
	var pre []*ir.Op
	var err error
	emit := func(kind string, in []*ir.Value, a ir.Attrs, name string) *ir.Value {
		if err != nil {
			return in[0]
		}
		o, e := s.f.NewOp(kind, in, a, op.Loc, name)
		if err = e; e != nil {
			return in[0]
		}
		pre = append(pre, o)
		return o.Results[0]
	}
	name := op.Results[0].Name + ".mask"
	one := emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: ir.Type{DType: whole.DType, Shape: ir.Shape{}}, Floats: []float64{1}})}, name+".one")
	ones := emit("expand", []*ir.Value{one}, ir.Attrs{"shape": ir.IntsAttr(whole.Shape...)}, name+".ones")
	a := ir.Attrs{"seed": op.Attrs["seed"]}
	for _, k := range []string{"ratio", "offset"} {
		if v, ok := op.Attrs[k]; ok {
			a[k] = v
		}
	}
	scale := emit("dropout", []*ir.Value{ones}, a, name+".whole")
	part := emit("reduce_scatter", []*ir.Value{scale}, ir.Attrs{"size": ir.IntAttr(s.ranks), "axis": ir.IntAttr(int64(c.dim)), "op": ir.StringAttr("max")}, name)
	if err != nil {
		return nil, nil, false, fmt.Errorf("%s: microbatch: the rank's mask of %s: %v", loc(op), op.Results[0].Ref(), err)
	}
	y, err := s.f.NewOp("mul", []*ir.Value{x, part}, nil, op.Loc, op.Results[0].Name)
	if err != nil {
		return nil, nil, false, err
	}
	s.sliced[y.Results[0]] = c
	return y, pre, true, nil
}

// readers counts the readers of f's values (once, before the split).
func (s *splitter) readers() map[*ir.Value]int {
	if s.users == nil {
		s.users = map[*ir.Value]int{}
		for _, op := range s.f.Body {
			for _, v := range op.Operands {
				s.users[v]++
			}
		}
	}
	return s.users
}

// reshapeTarget divides the dimension of op's target shape that holds the
// batch's digits of the flat index of its operand x (a slice).
func (s *splitter) reshapeTarget(op *ir.Op, x *ir.Value) (ir.Attrs, bool) {
	c := s.sliced[x]
	whole := op.Operands[0].Type.Shape
	sigma := c.inner * prod(whole[c.dim+1:]) // flat stride of the batch's lowest digit
	target, ok := op.Attrs["shape"].Ints()
	if !ok {
		return nil, false
	}
	for j := range target {
		below := prod(target[j+1:])
		if sigma%below != 0 {
			continue
		}
		inner := sigma / below
		if target[j]%(inner*s.batch) != 0 {
			continue
		}
		a := op.Attrs.Clone()
		nt := slices.Clone(target)
		nt[j] /= s.n
		a["shape"] = ir.IntsAttr(nt...)
		return a, true
	}
	return nil, false
}

func prod(s []int64) int64 {
	p := int64(1)
	for _, v := range s {
		p *= v
	}
	return p
}

// resultCut is where result i of op's copy is cut, given that it is cut
// in dimension dim: transpose moves the operand's cut, reshape keeps the
// batch's flat digits, and other ops keep the inner factor of an operand
// cut in the same dimension (counted from the last) with the same whole
// extent.
func (s *splitter) resultCut(op *ir.Op, operands []*ir.Value, i, dim int) cut {
	whole := op.Results[i].Type.Shape
	switch op.Kind {
	case "reshape":
		c := s.sliced[operands[0]]
		sigma := c.inner * prod(op.Operands[0].Type.Shape[c.dim+1:])
		return cut{dim: dim, inner: sigma / prod(whole[dim+1:])}
	case "transpose":
		return cut{dim: dim, inner: s.sliced[operands[0]].inner}
	}
	for j, v := range operands {
		c, ok := s.sliced[v]
		if !ok {
			continue
		}
		wo := op.Operands[j].Type.Shape
		if len(wo)-c.dim == len(whole)-dim && wo[c.dim] == whole[dim] {
			return cut{dim: dim, inner: c.inner}
		}
	}
	return cut{dim: dim, inner: 1}
}

// cutWhole cuts op's whole operands where a cut operand is cut (counted
// from the last dimension, with the same whole extent), for slice k.
func (s *splitter) cutWhole(op *ir.Op, operands []*ir.Value, k int64) ([]*ir.Value, []*ir.Op, bool) {
	var ref *ir.Value
	for _, v := range operands {
		if _, ok := s.sliced[v]; ok {
			ref = v
			break
		}
	}
	c := s.sliced[ref]
	extent := ref.Type.Shape[c.dim] * s.n
	fromEnd := len(ref.Type.Shape) - c.dim
	out := slices.Clone(operands)
	var pre []*ir.Op
	for i, v := range operands {
		if _, ok := s.sliced[v]; ok {
			continue
		}
		d := len(v.Type.Shape) - fromEnd
		if d < 0 || v.Type.Shape[d] != extent {
			continue
		}
		size := extent / s.n
		if s.ranks > 0 && !sameRows(v, d) {
			// A rank's rows are not the first: every rank holds the whole
			// tensor, and a reduce_scatter by max over identical tensors
			// gives each its rows (exactly).
			rs, err := s.f.NewOp("reduce_scatter", []*ir.Value{v}, ir.Attrs{"size": ir.IntAttr(s.ranks), "axis": ir.IntAttr(int64(d)), "op": ir.StringAttr("max")}, op.Loc, v.Name+".rows")
			if err != nil {
				return nil, nil, false
			}
			pre = append(pre, rs)
			v = rs.Results[0]
			if s.n == s.ranks {
				s.sliced[v] = cut{dim: d, inner: c.inner}
				out[i] = v
				continue
			}
		}
		sl, err := s.f.NewOp("slice", []*ir.Value{v}, ir.Attrs{
			"starts": ir.IntsAttr(k * size), "ends": ir.IntsAttr((k + 1) * size), "axes": ir.IntsAttr(int64(d)),
		}, op.Loc, fmt.Sprintf("%s.mb%d", v.Name, k))
		if err != nil {
			return nil, nil, false
		}
		s.sliced[sl.Results[0]] = cut{dim: d, inner: c.inner}
		out[i] = sl.Results[0]
		pre = append(pre, sl)
	}
	return out, pre, len(pre) > 0
}

// sameRows reports whether v repeats one row along dimension d (an
// expand of a tensor without it): any rank's rows are the first rows.
func sameRows(v *ir.Value, d int) bool {
	if v.Def == nil || v.Def.Kind != "expand" {
		return false
	}
	x := v.Def.Operands[0]
	od := d - (v.Type.Rank() - x.Type.Rank())
	return od < 0 || x.Type.Shape[od] == 1
}

// patches lists copies of attrs with one shape entry divided by n:
// aligned, only entries at the position of an operand's cut with its
// whole extent.
func (s *splitter) patches(attrs ir.Attrs, operands []*ir.Value, aligned bool) []ir.Attrs {
	var out []ir.Attrs
	for _, name := range shapeAttrs {
		a, ok := attrs[name]
		if !ok {
			continue
		}
		vals, ok := a.Ints()
		if !ok {
			continue
		}
		for i, v := range vals {
			if v <= 0 || v%s.n != 0 {
				continue
			}
			if aligned && !s.alignedAt(operands, i, v) {
				continue
			}
			p := attrs.Clone()
			nv := slices.Clone(vals)
			nv[i] = v / s.n
			p[name] = ir.IntsAttr(nv...)
			out = append(out, p)
		}
	}
	return out
}

// alignedAt reports whether some operand is cut in dimension i, whose
// whole extent is v.
func (s *splitter) alignedAt(operands []*ir.Value, i int, v int64) bool {
	for _, o := range operands {
		if c, ok := s.sliced[o]; ok && c.dim == i && o.Type.Shape[c.dim]*s.n == v {
			return true
		}
	}
	return false
}

// acrossBatch is an error when op indexes its data along the dimension
// that holds the batch: its indices name rows of the whole batch, which a
// slice does not have.
func (s *splitter) acrossBatch(op *ir.Op, operands []*ir.Value, dims []int) error {
	data, cutDim := op.Operands[0].Type, -1
	switch op.Kind {
	case "gather", "gather_elements":
		if c, ok := s.sliced[operands[0]]; ok {
			cutDim = c.dim
		}
	case "gather_grad", "gather_elements_grad":
		data, cutDim = op.Results[0].Type, dims[0]
	default:
		return nil
	}
	if cutDim < 0 {
		return nil
	}
	axis := op.Attrs.Int("axis", 0)
	if axis < 0 {
		axis += int64(len(data.Shape))
	}
	if axis == int64(cutDim) {
		return fmt.Errorf("%s: microbatch: %s (%s) indexes along the batch dimension, which a slice of the batch does not hold whole", loc(op), op.Results[0].Ref(), op.Kind)
	}
	return nil
}

// broadcastsCut reports whether a result of an elementwise op's copy (or
// expand's) kept its whole
// extent in a dimension that lines up (from the last) with a cut operand's
// cut dimension of the same whole extent: a slice of one row broadcast
// against a whole operand, which would compute the wrong thing.
func (s *splitter) broadcastsCut(op *ir.Op, operands []*ir.Value, dims []int) bool {
	f := op.Def().Fusion
	if f != ir.Elementwise && f != ir.Broadcast && op.Kind != "expand" && op.Kind != "matmul" {
		return false // only these broadcast (matmul its batch dimensions)
	}
	for j, v := range operands {
		c, ok := s.sliced[v]
		if !ok {
			continue
		}
		wo := op.Operands[j].Type.Shape
		if op.Kind == "matmul" && c.dim >= len(wo)-2 {
			continue // a matrix dimension: the product does not broadcast it
		}
		for i, r := range op.Results {
			wr := r.Type.Shape
			d := len(wr) - (len(wo) - c.dim)
			if d >= 0 && wr[d] == wo[c.dim] && dims[i] != d && v.Type.Shape[c.dim] == 1 {
				return true
			}
		}
	}
	return false
}

// follows checks the inferred types of a copy against op's: each result
// is the same, or 1/n of it in one dimension (returned; -1 when the
// same).
func (s *splitter) follows(op *ir.Op, types []ir.Type) ([]int, bool) {
	if len(types) != len(op.Results) {
		return nil, false
	}
	dims := make([]int, len(types))
	for i, t := range types {
		old := op.Results[i].Type
		if t.DType != old.DType || len(t.Shape) != len(old.Shape) {
			return nil, false
		}
		dims[i] = -1
		for d := range t.Shape {
			switch {
			case t.Shape[d] == old.Shape[d]:
			case t.Shape[d]*s.n == old.Shape[d] && dims[i] < 0:
				dims[i] = d
			default:
				return nil, false
			}
		}
	}
	return dims, true
}

// loc is where an error about op points: its position in the parsed
// file, else its source location (an ONNX node), else its kind.
func loc(op *ir.Op) string {
	switch {
	case op == nil:
		return "microbatch"
	case op.Pos.IsValid():
		return op.Pos.String()
	case !op.Loc.IsUnknown():
		return op.Loc.String()
	}
	return op.Kind
}

// accumulateInto is c, a slice's gemm whose result joins the running sum
// and nothing else, made to add sum itself (C = sum, beta = 1), or nil
// when c is not such a product. gemm writes over its C operand, so the
// slice's product and the running sum share one buffer.
func accumulateInto(f *ir.Func, c *ir.Op, sum *ir.Value, used bool, name string) *ir.Op {
	if used || c.Kind != "gemm" || len(c.Operands) != 2 || !sum.Type.Equal(c.Results[0].Type) {
		return nil
	}
	attrs := ir.Attrs{}
	for k, v := range c.Attrs {
		attrs[k] = v
	}
	attrs["beta"] = ir.FloatAttr(1)
	acc, err := f.NewOp("gemm", []*ir.Value{c.Operands[0], c.Operands[1], sum}, attrs, c.Loc, name)
	if err != nil {
		return nil
	}
	return acc
}
