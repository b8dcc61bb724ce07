// Package microbatch is the `microbatch` pass (gradient accumulation): it
// splits a training step into n slices of the batch that run one after
// another, each through the whole forward and backward, and accumulates
// their gradients, so that the activations of one slice are live at a
// time.
package microbatch

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "microbatch",
		Summary:     "run a training step as n sequential slices of the batch, accumulating the gradients (gradient accumulation), where the ops' records prove it exact",
		Requires:    []passes.Property{passes.TrainingStep},
		Excludes:    []passes.Property{passes.Fused, passes.Assigned},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		opts := Options{PerSliceBN: ctx.Allows(passes.PerSliceBN)}
		for _, f := range m.Funcs {
			split := SplitWith
			if o.ExactBN {
				split = SplitExact
			}
			st, err := split(f, o.N, opts)
			if err != nil {
				return err
			}
			ctx.AddStat("microbatches", int64(o.N))
			ctx.AddStat("batch", st.Batch)
			if st.Phases > 0 {
				ctx.AddStat("phases", int64(st.Phases))
			}
			if st.BatchNorms > 0 {
				ctx.Approximate(passes.PerSliceBN, fmt.Sprintf("%d batch-normalisation ops of @%s (forward and gradient) take the statistics of each microbatch of %d", st.BatchNorms, f.Name, st.Batch/int64(o.N)))
			}
		}
		return nil
	}))
}

type options struct {
	N       int  `opt:"n" default:"2" range:"[1,inf)" doc:"number of slices of the batch (it must divide the batch)"`
	ExactBN bool `opt:"exact-bn" default:"false" doc:"keep statistics of the whole batch (batch normalisation, and any value folded over the batch that rows then read): the slices run in phases, one per such statistic, recomputing their forward up to it (about L/2 extra forwards for L norms)"`
}

// Stats is what Split did.
type Stats struct {
	Batch      int64 // the batch that was split
	BatchNorms int   // normalisations that take each slice's statistics (allowed by name)
	Dropouts   int   // ops that draw random numbers, which draw the whole batch's for each slice
	Phases     int   // SplitExact: the passes over the slices
	Kept       int64 // SplitExact: the most bytes one phase reads from the last and keeps for the next, all slices
}

// Split rewrites the training step f (autodiff ran; the optimizer may
// have) into n slices of its batch that run one after another, proving
// from the ops' records that the split step computes the whole step
// (split.go says how), or fails naming the op that mixes the batch. On
// error f is unchanged.
//
// The batch is dimension 0 of the first data argument; every data
// argument with that leading dimension is sliced. Values folded over the
// batch (gradients, losses) are summed over the slices in running sums,
// averages weighted by the slices' shares; results that keep the batch
// are joined along it; in-place updates and whatever else reads a folded
// value run once after the slices. Random ops draw the whole batch's
// numbers for each slice.
func Split(f *ir.Func, n int) (Stats, error) { return SplitWith(f, n, Options{}) }

// SplitWith is Split with the approximations opts allows.
func SplitWith(f *ir.Func, n int, opts Options) (Stats, error) { return split(f, n, 0, opts) }

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
	st, err := split(f, n, 0, Options{Trace: trace})
	return st, trace, err
}

// Shard rewrites the training step f into the step of one of n ranks
// that share its batch (data parallelism): the batch arguments hold 1/n
// of the batch (rank r gets rows r·B/n to (r+1)·B/n), and every rank
// runs the same function. Where Split sums the slices, Shard all-reduces
// over the n ranks, at the point where a value folded over the batch is
// first needed whole, so steps whose rows read statistics of the whole
// batch split exactly; results that keep the batch are all-gathered.
// Sharded arguments carry shard = 0. On error f is unchanged.
func Shard(f *ir.Func, n int) (Stats, error) { return split(f, n, n, Options{}) }

// ShardWith is Shard on ranks ranks, each of which runs its part of the
// batch as m microbatches (as Split) before the all-reduces, with the
// approximations opts allows.
func ShardWith(f *ir.Func, ranks, m int, opts Options) (Stats, error) {
	if ranks == 1 {
		return split(f, m, 0, opts)
	}
	return split(f, ranks*max(1, m), ranks, opts)
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
