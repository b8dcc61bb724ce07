package planner

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestSearchPicksTheFastestPlanThatFits: over 4 devices the search weighs
// dp = 1, 2, 4 with ZeRO 0 to 3 and tp dividing what dp leaves (15 plans:
// the MLP has a block tensor parallelism splits) and pipelines of 2 and 4
// stages, 2 × 2 ranks and 2 stages of 2 tensor-parallel ranks (13 plans, 6
// of which the batch allows); with no memory limit it takes
// the fastest; with a limit between the plans' peaks it takes the fastest
// of those under it; under every peak it takes the fastest that recomputation
// brings under it; under what recomputation reaches it says which plan comes
// closest.
func TestSearchPicksTheFastestPlanThatFits(t *testing.T) {
	m := passtest.Parse(t, passtest.ReadFile("../testdata/steps/mlp_f64.kir"))
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam}")
	f := m.Funcs[0]
	before := f.String()
	best, cands, err := Search(f, 4, 0, 0, costmodel.Default)
	require.NoError(t, err)
	require.Len(t, cands, 28)
	require.Equal(t, before, f.String(), "the search leaves f alone")
	pipelines := 0
	for _, c := range cands {
		if c.Plan.PP > 1 && c.Err != nil {
			require.ErrorContains(t, c.Err, "is not divisible by") // a batch of 12 in 8 or 16 slices
			continue
		}
		require.NoError(t, c.Err)
		require.GreaterOrEqual(t, c.Seconds, cands[indexOf(cands, best)].Seconds)
		if c.Plan.PP > 1 {
			pipelines++
		}
	}
	require.Equal(t, 6, pipelines, "pp=2 with 2 and 4 microbatches, pp=4 with 4, dp=2 × pp=2 (ZeRO 0 and 2) with 2 (4 or 8 per rank do not divide 12), and tp=2 × pp=2 with 4")
	// A limit that only the smallest peaks meet.
	least, most := cands[0].Peak, cands[0].Peak
	for _, c := range cands {
		if c.Err == nil {
			least, most = min(least, c.Peak), max(most, c.Peak)
		}
	}
	limit := (least + most) / 2
	best, cands, err = Search(f, 4, limit, 0, costmodel.Default)
	require.NoError(t, err)
	chosen := cands[indexOf(cands, best)]
	require.LessOrEqual(t, chosen.Peak, limit)
	for _, c := range cands {
		if c.Fits {
			require.GreaterOrEqual(t, c.Seconds, chosen.Seconds)
		}
	}
	// Under every peak: recomputation makes some plans fit, at a cost.
	best, cands, err = Search(f, 4, least-1, 0, costmodel.Default)
	require.NoError(t, err)
	chosen = cands[indexOf(cands, best)]
	require.True(t, chosen.Remat, "%s fits by recomputing", chosen)
	for _, c := range cands {
		if c.Fits {
			require.True(t, c.Remat)
			require.GreaterOrEqual(t, c.Seconds, chosen.Seconds)
		}
	}
	// Under what recomputation reaches: nothing fits, and the search says
	// which plan came closest.
	_, _, err = Search(f, 4, 256, 0, costmodel.Default)
	require.ErrorContains(t, err, "no plan over 4 devices fits")
}

func indexOf(cands []Candidate, p parallel.Plan) int {
	for i, c := range cands {
		if c.Plan.DP == p.DP && c.Plan.TP == p.TP && c.Plan.PP == p.PP && c.Plan.Microbatches == p.Microbatches && c.Plan.Zero == p.Zero {
			return i
		}
	}
	return -1
}
