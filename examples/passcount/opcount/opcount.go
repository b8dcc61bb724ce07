// Package opcount is an example out-of-tree Kiln pass: count-ops records
// how many ops of each kind a module has (as statistics) and, with
// mark=true, tags every op with its kind's count as a free-form attribute.
package opcount

import (
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:    "count-ops",
		Summary: "count the ops of each kind (an example out-of-tree pass)",
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		counts := map[string]int64{}
		for _, f := range m.Funcs {
			f.Walk(func(op *ir.Op) { counts[op.Kind]++ })
		}
		total := int64(0)
		for _, n := range counts {
			total += n
		}
		ctx.Stat("ops", total)
		ctx.Stat("kinds", int64(len(counts)))
		if o.Mark {
			for _, f := range m.Funcs {
				f.Walk(func(op *ir.Op) {
					if op.Attrs == nil {
						op.Attrs = ir.Attrs{}
					}
					op.Attrs["opcount.kind_count"] = ir.IntAttr(counts[op.Kind])
				})
			}
		}
		return nil
	}))
}

// options are the pass's options: tagged fields, read by passes.Define.
type options struct {
	Mark bool `opt:"mark" default:"false" doc:"annotate each op with opcount.kind_count"`
}
