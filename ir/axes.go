package ir

import (
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// LoopKind says how an op treats one loop of its iteration space: what a
// part of the loop's range computes. Passes that split a tensor along a
// dimension (microbatch, parallel) rely on it, and optest checks every
// declaration against the op's loop nest and its interpreter kernel.
type LoopKind uint8

// The loop kinds. For every kind but Mixed, a result that indexes the
// loop (Index.Loop) is restricted with it: computing the op on the
// operands restricted to a part of the loop's range (every operand
// dimension the loop indexes cut to that part, the rest whole) gives the
// whole result restricted to that part, element for element. A result
// that does not index the loop folds over it as the kind says.
const (
	// Parallel: every result indexes the loop.
	Parallel LoopKind = iota + 1
	// Summed: results that do not index the loop sum over it; the parts'
	// results add up to the whole (a linear fold).
	Summed
	// Averaged: results that do not index the loop average over it; a
	// part of s of the loop's n positions gives a result that, times s/n,
	// adds up with the others' to the whole.
	Averaged
	// Maximum and Minimum: results that do not index the loop take the
	// largest (smallest) value over it; the parts' results combine so.
	Maximum
	Minimum
	// Mixed: no claim. A part of the loop computes nothing of the whole
	// (windows, normalisation statistics, softmax along the loop,
	// cumulative or shifted results): splitting there is refused.
	Mixed
)

var loopKindNames = [...]string{Parallel: "parallel", Summed: "summed", Averaged: "averaged", Maximum: "maximum", Minimum: "minimum", Mixed: "mixed"}

func (k LoopKind) String() string {
	if int(k) < len(loopKindNames) && loopKindNames[k] != "" {
		return loopKindNames[k]
	}
	return "unknown"
}

// Folds reports whether results that do not index a loop of kind k
// combine over its parts (Summed, Averaged, Maximum, Minimum).
func (k LoopKind) Folds() bool { return k == Summed || k == Averaged || k == Maximum || k == Minimum }

// Loop is one loop of an op's iteration space.
type Loop struct {
	Kind   LoopKind
	Extent int64
}

// Index says how one dimension of an operand or a result is indexed by
// the op's loops (one entry of an MLIR indexing map).
type Index struct {
	// Loop, when >= 0, is the loop whose index this dimension's index
	// equals (the two have the same extent). -1: the index is not a
	// loop's; Over lists the loops its arithmetic reads.
	Loop int
	// Over, when Loop is -1, lists the loops whose indices the index is
	// computed from (a window's position, an offset slice, a
	// concatenation). Empty: a constant index (a dimension of extent 1,
	// broadcast or reduced), or one the op's operand data chooses (a
	// gathered axis). A pass splitting a loop in Over refuses: the op
	// computes the index from its own loop position, which a part of the
	// loop shifts.
	Over []int
}

// At is the index of a dimension that loop l indexes.
func At(l int) Index { return Index{Loop: l} }

// Fixed is the index of a dimension that no loop indexes by itself: a
// dimension of extent 1 (broadcast or reduced), or one chosen by data.
var Fixed = Index{Loop: -1}

// Through is the index of a dimension computed from loops ls (windows,
// offsets).
func Through(ls ...int) Index { return Index{Loop: -1, Over: ls} }

// Reads reports whether x's index depends on loop l, as the loop's own
// index or through arithmetic.
func (x Index) Reads(l int) bool {
	if x.Loop == l {
		return true
	}
	for _, o := range x.Over {
		if o == l {
			return true
		}
	}
	return false
}

// Axes is an op's iteration space and the map from its loops to each
// dimension of each operand and result: MLIR's iterator types and
// indexing maps, JAX's batching rules, in the form Kiln's splitting
// passes prove their rewrites with.
type Axes struct {
	Loops    []Loop
	Operands [][]Index // Operands[j][e]: dimension e of operand j
	Results  [][]Index // Results[i][d]: dimension d of result i
	// Flat: result 0 holds operand 0's elements in the same row-major
	// order (reshape, flatten, squeeze, unsqueeze). Loops and the maps are
	// empty; a part of operand 0 whose elements are a run of digits of its
	// flat index is the same digits of the result's.
	Flat bool
}

// OpAxes returns op's axes, or false when its record declares none (an
// op with no per-axis semantics: passes that split tensors refuse it).
func OpAxes(op *Op) (Axes, bool) {
	d := op.Def()
	if d == nil || d.Axes == nil || op.Region != nil {
		return Axes{}, false
	}
	in := op.OperandTypes()
	out := make([]Type, len(op.Results))
	for i, v := range op.Results {
		out[i] = v.Type
	}
	return d.Axes(in, out, op.Attr()), true
}

// LinearIn reports whether op is jointly linear in the operands set (and
// no others), the rest held fixed: op(Σ x_k) = Σ op(x_k) when the
// operands in set are sums of parts. Floating-point rounding aside, a
// value summed in parts may then pass through op before the parts are
// added up.
func LinearIn(op *Op, set []int) bool {
	d := op.Def()
	if d == nil || op.Region != nil || len(set) == 0 {
		return false
	}
	if d.Linear != nil {
		for _, g := range d.Linear(op.Attr(), len(op.Operands)) {
			if sameSet(g, set) {
				return true
			}
		}
		return false
	}
	if d.Scalar == nil || len(op.Results) != 1 {
		return false
	}
	in := op.OperandTypes()
	if !op.Results[0].Type.DType.IsFloat() {
		return false
	}
	for _, j := range set {
		if j < 0 || j >= len(in) || !in[j].DType.IsFloat() {
			return false
		}
	}
	s := map[int]bool{}
	for _, j := range set {
		s[j] = true
	}
	return linearity(d.Scalar(op.Attr(), in, op.Results[0].Type), s) == linear
}

func isIn(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func sameSet(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !isIn(b, x) {
			return false
		}
	}
	for _, x := range b {
		if !isIn(a, x) {
			return false
		}
	}
	return true
}

// linearClass is what an expression is as a function of a set of operands.
type linearClass uint8

const (
	zero      linearClass = iota + 1 // the constant 0 (free and linear)
	free                             // does not read the set
	linear                           // homogeneous linear in the set
	nonlinear                        // anything else
)

// linearity classifies e as a function of the operands in s, the others
// held fixed (real arithmetic: rounding aside).
func linearity(e *scalar.Expr, s map[int]bool) linearClass {
	switch e.Node {
	case scalar.Const:
		if e.Value == 0 {
			return zero
		}
		return free
	case scalar.Operand:
		if s[e.Index] {
			return linear
		}
		return free
	case scalar.Convert:
		c := linearity(e.Args[0], s)
		if e.To == scalar.Float || c == free || c == zero {
			return c
		}
		return nonlinear
	case scalar.Select:
		if c := linearity(e.Args[0], s); c != free && c != zero {
			return nonlinear
		}
		return join(linearity(e.Args[1], s), linearity(e.Args[2], s))
	}
	args := make([]linearClass, len(e.Args))
	allFree := true
	for i, a := range e.Args {
		args[i] = linearity(a, s)
		allFree = allFree && (args[i] == free || args[i] == zero)
	}
	if allFree {
		return free
	}
	switch e.Prim {
	case scalar.Neg:
		return args[0]
	case scalar.Add, scalar.Sub:
		return join(args[0], args[1])
	case scalar.Mul:
		switch {
		case args[0] == zero || args[1] == zero:
			return zero
		case args[0] == linear && args[1] == free, args[0] == free && args[1] == linear:
			return linear
		}
	case scalar.Div:
		if args[0] == linear && args[1] == free {
			return linear
		}
	}
	return nonlinear
}

// join is the class of a sum (or of the two sides of a select): linear
// only when neither side is free of the set and nonzero.
func join(a, b linearClass) linearClass {
	switch {
	case a == nonlinear || b == nonlinear:
		return nonlinear
	case a == zero:
		return b
	case b == zero:
		return a
	case a == b:
		return a
	}
	return nonlinear
}

// Identity axes and helpers for the records.

// parallelLoops returns n parallel loops with the extents of s.
func parallelLoops(s Shape) []Loop {
	ls := make([]Loop, len(s))
	for i, e := range s {
		ls[i] = Loop{Kind: Parallel, Extent: e}
	}
	return ls
}

// identity maps dimension d to loop first+d, for each of n dimensions.
func identity(first, n int) []Index {
	out := make([]Index, n)
	for d := range out {
		out[d] = At(first + d)
	}
	return out
}

// broadcastTo maps the dimensions of an operand of shape s, broadcast
// (aligned on the right) to the loops of shape out: a dimension of the
// same extent is the loop's, one of extent 1 below a larger loop is
// Fixed.
func broadcastTo(s, out Shape) []Index {
	m := make([]Index, len(s))
	for e := range s {
		l := len(out) - len(s) + e
		if s[e] == out[l] {
			m[e] = At(l)
		} else {
			m[e] = Fixed
		}
	}
	return m
}

// broadcastAxes is the axes of an elementwise op that broadcasts its
// operands to result 0's shape (every result has that shape): one
// parallel loop per result dimension.
func broadcastAxes(in, out []Type, _ AttrValues) Axes {
	s := out[0].Shape
	a := Axes{Loops: parallelLoops(s)}
	for _, t := range in {
		a.Operands = append(a.Operands, broadcastTo(t.Shape, s))
	}
	for _, t := range out {
		a.Results = append(a.Results, identity(0, len(t.Shape)))
	}
	return a
}

// linearIn declares a record linear in each listed group of operands.
func linearIn(groups ...[]int) func(AttrValues, int) [][]int {
	return func(AttrValues, int) [][]int { return groups }
}

// flatAxes is the axes of a view that keeps the row-major order.
func flatAxes([]Type, []Type, AttrValues) Axes { return Axes{Flat: true} }
