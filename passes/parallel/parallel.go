// Package parallel is the `parallel` pass: it partitions a training step
// over devices. Today it builds data parallelism: with dp = N the step
// becomes the SPMD program of one of N ranks, each holding 1/N of the
// batch and every parameter, the gradients (and a summed loss)
// all-reduced before the optimizer's updates, so every rank updates its
// parameters alike (microbatch.Shard). Tensor and pipeline parallelism
// and ZeRO sharding are not built.
package parallel

import (
	"fmt"
	"strings"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/microbatch"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "parallel",
		Summary:     "partition a training step over devices: dp = N ranks each take 1/N of the batch and all-reduce the gradients (data parallelism)",
		Requires:    []passes.Property{passes.TrainingStep},
		Excludes:    []passes.Property{passes.Fused, passes.Assigned},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		for _, f := range m.Funcs {
			if _, err := Partition(f, Plan{DP: o.DP}); err != nil {
				return err
			}
			ctx.AddStat("ranks", int64(o.DP))
		}
		return nil
	}))
}

type options struct {
	DP int `opt:"dp" default:"1" range:"[1,inf)" doc:"data-parallel ranks: each takes 1/dp of the batch (dp must divide it)"`
}

// Plan is how a step is spread over ranks.
type Plan struct {
	DP int // data-parallel ranks
}

// Ranks is the number of ranks a plan runs on.
func (p Plan) Ranks() int { return max(1, p.DP) }

// Partition rewrites f into the SPMD step of one rank of p and marks it
// with the number of ranks (attribute ranks). On error f is unchanged.
func Partition(f *ir.Func, p Plan) (microbatch.Stats, error) {
	if p.DP < 1 {
		return microbatch.Stats{}, fmt.Errorf("dp must be at least 1, got %d", p.DP)
	}
	st, err := microbatch.Shard(f, p.DP)
	if err != nil {
		// Shard speaks of microbatches; here a slice of the batch is a rank's.
		msg := strings.ReplaceAll(err.Error(), "microbatch: ", "")
		msg = strings.ReplaceAll(msg, "is not divisible by n=", "is not divisible by dp=")
		return st, fmt.Errorf("parallel{dp=%d}: %s", p.DP, msg)
	}
	if p.DP > 1 {
		if f.Attrs == nil {
			f.Attrs = ir.Attrs{}
		}
		f.Attrs["ranks"] = ir.IntAttr(int64(p.Ranks()))
	}
	return st, nil
}

// RanksOf is the number of ranks f runs on (1 unless parallel made it
// an SPMD step).
func RanksOf(f *ir.Func) int { return int(f.Attrs.Int("ranks", 1)) }

// WholeType is the type of the tensor whose rank part argument a holds
// (a itself unless the argument is sharded) on a step of ranks ranks.
func WholeType(a *ir.Value, ranks int) ir.Type {
	t := a.Type
	if a.Arg == nil || ranks <= 1 {
		return t
	}
	if _, ok := a.Arg.Attrs["shard"]; !ok {
		return t
	}
	d := a.Arg.Attrs.Int("shard", 0)
	t.Shape = append(ir.Shape(nil), t.Shape...)
	t.Shape[d] *= int64(ranks)
	return t
}

// ShardValues gives each of f's ranks its arguments from the whole
// values: rank r gets part r of each sharded argument along its shard
// dimension and a copy of every other.
func ShardValues(f *ir.Func, whole []*interp.Tensor) ([][]*interp.Tensor, error) {
	n := RanksOf(f)
	out := make([][]*interp.Tensor, n)
	for i, a := range f.Args {
		wt := WholeType(a, n)
		if !whole[i].Type.Equal(wt) {
			return nil, fmt.Errorf("argument %s: got %s, want %s", a.Ref(), whole[i].Type, wt)
		}
		d := int(a.Arg.Attrs.Int("shard", 0))
		outer, _ := wt.Shape[:d].NumElements()
		rowLen := whole[i].Len() / max(1, int(outer))
		part := rowLen / n
		for r := range out {
			if wt.Equal(a.Type) {
				out[r] = append(out[r], whole[i].Clone())
				continue
			}
			p := interp.New(a.Type)
			for o := 0; o < int(outer); o++ {
				src := o*rowLen + r*part
				if p.F != nil {
					copy(p.F[o*part:(o+1)*part], whole[i].F[src:src+part])
				} else {
					copy(p.I[o*part:(o+1)*part], whole[i].I[src:src+part])
				}
			}
			out[r] = append(out[r], p)
		}
	}
	return out, nil
}
