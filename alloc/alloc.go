// Package alloc solves static memory allocation: given buffers with a
// size and a live interval [Lower, Upper), give each an offset so that no
// two buffers live at the same time overlap, using as little total memory
// as possible (or fitting a given capacity). It holds the greedy
// best-fit and first-fit heuristics, interference-graph colouring, and a
// complete branch-and-bound search; Check verifies any solution
// independently of how it was found.
package alloc

import (
	"fmt"
	"sort"
	"time"

	"github.com/kiln-compiler/kiln/interval"
)

// Buffer is one allocation request, live on [Lower, Upper).
type Buffer struct {
	ID           int
	Lower, Upper int64
	Size         int64
}

// Problem is a set of buffers and an alignment for offsets (and sizes).
type Problem struct {
	Buffers   []Buffer
	Alignment int64 // offsets are multiples of it; 0 or 1 means none
}

// Solution gives each buffer (by index in Problem.Buffers) an offset.
type Solution struct {
	Offsets []int64
	Size    int64 // the arena: max over buffers of offset + aligned size
	Optimal bool  // proven minimal (search only)
	Algo    string
}

func (p *Problem) align() int64 {
	if p.Alignment <= 1 {
		return 1
	}
	return p.Alignment
}

// alignedSize rounds a buffer size up to the alignment.
func (p *Problem) alignedSize(i int) int64 {
	a := p.align()
	return (p.Buffers[i].Size + a - 1) / a * a
}

func overlapsInTime(a, b Buffer) bool { return a.Lower < b.Upper && b.Lower < a.Upper }

// Check verifies a solution: every buffer placed at a non-negative,
// aligned offset, no two buffers that live at the same time share a byte,
// and the arena size covers every buffer. capacity > 0 also bounds it.
func Check(p *Problem, s *Solution, capacity int64) error {
	if len(s.Offsets) != len(p.Buffers) {
		return fmt.Errorf("%d offsets for %d buffers", len(s.Offsets), len(p.Buffers))
	}
	a := p.align()
	type ev struct {
		t     int64
		start bool
		i     int
	}
	var evs []ev
	for i, b := range p.Buffers {
		o := s.Offsets[i]
		if o < 0 {
			return fmt.Errorf("buffer %d has negative offset %d", b.ID, o)
		}
		if o%a != 0 {
			return fmt.Errorf("buffer %d offset %d is not a multiple of %d", b.ID, o, a)
		}
		if o+b.Size > s.Size {
			return fmt.Errorf("buffer %d [%d, %d) exceeds the arena of %d bytes", b.ID, o, o+b.Size, s.Size)
		}
		if capacity > 0 && o+b.Size > capacity {
			return fmt.Errorf("buffer %d [%d, %d) exceeds the capacity %d", b.ID, o, o+b.Size, capacity)
		}
		if b.Upper < b.Lower || b.Size < 0 {
			return fmt.Errorf("buffer %d has an invalid interval or size", b.ID)
		}
		if b.Size > 0 && b.Upper > b.Lower {
			evs = append(evs, ev{b.Lower, true, i}, ev{b.Upper, false, i})
		}
	}
	// Sweep over time; at each start, compare with the buffers live then.
	sort.Slice(evs, func(x, y int) bool {
		if evs[x].t != evs[y].t {
			return evs[x].t < evs[y].t
		}
		return !evs[x].start && evs[y].start // ends before starts at the same time
	})
	// The buffers live at one time are disjoint so far, so a new one
	// overlaps one of them exactly when it overlaps its neighbour.
	live := interval.NewSet()
	for _, e := range evs {
		b, o := p.Buffers[e.i], s.Offsets[e.i]
		if !e.start {
			live.Delete(o)
			continue
		}
		if c, ok := live.Overlap(o, o+b.Size); ok {
			return fmt.Errorf("buffers %d [%d, %d) and %d [%d, %d) are live together and overlap", b.ID, o, o+b.Size, p.Buffers[c.ID].ID, c.Lo, c.Hi)
		}
		live.Insert(interval.Span{Lo: o, Hi: o + b.Size, ID: e.i})
	}
	return nil
}

// MaxLive is the largest total (aligned) size of buffers live at one time:
// a lower bound for any solution.
func MaxLive(p *Problem) int64 {
	type ev struct {
		t int64
		d int64
	}
	var evs []ev
	for i, b := range p.Buffers {
		if b.Upper > b.Lower {
			s := p.alignedSize(i)
			evs = append(evs, ev{b.Lower, s}, ev{b.Upper, -s})
		}
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].t != evs[j].t {
			return evs[i].t < evs[j].t
		}
		return evs[i].d < evs[j].d
	})
	cur, best := int64(0), int64(0)
	for _, e := range evs {
		cur += e.d
		best = max(best, cur)
	}
	return best
}

func finish(p *Problem, offs []int64, algo string) *Solution {
	s := &Solution{Offsets: offs, Algo: algo}
	for i, b := range p.Buffers {
		if b.Upper > b.Lower || b.Size > 0 {
			s.Size = max(s.Size, offs[i]+p.alignedSize(i))
		}
	}
	return s
}

// sizeOrder sorts buffer indices by decreasing size, then longer lifetime,
// then earlier start, then id (deterministic).
func sizeOrder(p *Problem) []int {
	idx := make([]int, len(p.Buffers))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(x, y int) bool {
		a, b := p.Buffers[idx[x]], p.Buffers[idx[y]]
		if a.Size != b.Size {
			return a.Size > b.Size
		}
		if la, lb := a.Upper-a.Lower, b.Upper-b.Lower; la != lb {
			return la > lb
		}
		if a.Lower != b.Lower {
			return a.Lower < b.Lower
		}
		return a.ID < b.ID
	})
	return idx
}

// greedy places buffers in decreasing size; each goes into a gap among the
// already placed buffers that overlap it in time: the smallest gap that fits
// (best fit, XLA's GlobalDecreasingSizeBestFit) or the lowest one (first
// fit, TFLite's greedy by size). Its work grows with the buffers live
// together (quadratically in the worst case): past lim it gives up and
// returns nil.
func greedy(p *Problem, bestFit bool, lim limit) *Solution {
	a := p.align()
	offs := make([]int64, len(p.Buffers))
	var placed []int
	type span struct{ lo, hi int64 }
	for _, i := range sizeOrder(p) {
		if lim.spend(int64(len(placed))) {
			return nil
		}
		b := p.Buffers[i]
		size := p.alignedSize(i)
		var busy []span
		for _, j := range placed {
			if overlapsInTime(b, p.Buffers[j]) {
				busy = append(busy, span{offs[j], offs[j] + p.alignedSize(j)})
			}
		}
		if lim.spend(int64(len(busy)) * 8) {
			return nil
		}
		sort.Slice(busy, func(x, y int) bool { return busy[x].lo < busy[y].lo })
		best, bestGap := int64(-1), int64(-1)
		cursor := int64(0)
		for _, s := range busy {
			if gap := s.lo - cursor; gap >= size {
				if !bestFit {
					best = cursor
					break
				}
				if bestGap < 0 || gap < bestGap {
					best, bestGap = cursor, gap
				}
			}
			cursor = max(cursor, (s.hi+a-1)/a*a)
		}
		if best < 0 {
			best = cursor
		}
		offs[i] = best
		placed = append(placed, i)
	}
	name := "greedy-size-lowest"
	if bestFit {
		name = "greedy-size"
	}
	return finish(p, offs, name)
}

// limit bounds the work of a heuristic: a count of steps (deterministic)
// and a wall-clock deadline (zero: none), checked every so often.
type limit struct {
	work     *int64
	budget   int64
	deadline time.Time
}

// greedyWork is the work BestDeterministic lets the quadratic heuristics
// do (about a second): enough for the zoo's full-size steps, not for a
// 100,000-op step, which gets TimeOrdered.
const greedyWork = 400_000_000

func newLimit(budget int64, deadline time.Time) limit {
	return limit{work: new(int64), budget: budget, deadline: deadline}
}

// spend records n steps and reports whether the limit is passed.
func (l limit) spend(n int64) bool {
	before := *l.work
	*l.work += n
	if l.budget > 0 && *l.work > l.budget {
		return true
	}
	// The clock is read every 2^20 steps.
	return !l.deadline.IsZero() && before>>20 != *l.work>>20 && time.Now().After(l.deadline)
}

// orTimeOrdered returns s, or TimeOrdered's solution named after the
// heuristic that ran out of time.
func orTimeOrdered(p *Problem, s *Solution, what string) *Solution {
	if s != nil {
		return s
	}
	s = TimeOrdered(p)
	s.Algo = "time-order (" + what + " ran out of time)"
	return s
}

// GreedyBestFit is XLA's GlobalDecreasingSizeBestFit.
func GreedyBestFit(p *Problem) *Solution { return greedy(p, true, newLimit(0, time.Time{})) }

// GreedyFirstFit is TFLite's greedy by size (lowest offset that fits).
func GreedyFirstFit(p *Problem) *Solution { return greedy(p, false, newLimit(0, time.Time{})) }

// GreedyWithin runs a greedy heuristic (bestFit: best fit, else first
// fit) until deadline, and falls back to TimeOrdered when it passes.
func GreedyWithin(p *Problem, bestFit bool, deadline time.Time) *Solution {
	name := "greedy-size-lowest"
	if bestFit {
		name = "greedy-size"
	}
	return orTimeOrdered(p, greedy(p, bestFit, newLimit(0, deadline)), name)
}

// Coloring groups buffers into shared pools (TVM-style): buffers are
// taken in decreasing size and join the first pool none of whose members
// they interfere with; each pool is as large as its largest member and
// pools are laid out one after another.
func Coloring(p *Problem) *Solution { return coloring(p, newLimit(0, time.Time{})) }

// ColoringWithin runs Coloring until deadline, and falls back to
// TimeOrdered when it passes.
func ColoringWithin(p *Problem, deadline time.Time) *Solution {
	return orTimeOrdered(p, coloring(p, newLimit(0, deadline)), "coloring")
}

func coloring(p *Problem, lim limit) *Solution {
	var pools [][]int
	var poolSize []int64
	color := make([]int, len(p.Buffers))
	for _, i := range sizeOrder(p) {
		chosen := -1
		for c, members := range pools {
			if lim.spend(int64(len(members))) {
				return nil
			}
			ok := true
			for _, j := range members {
				if overlapsInTime(p.Buffers[i], p.Buffers[j]) {
					ok = false
					break
				}
			}
			if ok {
				chosen = c
				break
			}
		}
		if chosen < 0 {
			pools = append(pools, nil)
			poolSize = append(poolSize, 0)
			chosen = len(pools) - 1
		}
		pools[chosen] = append(pools[chosen], i)
		poolSize[chosen] = max(poolSize[chosen], p.alignedSize(i))
		color[i] = chosen
	}
	base := make([]int64, len(pools))
	for c := 1; c < len(pools); c++ {
		base[c] = base[c-1] + poolSize[c-1]
	}
	offs := make([]int64, len(p.Buffers))
	for i := range offs {
		offs[i] = base[color[i]]
	}
	return finish(p, offs, "coloring")
}

// BestNodes is the search budget of BestDeterministic, in search nodes.
const BestNodes = 200000

// BestDeterministic runs the greedy heuristics, then the search within a
// fixed node budget, and returns the smallest solution; the same problem
// always gives the same solution.
func BestDeterministic(p *Problem) *Solution {
	lim := newLimit(greedyWork, time.Time{})
	g := greedy(p, true, lim)
	if g == nil {
		// Too large for the greedy heuristics is too large for the search.
		return orTimeOrdered(p, nil, "greedy-size")
	}
	best := g
	if s := greedy(p, false, lim); s != nil && s.Size < best.Size {
		best = s
	}
	nodes := int64(BestNodes)
	if len(p.Buffers) > 1000 {
		nodes = BestNodes * 1000 / int64(len(p.Buffers)) // each node costs more on big problems
	}
	if s := Search(p, SearchOptions{MaxNodes: nodes, Initial: best}); s.Size > 0 && (s.Size < best.Size || s.Optimal) {
		best = s
	}
	return best
}

// Best runs the greedy heuristics, then the search within budget (started
// from the best greedy solution), and returns the smallest solution.
func Best(p *Problem, budget time.Duration) *Solution {
	var deadline time.Time
	if budget > 0 {
		deadline = time.Now().Add(budget)
	}
	lim := newLimit(0, deadline)
	best := orTimeOrdered(p, greedy(p, true, lim), "greedy-size")
	if s := greedy(p, false, lim); s != nil && s.Size < best.Size {
		best = s
	}
	if budget > 0 && time.Until(deadline) > 0 {
		if s := Search(p, SearchOptions{Timeout: time.Until(deadline), Initial: best}); s.Size <= best.Size {
			if s.Size < best.Size || s.Optimal {
				best = s
			}
		}
	}
	return best
}

// DefaultAlignment is the alignment of arena offsets when none is asked
// for (64 bytes: a cache line, and AVX-512's widest load).
const DefaultAlignment = 64

// WorkspaceAlignment is the alignment of a launch plan's workspace (after
// the arena) and of each kernel's temporary in it.
const WorkspaceAlignment = 256
