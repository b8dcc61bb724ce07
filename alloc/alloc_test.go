package alloc

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func randomProblem(r *rand.Rand, n int, horizon int64) *Problem {
	p := &Problem{}
	for i := 0; i < n; i++ {
		lo := r.Int64N(horizon)
		p.Buffers = append(p.Buffers, Buffer{ID: i, Lower: lo, Upper: lo + 1 + r.Int64N(horizon-lo), Size: 1 + r.Int64N(10)})
	}
	return p
}

// rectangles cuts a capacity x horizon rectangle into n random pieces:
// a zero-slack instance whose optimum equals its max-live bound.
func rectangles(r *rand.Rand, n int, capacity, horizon int64) *Problem {
	type rect struct{ x0, x1, y0, y1 int64 }
	rs := []rect{{0, horizon, 0, capacity}}
	for len(rs) < n {
		k := r.IntN(len(rs))
		c := rs[k]
		if c.x1-c.x0 < 2 && c.y1-c.y0 < 2 {
			continue
		}
		if c.x1-c.x0 >= 2 && (c.y1-c.y0 < 2 || r.IntN(2) == 0) {
			cut := c.x0 + 1 + r.Int64N(c.x1-c.x0-1)
			rs[k] = rect{c.x0, cut, c.y0, c.y1}
			rs = append(rs, rect{cut, c.x1, c.y0, c.y1})
		} else {
			cut := c.y0 + 1 + r.Int64N(c.y1-c.y0-1)
			rs[k] = rect{c.x0, c.x1, c.y0, cut}
			rs = append(rs, rect{c.x0, c.x1, cut, c.y1})
		}
	}
	r.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	p := &Problem{}
	for i, c := range rs {
		p.Buffers = append(p.Buffers, Buffer{ID: i, Lower: c.x0, Upper: c.x1, Size: c.y1 - c.y0})
	}
	return p
}

// bruteForce tries every placement order with skyline placement, which
// reaches every gravity-packed (hence an optimal) solution.
func bruteForce(p *Problem) int64 {
	n := len(p.Buffers)
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	best := int64(1 << 62)
	var rec func(k int)
	rec = func(k int) {
		if k == n {
			offs := make([]int64, n)
			top := int64(0)
			for a := 0; a < n; a++ {
				i := perm[a]
				o := int64(0)
				for b := 0; b < a; b++ {
					j := perm[b]
					if overlapsInTime(p.Buffers[i], p.Buffers[j]) {
						o = max(o, offs[j]+p.Buffers[j].Size)
					}
				}
				offs[i] = o
				top = max(top, o+p.Buffers[i].Size)
			}
			best = min(best, top)
			return
		}
		for i := k; i < n; i++ {
			perm[k], perm[i] = perm[i], perm[k]
			rec(k + 1)
			perm[k], perm[i] = perm[i], perm[k]
		}
	}
	rec(0)
	return best
}

func TestCheckerCatchesPlantedErrors(t *testing.T) {
	p := &Problem{Buffers: []Buffer{{ID: 0, Lower: 0, Upper: 5, Size: 10}, {ID: 1, Lower: 4, Upper: 8, Size: 10}, {ID: 2, Lower: 5, Upper: 9, Size: 10}}, Alignment: 2}
	ok := &Solution{Offsets: []int64{0, 10, 0}, Size: 20}
	require.NoError(t, Check(p, ok, 0))
	require.ErrorContains(t, Check(p, &Solution{Offsets: []int64{0, 8, 0}, Size: 20}, 0), "buffers 1 [8, 18) and 0 [0, 10) are live together and overlap")
	require.ErrorContains(t, Check(p, &Solution{Offsets: []int64{0, 10, 0}, Size: 19}, 0), "exceeds the arena")
	require.ErrorContains(t, Check(p, &Solution{Offsets: []int64{0, 11, 0}, Size: 22}, 0), "not a multiple of 2")
	require.ErrorContains(t, Check(p, &Solution{Offsets: []int64{-2, 10, 0}, Size: 20}, 0), "negative offset")
	require.ErrorContains(t, Check(p, ok, 15), "exceeds the capacity 15")
	require.ErrorContains(t, Check(p, &Solution{Offsets: []int64{0}, Size: 20}, 0), "1 offsets for 3 buffers")
	// Buffers 0 and 2 touch at t=5 but do not overlap: [0,5) and [5,9).
	require.NoError(t, Check(p, &Solution{Offsets: []int64{0, 10, 0}, Size: 20}, 20))
}

func TestEveryAlgorithmPassesTheChecker(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		p := randomProblem(r, 1+r.IntN(30), 20)
		p.Alignment = []int64{1, 4, 64}[r.IntN(3)]
		lb := MaxLive(p)
		g := GreedyBestFit(p)
		for _, s := range []*Solution{g, GreedyFirstFit(p), Coloring(p), Search(p, SearchOptions{Timeout: 50 * time.Millisecond}), Best(p, 20*time.Millisecond)} {
			require.NoError(t, Check(p, s, 0), s.Algo)
			require.GreaterOrEqual(t, s.Size, lb, s.Algo)
		}
		sr := Search(p, SearchOptions{Timeout: 50 * time.Millisecond, Initial: g})
		require.LessOrEqual(t, sr.Size, g.Size, "search is never worse than greedy")
	}
}

func TestSearchMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 150; iter++ {
		p := randomProblem(r, 1+r.IntN(7), 8)
		want := bruteForce(p)
		s := Search(p, SearchOptions{})
		require.NoError(t, Check(p, s, 0))
		require.True(t, s.Optimal)
		require.Equal(t, want, s.Size, "problem %+v", p.Buffers)
	}
}

// TestSearchWithTwins: buffers over the same interval (twins) are what
// the search's twin pruning works on; with few distinct intervals every
// problem is full of them. Small ones match brute force; rectangle cuts
// (many twins) are packed into their max-live bound and proven optimal.
func TestSearchWithTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 300; iter++ {
		n := 2 + r.IntN(6)
		spans := [][2]int64{{0, 3}, {1, 3}, {0, 2}, {2, 4}}[:1+r.IntN(4)]
		p := &Problem{}
		for i := range n {
			sp := spans[r.IntN(len(spans))]
			p.Buffers = append(p.Buffers, Buffer{ID: i, Lower: sp[0], Upper: sp[1], Size: 1 + r.Int64N(6)})
		}
		s := Search(p, SearchOptions{})
		require.NoError(t, Check(p, s, 0))
		require.True(t, s.Optimal)
		require.Equal(t, bruteForce(p), s.Size, "problem %+v", p.Buffers)
	}
	for n := 4; n <= 40; n++ {
		for seed := uint64(0); seed < 20; seed++ {
			p := rectangles(rand.New(rand.NewPCG(seed, uint64(n))), n, 20, 12)
			s := Search(p, SearchOptions{})
			require.NoError(t, Check(p, s, 20), "%d buffers, seed %d", n, seed)
			require.True(t, s.Optimal)
		}
	}
}

func TestCapacityMode(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	p := rectangles(r, 40, 100, 60)
	s := Search(p, SearchOptions{Capacity: 100, Timeout: 10 * time.Second})
	require.NoError(t, Check(p, s, 100))
	// An impossible capacity is reported as no solution.
	s = Search(p, SearchOptions{Capacity: 99, Timeout: 10 * time.Second})
	require.Equal(t, int64(-1), s.Size)
}

// TestZeroSlackInstances: rectangle cuts of 200 and 300 buffers pack
// exactly into their max-live bound, which greedy does not reach.
func TestZeroSlackInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	for _, n := range []int{200, 300} {
		for iter := uint64(0); iter < 4; iter++ {
			p := rectangles(rand.New(rand.NewPCG(iter, uint64(n))), n, 1000, 400)
			lb := MaxLive(p)
			require.Equal(t, int64(1000), lb)
			s := Search(p, SearchOptions{Capacity: lb, Timeout: 30 * time.Second})
			require.NoError(t, Check(p, s, lb), "%d buffers, instance %d: no packing within %d found in time", n, iter, lb)
		}
	}
}

// BenchmarkZeroSlack reports how long the search takes to pack zero-slack
// instances of 200 to 500 buffers into their max-live bound (48
// instances each, at most 10 s per instance).
func BenchmarkZeroSlack(b *testing.B) {
	const instances = 48
	for _, n := range []int{200, 300, 400, 500} {
		solved := 0
		var total, worst time.Duration
		for seed := uint64(0); seed < instances; seed++ {
			p := rectangles(rand.New(rand.NewPCG(seed, uint64(n))), n, 1000, 400)
			start := time.Now()
			s := Search(p, SearchOptions{Capacity: 1000, Timeout: 10 * time.Second})
			d := time.Since(start)
			total += d
			if s.Size > 0 {
				solved++
				worst = max(worst, d)
			}
		}
		b.Logf("%d buffers: %d/%d solved within capacity, %.2fs total, slowest solved %.2fs", n, solved, instances, total.Seconds(), worst.Seconds())
	}
}

// TestTimeOrderedIsValid: the time-ordered allocator's solutions pass the
// checker on random problems, and never need less than the max-live bound.
func TestTimeOrderedIsValid(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for k := 0; k < 200; k++ {
		p := &Problem{Alignment: int64(1 + rng.IntN(3)*32)}
		for i := 0; i < 1+rng.IntN(60); i++ {
			lo := int64(rng.IntN(40))
			p.Buffers = append(p.Buffers, Buffer{ID: i, Lower: lo, Upper: lo + int64(rng.IntN(15)), Size: int64(rng.IntN(300))})
		}
		s := TimeOrdered(p)
		require.NoError(t, Check(p, s, 0))
		require.GreaterOrEqual(t, s.Size, MaxLive(p))
	}
}
