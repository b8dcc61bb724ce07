package passes

import (
	"fmt"
	"slices"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// Property is a fact about a module that passes establish, rely on or
// destroy (Pass.Requires and the rest). Each can be read off a module, so
// a pipeline is checked against its actual input.
type Property uint8

// The properties.
const (
	TrainingStep  Property = iota + 1 // a function returns a loss (autodiff ran)
	Fused                             // fused kernels: ops with regions
	Assigned                          // values carry arena offsets
	OptimizerStep                     // parameters are updated in place
	numProperties
)

var propertyNames = [numProperties]string{
	TrainingStep:  "a training step",
	Fused:         "fused kernels",
	Assigned:      "arena offsets",
	OptimizerStep: "optimizer updates",
}

func (p Property) String() string { return propertyNames[p] }

// propertySet is a set of properties.
type propertySet [numProperties]bool

// PropertiesOf reads which properties hold for m.
func PropertiesOf(m *ir.Module) propertySet {
	var s propertySet
	for _, f := range m.Funcs {
		if f.ResultWithRole(ir.RoleLoss) >= 0 {
			s[TrainingStep] = true
		}
		for _, a := range f.Args {
			s[Assigned] = s[Assigned] || a.Offset != ir.NoOffset
		}
		f.Walk(func(op *ir.Op) {
			if op.Region != nil {
				s[Fused] = true
			}
			if d := op.Def(); d != nil && d.Update {
				s[OptimizerStep] = true
			}
			for _, r := range op.Results {
				s[Assigned] = s[Assigned] || r.Offset != ir.NoOffset
			}
		})
	}
	return s
}

// ContractError is a pipeline whose order breaks a pass's contract, or
// leaves its consumer without a property it needs.
type ContractError struct{ Msg string }

func (e *ContractError) Error() string { return e.Msg }

// CheckContracts checks that every pass of pipe finds the properties it
// requires, and none it excludes, when the pipeline runs on m, and that
// the properties need hold when it ends (a backend's: arena offsets).
// Passes from outside Kiln (external, or without any contract) make what
// holds after them unknown, and checking stops there.
func CheckContracts(m *ir.Module, pipe Pipeline, need ...Property) error {
	have := PropertiesOf(m)
	var by [numProperties]string     // the pass that established each, "" for the input
	var undone [numProperties]string // the last pass that undid each
	for _, step := range pipe {
		p := step.Pass
		for _, q := range p.Requires {
			if !have[q] {
				return &ContractError{fmt.Sprintf("pass %s needs %s, and nothing before it makes one%s%s", p.Name, q, undoneBy(undone[q]), maker(q))}
			}
		}
		for _, q := range p.Excludes {
			switch {
			case have[q] && by[q] == "":
				return &ContractError{fmt.Sprintf("pass %s cannot run on %s, which the input has", p.Name, q)}
			case have[q]:
				return &ContractError{fmt.Sprintf("pass %s cannot run on %s, which %s before it makes (put %s before %s)", p.Name, q, by[q], p.Name, by[q])}
			}
		}
		if p.AnyOptions {
			return nil // an external pass: what holds after it is unknown
		}
		for _, q := range p.Invalidates {
			if have[q] {
				undone[q] = p.Name
			}
			have[q], by[q] = false, ""
		}
		for _, q := range p.Establishes {
			have[q], by[q], undone[q] = true, p.Name, ""
		}
	}
	for _, q := range need {
		if !have[q] {
			if undone[q] != "" {
				return &ContractError{fmt.Sprintf("the pipeline must end with %s, which %s undoes (put %s after %s)", q, undone[q], makerName(q), undone[q])}
			}
			return &ContractError{fmt.Sprintf("the pipeline must end with %s, and nothing in it makes them (end it with %s)", q, makerName(q))}
		}
	}
	return nil
}

func undoneBy(pass string) string {
	if pass == "" {
		return ""
	}
	return " (" + pass + " undoes it)"
}

// maker names the built-in pass that establishes q, as advice.
func maker(q Property) string {
	if n := makerName(q); n != "" {
		return " (run " + n + " first)"
	}
	return ""
}

// makerName is the built-in pass that establishes q, or "".
func makerName(q Property) string {
	for _, p := range All() {
		for _, e := range p.Establishes {
			if e == q {
				return p.Name
			}
		}
	}
	return ""
}

// Established checks that q holds for m as a pass that establishes it
// claims: a loss for a training step, in-place updates for an optimizer
// step, an offset for every value that needs one and no two live values
// overlapping for arena offsets. The manager runs it under verify-each.
func Established(m *ir.Module, q Property) error {
	for _, f := range m.Funcs {
		switch q {
		case TrainingStep:
			if f.ResultWithRole(ir.RoleLoss) < 0 {
				return fmt.Errorf("@%s returns no loss", f.Name)
			}
		case OptimizerStep:
			updates := false
			f.Walk(func(op *ir.Op) {
				d := op.Def()
				updates = updates || d != nil && len(d.Writes) > 0
			})
			params := slices.ContainsFunc(f.Args, func(a *ir.Value) bool { return a.Arg.Kind == ir.ArgParam })
			if params && !updates {
				return fmt.Errorf("@%s has parameters and updates none of them", f.Name)
			}
		case Assigned:
			var missing *ir.Value
			for _, op := range f.Body {
				if d := op.Def(); d != nil && d.View {
					continue
				}
				for _, r := range op.Results {
					if r.Offset == ir.NoOffset && missing == nil {
						missing = r
					}
				}
			}
			if missing != nil {
				return fmt.Errorf("@%s: %s has no arena offset", f.Name, missing.Ref())
			}
			if err := liveness.CheckOffsets(f); err != nil {
				return fmt.Errorf("@%s: %v", f.Name, err)
			}
		}
	}
	return nil
}

// clear removes what q leaves in m, once a pass has undone it: arena
// offsets and the arena's size, so that no stale offset survives a pass
// that moves values (reorder, fuse) into a backend.
func clear(m *ir.Module, q Property) {
	if q != Assigned {
		return
	}
	for _, f := range m.Funcs {
		for _, a := range f.Args {
			a.Offset = ir.NoOffset
		}
		f.Walk(func(op *ir.Op) {
			for _, r := range op.Results {
				r.Offset = ir.NoOffset
			}
			if op.Region != nil {
				for _, a := range op.Region.Args {
					a.Offset = ir.NoOffset
				}
			}
		})
		delete(f.Attrs, "arena")
		delete(f.Attrs, "host_arena")
		delete(f.Attrs, "alignment")
	}
}
