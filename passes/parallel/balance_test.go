package parallel

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBalanceIsOptimal: on random weights and cut costs, balance's
// costliest run costs what brute force over every set of cuts finds.
func TestBalanceIsOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		m, n := 2+rng.IntN(9), 2+rng.IntN(3)
		if n > m {
			n = m
		}
		w, cross := make([]float64, m), make([]float64, m+1)
		for i := range w {
			w[i] = rng.Float64()
		}
		for i := range cross {
			cross[i] = rng.Float64() * rng.Float64()
		}
		worst := func(ends []int) float64 {
			out, a := 0.0, 0
			for _, b := range ends {
				c := 0.0
				for _, x := range w[a:b] {
					c += x
				}
				if a > 0 {
					c += cross[a]
				}
				if b < m {
					c += cross[b]
				}
				out, a = max(out, c), b
			}
			return out
		}
		best := -1.0
		var search func(ends []int, from int)
		search = func(ends []int, from int) {
			if len(ends) == n-1 {
				if c := worst(append(ends, m)); best < 0 || c < best {
					best = c
				}
				return
			}
			for e := from; e < m; e++ {
				search(append(ends[:len(ends):len(ends)], e), e+1)
			}
		}
		search(nil, 1)
		ends := balance(w, cross, n)
		require.Len(t, ends, n)
		require.Equal(t, m, ends[n-1])
		for i := 1; i < n; i++ {
			require.Less(t, ends[i-1], ends[i], "runs are nonempty")
		}
		require.InDelta(t, best, worst(ends), 1e-12, "trial %d: %v", trial, ends)
	}
}
