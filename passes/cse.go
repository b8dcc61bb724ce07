package passes

import (
	"fmt"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
)

func init() {
	MustRegister(&Pass{
		Name:    "cse",
		Summary: "merge pure ops that compute the same thing from the same operands",
		// A merged value lives from the first copy to the last reader of
		// either: offsets assigned before may now overlap.
		Invalidates: []Property{Assigned},
		Run: func(ctx *Context, m *ir.Module) error {
			for _, f := range m.Funcs {
				ctx.AddStat("ops-merged", int64(eliminateCommon(f)))
			}
			return nil
		},
	})
}

// eliminateCommon replaces each pure op that repeats an earlier one (same
// kind, operands, attributes and result types; operands in either order
// for commutative ops) by the earlier op's results, and deletes it. Ops
// marked recomputed repeat others on purpose, to free memory between
// the uses, and stay.
func eliminateCommon(f *ir.Func) int {
	seen := map[string]*ir.Op{}
	ids := map[*ir.Value]int{}
	for i, a := range f.Args {
		ids[a] = i
	}
	next := len(f.Args)
	merged := 0
	repl := map[*ir.Value]*ir.Value{}
	out := f.Body[:0]
	for _, op := range f.Body {
		for i, v := range op.Operands {
			if w, ok := repl[v]; ok {
				op.Operands[i] = w
			}
		}
		if isImpure(op) || op.Region != nil || len(op.Results) == 0 || op.Attr().Bool("recomputed") {
			for _, r := range op.Results {
				ids[r] = next
				next++
			}
			out = append(out, op)
			continue
		}
		key := opKey(op, ids)
		if prev, ok := seen[key]; ok {
			for i, r := range op.Results {
				repl[r] = prev.Results[i]
			}
			merged++
			continue
		}
		seen[key] = op
		for _, r := range op.Results {
			ids[r] = next
			next++
		}
		out = append(out, op)
	}
	f.Body = out
	for i, r := range f.Results {
		if w, ok := repl[r.Value]; ok {
			f.Results[i].Value = w
		}
	}
	return merged
}

func opKey(op *ir.Op, ids map[*ir.Value]int) string {
	var b strings.Builder
	b.WriteString(op.Kind)
	operands := make([]int, len(op.Operands))
	for i, v := range op.Operands {
		operands[i] = ids[v]
	}
	if d := op.Def(); d != nil && d.Commutative && len(operands) == 2 && operands[0] > operands[1] {
		operands[0], operands[1] = operands[1], operands[0]
	}
	fmt.Fprint(&b, operands)
	for _, k := range op.Attrs.Keys() {
		fmt.Fprintf(&b, "|%s=%s", k, op.Attrs[k].String())
	}
	for _, r := range op.Results {
		b.WriteString("|" + r.Type.String())
	}
	return b.String()
}
