package cuda

import (
	"fmt"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// A stage of few points whose value folds a long reduction (a batch
// norm's statistics, a loss's sum, a layer norm's row statistics) runs a
// block of threads per point: each thread folds every 256th term of the
// reduction, and the block folds the 256 partial results in shared
// memory (kiln_block_fold), a tree of halvings with a barrier between.
// The order of the fold changes (as any GPU reduction's does); what is
// folded does not.
const (
	foldMaxPoints = 16384 // stages of more points have threads enough
	foldMinTerms  = 512   // shorter reductions stay in one thread
)

// blockFolds are the reductions of stage st that a block should fold
// together, or nil: for a stage of at most foldMaxPoints points (no
// guard, no product), each reduction that every thread reaches (not
// under a guard, not in the index of a guarded read, not inside another
// reduction) and that folds at least foldMinTerms floating terms by a
// sum, max or min (a layer norm's mean and mean square both).
//
// The kernel folds them first, in this order, before anything else of
// the stage: a reduction that the value also reads under a guard is then
// already computed there, and every thread reaches every barrier.
func blockFolds(st *loops.Stage, override map[loops.Expr]loops.Expr) []*loops.Reduce {
	if st.Matmul != nil || st.Guard != nil {
		return nil
	}
	points := product(st.Extents)
	if points > foldMaxPoints || points == 0 {
		return nil
	}
	var out []*loops.Reduce
	seen := map[loops.Expr]bool{}
	var walk func(x loops.Expr)
	walk = func(x loops.Expr) {
		if x == nil || seen[x] {
			return
		}
		seen[x] = true
		if o, ok := override[x]; ok {
			walk(o)
			return
		}
		switch x := x.(type) {
		case *loops.Reduce:
			total := product(x.Extents)
			if _, ok := foldOps[x.Op]; ok && total >= foldMinTerms && x.Acc.IsFloat() {
				out = append(out, x)
			}
			return // a reduction inside it runs per term
		case *loops.Guarded:
			walk(x.Cond) // X runs only where Cond holds
			return
		case *loops.Load:
			if x.Guard != nil {
				walk(x.Guard) // the index is computed only where the guard holds
				return
			}
		}
		for _, c := range children(x) {
			walk(c)
		}
	}
	walk(st.Value)
	for _, i := range st.Index {
		walk(i)
	}
	return out
}

// foldOps are kiln_block_fold's codes of the folds.
var foldOps = map[scalar.Prim]int{scalar.Add: 0, scalar.Max: 1, scalar.Min: 2}

// blockFold writes reduction r folded by the block: each thread's share
// (terms threadIdx.x, +256, ...) then kiln_block_fold, whose result every
// thread holds.
func (w *cw) blockFold(r *loops.Reduce) string {
	for _, inner := range loops.InvariantReduces(r) {
		w.expr(inner) // computed once, before the loop
	}
	total := product(r.Extents)
	t := w.tmp()
	w.line("%s %s = %s;", cType(r.Acc), t, identity(r.Op, r.Acc))
	w.line("for (long long kiln_q = threadIdx.x; kiln_q < %dLL; kiln_q += %d) {", total, BlockSize)
	w.indent++
	w.push()
	w.unflatten(r.Vars, r.Extents, "kiln_q")
	v := w.expr(r.Body)
	w.line("%s = %s;", t, w.binary(r.Op, r.Acc, t, v))
	w.pop()
	w.indent--
	w.line("}")
	return w.def(r.Acc, fmt.Sprintf("kiln_block_fold(%s, %d)", t, foldOps[r.Op]))
}
