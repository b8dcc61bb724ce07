package passes

import "github.com/kiln-compiler/kiln/ir"

func init() {
	MustRegister(&Pass{
		Name:    "dce",
		Summary: "remove pure ops whose results are never used",
		Run: func(ctx *Context, m *ir.Module) error {
			for _, f := range m.Funcs {
				ctx.AddStat("ops-removed", int64(RemoveDeadOps(f)))
			}
			return nil
		},
	})
}

// RemoveDeadOps deletes every pure op of f none of whose results reaches a
// function result or an op that is kept, and returns how many it deleted.
// Impure ops and ops without results are always kept.
func RemoveDeadOps(f *ir.Func) int {
	used := map[*ir.Value]bool{}
	for _, r := range f.Results {
		used[r.Value] = true
	}
	keep := make([]bool, len(f.Body))
	for i := len(f.Body) - 1; i >= 0; i-- {
		op := f.Body[i]
		live := len(op.Results) == 0 || isImpure(op) || updatesState(op)
		for _, r := range op.Results {
			live = live || used[r]
		}
		if !live {
			continue
		}
		keep[i] = true
		for _, v := range op.Operands {
			used[v] = true
		}
	}
	out := f.Body[:0]
	removed := 0
	for i, op := range f.Body {
		if keep[i] {
			out = append(out, op)
		} else {
			removed++
		}
	}
	for i := len(out); i < len(f.Body); i++ {
		f.Body[i] = nil
	}
	f.Body = out
	return removed
}

// updatesState reports whether op computes the new value of a state
// argument (its record's Running: a running statistic), which a training
// step's optimizer pass writes back: dead code until then, kept.
func updatesState(op *ir.Op) bool {
	d := op.Def()
	if d == nil {
		return false
	}
	for k := range d.Running {
		if x := op.Operands[k]; x.Arg != nil && x.Arg.Kind == ir.ArgState {
			return true
		}
	}
	return false
}

// isImpure reports whether op may not be removed, merged or duplicated:
// its kind is impure or unknown, or its region holds an impure op.
func isImpure(op *ir.Op) bool {
	d := op.Def()
	if d == nil || d.Impure {
		return true
	}
	if op.Region != nil {
		for _, inner := range op.Region.Body {
			if isImpure(inner) {
				return true
			}
		}
	}
	return false
}
