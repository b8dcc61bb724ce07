// Package parallel is the `parallel` pass: it partitions a training step
// over devices. With dp = N (data parallelism) the step
// becomes the SPMD program of one of N ranks, each holding 1/N of the
// batch and every parameter, the gradients (and a summed loss)
// all-reduced before the optimizer's updates, so every rank updates its
// parameters alike (microbatch.Shard); ZeRO stages 1 to 3 shard the
// optimizer state, gradients and parameters (zero.go). Tensor
// parallelism splits MLP blocks (tensor.go); pipeline parallelism cuts
// the step into a function per stage (pipeline.go).
package parallel

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/microbatch"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "parallel",
		Summary:     "partition a training step over devices: dp = N ranks each take 1/N of the batch and all-reduce the gradients (data parallelism, ZeRO); tp = T ranks split MLP blocks' weights (Megatron); pp = P stages pass activations and gradients along (pipeline, 1F1B)",
		Requires:    []passes.Property{passes.TrainingStep},
		Excludes:    []passes.Property{passes.Fused, passes.Assigned},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		if !o.SyncBN && !ctx.Allows(passes.PerSliceBN) {
			return fmt.Errorf("parallel{sync-bn=false} lets each rank normalise by its own statistics, which changes the step: allow it by name (--allow %s)", passes.PerSliceBN)
		}
		if !o.ExactDropout && !ctx.Allows(passes.PerRankDropout) {
			return fmt.Errorf("parallel{exact-dropout=false} lets every rank draw its dropout masks from the same counters, which changes the step: allow it by name (--allow %s)", passes.PerRankDropout)
		}
		var funcs []*ir.Func
		for _, f := range m.Funcs {
			plan := Plan{DP: o.DP, TP: o.TP, PP: o.PP, Zero: o.Zero, Bucket: o.Bucket.Of(0), LocalBN: !o.SyncBN, Microbatches: o.Microbatches, PerRankDropout: !o.ExactDropout, Device: ctx.Device()}
			if plan.PP > 1 {
				if len(m.Funcs) > 1 {
					return fmt.Errorf("parallel{pp=%d}: the module has %d functions; a pipeline cuts one step", plan.PP, len(m.Funcs))
				}
				stages, st, err := PipelinePlan(f, plan)
				if err != nil {
					return fmt.Errorf("parallel{pp=%d}: @%s: %v", plan.PP, f.Name, err)
				}
				funcs = append(funcs, stages...)
				ctx.AddStat("ranks", int64(plan.Ranks()))
				ctx.AddStat("sends", int64(st.Sends))
				ctx.AddStat("sent-bytes", st.SentBytes)
				order := "1F1B"
				if !st.Interleave {
					order = "each microbatch's forward and backward in turn (1F1B could deadlock)"
				}
				one := ctx.Device().Simulate(f).Seconds
				ctx.Note(fmt.Sprintf("@%s in %d stages of %d microbatches, %s; modelled step %.3g s (one device: %.3g s), %.0f%% of the stages' time idle", f.Name, plan.PP, max(1, plan.Microbatches), order, st.Step, one, 100*st.Bubble()))
				continue
			}
			st, err := Partition(f, plan)
			if err != nil {
				return err
			}
			funcs = append(funcs, f)
			ctx.AddStat("ranks", int64(plan.Ranks()))
			if st.BatchNorms > 0 {
				ctx.Approximate(passes.PerSliceBN, fmt.Sprintf("%d batch-normalisation ops of @%s (forward and gradient) take each rank's statistics", st.BatchNorms, f.Name))
			}
			if st.Dropouts > 0 && plan.PerRankDropout {
				ctx.Approximate(passes.PerRankDropout, fmt.Sprintf("%d random ops of @%s draw the same numbers on every rank", st.Dropouts, f.Name))
			}
		}
		m.Funcs = funcs
		return nil
	}))
}

type options struct {
	DP           int         `opt:"dp" default:"1" range:"[1,4096]" doc:"data-parallel ranks: each takes 1/dp of the batch (dp must divide it)"`
	PP           int         `opt:"pp" default:"1" range:"[1,64]" doc:"pipeline stages: the step is cut into pp functions balanced by the cost model that send activations forward and gradients back, each run by dp ranks (stage s on ranks s·dp to s·dp+dp−1); with microbatches they run 1F1B"`
	TP           int         `opt:"tp" default:"1" range:"[1,4096]" doc:"tensor-parallel ranks: the weights of each MLP block (two matrix products joined by elementwise ops) are split among them, Megatron's columns then rows, with one all_reduce forward and one backward"`
	Zero         int         `opt:"zero" default:"0" range:"[0,3]" doc:"ZeRO stage: 1 holds each parameter's optimizer state and update in parts across the ranks, its gradient whole until the backward ends, then reduce-scattered; 2 reduce-scatters each gradient once made (parameters gathered once); 3 also gathers each parameter separately for the forward and the backward"`
	Bucket       passes.Size `opt:"bucket" default:"25MiB" doc:"without ZeRO: all-reduce consecutive gradients together in buckets of up to this many bytes (DDP's default; 0: one all_reduce per gradient)"`
	Microbatches int         `opt:"microbatches" default:"1" range:"[1,inf)" doc:"each rank runs its part of the batch as this many microbatches (gradient accumulation) before the all-reduces"`
	SyncBN       bool        `opt:"sync-bn" default:"true" doc:"batch normalisation takes the whole batch's statistics, all-reduced over the ranks (SyncBatchNorm), so the step computes what one device does; false (an approximation: --allow per-slice-bn): each rank's own, as DDP does by default"`
	ExactDropout bool        `opt:"exact-dropout" default:"true" doc:"data-parallel ranks draw their rows of the whole batch's dropout masks (each rank's counters start at its rows' offset), so the step computes what one device does, with no exchange; false (an approximation: --allow per-rank-dropout): each rank draws a mask for its rows from the same counter, as DDP ranks seeded alike do"`
}

// Plan is how a step is spread over ranks.
type Plan struct {
	DP     int   // data-parallel ranks
	TP     int   // tensor-parallel ranks (0 or 1: none)
	PP     int   // pipeline stages (0 or 1: none; Pipeline makes them)
	Zero   int   // ZeRO stage (0 to 3)
	Bucket int64 // bytes of a gradient bucket without ZeRO (0: none)
	// LocalBN keeps each rank's batch-norm statistics (DDP's default)
	// instead of the whole batch's.
	LocalBN bool
	// Microbatches each rank runs its part of the batch as (0 or 1: one).
	Microbatches int
	// PerRankDropout lets every data-parallel rank draw its dropout
	// masks from the same counters (an approximation) instead of its rows
	// of the one-device step's masks.
	PerRankDropout bool
	// Device is what the pipeline's stages are balanced for (zero:
	// costmodel.Default).
	Device costmodel.Device
}

func (p Plan) device() costmodel.Device {
	if p.Device == (costmodel.Device{}) {
		return costmodel.Default
	}
	return p.Device
}

// String is p as the parallel pass's options (dp=2,zero=1), which parse
// back to p, its bucket and approximations aside.
func (p Plan) String() string {
	var parts []string
	for _, c := range []struct {
		name string
		n    int
		show bool
	}{{"dp", p.DP, p.PP <= 1 || p.DP > 1 || p.TP > 1}, {"tp", p.TP, p.TP > 1}, {"pp", p.PP, p.PP > 1}, {"zero", p.Zero, p.PP <= 1 || p.DP > 1 || p.TP > 1}, {"microbatches", p.Microbatches, p.PP > 1 || p.Microbatches > 1}} {
		if c.show {
			parts = append(parts, fmt.Sprintf("%s=%d", c.name, c.n))
		}
	}
	return strings.Join(parts, ",")
}

// Ranks is the number of ranks a plan runs on.
func (p Plan) Ranks() int { return max(1, p.DP) * max(1, p.TP) * max(1, p.PP) }

// Partition rewrites f into the SPMD step of one rank of p and marks it
// with the number of ranks (attribute ranks). On error f is unchanged.
func Partition(f *ir.Func, p Plan) (microbatch.Stats, error) {
	g := f.Clone()
	st, err := partition(g, p, nil, nil)
	if err == nil {
		*f = *g
	}
	return st, err
}

// partition is Partition, leaving f half rewritten on error; a non-nil
// trace gets the origin of each op made for a microbatch (ShardMicroTraced),
// and a non-nil tpTrace the op of f each op of the tensor-parallel
// rewrite comes from.
func partition(f *ir.Func, p Plan, trace map[*ir.Op]microbatch.Origin, tpTrace map[*ir.Op]*ir.Op) (microbatch.Stats, error) {
	if p.DP < 1 {
		return microbatch.Stats{}, fmt.Errorf("dp must be at least 1, got %d", p.DP)
	}
	tp := int64(max(1, p.TP))
	if p.Ranks() > 1 {
		if f.Attrs == nil {
			f.Attrs = ir.Attrs{}
		}
		f.Attrs["ranks"] = ir.IntAttr(int64(p.Ranks()))
	}
	// A mesh of dp × tp ranks: rank r is tensor-parallel rank r mod tp of
	// data-parallel rank r / tp; tensor-parallel groups are tp
	// consecutive ranks, data-parallel ones dp ranks tp apart.
	if tp > 1 {
		if _, err := tensorParallelTraced(f, tp, 1, tpTrace); err != nil {
			return microbatch.Stats{}, fmt.Errorf("parallel{tp=%d}: %v", p.TP, err)
		}
		if p.DP == 1 && p.Microbatches <= 1 {
			return microbatch.Stats{}, nil
		}
	}
	if p.DP > 1 && !p.LocalBN {
		// Whole-batch statistics: sums over the batch, which the ranks
		// all-reduce where their rows read them (SyncBatchNorm).
		if err := microbatch.DecomposeBatchNorm(f); err != nil {
			return microbatch.Stats{}, fmt.Errorf("parallel: whole-batch statistics: %v", err)
		}
	}
	opts := microbatch.Options{Trace: trace, PerSliceBN: p.LocalBN, PerRankDropout: p.PerRankDropout}
	st, err := microbatch.ShardWith(f, p.DP, max(1, p.Microbatches), opts)
	if err != nil && p.DP == 1 {
		return st, err
	}
	if err != nil {
		// Shard speaks of microbatches; here a slice of the batch is a rank's.
		msg := strings.ReplaceAll(err.Error(), "microbatch: ", "")
		if m := max(1, p.Microbatches); m > 1 {
			msg = strings.ReplaceAll(msg, "is not divisible by n=", fmt.Sprintf("is not divisible by dp × microbatches = %d × %d = ", p.DP, m))
		} else {
			msg = strings.ReplaceAll(msg, "is not divisible by n=", "is not divisible by dp=")
		}
		return st, fmt.Errorf("parallel{dp=%d}: %s", p.DP, msg)
	}
	if tp > 1 {
		// The data-parallel collectives and batch parts span the groups
		// of ranks tp apart. Shard's collectives name no stride; the
		// tensor-parallel ones (which its slices copy) name theirs.
		for _, op := range f.Body {
			if _, named := op.Attrs["stride"]; ir.IsCollective(op.Kind) && !named {
				op.Attrs["stride"] = ir.IntAttr(tp)
			}
			if _, named := op.Attrs["rank_stride"]; op.Attrs.Int("rank_offset", 0) != 0 && !named {
				op.Attrs["rank_stride"] = ir.IntAttr(tp) // its data-parallel group
			}
		}
		for _, a := range f.Args {
			if sh, ok := a.Arg.Attrs["shard"]; ok && sh.Kind == ir.AttrInt && a.Arg.Kind == ir.ArgData {
				delete(a.Arg.Attrs, "shard")
				ir.AddShardLevel(f, a, ir.ShardLevel{Dim: sh.Int, Size: int64(p.DP), Stride: tp})
			}
		}
	}
	switch p.Zero {
	case 0:
		if p.DP > 1 && p.Bucket > 0 {
			if _, err := bucket(f, int64(p.DP), tp, p.Bucket); err != nil {
				return st, fmt.Errorf("parallel{bucket}: %v", err)
			}
		}
	case 1, 2, 3:
		if p.DP > 1 {
			if _, err := shardState(f, int64(p.DP), tp, p.Zero); err != nil {
				return st, fmt.Errorf("parallel{zero=%d}: %v", p.Zero, err)
			}
		}
	}
	return st, nil
}

// RanksOf is the number of ranks f runs on (1 unless parallel made it
// an SPMD step).
func RanksOf(f *ir.Func) int { return int(f.Attrs.Int("ranks", 1)) }

// WholeType is the type of the tensor whose rank part argument a holds
// (a itself unless the argument is sharded) on a step of ranks ranks.
func WholeType(a *ir.Value, ranks int) ir.Type {
	f := &ir.Func{Attrs: ir.Attrs{"ranks": ir.IntAttr(int64(ranks))}}
	return ir.InitType(f, a)
}

// blockIndex maps each index along every dimension of rank r's part
// (of shape part) under levels to the whole tensor's.
func blockIndex(part ir.Shape, levels []ir.ShardLevel, r int) [][]int64 {
	idx := make([][]int64, len(part))
	extent := slices.Clone([]int64(part))
	for d := range part {
		idx[d] = make([]int64, part[d])
		for p := range idx[d] {
			idx[d][p] = int64(p)
		}
	}
	for i := len(levels) - 1; i >= 0; i-- { // from the rank's part outwards
		l := levels[i]
		for p, x := range idx[l.Dim] {
			idx[l.Dim][p] = l.WholeIndex(x, extent[l.Dim], int64(r))
		}
		extent[l.Dim] *= l.Size
	}
	return idx
}

// copyBlock copies between a whole tensor and a rank's part: the part's
// element at index p is the whole's at (idx[d][p[d]]); toPart picks the
// direction.
func copyBlock(whole, part *interp.Tensor, idx [][]int64, toPart bool) {
	ws, ps := whole.Type.Shape.Strides(), part.Type.Shape.Strides()
	n := part.Len()
	for k := 0; k < n; k++ {
		rem, w := int64(k), int64(0)
		for d := range idx {
			w += idx[d][rem/ps[d]] * ws[d]
			rem %= ps[d]
		}
		switch {
		case toPart && part.F != nil:
			part.F[k] = whole.F[w]
		case toPart:
			part.I[k] = whole.I[w]
		case part.F != nil:
			whole.F[w] = part.F[k]
		default:
			whole.I[w] = part.I[k]
		}
	}
}

// ShardValues gives each of f's ranks its arguments from the whole
// values: each rank gets its part of each sharded argument (its block
// under the argument's ShardLevels) and a copy of every other.
func ShardValues(f *ir.Func, whole []*interp.Tensor) ([][]*interp.Tensor, error) {
	n := RanksOf(f)
	out := make([][]*interp.Tensor, n)
	for i, a := range f.Args {
		wt := ir.InitType(f, a)
		if !whole[i].Type.Equal(wt) {
			return nil, fmt.Errorf("argument %s: got %s, want %s", a.Ref(), whole[i].Type, wt)
		}
		levels, err := ir.ShardLevels(f, a)
		if err != nil {
			return nil, fmt.Errorf("argument %s: %v", a.Ref(), err)
		}
		for r := range out {
			if len(levels) == 0 {
				out[r] = append(out[r], whole[i].Clone())
				continue
			}
			p := interp.New(a.Type)
			copyBlock(whole[i], p, blockIndex(a.Type.Shape, levels, r), true)
			out[r] = append(out[r], p)
		}
	}
	return out, nil
}

// JoinValues is the whole of each argument from the ranks' final values:
// a sharded argument's parts put back at their blocks (ranks that hold
// the same block agree on it), rank 0's value of any other.
func JoinValues(f *ir.Func, ranks [][]*interp.Tensor) []*interp.Tensor {
	out := make([]*interp.Tensor, len(f.Args))
	for i, a := range f.Args {
		levels, err := ir.ShardLevels(f, a)
		if err != nil || len(levels) == 0 {
			out[i] = ranks[0][i]
			continue
		}
		wt := ir.InitType(f, a)
		w := interp.New(wt)
		for r := range ranks {
			copyBlock(w, ranks[r][i], blockIndex(a.Type.Shape, levels, r), false)
		}
		out[i] = w
	}
	return out
}
