package reorder

import (
	"sort"

	"github.com/kiln-compiler/kiln/ir"
)

// exactOrder finds an order of the ops in seg (indices into the function,
// listed in a valid order) that minimises the peak live bytes while they
// run, by dynamic programming over the sets of scheduled ops. Values from
// outside the segment are accounted as they are: alive on entry, freed at
// their last use inside it, or kept when used later. It returns nil when
// the segment has more than 63 ops or the search needs more than
// maxStates states.
func (g *graph) exactOrder(seg []int, maxStates int) []int {
	k := len(seg)
	if k == 0 || k > 63 {
		return nil
	}
	pos := map[int]int{}
	for j, i := range seg {
		pos[i] = j
	}
	after := make([]bool, g.n) // ops after the segment in the current order
	{
		inSeg := make([]bool, g.n)
		for _, i := range seg {
			inSeg[i] = true
		}
		// Ops not in the segment that depend on it run after it.
		for _, i := range seg {
			for _, s := range g.succs[i] {
				if !inSeg[s] {
					after[s] = true
				}
			}
		}
		for changed := true; changed; {
			changed = false
			for i := 0; i < g.n; i++ {
				if after[i] {
					for _, s := range g.succs[i] {
						if !after[s] && !inSeg[s] {
							after[s] = true
							changed = true
						}
					}
				}
			}
		}
	}
	type rootInfo struct {
		size      int64
		useMask   uint64 // segment ops using the root
		liveAfter bool   // pinned, or used by an op outside the segment
		defined   int    // segment position defining it, or -1 (external)
	}
	roots := map[*ir.Value]*rootInfo{}
	get := func(r *ir.Value) *rootInfo {
		ri := roots[r]
		if ri == nil {
			ri = &rootInfo{size: g.rootSize[r], defined: -1, liveAfter: g.pinned[r]}
			roots[r] = ri
		}
		return ri
	}
	for j, i := range seg {
		op := g.f.Body[i]
		for _, v := range op.Operands {
			get(g.root[v]).useMask |= 1 << j
		}
		for _, r := range op.Results {
			if g.root[r] == r {
				get(r).defined = j
			}
		}
	}
	// Uses outside the segment (by any op not in it) keep a root alive.
	inSeg := map[int]bool{}
	for _, i := range seg {
		inSeg[i] = true
	}
	for i, op := range g.f.Body {
		if inSeg[i] {
			continue
		}
		for _, v := range op.Operands {
			if ri := roots[g.root[v]]; ri != nil && (ri.defined >= 0 || after[i]) {
				ri.liveAfter = true
			}
		}
	}
	predMask := make([]uint64, k)
	for j, i := range seg {
		for _, p := range g.preds[i] {
			if q, ok := pos[p]; ok {
				predMask[j] |= 1 << q
			}
		}
	}
	// Per-op effects.
	type opInfo struct {
		alloc   int64
		results []*rootInfo
		inplace []*rootInfo // operands whose buffer the result may take over
		operand []*rootInfo
	}
	ops := make([]opInfo, k)
	for j, i := range seg {
		op := g.f.Body[i]
		d := op.Def()
		oi := opInfo{alloc: g.alloc[i]}
		seen := map[*rootInfo]bool{}
		for k, v := range op.Operands {
			ri := roots[g.root[v]]
			if !seen[ri] {
				seen[ri] = true
				oi.operand = append(oi.operand, ri)
			}
			if d.MayOverwrite(k) && len(op.Results) > 0 && !g.pinned[g.root[v]] &&
				v.Type.Equal(op.Results[0].Type) && g.rootSize[g.root[v]] == op.Results[0].Type.SizeBytes() &&
				(d.InPlaceOperands == nil || !rootReadElsewhere(g, op, k)) {
				oi.inplace = append(oi.inplace, ri)
			}
		}
		for _, r := range op.Results {
			if g.root[r] == r {
				oi.results = append(oi.results, roots[r])
			}
		}
		ops[j] = oi
	}
	alive := func(ri *rootInfo, S uint64) bool {
		if ri.defined >= 0 && S&(1<<ri.defined) == 0 {
			return false
		}
		return ri.liveAfter || ri.useMask&^S != 0
	}
	base := int64(0) // the arguments and external roots never touched here
	for _, a := range g.f.Args {
		base += a.Type.SizeBytes()
	}
	type state struct {
		mem, peak int64
		prev      uint64
		op        int
	}
	memOf := func(S uint64) int64 {
		m := base
		for _, ri := range roots {
			if alive(ri, S) {
				m += ri.size
			}
		}
		return m
	}
	full := uint64(1)<<k - 1
	if k == 64 {
		full = ^uint64(0)
	}
	level := map[uint64]*state{0: {mem: memOf(0), peak: 0}}
	all := []map[uint64]*state{level}
	states := 1
	for step := 0; step < k; step++ {
		next := map[uint64]*state{}
		keys := make([]uint64, 0, len(level))
		for S := range level {
			keys = append(keys, S)
		}
		sort.Slice(keys, func(a, b int) bool { return keys[a] < keys[b] })
		for _, S := range keys {
			st := level[S]
			for j := 0; j < k; j++ {
				if S&(1<<j) != 0 || predMask[j]&^S != 0 {
					continue
				}
				oi := ops[j]
				T := S | 1<<j
				saving := int64(0)
				for _, ri := range oi.inplace {
					if ri.useMask&^T == 0 && !ri.liveAfter && len(oi.results) > 0 {
						saving = oi.results[0].size
						break
					}
				}
				peak := max(st.peak, st.mem+oi.alloc-saving)
				mem := st.mem
				for _, ri := range oi.results {
					if alive(ri, T) {
						mem += ri.size
					}
				}
				for _, ri := range oi.operand {
					if alive(ri, S) && !alive(ri, T) {
						mem -= ri.size
					}
				}
				if old, ok := next[T]; !ok || peak < old.peak {
					next[T] = &state{mem: mem, peak: peak, prev: S, op: j}
				}
			}
		}
		states += len(next)
		if states > maxStates {
			return nil
		}
		level = next
		all = append(all, level)
	}
	st, ok := level[full]
	if !ok {
		return nil
	}
	order := make([]int, k)
	S := full
	for step := k; step > 0; step-- {
		order[step-1] = seg[st.op]
		S = st.prev
		st = all[step-1][S]
	}
	return order
}

// rootReadElsewhere reports whether another operand of op than operand k
// shares operand k's root: an op that overwrites only some operands (gemm's
// C) reads the others at other indices, so it cannot run in place there.
func rootReadElsewhere(g *graph, op *ir.Op, k int) bool {
	for j, y := range op.Operands {
		if j != k && g.root[y] == g.root[op.Operands[k]] {
			return true
		}
	}
	return false
}
