package ir

import (
	"fmt"
	"sort"
)

// FusionClass tells the fusion pass how an op combines with its neighbours.
type FusionClass uint8

// The fusion classes.
const (
	Elementwise FusionClass = iota + 1 // one output element from the same element of each operand
	Broadcast                          // elementwise with operands broadcast to the result
	Injective                          // each output element reads one input element (transpose, slice, reshape)
	Reduction                          // combines many input elements (reduce, softmax, layer norm)
	OutFusable                         // compute-heavy producer that takes an epilogue (conv, matmul, gemm)
	Opaque                             // never fused
)

func (c FusionClass) String() string {
	switch c {
	case Elementwise:
		return "elementwise"
	case Broadcast:
		return "broadcast"
	case Injective:
		return "injective"
	case Reduction:
		return "reduction"
	case OutFusable:
		return "out-fusable"
	case Opaque:
		return "opaque"
	}
	return "unknown"
}

// AttrSpec declares one attribute of an op kind.
type AttrSpec struct {
	Name     string
	Kind     AttrKind // AttrFloat also accepts an int; AttrList means a list of ints
	Required bool
}

// Cost is the work of one op.
type Cost struct {
	FLOPs        int64
	BytesRead    int64
	BytesWritten int64
}

// OpDef declares an op kind. Infer, given operand types and validated
// attributes, returns the result types or an error saying what is wrong.
type OpDef struct {
	Name        string
	Summary     string
	MinOperands int
	MaxOperands int // -1: any number
	Attrs       []AttrSpec
	Infer       func(in []Type, a Attrs) ([]Type, error)
	// FLOPs returns the op's floating-point work; nil means one per
	// result element (the design notes' counting rule).
	FLOPs  func(in, out []Type, a Attrs) int64
	Fusion FusionClass
	// InPlace: result 0 may be written over an operand of the same type
	// that dies at this op.
	InPlace bool
	// View: result 0 is a view of operand 0's memory (same bytes, new shape).
	View bool
	// Impure ops are never duplicated, merged or recomputed.
	Impure bool
	// Commutative binary ops let CSE match operands in either order.
	Commutative bool
	// HasRegion ops (fused kernels) carry a body; their result types are
	// those their region yields, and Infer is not called.
	HasRegion bool
	// Writes lists operands the op overwrites in place (optimizer
	// updates); each must be an inout argument, and the op its last use.
	Writes []int
	// Host: the result lives in host memory (swap_out); only swap_in may
	// read it.
	Host bool
}

var registry = map[string]*OpDef{}

// Register adds an op kind; registering a name twice panics (a
// programming error found at start-up).
func Register(d *OpDef) {
	if _, dup := registry[d.Name]; dup {
		panic("ir: op " + d.Name + " registered twice")
	}
	if d.Infer == nil && !d.HasRegion || d.Fusion == 0 {
		panic("ir: op " + d.Name + " needs Infer and a fusion class")
	}
	registry[d.Name] = d
}

// Lookup returns the registered op kind called name, or nil.
func Lookup(name string) *OpDef { return registry[name] }

// OpNames returns every registered op kind, sorted.
func OpNames() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// commonAttrs may appear on any op.
var commonAttrs = map[string]AttrKind{
	"remat":      AttrString, // "never" or "always": recompute hints
	"recomputed": AttrBool,   // set on ops cloned by remat
}

// CheckAttrs validates a against the op kind's declared attributes.
// Names containing a dot are free-form (user annotations) and pass.
func (d *OpDef) CheckAttrs(a Attrs) error {
	for _, k := range a.Keys() {
		if containsDot(k) {
			continue
		}
		want, ok := commonAttrs[k]
		if !ok {
			var spec *AttrSpec
			for i := range d.Attrs {
				if d.Attrs[i].Name == k {
					spec = &d.Attrs[i]
				}
			}
			if spec == nil {
				return fmt.Errorf("op %s has no attribute %q", d.Name, k)
			}
			want = spec.Kind
		}
		if err := checkAttrKind(k, a[k], want); err != nil {
			return err
		}
	}
	for _, s := range d.Attrs {
		if _, ok := a[s.Name]; s.Required && !ok {
			return fmt.Errorf("op %s needs attribute %q", d.Name, s.Name)
		}
	}
	if k, ok := a["remat"]; ok && k.Str != "never" && k.Str != "always" {
		return fmt.Errorf("attribute \"remat\" must be \"never\" or \"always\", not %q", k.Str)
	}
	return nil
}

func checkAttrKind(name string, a Attr, want AttrKind) error {
	switch {
	case a.Kind == want:
	case want == AttrFloat && a.Kind == AttrInt:
	default:
		return fmt.Errorf("attribute %q must be %s, not %s", name, want, a.Kind)
	}
	if want == AttrList {
		if _, ok := a.Ints(); !ok {
			return fmt.Errorf("attribute %q must be a list of ints", name)
		}
	}
	if want == AttrDense {
		if err := a.Dense.Validate(); err != nil {
			return fmt.Errorf("attribute %q: %v", name, err)
		}
	}
	return nil
}

func containsDot(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return true
		}
	}
	return false
}

// InferTypes checks the operand count and attributes of an op of this
// kind and returns its result types.
func (d *OpDef) InferTypes(in []Type, a Attrs) ([]Type, error) {
	if len(in) < d.MinOperands || d.MaxOperands >= 0 && len(in) > d.MaxOperands {
		return nil, fmt.Errorf("op %s takes %s, got %d", d.Name, arity(d.MinOperands, d.MaxOperands), len(in))
	}
	if err := d.CheckAttrs(a); err != nil {
		return nil, err
	}
	return d.Infer(in, a)
}

func arity(lo, hi int) string {
	plural := func(n int) string {
		if n == 1 {
			return "1 operand"
		}
		return fmt.Sprintf("%d operands", n)
	}
	switch {
	case hi < 0:
		return fmt.Sprintf("at least %s", plural(lo))
	case lo == hi:
		return plural(lo)
	}
	return fmt.Sprintf("%d to %d operands", lo, hi)
}

// OpCost returns the FLOPs and bytes moved by op (regions: the sum of
// their body's FLOPs, bytes at the kernel boundary).
func OpCost(op *Op) Cost {
	var c Cost
	for _, v := range op.Operands {
		c.BytesRead += v.Type.SizeBytes()
	}
	for _, v := range op.Results {
		c.BytesWritten += v.Type.SizeBytes()
	}
	if op.Region != nil {
		for _, inner := range op.Region.Body {
			c.FLOPs += OpCost(inner).FLOPs
		}
		return c
	}
	d := op.Def()
	if d == nil {
		return c
	}
	in := make([]Type, len(op.Operands))
	for i, v := range op.Operands {
		in[i] = v.Type
	}
	out := make([]Type, len(op.Results))
	for i, v := range op.Results {
		out[i] = v.Type
	}
	if d.FLOPs != nil {
		c.FLOPs = d.FLOPs(in, out, op.Attrs)
	} else {
		for _, t := range out {
			c.FLOPs += t.NumElements()
		}
	}
	return c
}

// zeroFLOPs is the cost function of views, reshapes and copies.
func zeroFLOPs([]Type, []Type, Attrs) int64 { return 0 }

// inputFLOPs counts one FLOP per element of operand 0 (reductions).
func inputFLOPs(in, _ []Type, _ Attrs) int64 { return in[0].NumElements() }
