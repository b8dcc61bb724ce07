package memreport

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

func TestTimelineIsChromeTraceJSON(t *testing.T) {
	m, err := parser.Parse("t.kir", `func @f(%x: f32[16]) -> (f32[16]) {
  %a = exp(%x) : f32[16]
  %b = neg(%x) : f32[16]
  %c = add(%a, %b) : f32[16]
  %d = sqrt(%c) : f32[16]
  return %d
}
`)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	rep := Build(m.Funcs[0], nil)
	var b bytes.Buffer
	require.NoError(t, rep.WriteTimeline(&b))
	var trace struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   int64          `json:"ts"`
			Dur  int64          `json:"dur"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b.Bytes(), &trace))
	counters, slices := 0, map[string]int64{}
	for _, e := range trace.TraceEvents {
		switch e.Ph {
		case "C":
			counters++
			require.Equal(t, float64(rep.info.Live[e.Ts]), e.Args["bytes"])
		case "X":
			slices[e.Name] = e.Dur
		}
	}
	require.Equal(t, 4, counters, "one counter per op")
	// c is written in place over a (which dies there) and d over c: one
	// buffer for ops 0-3; b lives from op 1 to op 2.
	require.Equal(t, map[string]int64{"%a": 4, "%b": 2}, slices)
	require.Equal(t, int64(64*3), rep.PeakBytes, "x, a and b at op 2")
}
