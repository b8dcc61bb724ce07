// Package loops lowers Kiln ops and fused kernels to loop programs: each
// kernel is a list of stages, and each stage stores a scalar expression at
// every point of a rectangular loop domain. Backends (codegen/llvm) emit the
// loops; this package decides what is computed where.
//
// Contract: a stage reads only buffers written by earlier stages, kernel
// operands and its own output at the point it stores (accumulation); every
// Load is either in bounds or carries a Guard that is false where it is not.
package loops

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// Kind is the scalar type an expression computes in.
type Kind uint8

const (
	F32  Kind = iota // float (also the compute type of f16, bf16 and fp8)
	F64              // double
	I64              // every integer dtype but u64 computes in 64 bits
	Bool             // i1: comparisons and masks
	U64              // u64: i64's bits, computed unsigned (scalar.Uint)
)

func (k Kind) String() string { return [...]string{"f32", "f64", "i64", "bool", "u64"}[k] }

// IsInteger reports whether k is I64 or U64.
func (k Kind) IsInteger() bool { return k == I64 || k == U64 }

// IsFloat reports whether k is F32 or F64.
func (k Kind) IsFloat() bool { return k == F32 || k == F64 }

// ComputeKind is the kind a dtype's elements are loaded as.
func ComputeKind(d ir.DType) Kind {
	switch {
	case d == ir.F64:
		return F64
	case d.IsFloat():
		return F32
	case d == ir.Bool:
		return Bool
	case d == ir.U64:
		return U64
	}
	return I64
}

// Expr is a scalar expression evaluated at one point of a loop domain.
type Expr interface{ Kind() Kind }

// Var is a loop variable (i64).
type Var struct{ ID int }

// Int is an i64 constant.
type Int struct{ V int64 }

// Float is a floating constant of kind K.
type Float struct {
	V float64
	K Kind
}

// BoolConst is a constant i1.
type BoolConst struct{ V bool }

// Load reads Buf at Index (one expression per dimension). When Guard is
// set the load happens only where it is true; elsewhere it yields Else.
type Load struct {
	Buf   *Buffer
	Index []Expr
	Guard Expr
	Else  float64
}

// Unary applies a unary primitive (scalar.Prim documents each).
type Unary struct {
	Fn scalar.Prim
	X  Expr
}

// Binary applies a binary arithmetic or logical primitive to operands of
// one kind.
type Binary struct {
	Op   scalar.Prim
	A, B Expr
}

// Compare applies a comparison primitive; NaN compares false except
// under Ne. I64 compares signed, U64 unsigned.
type Compare struct {
	Pred scalar.Prim
	A, B Expr
}

// Select is C ? A : B.
type Select struct{ C, A, B Expr }

// Convert changes kind as scalar.Convert does: floats truncate toward
// zero into integers, saturating (NaN: 0), bools become 0 or 1, a
// number becomes a bool when it is not zero, and I64 and U64 keep their
// bits (a U64 constant is an Int converted so).
type Convert struct {
	To Kind
	X  Expr
}

// Round is an F32 value rounded to the nearest value of a narrower
// float dtype (F16 or BF16, ties to even), as storing and loading it
// would: values inside a fused kernel keep the precision their type
// declares, as the interpreter computes them.
type Round struct {
	To ir.DType
	X  Expr
}

// Reduce folds Body over the loop domain Vars × Extents with Op (Add,
// Max or Min), accumulating in Acc. An empty domain yields the identity.
type Reduce struct {
	Op      scalar.Prim
	Vars    []*Var
	Extents []int64
	Body    Expr
	Acc     Kind
}

// Guarded is X where Cond holds and Else (in X's kind) elsewhere; X is
// evaluated only where Cond holds, so it may read out of bounds
// elsewhere. Backends emit a branch, which vectorisers turn into masked
// loads.
type Guarded struct {
	Cond, X Expr
	Else    float64
}

// Mix is the SplitMix64 finaliser on an i64 (dropout's counter-based RNG).
type Mix struct{ X Expr }

// RankIndex is the index of the running rank in its group of Size ranks
// Stride apart (ir.RankIndex), an i64: 0 in a program of one rank.
type RankIndex struct{ Size, Stride int64 }

// Checked is X, and where Cond is false a record that the run went wrong:
// the program's status becomes StatusIndexOutOfRange (the interpreter
// reports the same input as an error). X must be safe to evaluate
// anyway (a clamped index).
type Checked struct {
	Cond, X Expr
}

// StatusIndexOutOfRange is the status a compiled run returns when a
// gather index or a cross-entropy label was outside its dimension.
const StatusIndexOutOfRange = 1

func (*Var) Kind() Kind       { return I64 }
func (Int) Kind() Kind        { return I64 }
func (f Float) Kind() Kind    { return f.K }
func (BoolConst) Kind() Kind  { return Bool }
func (l *Load) Kind() Kind    { return ComputeKind(l.Buf.Type.DType) }
func (u *Unary) Kind() Kind   { return u.X.Kind() }
func (b *Binary) Kind() Kind  { return b.A.Kind() }
func (*Compare) Kind() Kind   { return Bool }
func (s *Select) Kind() Kind  { return s.A.Kind() }
func (c *Convert) Kind() Kind { return c.To }
func (*Round) Kind() Kind     { return F32 }
func (r *Reduce) Kind() Kind  { return r.Acc }
func (*Mix) Kind() Kind       { return I64 }
func (*RankIndex) Kind() Kind { return I64 }
func (g *Guarded) Kind() Kind { return g.X.Kind() }
func (c *Checked) Kind() Kind { return c.X.Kind() }

// Storage says where a buffer lives.
type Storage uint8

const (
	Arena Storage = iota // at Offset bytes in the arena
	Param                // params[Slot] (+ Offset bytes)
	Input                // inputs[Slot] (+ Offset bytes)
	Temp                 // kernel workspace, allocated for the kernel's run
	Const                // a constant array (Data) in the program image
	Host                 // at Offset bytes in the host arena (swapped-out tensors)
)

// Buffer is a dense row-major tensor in memory.
type Buffer struct {
	Name    string
	Type    ir.Type
	Storage Storage
	Slot    int
	Offset  int64
	Data    *ir.Dense
}

func (b *Buffer) String() string {
	return fmt.Sprintf("%s(%s %s slot %d +%d)", b.Name, b.Type, [...]string{"arena", "param", "input", "temp", "const", "host"}[b.Storage], b.Slot, b.Offset)
}

// Step is a *Stage or a *Loop.
type Step interface{}

// Loop runs Body for Var = 0 .. Extent-1; stages inside may use Var.
type Loop struct {
	Var    *Var
	Extent int64
	Body   []Step
}

// Stage stores Value at Out[Index] for every point of the domain
// Vars × Extents (Index nil: the domain is Out's shape and Index = Vars).
// With Accumulate it adds to what Out holds.
type Stage struct {
	Vars       []*Var
	Extents    []int64
	Out        *Buffer
	Index      []Expr
	Value      Expr
	Accumulate bool
	// Guard, when set, limits the store to the points where it holds.
	Guard Expr
	// Matmul, when set, replaces Value: for every (m, n) of the domain
	// Vars = [m, n], Extents = [M, N], Out[Index] (+)= Epilogue(Σk A·B)
	// with A an expression of (m, K) and B of (K, n), emitted as a
	// register-blocked, vectorisable loop nest rather than one reduction
	// per element.
	Matmul *Matmul
}

// Matmul is the contraction of a matmul stage.
type Matmul struct {
	K        *Var
	Extent   int64
	A, B     Expr
	Epilogue func(acc Expr) Expr // nil: the sum itself
	// Taps, when set, restates B as a convolution's input read under its
	// kernel taps (Options.ConvPanels), so that a backend may copy B's
	// rows run by run; B stays its whole definition.
	Taps *Taps
}

// Taps says that a Matmul's B(k, n) is the convolution input X under
// kernel tap k = (c, kh, kw) (c counted within the group) at output
// position n = i·OH·OW + oh·OW + ow of image i: X at N = i, C = c,
// H = oh·SH - PT + kh·DH, W = ow·SW - PL + kw·DW, and 0
// where H or W falls outside the input (the padding). X reads the input
// through the variables N, C, H and W, bound to points inside it.
type Taps struct {
	Geometry   ir.ConvGeometry
	N, C, H, W *Var
	X          Expr
}

// Row reports whether X is an unguarded read of a buffer whose index
// has W as its last component and nowhere else: then X at W = w + i is
// the element i places after X at W = w, and a row of taps is a run of
// contiguous elements starting at Index.
func (t *Taps) Row() (buf *Buffer, index []Expr, ok bool) {
	l, isLoad := t.X.(*Load)
	if !isLoad || l.Guard != nil || len(l.Index) == 0 || l.Index[len(l.Index)-1] != Expr(t.W) {
		return nil, nil, false
	}
	for _, x := range l.Index[:len(l.Index)-1] {
		if reads(x, t.W) {
			return nil, nil, false
		}
	}
	return l.Buf, l.Index, true
}

// foreign reports whether x is an expression of a type this package does
// not define (a backend's own), whose reads it cannot see.
func foreign(x Expr) bool {
	switch x.(type) {
	case *Var, Int, Float, BoolConst, *RankIndex, *Load, *Unary, *Binary, *Compare, *Select, *Convert, *Round, *Mix, *Guarded, *Checked, *Reduce:
		return false
	}
	return true
}

// reads reports whether x reads the variable v (an expression of a type
// this package does not know is assumed to).
func reads(x Expr, v *Var) bool {
	if x == nil {
		return false
	}
	if w, ok := x.(*Var); ok {
		return w == v
	}
	if foreign(x) {
		return true
	}
	for _, c := range Children(x) {
		if reads(c, v) {
			return true
		}
	}
	return false
}

// Kernel is what one op (or one fused kernel op) becomes.
type Kernel struct {
	Name  string
	Op    *ir.Op // nil for a check kernel (Options.Transactional)
	Steps []Step
	Temps []*Buffer
	// TestStatus: the kernel writes an argument, and the run ends before
	// it, nothing written, when an index check so far has failed
	// (Options.Transactional).
	TestStatus bool
	// Backups is how many of the program's backups (Program.Restore) are
	// taken when this kernel starts: those a failure found here restores.
	Backups int
}

// Children are the expressions x reads directly (nil where absent).
func Children(x Expr) []Expr {
	switch x := x.(type) {
	case *Load:
		return append(append([]Expr{}, x.Index...), x.Guard)
	case *Unary:
		return []Expr{x.X}
	case *Binary:
		return []Expr{x.A, x.B}
	case *Compare:
		return []Expr{x.A, x.B}
	case *Select:
		return []Expr{x.C, x.A, x.B}
	case *Convert:
		return []Expr{x.X}
	case *Round:
		return []Expr{x.X}
	case *Mix:
		return []Expr{x.X}
	case *Guarded:
		return []Expr{x.Cond, x.X}
	case *Checked:
		return []Expr{x.Cond, x.X}
	case *Reduce:
		return []Expr{x.Body}
	}
	return nil
}

// InvariantReduces are the outermost reductions in r's body that read
// none of r's variables and are evaluated wherever the body is (not
// under a Guarded's X, a guarded load's index or another reduction): a
// backend computes each once, before r's loop, rather
// than once per term (a max-pool gradient's window maximum, which the
// search for the first tap equal to it reads at every tap). None when
// r's domain is empty: the body, and they, are then never evaluated.
func InvariantReduces(r *Reduce) []*Reduce {
	for _, e := range r.Extents {
		if e <= 0 {
			return nil
		}
	}
	bound := map[*Var]bool{}
	for _, v := range r.Vars {
		bound[v] = true
	}
	reads := map[Expr]bool{} // whether an expression reads a variable of r
	var readsBound func(x Expr) bool
	readsBound = func(x Expr) bool {
		if x == nil {
			return false
		}
		if v, ok := reads[x]; ok {
			return v
		}
		found := foreign(x) // a backend's own expression: assume it reads them
		if v, ok := x.(*Var); ok {
			found = bound[v]
		}
		for _, c := range Children(x) {
			if readsBound(c) {
				found = true
			}
		}
		reads[x] = found
		return found
	}
	var out []*Reduce
	seen := map[Expr]bool{}
	var walk func(x Expr)
	walk = func(x Expr) {
		if x == nil || seen[x] {
			return
		}
		seen[x] = true
		switch x := x.(type) {
		case *Reduce:
			// Inside a reduction that reads r's variables, a term may read
			// its own (and run zero times): it hoists its own invariants.
			if !readsBound(x) {
				out = append(out, x)
			}
			return
		case *Guarded:
			walk(x.Cond)
			return
		case *Load:
			if x.Guard != nil {
				walk(x.Guard) // a backend may compute the index only where the guard holds
				return
			}
		}
		for _, c := range Children(x) {
			walk(c)
		}
	}
	walk(r.Body)
	return out
}
