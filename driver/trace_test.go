package driver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlanCheckTrace: plan-check's Chrome trace names the process and a
// track per stream, puts kernels and copies on their stream's track in
// microseconds, and has device and host memory counter tracks whose
// largest values fit the plan's arenas (the offloaded gradients of a wide
// step are on the host).
func TestPlanCheckTrace(t *testing.T) {
	dir := t.TempDir()
	src := "../testdata/examples/wide.kir"
	plan := filepath.Join(dir, "plan")
	_, stderr, code := kiln(t, "compile", src, "--target", "cuda", "--passes", "autodiff,fuse,reorder,swap{device-budget=0.75,params=false},assign", "-o", plan)
	require.Equal(t, 0, code, stderr)
	trace := filepath.Join(dir, "trace.json")
	_, stderr, code = kiln(t, "plan-check", plan, "--timeline", trace)
	require.Equal(t, 0, code, stderr)
	var doc struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   float64        `json:"ts"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	raw, err := os.ReadFile(trace)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &doc))
	var p struct {
		Arena struct {
			SizeBytes float64 `json:"size_bytes"`
		} `json:"arena"`
		Host struct {
			SizeBytes float64 `json:"size_bytes"`
		} `json:"host"`
	}
	raw, err = os.ReadFile(filepath.Join(plan, "plan.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &p))
	tracks := map[int]string{}
	peak := map[string]float64{}
	copies := 0
	for _, e := range doc.TraceEvents {
		switch e.Ph {
		case "M":
			if e.Name == "thread_name" {
				tracks[e.Tid] = e.Args["name"].(string)
			}
		case "C":
			peak[e.Name] = max(peak[e.Name], e.Args["bytes"].(float64))
		case "X":
			if e.Tid == 1 {
				copies++
			}
		}
	}
	require.Equal(t, map[int]string{0: "stream 0 (compute)", 1: "stream 1 (copy)"}, tracks)
	require.Positive(t, copies, "copies run on the copy stream's track")
	require.Positive(t, peak["device memory"])
	require.LessOrEqual(t, peak["device memory"], p.Arena.SizeBytes)
	require.Positive(t, peak["host memory"], "the offloaded gradients are on the host")
	require.LessOrEqual(t, peak["host memory"], p.Host.SizeBytes)
}
