package assign_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/memreport"
	"github.com/kiln-compiler/kiln/passes"
	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestEveryAlgorithmGivesCheckedOffsets: on the bundled examples'
// training steps every algorithm's offsets pass the independent checker,
// results do not change, the arena is at least the peak's arena part, and
// the default is deterministic.
func TestEveryAlgorithmGivesCheckedOffsets(t *testing.T) {
	for _, path := range []string{"../../testdata/examples/mlp.kir", "../../testdata/examples/cnn.kir"} {
		src, err := os.ReadFile(path)
		require.NoError(t, err)
		m := passtest.Parse(t, string(src))
		pipe, err := passes.ParsePipeline("autodiff", nil)
		require.NoError(t, err)
		require.NoError(t, (&passes.Manager{}).Run(m, pipe))
		step := m.String()
		info := liveness.Analyze(m.Funcs[0])
		arenaLowerBound := info.Peak - info.ParamBytes - info.StateBytes - info.InputBytes
		var first string
		for _, algo := range []string{"best", "greedy-size", "greedy-size-lowest", "coloring", "search", "best"} {
			out := passtest.CheckPipeline(t, step, "assign{algo="+algo+"}", 0)
			f := out.Funcs[0]
			require.NoError(t, liveness.CheckOffsets(f), algo)
			arena := f.Attrs.Int("arena", -1)
			require.GreaterOrEqual(t, arena, arenaLowerBound, algo)
			require.Equal(t, arena, memreport.Build(f, nil, costmodel.Default).ArenaBytes)
			if algo == "best" {
				if first == "" {
					first = out.String()
				} else {
					require.Equal(t, first, out.String(), "best is deterministic")
				}
			}
		}
	}
}
