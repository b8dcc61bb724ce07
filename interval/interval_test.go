package interval

import (
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTreeAgainstSortedSlice: random inserts and deletes, checked after
// each step against a sorted slice.
func TestTreeAgainstSortedSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tr := NewTree(func(a, b int) bool { return a < b })
	var ref []int
	for step := 0; step < 20000; step++ {
		x := rng.IntN(500)
		i := sort.SearchInts(ref, x)
		if rng.IntN(3) > 0 {
			if i == len(ref) || ref[i] != x {
				tr.Insert(x)
				ref = append(ref[:i], append([]int{x}, ref[i:]...)...)
			}
		} else {
			ok := tr.Delete(x)
			require.Equal(t, i < len(ref) && ref[i] == x, ok)
			if ok {
				ref = append(ref[:i], ref[i+1:]...)
			}
		}
		require.Equal(t, len(ref), tr.Len())
		q := rng.IntN(520) - 10
		j := sort.SearchInts(ref, q)
		c, ok := tr.Ceil(q)
		require.Equal(t, j < len(ref), ok)
		if ok {
			require.Equal(t, ref[j], c)
		}
		b, ok := tr.Below(q)
		require.Equal(t, j > 0, ok)
		if ok {
			require.Equal(t, ref[j-1], b)
		}
	}
}

func TestSetOverlap(t *testing.T) {
	s := NewSet()
	s.Insert(Span{0, 10, 1})
	s.Insert(Span{20, 30, 2})
	for _, c := range []struct {
		lo, hi int64
		id     int
	}{{10, 20, 0}, {5, 6, 1}, {9, 21, 2}, {25, 40, 2}, {30, 40, 0}, {-5, 0, 0}, {-5, 1, 1}, {3, 3, 0}} {
		sp, ok := s.Overlap(c.lo, c.hi)
		require.Equal(t, c.id != 0, ok, "[%d,%d)", c.lo, c.hi)
		if ok {
			require.Equal(t, c.id, sp.ID)
		}
	}
	require.True(t, s.Delete(0))
	_, ok := s.Overlap(5, 6)
	require.False(t, ok)
}
