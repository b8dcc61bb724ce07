// Package scalar is the expression language in which op records define
// elementwise semantics: an Expr computes one result element from the
// elements of the op's operands at the same (broadcast) index. The
// interpreter evaluates an Expr and the loop lowering translates it, so a
// run, a constant fold and compiled code all follow one definition. Its
// primitives (Prim) are also the typed operations of the loop language.
//
// Values have one of four kinds: Float (computed in the precision the
// evaluator chooses: f64 in the interpreter, the storage type's compute
// type in compiled code), Int (64-bit two's complement), Uint (64-bit
// unsigned: the same bits and the same wrapping addition, subtraction and
// multiplication, with unsigned division, remainder, comparison and
// conversion) and Bool.
// Constants have no kind of their own: they take the kind of the operand
// they meet, or the kind the result is stored in.
package scalar

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Kind is the kind of a scalar value.
type Kind uint8

// The kinds. Untyped marks constants before they meet a typed operand.
const (
	Untyped Kind = iota
	Float
	Int
	Bool
	Uint
)

func (k Kind) String() string {
	return [...]string{"untyped", "float", "int", "bool", "uint"}[k]
}

// IsInteger reports whether k is Int or Uint.
func (k Kind) IsInteger() bool { return k == Int || k == Uint }

// Prim is a primitive operation.
type Prim uint8

// The primitives. Unary ones take one operand, the rest two. Arithmetic
// keeps its operands' kind; comparisons give Bool.
const (
	Neg   Prim = iota + 1 // -x
	Abs                   // |x|
	Exp                   // e^x
	Log                   // natural logarithm
	Log1p                 // log(1 + x), accurate near 0
	Expm1                 // e^x - 1, accurate near 0
	Sqrt                  // square root
	Tanh                  // hyperbolic tangent
	Erf                   // error function
	Not                   // logical not (Bool)
	Floor                 // round toward -inf
	Ceil                  // round toward +inf
	Round                 // round half to even
	Sin                   // sine
	Cos                   // cosine
	Tan                   // tangent
	Asin                  // arcsine
	Acos                  // arccosine
	Atan                  // arctangent
	Sinh                  // hyperbolic sine
	Cosh                  // hyperbolic cosine
	Asinh                 // inverse hyperbolic sine
	Acosh                 // inverse hyperbolic cosine
	Atanh                 // inverse hyperbolic tangent

	Add // a + b
	Sub // a - b
	Mul // a * b
	Div // a / b; Int: truncated, and 0 when b is 0
	Rem // remainder with a's sign (fmod); Int: 0 when b is 0
	Pow // a ^ b; Int: exact, wrapping like Mul; a negative b gives 1/a^-b truncated
	Max // larger; a NaN on either side gives NaN
	Min // smaller; a NaN on either side gives NaN
	And // logical (Bool) or bitwise (Int) and
	Or  // logical (Bool) or bitwise (Int) or
	Xor // bitwise exclusive or (Int)
	Shr // logical shift right (Int)

	Eq // a == b (NaN: false)
	Ne // a != b (NaN: true)
	Lt // a < b
	Le // a <= b
	Gt // a > b
	Ge // a >= b

	numPrims
)

var primNames = [numPrims]string{
	Neg: "neg", Abs: "abs", Exp: "exp", Log: "log", Log1p: "log1p", Sqrt: "sqrt", Tanh: "tanh", Erf: "erf",
	Expm1: "expm1", Not: "not", Floor: "floor", Ceil: "ceil", Round: "round", Sin: "sin", Cos: "cos",
	Tan: "tan", Asin: "asin", Acos: "acos", Atan: "atan", Sinh: "sinh", Cosh: "cosh", Asinh: "asinh", Acosh: "acosh", Atanh: "atanh",
	Add: "add", Sub: "sub", Mul: "mul", Div: "div", Rem: "rem", Pow: "pow", Max: "max", Min: "min",
	And: "and", Or: "or", Xor: "xor", Shr: "shr",
	Eq: "eq", Ne: "ne", Lt: "lt", Le: "le", Gt: "gt", Ge: "ge",
}

func (p Prim) String() string {
	if p > 0 && p < numPrims {
		return primNames[p]
	}
	return "prim(" + strconv.Itoa(int(p)) + ")"
}

// Arity is the number of operands p takes.
func (p Prim) Arity() int {
	if p < Add {
		return 1
	}
	return 2
}

// IsCompare reports whether p is a comparison (its result is Bool).
func (p Prim) IsCompare() bool { return p >= Eq && p <= Ge }

// Prims lists every primitive.
func Prims() []Prim {
	out := make([]Prim, 0, numPrims-1)
	for p := Neg; p < numPrims; p++ {
		out = append(out, p)
	}
	return out
}

// Node says what an Expr is.
type Node uint8

// The nodes.
const (
	Operand Node = iota + 1 // operand Index of the op
	Const                   // the number Value
	Apply                   // Prim applied to Args
	Select                  // Args[0] ? Args[1] : Args[2]
	Convert                 // Args[0] converted to kind To
)

// Expr is a scalar expression. Build it with the functions of this
// package; an Expr is never modified after it is built.
type Expr struct {
	Node  Node
	Index int     // Operand
	Value float64 // Const
	Prim  Prim    // Apply
	// Convert: to Float; to Int (Uint), truncating toward zero and
	// saturating at the int64 (uint64) range, NaN giving 0, and keeping
	// the 64 bits between Int and Uint; to Bool, true where not zero (NaN
	// too).
	To   Kind
	Args []*Expr
}

// X is operand i.
func X(i int) *Expr { return &Expr{Node: Operand, Index: i} }

// C is the constant v.
func C(v float64) *Expr { return &Expr{Node: Const, Value: v} }

// Un applies a unary primitive.
func Un(p Prim, x *Expr) *Expr {
	if p.Arity() != 1 {
		panic("scalar: " + p.String() + " is not unary")
	}
	return &Expr{Node: Apply, Prim: p, Args: []*Expr{x}}
}

// Bin applies a binary primitive.
func Bin(p Prim, a, b *Expr) *Expr {
	if p.Arity() != 2 {
		panic("scalar: " + p.String() + " is not binary")
	}
	return &Expr{Node: Apply, Prim: p, Args: []*Expr{a, b}}
}

// If is c ? a : b.
func If(c, a, b *Expr) *Expr { return &Expr{Node: Select, Args: []*Expr{c, a, b}} }

// To converts x to kind k.
func To(k Kind, x *Expr) *Expr { return &Expr{Node: Convert, To: k, Args: []*Expr{x}} }

// Methods build binary primitives: a.Mul(b) is Bin(Mul, a, b).
func (a *Expr) Add(b *Expr) *Expr { return Bin(Add, a, b) }
func (a *Expr) Sub(b *Expr) *Expr { return Bin(Sub, a, b) }
func (a *Expr) Mul(b *Expr) *Expr { return Bin(Mul, a, b) }
func (a *Expr) Div(b *Expr) *Expr { return Bin(Div, a, b) }
func (a *Expr) Pow(b *Expr) *Expr { return Bin(Pow, a, b) }
func (a *Expr) Max(b *Expr) *Expr { return Bin(Max, a, b) }
func (a *Expr) Min(b *Expr) *Expr { return Bin(Min, a, b) }
func (a *Expr) And(b *Expr) *Expr { return Bin(And, a, b) }
func (a *Expr) Lt(b *Expr) *Expr  { return Bin(Lt, a, b) }
func (a *Expr) Le(b *Expr) *Expr  { return Bin(Le, a, b) }
func (a *Expr) Gt(b *Expr) *Expr  { return Bin(Gt, a, b) }
func (a *Expr) Ge(b *Expr) *Expr  { return Bin(Ge, a, b) }
func (a *Expr) Eq(b *Expr) *Expr  { return Bin(Eq, a, b) }
func (a *Expr) Ne(b *Expr) *Expr  { return Bin(Ne, a, b) }

// Sigmoid is 1/(1+e^-x), written so that no branch overflows: with
// e = e^-|x|, 1/(1+e) for x >= 0 and e/(1+e) below.
func Sigmoid(x *Expr) *Expr {
	e := Un(Exp, Un(Neg, Un(Abs, x)))
	return If(x.Lt(C(0)), e.Div(C(1).Add(e)), C(1).Div(C(1).Add(e)))
}

// String prints e in a prefix form, e.g. mul(x0, sigmoid...).
func (e *Expr) String() string {
	var b strings.Builder
	e.write(&b)
	return b.String()
}

func (e *Expr) write(b *strings.Builder) {
	switch e.Node {
	case Operand:
		fmt.Fprintf(b, "x%d", e.Index)
		return
	case Const:
		b.WriteString(strconv.FormatFloat(e.Value, 'g', -1, 64))
		return
	case Apply:
		b.WriteString(e.Prim.String())
	case Select:
		b.WriteString("select")
	case Convert:
		b.WriteString("to_" + e.To.String())
	}
	b.WriteByte('(')
	for i, a := range e.Args {
		if i > 0 {
			b.WriteString(", ")
		}
		a.write(b)
	}
	b.WriteByte(')')
}

// Size is the number of nodes of e.
func (e *Expr) Size() int {
	n := 1
	for _, a := range e.Args {
		n += a.Size()
	}
	return n
}

// Typed is an Expr with the kind of every node resolved. Operands of a
// node are converted to ArgKind before it applies (an Int operand of a
// Float addition, say); the node's value has Kind.
type Typed struct {
	*Expr
	Kind    Kind
	ArgKind Kind // Apply: the kind its operands compute in
	Args    []*Typed
}

// Resolve gives every node of e its kind, given the kinds of the op's
// operands and the kind its result is stored in. Constants take the kind
// of the operand they meet (of the result, where they meet none);
// arithmetic on mixed Int and Float operands computes in Float. It
// returns an error for an expression that no evaluator can run.
func Resolve(e *Expr, operands []Kind, result Kind) (*Typed, error) {
	t, err := resolve(e, operands)
	if err != nil {
		return nil, err
	}
	settle(t, result)
	return t, nil
}

func resolve(e *Expr, operands []Kind) (*Typed, error) {
	t := &Typed{Expr: e}
	for _, a := range e.Args {
		ta, err := resolve(a, operands)
		if err != nil {
			return nil, err
		}
		t.Args = append(t.Args, ta)
	}
	switch e.Node {
	case Operand:
		if e.Index < 0 || e.Index >= len(operands) {
			return nil, fmt.Errorf("operand %d of %d", e.Index, len(operands))
		}
		t.Kind = operands[e.Index]
	case Const:
		t.Kind = Untyped
	case Convert:
		settle(t.Args[0], Float)
		t.Kind = e.To
	case Select:
		settle(t.Args[0], Bool)
		if t.Args[0].Kind != Bool {
			return nil, fmt.Errorf("select on %s", t.Args[0].Kind)
		}
		t.Kind = meet(t.Args[1].Kind, t.Args[2].Kind)
		settle(t.Args[1], t.Kind)
		settle(t.Args[2], t.Kind)
	case Apply:
		k := t.Args[0].Kind
		if len(t.Args) == 2 {
			k = meet(k, t.Args[1].Kind)
		}
		switch p := e.Prim; {
		case p.IsCompare():
			if k == Bool {
				k = Int
			}
			t.Kind, t.ArgKind = Bool, k
		case p == Not:
			t.Kind, t.ArgKind = Bool, Bool
		case p == And || p == Or:
			if k == Float {
				return nil, fmt.Errorf("%s of float", p)
			}
			t.Kind, t.ArgKind = k, k
		case p == Xor || p == Shr:
			if k == Float || k == Bool {
				return nil, fmt.Errorf("%s of %s", p, k)
			}
			t.Kind, t.ArgKind = k, k
		default:
			if k == Bool {
				return nil, fmt.Errorf("%s of bool", p)
			}
			if k.IsInteger() && p.floatOnly() {
				return nil, fmt.Errorf("%s of int", p)
			}
			t.Kind, t.ArgKind = k, k
		}
		for _, a := range t.Args {
			settle(a, t.ArgKind)
		}
	}
	return t, nil
}

// floatOnly primitives have no integer form.
func (p Prim) floatOnly() bool {
	switch p {
	case Exp, Expm1, Log, Log1p, Sqrt, Tanh, Erf, Floor, Ceil, Round, Sin, Cos:
		return true
	}
	return false
}

// meet is the kind two operands compute in: Float over the integers,
// Uint over Int (as C's usual conversions of 64-bit operands do).
func meet(a, b Kind) Kind {
	switch {
	case a == Untyped:
		return b
	case b == Untyped:
		return a
	case a == Float || b == Float:
		return Float
	case a == Uint || b == Uint:
		return Uint
	case a == Int || b == Int:
		return Int
	}
	return Bool
}

// settle gives an untyped node (a constant, or arithmetic on constants
// alone) kind k.
func settle(t *Typed, k Kind) {
	if t.Kind != Untyped || k == Untyped {
		return
	}
	t.Kind = k
	switch t.Node {
	case Apply:
		t.ArgKind = k
		for _, a := range t.Args {
			settle(a, k)
		}
	case Select:
		settle(t.Args[1], k)
		settle(t.Args[2], k)
	}
}

// Clamp is min(max(x, lo), hi); NaN stays NaN.
func Clamp(x, lo, hi *Expr) *Expr { return x.Max(lo).Min(hi) }

// SaturatingInt converts a float to int64 as Convert defines it:
// truncation toward zero, saturating at the int64 range, NaN to 0.
func SaturatingInt(v float64) int64 {
	switch {
	case v != v:
		return 0
	case v >= 0x1p63:
		return math.MaxInt64
	case v <= -0x1p63:
		return math.MinInt64
	}
	return int64(v)
}

// SaturatingUint converts a float to uint64 (returned as its bits in an
// int64) as Convert defines it: truncation toward zero, saturating at 0
// and 2^64-1, NaN to 0.
func SaturatingUint(v float64) int64 {
	switch {
	case !(v > 0):
		return 0
	case v >= 0x1p64:
		return -1
	}
	return int64(uint64(v))
}
