package alloc

import (
	"math/rand/v2"
	"sort"
	"time"
)

// SearchOptions bound the branch-and-bound search.
type SearchOptions struct {
	Timeout time.Duration // 0: no limit
	// Capacity > 0 asks for any solution within it (stop at the first);
	// 0 minimises the arena.
	Capacity int64
	// Initial is a known solution; the search only looks for better ones.
	Initial *Solution
	// MaxNodes > 0 bounds the nodes visited over all restarts, which makes
	// the result independent of machine speed (deterministic).
	MaxNodes int64
}

// Search is a complete branch-and-bound over canonical placements. Every
// packing can be rearranged so that each buffer rests on the buffers below
// it; the search builds such packings bottom-up on a skyline. At each step
// it takes the lowest level v and the leftmost maximal segment of time at
// that level, and branches on which buffer is the leftmost one placed at
// level v inside the segment (the columns left of it stay empty at v and
// rise to the lower of their walls), or on no buffer at all (the whole
// segment rises to the lower of its walls). A column between walls can
// only be covered by a buffer crossing a wall, so these raises lose no
// packing. The bound max over time of (skyline + unplaced buffers live
// then) prunes; zero-slack instances (capacity equal to the max-live
// bound) are pruned at the first wasted byte. Pits (pitsFeasible) prune
// placements that leave a region nothing can fill, and where a floor cell
// may waste nothing the search branches instead on the buffers that can
// cover the most constrained such cell (coverCell). It returns the best
// solution found; Optimal is set when the search finished.
func Search(p *Problem, opt SearchOptions) *Solution {
	if len(p.Buffers) == 0 {
		return &Solution{Offsets: []int64{}, Algo: "search", Optimal: true} // nothing to place: an empty arena
	}
	if opt.Initial == nil {
		opt.Initial = GreedyBestFit(p)
		if f := GreedyFirstFit(p); f.Size < opt.Initial.Size {
			opt.Initial = f
		}
	}
	s := newSearcher(p, opt)
	runAlternating([]*searcher{s, newSearcher(mirror(p), opt)})
	return s.result()
}

type searcher struct {
	p         *Problem
	opt       SearchOptions
	n         int
	cols      int
	lo, hi    []int   // compressed interval of each buffer
	size      []int64 // aligned sizes
	h         []int64 // skyline height per column
	ulive     []int64 // size of unplaced buffers live per column
	placed    []bool
	offs      []int64
	best      []int64
	bestSize  int64
	target    int64 // stop as soon as a solution of this size or less is found
	deadline  time.Time
	nodes     int64
	nodeLimit int64
	truncated bool // the current run hit its node limit
	stopped   bool
	done      bool
	order     []int
	// scratch of pitsFeasible
	pitOf, head, next []int
	reach             []bool
	inside            []int64
	cover             []int
	// The zero-slack floor cell of a pit with the fewest buffers that can
	// cover it, found by pitsFeasible (cellCount < 0: none).
	cellCol, cellA, cellB, cellCount int
	cellW                            int64
	// colRank breaks ties between equally constrained cells: left to right
	// in the first run, a fresh random order in each restart.
	colRank []int
	// bySize is the first run's candidate order (sizeOrder); the rank keys
	// of reorder are scratch.
	bySize []int
	rank   []float64
	// twins[i]: the other buffers live over exactly i's interval.
	twins       [][]int
	failedTwins [][]int
}

func newSearcher(p *Problem, opt SearchOptions) *searcher {
	n := len(p.Buffers)
	s := &searcher{p: p, opt: opt, n: n}
	// Compress time to the distinct interval bounds.
	var ts []int64
	for _, b := range p.Buffers {
		ts = append(ts, b.Lower, b.Upper)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	uniq := ts[:0]
	for i, t := range ts {
		if i == 0 || t != ts[i-1] {
			uniq = append(uniq, t)
		}
	}
	index := func(t int64) int { return sort.Search(len(uniq), func(i int) bool { return uniq[i] >= t }) }
	s.cols = max(len(uniq)-1, 0)
	s.lo, s.hi, s.size = make([]int, n), make([]int, n), make([]int64, n)
	s.h, s.ulive = make([]int64, s.cols), make([]int64, s.cols)
	s.placed, s.offs = make([]bool, n), make([]int64, n)
	for i, b := range p.Buffers {
		s.lo[i], s.hi[i], s.size[i] = index(b.Lower), index(b.Upper), p.alignedSize(i)
		if b.Upper <= b.Lower {
			s.hi[i] = s.lo[i]
		}
		for t := s.lo[i]; t < s.hi[i]; t++ {
			s.ulive[t] += s.size[i]
		}
	}
	s.bestSize = -1
	if opt.Initial != nil {
		s.best = append([]int64(nil), opt.Initial.Offsets...)
		s.bestSize = opt.Initial.Size
	}
	s.target = MaxLive(p)
	if opt.Capacity > 0 {
		s.target = opt.Capacity
	}
	if opt.Timeout > 0 {
		s.deadline = time.Now().Add(opt.Timeout)
	}
	// A fixed preference among equal candidates: larger, longer, earlier first.
	s.bySize = sizeOrder(p)
	s.order = append([]int(nil), s.bySize...)
	s.pitOf, s.head, s.next = make([]int, s.cols), make([]int, s.cols), make([]int, n)
	s.reach = make([]bool, s.cols+1)
	s.inside = make([]int64, s.cols+1)
	s.cover = make([]int, s.cols+1)
	s.colRank = make([]int, s.cols)
	for c := range s.colRank {
		s.colRank[c] = c
	}
	s.twins, s.failedTwins = make([][]int, n), make([][]int, n)
	byInterval := map[[2]int][]int{}
	for i := range n {
		if s.hi[i] > s.lo[i] {
			k := [2]int{s.lo[i], s.hi[i]}
			byInterval[k] = append(byInterval[k], i)
		}
	}
	for _, group := range byInterval {
		for _, i := range group {
			for _, j := range group {
				if i != j {
					s.twins[i] = append(s.twins[i], j)
				}
			}
		}
	}
	return s
}

// Twins are buffers over exactly the same interval: swapping two that
// lie directly on one another gives another packing of the same columns.
// When twin x failed as a node's branch (placed at level v there) and
// twin y is that node's next branch, a packing with x directly on y is a
// packing of x's branch with y directly on x: it failed already.
// failedTwins[y] lists the twins that had failed when y was placed, and
// repeatsFailedTwin prunes x on such a y. (Forbidding every order of a
// stack but one, regardless of failures, clashes with the value order
// and made satisfiable instances much slower.)
func (s *searcher) repeatsFailedTwin(x int, off int64) bool {
	for _, y := range s.twins[x] {
		if s.placed[y] && s.offs[y]+s.size[y] == off {
			for _, f := range s.failedTwins[y] {
				if f == x {
					return true
				}
			}
		}
	}
	return false
}

// noteFailed sets the twins of i among failed as failedTwins[i].
func (s *searcher) noteFailed(i int, failed []int) {
	s.failedTwins[i] = s.failedTwins[i][:0]
	for _, f := range failed {
		if s.lo[f] == s.lo[i] && s.hi[f] == s.hi[i] {
			s.failedTwins[i] = append(s.failedTwins[i], f)
		}
	}
}

// run searches with restarts: the k-th run may visit luby(k)·restartBase
// nodes and orders equal candidates afresh (reorder), which
// cuts the heavy tail of a single search; the limits grow without bound,
// so the search stays complete. A run that ends within its limit has
// explored everything: the best found is then optimal (or nothing fits).
func (s *searcher) run() { runAlternating([]*searcher{s}) }

// runAlternating runs restarts of several searchers over the same buffers
// in turn (the problem and its mirror image in time), sharing the best
// solution: the k-th restart of each may visit luby(k)·restartBase nodes.
// Alternating the direction of the sweep breaks the heavy tails of either
// one alone; the limits grow without bound, so the search stays complete.
func runAlternating(ss []*searcher) {
	for _, s := range ss {
		if s.bestSize >= 0 && s.bestSize <= s.target {
			s.done = true
			for _, t := range ss {
				t.done = true
			}
			return
		}
	}
	rngs := make([]*rand.Rand, len(ss))
	for i, s := range ss {
		rngs[i] = rand.New(rand.NewPCG(uint64(s.n), 0x616c6c6f63+uint64(i)))
	}
	spent := int64(0)
	lead := ss[0]
	for k := 1; ; k++ {
		for i, s := range ss {
			// Share the best solution found so far.
			for _, t := range ss {
				if t.bestSize >= 0 && (s.bestSize < 0 || t.bestSize < s.bestSize) {
					s.best, s.bestSize = append(s.best[:0], t.best...), t.bestSize
				}
			}
			s.nodes, s.nodeLimit, s.truncated, s.stopped = 0, luby(k)*restartBase, false, false
			if lead.opt.MaxNodes > 0 {
				if spent >= lead.opt.MaxNodes {
					return
				}
				s.nodeLimit = min(s.nodeLimit, lead.opt.MaxNodes-spent)
			}
			s.dfs(0)
			spent += s.nodes
			if s.done || s.stopped && !s.truncated || !s.truncated {
				if !s.truncated && !(s.stopped && !s.done) {
					s.done = true
				}
				if s != lead {
					lead.best, lead.bestSize, lead.done, lead.stopped = s.best, s.bestSize, s.done, s.stopped
				}
				return
			}
			s.reorder(rngs[i], k)
			rngs[i].Shuffle(len(s.colRank), func(a, b int) { s.colRank[a], s.colRank[b] = s.colRank[b], s.colRank[a] })
		}
	}
}

// reorder draws the candidate order for the restart after restart k.
// After an even k it shuffles the order completely; after an odd k it
// perturbs the size order, each buffer's rank plus a uniform draw up to
// 0.3·n, so that large buffers still tend to come first. Alternating the
// two solved more zero-slack instances than full shuffles alone (fresh
// rectangle cuts of 300/400/500 buffers, 5 s each: 32/30/31 of 32
// against 31/27/25) and brought the slowest published instance from
// 9.5 s to under 1 s.
func (s *searcher) reorder(rng *rand.Rand, k int) {
	if k%2 == 0 {
		rng.Shuffle(len(s.order), func(a, b int) { s.order[a], s.order[b] = s.order[b], s.order[a] })
		return
	}
	if s.rank == nil {
		s.rank = make([]float64, s.n)
	}
	for r, i := range s.bySize {
		s.rank[i] = float64(r) + rng.Float64()*0.3*float64(s.n)
	}
	copy(s.order, s.bySize)
	sort.SliceStable(s.order, func(a, b int) bool { return s.rank[s.order[a]] < s.rank[s.order[b]] })
}

// mirror reverses time: overlaps, hence packings, are unchanged.
func mirror(p *Problem) *Problem {
	end := int64(0)
	for _, b := range p.Buffers {
		end = max(end, b.Upper)
	}
	m := &Problem{Alignment: p.Alignment, Buffers: make([]Buffer, len(p.Buffers))}
	for i, b := range p.Buffers {
		m.Buffers[i] = Buffer{ID: b.ID, Lower: end - b.Upper, Upper: end - b.Lower, Size: b.Size}
	}
	return m
}

const restartBase = 2000

// fitCheckLimit is the largest problem whose nodes run the per-buffer fit
// test.
const fitCheckLimit = 400

// luby is the Luby restart sequence 1 1 2 1 1 2 4 1 1 2 ...
func luby(k int) int64 {
	for p := 1; ; p++ {
		if k == 1<<p-1 {
			return 1 << (p - 1)
		}
		if k < 1<<p-1 {
			return luby(k - (1<<(p-1) - 1))
		}
	}
}

func (s *searcher) result() *Solution {
	if s.best == nil || s.opt.Capacity > 0 && s.bestSize > s.opt.Capacity {
		// Optimal here means: the search finished, so nothing fits.
		return &Solution{Size: -1, Algo: "search", Optimal: s.done}
	}
	sol := finish(s.p, s.best, "search")
	sol.Optimal = s.done && s.opt.Capacity == 0
	return sol
}

// limit is the size a new solution must beat (strictly below it).
func (s *searcher) limit() int64 {
	if s.opt.Capacity > 0 {
		if s.bestSize >= 0 && s.bestSize <= s.opt.Capacity {
			return s.bestSize
		}
		return s.opt.Capacity + 1
	}
	if s.bestSize < 0 {
		return 1 << 62
	}
	return s.bestSize
}

// inf marks a column no buffer can cover any more.
const inf = int64(1) << 62

// wall is the height that bounds a segment at column t: its skyline, or
// inf outside the horizon or where no unplaced buffer lives.
func (s *searcher) wall(t int) int64 {
	if t < 0 || t >= s.cols || s.ulive[t] == 0 {
		return inf
	}
	return s.h[t]
}

func (s *searcher) dfs(depth int) {
	if s.stopped {
		return
	}
	s.nodes++
	if s.nodes > s.nodeLimit {
		s.stopped, s.truncated = true, true
		return
	}
	if s.nodes&1023 == 0 && !s.deadline.IsZero() && time.Now().After(s.deadline) {
		s.stopped = true
		return
	}
	lim := s.limit()
	if depth == s.n {
		top := int64(0)
		for i := range s.offs {
			top = max(top, s.offs[i]+s.size[i])
		}
		if top < lim {
			s.best = append(s.best[:0], s.offs...)
			s.bestSize = top
			if top <= s.target {
				s.stopped, s.done = true, true
			}
		}
		return
	}
	// Bound, and the lowest level among columns that still need buffers.
	v, a := inf, -1
	for t := 0; t < s.cols; t++ {
		if s.ulive[t] == 0 {
			continue
		}
		if s.h[t]+s.ulive[t] >= lim {
			return
		}
		if s.h[t] < v {
			v, a = s.h[t], t
		}
	}
	if a < 0 || v >= inf {
		return // an unplaced buffer lies under a closed column
	}
	if !s.pitsFeasible(lim) {
		return
	}
	if s.cellCount >= 0 {
		s.coverCell(depth, lim)
		return
	}
	// Every unplaced buffer must still fit on the skyline over its interval
	// (a strong test on tight instances, too costly per node on big ones).
	for i := range s.placed {
		if s.n > fitCheckLimit {
			break
		}
		if s.placed[i] {
			continue
		}
		p := int64(0)
		for t := s.lo[i]; t < s.hi[i]; t++ {
			p = max(p, s.h[t])
		}
		if p+s.size[i] >= lim {
			return
		}
	}
	b := a
	for b < s.cols && s.ulive[b] > 0 && s.h[b] == v {
		b++
	}
	// Candidates: unplaced buffers inside [a, b), leftmost first, larger first.
	var cands []int
	for _, i := range s.order {
		if !s.placed[i] && s.lo[i] >= a && s.hi[i] <= b && s.hi[i] > s.lo[i] && v+s.size[i] < lim {
			cands = append(cands, i)
		}
	}
	// Leftmost first; among equals, the order of s.order.
	sort.SliceStable(cands, func(x, y int) bool {
		cx, cy := cands[x], cands[y]
		if s.lo[cx] != s.lo[cy] {
			return s.lo[cx] < s.lo[cy]
		}
		return false
	})
	saved := make([]int64, b-a)
	copy(saved, s.h[a:b])
	restore := func() { copy(s.h[a:b], saved) }
	tried := -1
	var failed []int
	for _, i := range cands {
		if tried >= 0 && s.lo[i] == s.lo[tried] && s.hi[i] == s.hi[tried] && s.size[i] == s.size[tried] {
			continue // an identical buffer was just tried here
		}
		if s.repeatsFailedTwin(i, v) {
			continue
		}
		tried = i
		top := v + s.size[i]
		// Columns [a, lo) stay empty at v: they rise to their lower wall.
		if s.lo[i] > a {
			raise := min(s.wall(a-1), top)
			if raise >= lim && raise < inf {
				continue
			}
			for t := a; t < s.lo[i]; t++ {
				s.h[t] = raise
			}
		}
		s.noteFailed(i, failed)
		s.place(i, v)
		s.dfs(depth + 1)
		s.unplace(i)
		restore()
		if s.stopped {
			return
		}
		failed = append(failed, i)
		lim = s.limit()
	}
	// Nothing more at level v in this segment: it rises to its lower wall.
	raise := min(s.wall(a-1), s.wall(b))
	for t := a; t < b; t++ {
		s.h[t] = raise
	}
	s.dfs(depth)
	restore()
}

// pitsFeasible is a necessary condition on the skyline. A pit is a
// maximal run of columns [a, b) at one level w between higher walls; let
// H be the lower wall (or the limit). Walls only rise, so every byte of
// the pit's basin, its columns from w up to H, can only be covered by a
// buffer lying inside [a, b); and a column may leave at most its slack
// (what the limit leaves above its skyline and the unplaced buffers live
// there) uncovered. Two tests follow:
//   - basin: at every column of the pit, the unplaced buffers inside the
//     pit must add up to at least H - w minus the column's slack;
//   - floor: the level w itself can only be covered by buffers placed at
//     offset w inside the pit, so its zero-slack columns must be covered
//     by disjoint intervals of such buffers (a reachability sweep).
//
// On zero-slack instances, where every column has zero slack, a placement
// that leaves a pit nothing can fill is pruned at once, not when the pit
// becomes the lowest.
func (s *searcher) pitsFeasible(lim int64) bool {
	type pit struct {
		a, b  int
		w, to int64
	}
	var pits []pit
	s.cellCount = -1
	for t := 0; t < s.cols; {
		s.pitOf[t] = -1
		if s.ulive[t] == 0 {
			t++
			continue
		}
		w := s.h[t]
		u := t
		for u < s.cols && s.ulive[u] > 0 && s.h[u] == w {
			s.pitOf[u] = -1
			u++
		}
		if l, r := s.wall(t-1), s.wall(u); l > w && r > w {
			for c := t; c < u; c++ {
				s.pitOf[c] = len(pits)
				s.head[c] = -1
				s.inside[c] = 0
				s.cover[c] = 0
			}
			s.inside[u] = 0
			s.cover[u] = 0
			pits = append(pits, pit{t, u, w, min(l, r, lim-1)})
		}
		t = u
	}
	if len(pits) == 0 {
		return true
	}
	for i := range s.placed {
		if s.placed[i] || s.hi[i] <= s.lo[i] {
			continue
		}
		k := s.pitOf[s.lo[i]]
		if k < 0 || s.hi[i] > pits[k].b {
			continue
		}
		s.inside[s.lo[i]] += s.size[i]
		s.inside[s.hi[i]] -= s.size[i]
		if pits[k].w+s.size[i] < lim {
			s.next[i] = s.head[s.lo[i]]
			s.head[s.lo[i]] = i
			s.cover[s.lo[i]]++
			s.cover[s.hi[i]]--
		}
	}
	for _, p := range pits {
		// Basin; and the zero-slack floor cell with the fewest covers.
		sum, covers := int64(0), 0
		for c := p.a; c < p.b; c++ {
			sum += s.inside[c]
			covers += s.cover[c]
			slack := lim - 1 - p.w - s.ulive[c]
			if sum < p.to-p.w-slack {
				return false
			}
			if slack == 0 && (s.cellCount < 0 || covers < s.cellCount || covers == s.cellCount && (p.w < s.cellW || p.w == s.cellW && s.colRank[c] < s.colRank[s.cellCol])) {
				s.cellCol, s.cellA, s.cellB, s.cellCount, s.cellW = c, p.a, p.b, covers, p.w
			}
		}
		// Floor.
		for c := p.a; c <= p.b; c++ {
			s.reach[c] = false
		}
		s.reach[p.a] = true
		for c := p.a; c < p.b; c++ {
			if !s.reach[c] {
				continue
			}
			if p.w+s.ulive[c] < lim-1 {
				s.reach[c+1] = true // slack: this column may stay empty at w
			}
			for i := s.head[c]; i >= 0; i = s.next[i] {
				s.reach[s.hi[i]] = true
			}
		}
		if !s.reach[p.b] {
			return false
		}
	}
	return true
}

// coverCell branches on the buffer that covers the floor cell pitsFeasible
// chose: a zero-slack column c of a pit [a, b) at level w must be covered
// at w by a buffer placed there, inside the pit. Trying every such buffer
// is complete; choosing the cell with the fewest of them (as exact-cover
// solvers choose their column) keeps the tree narrow.
func (s *searcher) coverCell(depth int, lim int64) {
	c, a, b, w := s.cellCol, s.cellA, s.cellB, s.cellW
	var cands []int
	for _, i := range s.order {
		if s.placed[i] || s.lo[i] < a || s.lo[i] > c || s.hi[i] <= c || s.hi[i] > b || w+s.size[i] >= lim || s.repeatsFailedTwin(i, w) {
			continue
		}
		dup := false
		for _, j := range cands {
			if s.lo[j] == s.lo[i] && s.hi[j] == s.hi[i] && s.size[j] == s.size[i] {
				dup = true // an identical buffer is tried already
				break
			}
		}
		if !dup {
			cands = append(cands, i)
		}
	}
	// Prefer a buffer whose top meets a neighbouring wall: it leaves a
	// flat skyline rather than a new pit.
	fits := func(i int) int {
		top, n := w+s.size[i], 0
		if s.lo[i] > 0 && s.h[s.lo[i]-1] == top {
			n++
		}
		if s.hi[i] < s.cols && s.h[s.hi[i]] == top {
			n++
		}
		return n
	}
	sort.SliceStable(cands, func(x, y int) bool { return fits(cands[x]) > fits(cands[y]) })
	var failed []int
	for _, i := range cands {
		if w+s.size[i] >= lim {
			continue // a better solution found meanwhile lowered the limit
		}
		s.noteFailed(i, failed)
		s.place(i, w)
		s.dfs(depth + 1)
		s.unplace(i)
		for t := s.lo[i]; t < s.hi[i]; t++ {
			s.h[t] = w
		}
		if s.stopped {
			return
		}
		failed = append(failed, i)
		lim = s.limit()
	}
}

// place puts buffer i at offset off on the skyline.
func (s *searcher) place(i int, off int64) {
	s.placed[i] = true
	s.offs[i] = off
	for t := s.lo[i]; t < s.hi[i]; t++ {
		s.h[t] = off + s.size[i]
		s.ulive[t] -= s.size[i]
	}
}

// unplace takes buffer i back; the caller restores the skyline.
func (s *searcher) unplace(i int) {
	for t := s.lo[i]; t < s.hi[i]; t++ {
		s.ulive[t] += s.size[i]
	}
	s.placed[i] = false
}
