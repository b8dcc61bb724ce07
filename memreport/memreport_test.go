package memreport

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/costmodel"
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
	rep := Build(m.Funcs[0], nil, costmodel.Default)
	var b bytes.Buffer
	require.NoError(t, rep.WriteTimeline(&b))
	var trace struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b.Bytes(), &trace))
	var counters []float64
	opStart := map[int]float64{}
	spans := map[string][2]float64{} // buffer -> first op, last op
	tracks := map[int]string{}
	prevEnd := 0.0
	for _, e := range trace.TraceEvents {
		switch {
		case e.Ph == "M" && e.Name == "thread_name":
			tracks[e.Tid] = e.Args["name"].(string)
		case e.Ph == "C":
			counters = append(counters, e.Args["bytes"].(float64))
		case e.Ph == "X" && e.Tid == 0:
			// Ops follow each other in simulated microseconds.
			require.InDelta(t, prevEnd, e.Ts, 1e-9)
			require.Positive(t, e.Dur)
			prevEnd = e.Ts + e.Dur
			opStart[int(e.Args["op"].(float64))] = e.Ts
		case e.Ph == "X":
			spans[e.Name] = [2]float64{e.Args["first_op"].(float64), e.Args["last_op"].(float64)}
			require.Equal(t, opStart[int(e.Args["first_op"].(float64))], e.Ts, "a buffer starts with its first op")
		}
	}
	require.Len(t, counters, 4, "one counter per op")
	for i, c := range counters {
		require.Equal(t, float64(rep.info.Live[i]), c)
	}
	require.Equal(t, "ops", tracks[0])
	require.Equal(t, "buffers 1", tracks[1])
	// c is written in place over a (which dies there) and d over c: one
	// buffer for ops 0-3; b lives from op 1 to op 2.
	require.Equal(t, map[string][2]float64{"%a": {0, 3}, "%b": {1, 2}}, spans)
	require.Equal(t, int64(64*3), rep.PeakBytes, "x, a and b at op 2")
}

// TestCategories: in a training step the parameters, the forward values
// the backward reads (activations), the backward's values (gradients) and
// forward values that die early (temporaries) each get their category.
func TestCategories(t *testing.T) {
	m, err := parser.Parse("step.kir", `func @f(%x: f32[4,8], %w: f32[8,8] {param}) -> (loss: f32[] {role = "loss"}, grad.w: f32[8,8] {param = "w", role = "grad"}) {
  %t = matmul(%x, %w) : f32[4,8]
  %u = matmul(%t, %w) : f32[4,8]
  %h = matmul(%u, %w) : f32[4,8]
  %a = tanh(%h) : f32[4,8]
  %loss = reduce_sum(%a) : f32[]
  %seed = constant() {role = "loss_seed", value = dense<f32[]: 1.0>} : f32[]
  %g = expand(%seed) {shape = [4, 8]} : f32[4,8]
  %gh = tanh_grad(%g, %a) : f32[4,8]
  %gw = gemm(%u, %gh) {trans_a = true} : f32[8,8]
  return %loss, %gw
}
`)
	require.NoError(t, err)
	rep := Build(m.Funcs[0], nil, costmodel.Default)
	got := map[string]string{}
	for b, c := range categorize(rep.info) {
		got[b.Root().Name] = categories[c].name
	}
	require.Equal(t, "parameters", got["w"])
	require.Equal(t, "inputs", got["x"])
	require.Equal(t, "temporaries", got["t"])
	require.Equal(t, "activations", got["u"])
	require.Equal(t, "activations", got["h"]) // tanh writes a into h's buffer
	require.Equal(t, "gradients", got["gw"])
	var b bytes.Buffer
	require.NoError(t, rep.WriteHTML(&b))
	require.Contains(t, b.String(), "<svg")
}

// TestMechanismsChargeEachPass: each pass's change is charged to its
// mechanism, an inner state to its own, and passes that are no
// mechanism (autodiff, assign) to none.
func TestMechanismsChargeEachPass(t *testing.T) {
	effects := []Effect{
		{Pass: "", Peak: 100, FLOPs: 10, Seconds: 1},
		{Pass: "autodiff", Peak: 300, FLOPs: 30, Seconds: 3},
		{Pass: "saveset", Peak: 250, FLOPs: 32, Seconds: 3.5},
		{Pass: "microbatch", Peak: 180, FLOPs: 31, Seconds: 4},
		{Pass: "remat", Peak: 120, FLOPs: 40, Seconds: 5},
		{Pass: "fuse", Peak: 110, FLOPs: 40, Seconds: 4},
		{Pass: "assign", Peak: 110, FLOPs: 40, Seconds: 4},
	}
	got := Mechanisms(effects)
	require.Equal(t, map[string]*Mechanism{
		"recompute":  {Passes: []string{"saveset", "remat"}, BytesSaved: 50 + 60, FLOPsAdded: 2 + 9, SecondsAdded: 0.5 + 1},
		"microbatch": {Passes: []string{"microbatch"}, BytesSaved: 70, FLOPsAdded: -1, SecondsAdded: 0.5},
		"fusion":     {Passes: []string{"fuse"}, BytesSaved: 10, FLOPsAdded: 0, SecondsAdded: -1},
	}, got)
}
