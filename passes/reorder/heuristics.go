package reorder

import (
	"container/heap"
	"sort"

	"github.com/kiln-compiler/kiln/ir"
)

// listSchedule is greedy list scheduling: among ready ops, run the one
// that frees the most bytes net of what it allocates (ties: fewer bytes
// defined, then the original position).
func (g *graph) listSchedule() []int {
	remaining := map[*ir.Value]int{}
	for r, u := range g.uses {
		remaining[r] = u
	}
	indeg := make([]int, g.n)
	for i := range g.preds {
		indeg[i] = len(g.preds[i])
	}
	// usesBy[i] counts op i's uses of each root.
	usesBy := make([]map[*ir.Value]int, g.n)
	users := map[*ir.Value][]int{}
	for i, op := range g.f.Body {
		usesBy[i] = map[*ir.Value]int{}
		for _, v := range op.Operands {
			r := g.root[v]
			if usesBy[i][r] == 0 {
				users[r] = append(users[r], i)
			}
			usesBy[i][r]++
		}
	}
	score := func(i int) int64 {
		s := -g.alloc[i]
		for r, k := range usesBy[i] {
			if remaining[r] == k && !g.pinned[r] {
				s += g.rootSize[r]
			}
		}
		return s
	}
	h := &opHeap{}
	inHeapScore := make([]int64, g.n)
	ready := make([]bool, g.n)
	push := func(i int) {
		inHeapScore[i] = score(i)
		heap.Push(h, heapItem{score: inHeapScore[i], alloc: g.alloc[i], idx: i})
	}
	for i := range indeg {
		if indeg[i] == 0 {
			ready[i] = true
			push(i)
		}
	}
	order := make([]int, 0, g.n)
	done := make([]bool, g.n)
	for h.Len() > 0 {
		it := heap.Pop(h).(heapItem)
		i := it.idx
		if done[i] || it.score != inHeapScore[i] {
			continue // stale
		}
		done[i] = true
		order = append(order, i)
		for r, k := range usesBy[i] {
			remaining[r] -= k
			// A ready user that now holds the last uses frees r: rescore it.
			for _, u := range users[r] {
				if ready[u] && !done[u] && usesBy[u][r] == remaining[r] {
					if s := score(u); s != inHeapScore[u] {
						push(u)
					}
				}
			}
		}
		for _, s := range g.succs[i] {
			indeg[s]--
			if indeg[s] == 0 {
				ready[s] = true
				push(s)
			}
		}
	}
	return order
}

type heapItem struct {
	score int64
	alloc int64
	idx   int
}

type opHeap []heapItem

func (h opHeap) Len() int { return len(h) }
func (h opHeap) Less(a, b int) bool {
	if h[a].score != h[b].score {
		return h[a].score > h[b].score
	}
	if h[a].alloc != h[b].alloc {
		return h[a].alloc < h[b].alloc
	}
	return h[a].idx < h[b].idx
}
func (h opHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *opHeap) Push(x any)   { *h = append(*h, x.(heapItem)) }
func (h *opHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// depthFirst schedules each result's producers depth-first: before an op,
// its operands' producers, the ones allocating the most first (so their
// large intermediates die before the small branches run).
func (g *graph) depthFirst() []int {
	done := make([]bool, g.n)
	order := make([]int, 0, g.n)
	index := map[*ir.Op]int{}
	for i, op := range g.f.Body {
		index[op] = i
	}
	// Iterative post-order.
	var visit func(i int)
	visit = func(start int) {
		type frame struct {
			i    int
			next int
			kids []int
		}
		stack := []frame{{i: start, kids: g.sortedPreds(start)}}
		done[start] = true
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.next < len(top.kids) {
				k := top.kids[top.next]
				top.next++
				if !done[k] {
					done[k] = true
					stack = append(stack, frame{i: k, kids: g.sortedPreds(k)})
				}
				continue
			}
			order = append(order, top.i)
			stack = stack[:len(stack)-1]
		}
	}
	var roots []int
	for _, r := range g.f.Results {
		if r.Value.Def != nil {
			roots = append(roots, index[r.Value.Def])
		}
	}
	for i := range g.succs {
		if len(g.succs[i]) == 0 {
			roots = append(roots, i)
		}
	}
	for _, r := range roots {
		if !done[r] {
			visit(r)
		}
	}
	return order
}

// sortedPreds orders an op's predecessors by the bytes they allocate,
// largest first (ties: original position).
func (g *graph) sortedPreds(i int) []int {
	ps := append([]int(nil), g.preds[i]...)
	sort.SliceStable(ps, func(a, b int) bool {
		if g.alloc[ps[a]] != g.alloc[ps[b]] {
			return g.alloc[ps[a]] > g.alloc[ps[b]]
		}
		return ps[a] < ps[b]
	})
	return ps
}

// reversePostOrder walks users depth-first from the ops without
// predecessors and reverses the post-order: each op runs as soon after its
// producers as the walk allows.
func (g *graph) reversePostOrder() []int {
	done := make([]bool, g.n)
	post := make([]int, 0, g.n)
	for start := g.n - 1; start >= 0; start-- {
		if len(g.preds[start]) != 0 || done[start] {
			continue
		}
		type frame struct{ i, next int }
		stack := []frame{{i: start}}
		done[start] = true
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.next < len(g.succs[top.i]) {
				k := g.succs[top.i][len(g.succs[top.i])-1-top.next]
				top.next++
				if !done[k] {
					done[k] = true
					stack = append(stack, frame{i: k})
				}
				continue
			}
			post = append(post, top.i)
			stack = stack[:len(stack)-1]
		}
	}
	for a, b := 0, len(post)-1; a < b; a, b = a+1, b-1 {
		post[a], post[b] = post[b], post[a]
	}
	return post
}
