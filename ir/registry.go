package ir

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/ir/scalar"
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
	// Default is the value an absent attribute has (zero Kind: none, and
	// readers see the kind's zero value).
	Default Attr
	// Enum lists the values a string attribute may take.
	Enum []string
}

// Cost is the work of one op.
type Cost struct {
	FLOPs        int64
	BytesRead    int64
	BytesWritten int64
}

// GradKind says how autodiff differentiates an op.
type GradKind uint8

// The gradient kinds.
const (
	GradRule GradKind = iota // autodiff has a rule for it (or, with Deriv, derives one)
	GradZero                 // piecewise constant: its gradient is zero
	NoGrad                   // not differentiable: indices, masks, backward ops, updates
)

// Deriv is the derivative of a unary elementwise op as a scalar
// expression of one saved value (operand 0 of the expression): the op's
// input, or its output when FromOutput. Registering an op with a Deriv
// also registers NAME_grad(dy, s) = dy * Expr(s), which autodiff emits.
type Deriv struct {
	FromOutput bool
	Expr       func(a AttrValues) *scalar.Expr
	// SignOnly: f'(s) depends on s only through its sign (relu), so
	// NAME_grad's operand s is ScaleFree.
	SignOnly bool
}

// OpDef is the one record of an op kind: its signature, attributes,
// shape and dtype inference, cost, memory behaviour, elementwise
// semantics, gradient and ONNX mapping. The interpreter, the loop
// lowering, autodiff, constant folding, mixed precision and the ONNX
// importer derive what they need from it, and a coverage test checks
// that none of them lacks an op.
type OpDef struct {
	Name        string
	Summary     string
	MinOperands int
	MaxOperands int // -1: any number
	Attrs       []AttrSpec
	// Infer, given operand types and the op's attributes, returns the
	// result types or an error saying what is wrong.
	Infer func(in []Type, a AttrValues) ([]Type, error)
	// FLOPs returns the op's floating-point work; nil means one per
	// result element (the design notes' counting rule).
	FLOPs  func(in, out []Type, a AttrValues) int64
	Fusion FusionClass
	// InPlace: result 0 may be written over an operand of the same type
	// that dies at this op: any operand, or only those InPlaceOperands
	// lists (gemm's C: each output element reads its own C element before
	// it is written, while A and B are read across the whole product).
	InPlace         bool
	InPlaceOperands []int
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
	// FromHost: the op copies a host tensor (its operand) into device
	// memory (swap_in). Host and FromHost ops are copies over the host
	// link, which the cost model times by the link's bandwidth.
	FromHost bool
	// Constant: the result is known before the step runs; no kernel
	// computes it (it is materialised with the arena).
	Constant bool
	// Update: an optimizer update, which reads a gradient and writes the
	// parameter and its state in place (Writes).
	Update bool
	// Indices lists the operands whose integer values index a dimension
	// at run time (gather indices, cross-entropy labels): an element
	// outside the range IndexOperand states fails the run (the
	// interpreter returns an error, compiled code a status). nil: none.
	Indices func(in []Type, a AttrValues) []IndexOperand
	// Running maps an operand that holds a running statistic to the
	// result that is its new value (batch_norm_train's running mean and
	// variance): a training step writes the result back into the operand
	// when the operand is state.
	Running map[int]int

	// Scalar, for an elementwise op with one result, computes a result
	// element from the operands' elements at the same (broadcast) index.
	// The interpreter, constant folding and the loop lowering all run it.
	Scalar func(a AttrValues, in []Type, out Type) *scalar.Expr
	// Deriv defines the gradient of a unary elementwise op (see Deriv).
	Deriv *Deriv
	// Grad says whether and how autodiff differentiates the op.
	Grad GradKind
	// KeepF32: under mixed precision the op computes in f32 (statistics,
	// losses, optimizer updates).
	KeepF32 bool
	// LowOperands: the operands of a KeepF32 op that mixed precision may
	// hand in the low dtype as they are, with no cast-up copy: the kernels
	// read every float into f32 at least, so the op computes what it would
	// from exact f32 copies. The op's typing lets their dtype differ from
	// its parameters' and statistics' (a bf16 activation normalised with
	// f32 scale and bias, with f32 statistics).
	LowOperands []int
	// ScaleFree: the operands the op reads only through comparisons that a
	// positive scale keeps (a ReLU's sign, a max-pool's argmax). A value
	// stored with a per-tensor scale (fp8) can be read there as stored;
	// their dtype may differ from the op's other operands'.
	ScaleFree []int
	// Contraction: the op sums products over a long axis (matrix
	// products, a convolution's weight gradient); mixed precision
	// produces a weight gradient it makes in f32.
	Contraction bool
	// ONNX names the ONNX operator this op imports from one to one: same
	// operands, and attributes of the same name (floats rounded to f32).
	ONNX string

	// Axes says, dimension by dimension, how the results relate to the
	// operands (see Axes): which loops are parallel, which fold, and
	// which index each dimension. nil: no declared relation, and passes
	// that split tensors refuse the op. Ops with a Scalar broadcast
	// (broadcastAxes) unless they say otherwise.
	Axes func(in, out []Type, a AttrValues) Axes
	// PerPart, when set, is the op's axes when each part of a split
	// takes statistics of its own (training batch norm under gradient
	// accumulation, as PyTorch computes it): an approximation that a
	// pass makes only when the user allows it by name. A result that does
	// not index a parallel loop is then each part's own.
	PerPart func(in, out []Type, a AttrValues) Axes
	// Linear lists the groups of operands in which the op is jointly
	// linear, the others held fixed (LinearIn); nil: derived from Scalar
	// (none for an op without one).
	Linear func(a AttrValues, operands int) [][]int
	// Random, given the operands' types, reports whether the op draws
	// from the counter-based generator seeded by its "seed" attribute,
	// element i of result 0 drawing number key+offset+i (its "offset"
	// attribute; key the op's random key operand, RandomKey, or 0): a
	// part of the result whose elements are a run of the whole's draws
	// the whole's numbers at that offset. nil: never.
	Random func(in []Type) bool
	// ShapeAttr names the attribute that holds result 0's shape (a copy
	// of the op for a part of its result sets it to the part's shape).
	ShapeAttr string
}

// IndexOperand is an operand whose elements index a dimension of Bound
// entries at run time: each must lie in [0, Bound), or in [-Bound, Bound)
// where Negative (an index below 0 counts from the end, as ONNX's Gather).
type IndexOperand struct {
	Operand  int
	Bound    int64
	Negative bool
}

// Allows reports whether the index value v is in range.
func (x IndexOperand) Allows(v int64) bool {
	if x.Negative && v < 0 {
		v += x.Bound
	}
	return v >= 0 && v < x.Bound
}

// AttrNegative is the bool attribute of the gathers and their gradients
// that says whether an index below 0 counts from the end (the default,
// ONNX's Gather and GatherElements) or is out of range (labels, batch
// indices, positions a pooling recorded).
const AttrNegative = "negative"

// negativeAttr is the AttrSpec of AttrNegative.
var negativeAttr = AttrSpec{Name: AttrNegative, Kind: AttrBool, Default: BoolAttr(true)}

// AttrValues reads an op's attributes, with the declared default where
// one is absent. Reading a name the op does not declare panics: that is
// a programming error, found by the tests.
type AttrValues struct {
	def *OpDef
	set Attrs
}

// Values returns a's attributes as an op of this kind reads them.
func (d *OpDef) Values(a Attrs) AttrValues { return AttrValues{def: d, set: a} }

// Attr returns op's attributes as its kind declares them.
func (o *Op) Attr() AttrValues { return AttrValues{def: o.Def(), set: o.Attrs} }

func (v AttrValues) get(name string) Attr {
	if a, ok := v.set[name]; ok {
		return a
	}
	if _, ok := commonAttrs[name]; ok {
		return Attr{}
	}
	if v.def == nil {
		panic("ir: attribute " + name + " read from an op of unknown kind")
	}
	for i := range v.def.Attrs {
		if v.def.Attrs[i].Name == name {
			return v.def.Attrs[i].Default
		}
	}
	panic("ir: op " + v.def.Name + " reads undeclared attribute " + name)
}

// Has reports whether the attribute is given (not defaulted).
func (v AttrValues) Has(name string) bool {
	v.get(name) // panics on an undeclared name
	_, ok := v.set[name]
	return ok
}

// Float returns a float attribute (an int is accepted).
func (v AttrValues) Float(name string) float64 {
	switch a := v.get(name); a.Kind {
	case AttrFloat:
		return a.Float
	case AttrInt:
		return float64(a.Int)
	}
	return 0
}

// Int returns an int attribute.
func (v AttrValues) Int(name string) int64 { return v.get(name).Int }

// String returns a string attribute.
func (v AttrValues) String(name string) string { return v.get(name).Str }

// Bool returns a bool attribute.
func (v AttrValues) Bool(name string) bool { return v.get(name).Bool }

// DType returns a dtype attribute.
func (v AttrValues) DType(name string) DType { return v.get(name).DType }

// Dense returns a dense attribute, or nil.
func (v AttrValues) Dense(name string) *Dense { return v.get(name).Dense }

// Ints returns an int-list attribute, or nil when it is absent and has
// no default.
func (v AttrValues) Ints(name string) []int64 {
	l, _ := v.get(name).Ints()
	return l
}

// IntsOr returns an int-list attribute, or def when it is absent and has
// no default (a default that depends on other attributes or operands).
func (v AttrValues) IntsOr(name string, def []int64) []int64 {
	if a := v.get(name); a.Kind == AttrList {
		l, _ := a.Ints()
		return l
	}
	return def
}

// Raw returns the attributes as set on the op, without defaults.
func (v AttrValues) Raw() Attrs { return v.set }

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
	for _, a := range d.Attrs {
		if a.Default.Kind != 0 {
			if err := checkAttrKind(a.Name, a.Default, a.Kind); err != nil {
				panic("ir: op " + d.Name + ": default of " + err.Error())
			}
		}
	}
	if d.Axes == nil && d.Scalar != nil {
		d.Axes = broadcastAxes
	}
	registry[d.Name] = d
	if d.Deriv != nil {
		registerDerivative(d)
	}
}

// registerDerivative registers NAME_grad(dy, s) = dy * f'(s) for a unary
// elementwise op with a Deriv.
func registerDerivative(d *OpDef) {
	deriv := d.Deriv.Expr
	saved := "input"
	if d.Deriv.FromOutput {
		saved = "output"
	}
	var scaleFree []int
	if d.Deriv.SignOnly {
		scaleFree = []int{1}
	}
	Register(&OpDef{
		Name: d.Name + "_grad", Summary: "dy * f'(s) of " + d.Name + ", from dy and its saved " + saved + " s", ScaleFree: scaleFree,
		MinOperands: 2, MaxOperands: 2, Attrs: d.Attrs,
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			same := in[0].Equal(in[1])
			if d.Deriv.SignOnly {
				same = in[0].Shape.Equal(in[1].Shape) && in[1].DType.IsFloat()
			}
			if !same {
				return nil, fmt.Errorf("dy %s and saved value %s differ", in[0], in[1])
			}
			return []Type{in[0]}, floatOperand(in[0])
		},
		FLOPs:   func(in, _ []Type, _ AttrValues) int64 { return 2 * in[0].NumElements() },
		Fusion:  Elementwise,
		InPlace: true,
		Grad:    NoGrad,
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			// operand 1 is the saved value; the derivative reads it as x0
			return scalar.X(0).Mul(substitute(deriv(a), 1))
		},
	})
}

// substitute returns e with operand 0 renamed to operand i.
func substitute(e *scalar.Expr, i int) *scalar.Expr {
	if e.Node == scalar.Operand {
		return scalar.X(i)
	}
	c := *e
	c.Args = make([]*scalar.Expr, len(e.Args))
	for j, a := range e.Args {
		c.Args[j] = substitute(a, i)
	}
	return &c
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
	"remat":         AttrString, // "never" or "always": recompute hints
	"recomputed":    AttrBool,   // set on ops cloned by remat
	"role":          AttrString, // what the value is to later passes (RoleLossSeed)
	AttrAccumulator: AttrBool,
}

// AttrAccumulator (a common attribute) marks an op as a step of a
// reduction or scan written out as elementwise and data-movement ops (the
// ONNX importer's log-depth CumSum, CumProd and ReduceProd): its partial
// results are an accumulator, which mixed precision keeps in f32 and
// rounds once where the chain ends, as a reduction kernel would.
const AttrAccumulator = "accumulator"

// Op roles (the common attribute "role"): passes find these values by
// role, never by name, and CSE and folding keep them apart.
const (
	// RoleLossSeed marks the constant autodiff starts the backward pass
	// from (d loss / d loss); mixed precision scales it.
	RoleLossSeed = "loss_seed"
)

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
			if err := checkAttrKind(k, a[k], want); err != nil {
				return err
			}
			if len(spec.Enum) > 0 && !contains(spec.Enum, a[k].Str) {
				return fmt.Errorf("attribute %q must be one of %s, not %q", k, quoteAll(spec.Enum), a[k].Str)
			}
			continue
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
	if k, ok := a["role"]; ok && k.Str != RoleLossSeed {
		return fmt.Errorf("attribute \"role\" must be %q, not %q", RoleLossSeed, k.Str)
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

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func quoteAll(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
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
	if d.Infer == nil {
		return nil, fmt.Errorf("op %s takes its result types from its region, not from its operands", d.Name)
	}
	return d.Infer(in, d.Values(a))
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
	in := op.OperandTypes()
	out := make([]Type, len(op.Results))
	for i, v := range op.Results {
		out[i] = v.Type
	}
	if d.FLOPs != nil {
		c.FLOPs = d.FLOPs(in, out, d.Values(op.Attrs))
	} else {
		for _, t := range out {
			c.FLOPs += t.NumElements()
		}
	}
	return c
}

// zeroFLOPs is the cost function of views, reshapes and copies.
func zeroFLOPs([]Type, []Type, AttrValues) int64 { return 0 }

// inputFLOPs counts one FLOP per element of operand 0 (reductions).
func inputFLOPs(in, _ []Type, _ AttrValues) int64 { return in[0].NumElements() }

// MayOverwrite reports whether result 0 of an op of this kind may be
// written over its operand k (see InPlace).
func (d *OpDef) MayOverwrite(k int) bool {
	return d != nil && d.InPlace && (d.InPlaceOperands == nil || slices.Contains(d.InPlaceOperands, k))
}

// IsConstant reports whether op's result is known before the step runs
// (OpDef.Constant).
func IsConstant(op *Op) bool { d := op.Def(); return d != nil && d.Constant }

// CopiesToHost reports whether op copies a device tensor to host memory
// (OpDef.Host).
func CopiesToHost(op *Op) bool { d := op.Def(); return d != nil && d.Host }

// CopiesFromHost reports whether op copies a host tensor into device
// memory (OpDef.FromHost).
func CopiesFromHost(op *Op) bool { d := op.Def(); return d != nil && d.FromHost }

// Overwrites reports whether op writes v in place (v is one of the
// operands its record's Writes names).
func Overwrites(op *Op, v *Value) bool {
	d := op.Def()
	if d == nil {
		return false
	}
	for _, k := range d.Writes {
		if op.Operands[k] == v {
			return true
		}
	}
	return false
}

// DrawsRandom reports whether op draws from the counter-based generator
// (its record's Random, given its operands).
func DrawsRandom(op *Op) bool {
	d := op.Def()
	if d == nil || d.Random == nil {
		return false
	}
	in := op.OperandTypes()
	return d.Random(in)
}

// IndexOperands returns what op's record says of the operands it reads
// as run-time indices (OpDef.Indices), nil for none.
func IndexOperands(op *Op) []IndexOperand {
	d := op.Def()
	if d == nil || d.Indices == nil {
		return nil
	}
	in := op.OperandTypes()
	return d.Indices(in, op.Attr())
}

// IsRandomKey reports whether t is the type of a random key operand: the
// generator's position, an i64 scalar that a training step advances
// (random ops take it as their last operand).
func IsRandomKey(t Type) bool { return t.DType == I64 && t.Rank() == 0 }

// RandomKey is the key operand of random op op, or nil.
func RandomKey(op *Op) *Value {
	if len(op.Operands) == 0 || op.Def() == nil || op.Def().Random == nil {
		return nil
	}
	if k := op.Operands[len(op.Operands)-1]; IsRandomKey(k.Type) {
		return k
	}
	return nil
}

// AttrStraightThrough (an attribute of round) marks the round of a fake
// quantiser: with the ste approximation allowed, autodiff passes its
// gradient through unchanged (the straight-through estimate); otherwise
// its gradient is 0, round's derivative.
const AttrStraightThrough = "straight_through"
