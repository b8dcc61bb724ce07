// Package reorder is the `reorder` pass: it chooses a topological order of
// a function's ops that lowers peak live bytes, and never returns an order
// with a higher peak than the one it was given. Heuristics (list
// scheduling by bytes freed, depth-first orders, reverse post-order) run
// on any size; an exact dynamic programme over sets of scheduled ops solves
// small graphs and small segments between single-value cut points; a
// local improvement phase sinks ops towards their users. Every candidate
// is measured with the liveness analysis and the best one wins.
package reorder

import (
	"github.com/kiln-compiler/kiln/ir"
)

// graph is the dependence graph of a function's top-level ops.
type graph struct {
	f     *ir.Func
	n     int
	preds [][]int // ops whose results op i reads (deduplicated)
	succs [][]int // ops reading op i's results
	// Memory model used by the heuristics: each op allocates the bytes of
	// its results that are not views; a storage root is freed when every
	// use of every value sharing it is done.
	alloc    []int64
	root     map[*ir.Value]*ir.Value
	rootSize map[*ir.Value]int64
	uses     map[*ir.Value]int // uses of all values sharing a root
	pinned   map[*ir.Value]bool
}

func newGraph(f *ir.Func) *graph {
	g := &graph{f: f, n: len(f.Body), root: map[*ir.Value]*ir.Value{}, rootSize: map[*ir.Value]int64{}, uses: map[*ir.Value]int{}, pinned: map[*ir.Value]bool{}}
	index := map[*ir.Op]int{}
	for i, op := range f.Body {
		index[op] = i
	}
	g.preds, g.succs, g.alloc = make([][]int, g.n), make([][]int, g.n), make([]int64, g.n)
	for _, a := range f.Args {
		g.root[a] = a
		g.pinned[a] = true
	}
	lastImpure := -1
	for i, op := range f.Body {
		seen := map[int]bool{}
		addPred := func(j int) {
			if j >= 0 && !seen[j] {
				seen[j] = true
				g.preds[i] = append(g.preds[i], j)
				g.succs[j] = append(g.succs[j], i)
			}
		}
		for _, v := range op.Operands {
			if v.Def != nil {
				addPred(index[v.Def])
			}
			g.uses[g.root[v]]++
		}
		if d := op.Def(); d == nil || d.Impure {
			addPred(lastImpure) // impure ops keep their relative order
			lastImpure = i
		}
		d := op.Def()
		for j, r := range op.Results {
			if d != nil && d.View && j == 0 && len(op.Operands) > 0 {
				g.root[r] = g.root[op.Operands[0]]
				continue
			}
			g.root[r] = r
			g.rootSize[r] = r.Type.SizeBytes()
			g.alloc[i] += r.Type.SizeBytes()
		}
	}
	for _, r := range f.Results {
		g.pinned[g.root[r.Value]] = true
	}
	// An op that overwrites an operand (an optimizer update) runs after
	// every other reader of it.
	readers := map[*ir.Value][]int{}
	for i, op := range f.Body {
		for _, v := range op.Operands {
			readers[v] = append(readers[v], i)
		}
	}
	for i, op := range f.Body {
		d := op.Def()
		if d == nil {
			continue
		}
		for _, k := range d.Writes {
			for _, r := range readers[op.Operands[k]] {
				if r != i && !contains(g.preds[i], r) {
					g.preds[i] = append(g.preds[i], r)
					g.succs[r] = append(g.succs[r], i)
				}
			}
		}
	}
	return g
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// apply reorders f's body to the given permutation of op indices.
func (g *graph) apply(order []int) {
	body := make([]*ir.Op, len(order))
	for k, i := range order {
		body[k] = g.f.Body[i]
	}
	copy(g.f.Body, body)
}

// isTopological reports whether order is a valid schedule.
func (g *graph) isTopological(order []int) bool {
	if len(order) != g.n {
		return false
	}
	pos := make([]int, g.n)
	seen := make([]bool, g.n)
	for k, i := range order {
		if i < 0 || i >= g.n || seen[i] {
			return false
		}
		seen[i] = true
		pos[i] = k
	}
	for i := range g.preds {
		for _, p := range g.preds[i] {
			if pos[p] >= pos[i] {
				return false
			}
		}
	}
	return true
}
