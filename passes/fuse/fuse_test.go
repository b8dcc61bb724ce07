package fuse_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	"github.com/kiln-compiler/kiln/passes/fuse"
	_ "github.com/kiln-compiler/kiln/passes/remat"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestFusionPreservesResults: fused functions compute exactly what the
// unfused ones did, forward and training steps, on the bundled examples
// and the CI-sized zoo.
func TestFusionPreservesResults(t *testing.T) {
	var srcs []string
	for _, p := range []string{"../../testdata/examples/mlp.kir", "../../testdata/examples/cnn.kir"} {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		srcs = append(srcs, string(b))
	}
	models := []string{"resnet50_ci", "bert_base_ci", "gpt2_small_ci"}
	if testing.Short() {
		models = nil // model-scale: the full suite (go test ./..., bash .ci/run) runs them
	}
	for _, name := range models {
		m, err := onnx.ImportFile("../../testdata/models/ci/"+name+".onnx", onnx.Options{})
		require.NoError(t, err)
		srcs = append(srcs, m.String())
	}
	for _, src := range srcs {
		fused := passtest.CheckPipeline(t, src, "fuse", 0)
		kernels := 0
		for _, op := range fused.Funcs[0].Body {
			if op.Region != nil {
				kernels++
			}
		}
		require.Greater(t, kernels, 0)
		before := passtest.Parse(t, src)
		pipe, err := passes.ParsePipeline("autodiff", nil)
		require.NoError(t, err)
		require.NoError(t, (&passes.Manager{}).Run(before, pipe))
		after := passtest.CheckPipeline(t, before.String(), "fuse", 0)
		require.LessOrEqual(t, liveness.Analyze(after.Funcs[0]).Peak, liveness.Analyze(before.Funcs[0]).Peak, "fusion never raises the peak")
	}
}

func TestNoCycles(t *testing.T) {
	// c depends on a directly and through the opaque gather_grad; fusing a
	// into c would make a cycle through it, so a stays out.
	src := `func @f(%x: f32[4,4], %i: i64[4]) -> (f32[4,4]) {
  %a = exp(%x) : f32[4,4]
  %g = gather_grad(%a, %i) {data_shape = [4, 4]} : f32[4,4]
  %c = add(%a, %g) : f32[4,4]
  return %c
}
`
	m := passtest.CheckPipeline(t, src, "fuse", 0)
	require.NoError(t, ir.Verify(m))
	require.Len(t, m.Funcs[0].Body, 3, "nothing fuses:\n%s", m)
}

// TestReadsStayBeforeInPlaceWrites: an op that reads a parameter before
// the optimizer update overwrites it is never fused into a kernel placed
// after the update (found compiling a rematerialised AdamW step).
func TestReadsStayBeforeInPlaceWrites(t *testing.T) {
	src := `func @f(%x: f32[4], %w: f32[4] {param, inout}, %g: f32[4], %lr: f32[] {state}) -> (f32[4]) {
  %a = mul(%w, %x) : f32[4]
  sgd_update(%w, %g, %lr)
  %b = relu(%a) : f32[4]
  return %b
}
`
	m := passtest.CheckPipeline(t, src, "fuse", 0)
	require.NoError(t, ir.Verify(m))
}

// TestFusionAfterRematKeepsHarmlessKernels: after remat has brought a
// step to its budget, a few fusions would raise the peak; backing out
// drops them in growing batches, and the kernels that did no harm come
// back, so most of the step is still fused and the peak does not rise.
func TestFusionAfterRematKeepsHarmlessKernels(t *testing.T) {
	src := `func @deep(%x: f64[512,16], %w0: f64[16,16] {param}, %w1: f64[16,16] {param}, %w2: f64[16,16] {param}, %w3: f64[16,16] {param}) -> (f64[512,16]) {
  %h0 = matmul(%x, %w0) : f64[512,16]
  %t0 = tanh(%h0) : f64[512,16]
  %a0 = sigmoid(%t0) : f64[512,16]
  %h1 = matmul(%a0, %w1) : f64[512,16]
  %t1 = tanh(%h1) : f64[512,16]
  %a1 = sigmoid(%t1) : f64[512,16]
  %h2 = matmul(%a1, %w2) : f64[512,16]
  %t2 = tanh(%h2) : f64[512,16]
  %a2 = sigmoid(%t2) : f64[512,16]
  %h3 = matmul(%a2, %w3) : f64[512,16]
  %t3 = tanh(%h3) : f64[512,16]
  %a3 = sigmoid(%t3) : f64[512,16]
  return %a3
}`
	m := passtest.Parse(t, src)
	passtest.Run(t, m, "autodiff,canonicalize,dce,cse,saveset,remat{budget=0.8}")
	step := m.String()
	f := passtest.Parse(t, step).Funcs[0]
	before := liveness.Analyze(f).Peak
	st := fuse.Fuse(f, fuse.Options{MultiOutput: true})
	require.LessOrEqual(t, liveness.Analyze(f).Peak, before)
	require.Positive(t, st.BackedOut, "some fusion would raise the peak")
	require.Greater(t, st.Kernels, st.BackedOut, "most kernels stay")
	passtest.CheckPipeline(t, step, "fuse", 0)
}
