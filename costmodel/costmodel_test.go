package costmodel

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCollectiveSeconds: the ring formulas at p = 4 for 1 MB, against
// the alpha-beta terms written out.
func TestCollectiveSeconds(t *testing.T) {
	d := Device{CommBW: 1e9, CommLatency: 1e-5}
	n := int64(1_000_000)
	require.InDelta(t, 6*1e-5+2*0.75*1e-3, d.CollectiveSeconds("all_reduce", n, 4), 1e-12)
	require.InDelta(t, 3*1e-5+0.75*1e-3, d.CollectiveSeconds("reduce_scatter", n, 4), 1e-12)
	require.InDelta(t, 3*1e-5+3*1e-3, d.CollectiveSeconds("all_gather", n, 4), 1e-12)
	require.InDelta(t, 3*1e-5+1e-3, d.CollectiveSeconds("broadcast", n, 4), 1e-12)
	require.Zero(t, d.CollectiveSeconds("all_reduce", n, 1))
	// An all_reduce costs a reduce_scatter and an all_gather of its part.
	require.InDelta(t, d.CollectiveSeconds("reduce_scatter", n, 4)+d.CollectiveSeconds("all_gather", n/4, 4), d.CollectiveSeconds("all_reduce", n, 4), 1e-12)
}
