package passes

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
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
			if d := op.Def(); d != nil && len(d.Writes) > 0 && op.Kind != "overwrite" {
				s[OptimizerStep] = true
			}
			for _, r := range op.Results {
				s[Assigned] = s[Assigned] || r.Offset != ir.NoOffset
			}
		})
	}
	return s
}

// ContractError is a pipeline whose order breaks a pass's contract.
type ContractError struct{ Msg string }

func (e *ContractError) Error() string { return e.Msg }

// CheckContracts checks that every pass of pipe finds the properties it
// requires, and none it excludes, when the pipeline runs on m. Passes
// from outside Kiln (external, or without any contract) make what holds
// after them unknown, and checking stops there.
func CheckContracts(m *ir.Module, pipe Pipeline) error {
	have := PropertiesOf(m)
	var by [numProperties]string // the pass that established each, "" for the input
	for _, step := range pipe {
		p := step.Pass
		for _, q := range p.Requires {
			if !have[q] {
				return &ContractError{fmt.Sprintf("pass %s needs %s, and nothing before it makes one%s", p.Name, q, maker(q))}
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
			have[q], by[q] = false, ""
		}
		for _, q := range p.Establishes {
			have[q], by[q] = true, p.Name
		}
	}
	return nil
}

// maker names the built-in pass that establishes q, as advice.
func maker(q Property) string {
	for _, p := range All() {
		for _, e := range p.Establishes {
			if e == q {
				return " (run " + p.Name + " first)"
			}
		}
	}
	return ""
}
