package cuda

import (
	"fmt"
	"math"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// A kernel computes each point of its stage in one thread, so a stage of
// few points whose value folds a long reduction (a batch norm's
// statistics: one point per channel, each summing batch × height × width
// values) runs on a handful of threads, each looping over its whole
// reduction. Such a stage is split in two: the reduction's first
// variable is cut into P chunks, a stage of points × P threads folds one
// chunk each into a partial buffer in the workspace, and the stage itself
// then folds the P partials where it folded the reduction. The order of
// the fold changes (as a GPU reduction's does); what is folded does not.
const (
	splitMinReduce = 4096  // reductions shorter than this stay in one thread
	splitMaxPoints = 16384 // stages of more points have threads enough
	splitChunk     = 256   // terms each partial thread folds, about
	splitMaxParts  = 1024
	// splitMaxPartials bounds a split's partial buffer (elements).
	splitMaxPartials = 1 << 16
)

// bindVar is Body with Var bound to Value (an expression of the kernel
// writer, not of the loop program): the partial stage's reduction runs
// over a chunk and binds the variable it cut to its place in the whole.
type bindVar struct {
	Var   *loops.Var
	Value loops.Expr
	Body  loops.Expr
}

func (b *bindVar) Kind() loops.Kind { return b.Body.Kind() }

// splitVarBase numbers the variables splits make, above any the loop
// program uses.
const splitVarBase = 1 << 30

// longReduce is the longest reduction in x that no other reduction
// encloses, with its length, or nil.
func longReduce(x loops.Expr) (*loops.Reduce, int64) {
	var best *loops.Reduce
	var n int64
	seen := map[loops.Expr]bool{}
	var walk func(x loops.Expr)
	walk = func(x loops.Expr) {
		if x == nil || seen[x] {
			return
		}
		seen[x] = true
		if r, ok := x.(*loops.Reduce); ok {
			total := product(r.Extents)
			if total > n {
				best, n = r, total
			}
			return // a reduction inside it runs per term: not split
		}
		if g, ok := x.(*loops.Guarded); ok {
			// A reduction under a guard runs only where the guard holds:
			// the partial stage would run it everywhere.
			walk(g.Cond)
			return
		}
		for _, c := range children(x) {
			walk(c)
		}
	}
	walk(x)
	return best, n
}

// identityValue is the value a fold starts from.
func identityValue(op scalar.Prim) float64 {
	switch op {
	case scalar.Max:
		return math.Inf(-1)
	case scalar.Min:
		return math.Inf(1)
	}
	return 0
}

// splitReduce returns the partial stage and the override of st's
// reduction when st should be split, or nil: a stage of at most
// splitMaxPoints points (no guard, no matmul) whose longest reduction
// folds at least splitMinReduce floating terms. partial is the buffer
// (a kernel temporary) the partial stage writes.
func splitReduce(st *loops.Stage, partial func(t ir.Type) *loops.Buffer) (*loops.Stage, map[loops.Expr]loops.Expr) {
	if st.Matmul != nil || st.Guard != nil {
		return nil, nil
	}
	points := product(st.Extents)
	if points > splitMaxPoints || points == 0 {
		return nil, nil
	}
	r, n := longReduce(st.Value)
	if r == nil || n < splitMinReduce || !r.Acc.IsFloat() {
		return nil, nil
	}
	switch r.Op {
	case scalar.Add, scalar.Max, scalar.Min:
	default:
		return nil, nil
	}
	// The reduction's longest variable is cut.
	j := 0
	for i, e := range r.Extents {
		if e > r.Extents[j] {
			j = i
		}
	}
	parts := min(splitMaxParts, max(2, n/splitChunk), max(2, splitMaxPartials/points))
	parts = min(parts, r.Extents[j])
	if parts < 2 {
		return nil, nil
	}
	chunk := (r.Extents[j] + parts - 1) / parts
	parts = (r.Extents[j] + chunk - 1) / chunk
	dt := ir.F32
	if r.Acc == loops.F64 {
		dt = ir.F64
	}
	shape := append(append([]int64{}, st.Extents...), parts)
	buf := partial(ir.Type{DType: dt, Shape: shape})
	cut := r.Vars[j]
	p := &loops.Var{ID: splitVarBase + 3*cut.ID}
	q := &loops.Var{ID: splitVarBase + 3*cut.ID + 1}
	// cut = p·chunk + q, folded where it lies in the reduction.
	at := &loops.Binary{Op: scalar.Add, A: &loops.Binary{Op: scalar.Mul, A: p, B: loops.Int{V: chunk}}, B: q}
	inside := &loops.Compare{Pred: scalar.Lt, A: at, B: loops.Int{V: r.Extents[j]}}
	// Places past the end fold the identity.
	body := &bindVar{Var: cut, Value: at, Body: &loops.Guarded{Cond: inside, X: r.Body, Else: identityValue(r.Op)}}
	vars, exts := append([]*loops.Var{}, r.Vars...), append([]int64{}, r.Extents...)
	vars[j], exts[j] = q, chunk
	part := &loops.Stage{
		Vars:    append(append([]*loops.Var{}, st.Vars...), p),
		Extents: shape,
		Out:     buf,
		Value:   &loops.Reduce{Op: r.Op, Vars: vars, Extents: exts, Body: body, Acc: r.Acc},
	}
	k := &loops.Var{ID: splitVarBase + 3*cut.ID + 2}
	idx := make([]loops.Expr, 0, len(st.Vars)+1)
	for _, v := range st.Vars {
		idx = append(idx, v)
	}
	idx = append(idx, k)
	whole := &loops.Reduce{Op: r.Op, Vars: []*loops.Var{k}, Extents: []int64{parts}, Body: &loops.Load{Buf: buf, Index: idx}, Acc: r.Acc}
	return part, map[loops.Expr]loops.Expr{r: whole}
}

// split adds st as its partial stage and st folding the partials, when
// splitReduce splits it; it reports whether it did.
func (b *planner) split(op int, k *loops.Kernel, st *loops.Stage, outer []*loops.Var, extents, iter []int64, temps map[string]int64) (bool, error) {
	var name string
	var size int64
	part, override := splitReduce(st, func(t ir.Type) *loops.Buffer {
		name = fmt.Sprintf("partial%d", b.stageIndex(k, st))
		size = t.SizeBytes()
		return &loops.Buffer{Name: name, Type: t, Storage: loops.Temp}
	})
	if part == nil {
		return false, nil
	}
	// The partials go after the kernel's temporaries, each split of the
	// kernel in its own place, and only into workspace the plan has anyway
	// (another kernel's temporaries need it): a split never makes the
	// device memory a budget planned for grow.
	if _, ok := temps[name]; !ok {
		if b.splitTop+size > b.splitLimit {
			return false, nil
		}
		temps[name] = b.splitTop
		id := len(b.plan.Buffers)
		b.plan.Buffers = append(b.plan.Buffers, Buffer{ID: id, Values: []string{k.Name + "." + name}, Space: "device", Offset: b.splitTop, SizeBytes: size,
			DType: part.Out.Type.DType.String(), Shape: append([]int64{}, part.Out.Type.Shape...), FirstOp: op, LastOp: op})
		b.byName[k.Name+"."+name] = id
		b.splitTop += alignUp(size, loops.TempAlignment)
	}
	base := fmt.Sprintf("%s_s%d", k.Name, b.stageIndex(k, st))
	b.alias[part] = base + "_partial"
	folded := *st
	b.alias[&folded] = base + "_folded"
	b.override[&folded] = override
	return true, b.launches(op, k, []loops.Step{part, &folded}, outer, extents, iter, temps)
}

// product is the product of extents: the points of a domain.
func product(extents []int64) int64 {
	n := int64(1)
	for _, e := range extents {
		n *= e
	}
	return n
}
