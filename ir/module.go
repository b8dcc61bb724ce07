package ir

import (
	"fmt"
	"strconv"
	"strings"
)

// Module is a list of functions.
type Module struct {
	Funcs []*Func
}

// Func returns the function called name, or nil.
func (m *Module) Func(name string) *Func {
	for _, f := range m.Funcs {
		if f.Name == name {
			return f
		}
	}
	return nil
}

// ArgKind says what a function argument is.
type ArgKind uint8

// The argument kinds.
const (
	ArgData  ArgKind = iota // a data input
	ArgParam                // a trainable weight
	ArgState                // non-trainable state, e.g. batch-norm running statistics
)

func (k ArgKind) String() string {
	switch k {
	case ArgParam:
		return "param"
	case ArgState:
		return "state"
	}
	return "data"
}

// Func is a function: arguments, one block of ops in schedule order, and
// results. Attrs holds function-level attributes such as the arena size
// set by buffer assignment.
type Func struct {
	Name    string
	Args    []*Value // every Arg has Value.Arg set
	Body    []*Op
	Results []Result
	Attrs   Attrs
	Pos     Pos // where the function was parsed, if it was

	names  map[string]bool // names in use, built by UniqueName
	suffix map[string]int  // last suffix UniqueName gave each base
}

// Result is one function result: a value, an optional name and
// attributes, among them its role (RoleLoss, RoleGrad, ...).
type Result struct {
	Name  string // empty when unnamed
	Value *Value
	Attrs Attrs
}

// Result roles (the result attribute "role"): what a result of a training
// step is, so that passes never decide from names.
const (
	RoleLoss        = "loss"         // the loss the step minimises
	RoleGrad        = "grad"         // the gradient of the param argument named by the attribute "param"
	RoleGradsFinite = "grads_finite" // whether every gradient is finite (dynamic loss scaling)

	// Roles of state arguments (the argument attribute "role").
	RoleLR             = "lr"              // the learning rate
	RoleStep           = "step"            // the optimizer steps taken
	RoleRandom         = "rng"             // the random generator's position
	RoleOptimizerState = "optimizer_state" // momentum buffers, Adam's moments
	RoleRunningStat    = "running_stat"    // batch-norm running statistics
	RoleHyperParameter = "hyper"           // an optimizer's momentum or beta, which a scheduler may move
)

// Role returns the result's role, or "".
func (r Result) Role() string { return r.Attrs.String("role", "") }

// ResultWithRole returns the index of the first result with the role, or -1.
func (f *Func) ResultWithRole(role string) int {
	for i, r := range f.Results {
		if r.Role() == role {
			return i
		}
	}
	return -1
}

// GradResult returns the index of the result that is the gradient of the
// param argument p, or -1.
func (f *Func) GradResult(p *Value) int {
	for i, r := range f.Results {
		if r.Role() == RoleGrad && r.Attrs.String("param", "") == p.Name {
			return i
		}
	}
	return -1
}

// ResultName returns the name of result i: its own name, or "result<i>".
func (f *Func) ResultName(i int) string {
	if f.Results[i].Name != "" {
		return f.Results[i].Name
	}
	return "result" + strconv.Itoa(i)
}

// ArgInfo describes a function argument.
type ArgInfo struct {
	Kind  ArgKind
	Init  *Dense // initial value (imported weights), or nil
	Attrs Attrs  // extra argument attributes
	// InOut arguments are read and then written in place by an op that
	// updates them (an optimizer step); the caller sees the new value.
	InOut bool
}

// NoOffset marks a value without an arena offset.
const NoOffset int64 = -1

// Value is an SSA tensor: a function argument, an op result, or a region
// argument.
type Value struct {
	Name   string
	Type   Type
	Def    *Op      // defining op; nil for arguments
	Index  int      // result index in Def, or argument index
	Arg    *ArgInfo // set for function arguments
	Offset int64    // arena offset at the memory level, or NoOffset
}

// IsArg reports whether v is a function argument.
func (v *Value) IsArg() bool { return v.Arg != nil }

// Ref prints the value reference, e.g. %x or %"a/b".
func (v *Value) Ref() string { return "%" + QuoteName(v.Name) }

// Op is one operation. Results are defined by the op; Region, when set,
// holds the body of a fused kernel.
type Op struct {
	Kind     string
	Operands []*Value
	Results  []*Value
	Attrs    Attrs
	Loc      Location
	Region   *Region
	Pos      Pos // where the op was parsed, if it was
}

// Def returns the op's registry entry, or nil when the kind is unknown.
func (o *Op) Def() *OpDef { return Lookup(o.Kind) }

// OperandTypes is the types of o's operands, in order.
func (o *Op) OperandTypes() []Type {
	in := make([]Type, len(o.Operands))
	for i, x := range o.Operands {
		in[i] = x.Type
	}
	return in
}

// Result returns result i.
func (o *Op) Result(i int) *Value { return o.Results[i] }

// Region is the body of a fused kernel: arguments bound to the op's
// operands in order, ops, and the values yielded as the op's results.
type Region struct {
	Args  []*Value
	Body  []*Op
	Yield []*Value
}

// Pos is a position in a source text.
type Pos struct {
	File      string
	Line, Col int
}

// IsValid reports whether p names a position.
func (p Pos) IsValid() bool { return p.Line > 0 }

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// Location is an op's source location: a file position, an ONNX node
// (file and node name), a plain name, or a fused list of locations.
type Location struct {
	File  string
	Line  int
	Col   int
	Name  string
	Fused []Location
}

// IsUnknown reports whether l carries no information.
func (l Location) IsUnknown() bool {
	return l.File == "" && l.Line == 0 && l.Col == 0 && l.Name == "" && len(l.Fused) == 0
}

// Equal compares two locations.
func (l Location) Equal(m Location) bool {
	if l.File != m.File || l.Line != m.Line || l.Col != m.Col || l.Name != m.Name || len(l.Fused) != len(m.Fused) {
		return false
	}
	for i := range l.Fused {
		if !l.Fused[i].Equal(m.Fused[i]) {
			return false
		}
	}
	return true
}

// String prints the location in the text format's loc(...) form, without
// the loc keyword.
func (l Location) String() string {
	if len(l.Fused) > 0 {
		parts := make([]string, len(l.Fused))
		for i, f := range l.Fused {
			parts[i] = f.String()
		}
		return "fused[" + strings.Join(parts, ", ") + "]"
	}
	switch {
	case l.Name != "" && l.File != "":
		return strconv.Quote(l.File) + ":" + strconv.Quote(l.Name)
	case l.Name != "":
		return strconv.Quote(l.Name)
	}
	return fmt.Sprintf("%s:%d:%d", strconv.Quote(l.File), l.Line, l.Col)
}

// FuseLocations merges locations into one fused location, flattening
// nested fused lists and dropping unknown and repeated entries.
func FuseLocations(ls ...Location) Location {
	var out []Location
	var add func(l Location)
	add = func(l Location) {
		if len(l.Fused) > 0 {
			for _, f := range l.Fused {
				add(f)
			}
			return
		}
		if l.IsUnknown() {
			return
		}
		for _, o := range out {
			if o.Equal(l) {
				return
			}
		}
		out = append(out, l)
	}
	for _, l := range ls {
		add(l)
	}
	switch len(out) {
	case 0:
		return Location{}
	case 1:
		return out[0]
	}
	return Location{Fused: out}
}

// QuoteName returns name as written after a sigil: bare when it is made
// of letters, digits and _ . $ - (not starting with - or .), quoted otherwise.
func QuoteName(name string) string {
	if isBareName(name) {
		return name
	}
	return strconv.Quote(name)
}

// QuoteKey quotes an attribute key or result name unless the text
// format reads it bare (an identifier that is no keyword).
func QuoteKey(name string) string {
	if isIdent(name) {
		return name
	}
	return strconv.Quote(name)
}

func isIdent(s string) bool {
	for _, kw := range []string{"func", "return", "yield"} {
		// A keyword ends at a '.', so "func.x" would not read back bare.
		if s == kw || strings.HasPrefix(s, kw+".") {
			return false
		}
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || i > 0 && (c >= '0' && c <= '9' || c == '.')) {
			return false
		}
	}
	return true
}

func isBareName(s string) bool {
	if s == "" || s[0] == '-' || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '$' || c == '-') {
			return false
		}
	}
	return true
}

// KeepsInit reports whether argument a holds a hyper-parameter or a
// counter (the roles lr, hyper, step and rng), whose domain a random draw would
// leave (a negative step count or learning rate): random arguments for
// tests keep its initial value.
func KeepsInit(a *Value) bool {
	if a.Arg == nil || a.Arg.Init == nil {
		return false
	}
	switch a.Arg.Attrs.String("role", "") {
	case RoleLR, RoleHyperParameter, RoleStep, RoleRandom:
		return true
	}
	return false
}
