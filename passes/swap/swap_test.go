package swap_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/memreport"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes"
	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/fuse"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	_ "github.com/kiln-compiler/kiln/passes/reorder"
	"github.com/kiln-compiler/kiln/passes/swap"
	"github.com/kiln-compiler/kiln/passtest"
)

// A training step whose forward activations wait through a long
// backward pass: swapping them is the only way down besides recomputing.
const mlp = `func @mlp(%x: f64[256,32], %w1: f64[32,32] {param}, %w2: f64[32,32] {param}, %w3: f64[32,32] {param}, %w4: f64[32,4] {param}) -> (f64[256,4]) {
  %h1 = matmul(%x, %w1) : f64[256,32]
  %a1 = tanh(%h1) : f64[256,32]
  %h2 = matmul(%a1, %w2) : f64[256,32]
  %a2 = sigmoid(%h2) : f64[256,32]
  %h3 = matmul(%a2, %w3) : f64[256,32]
  %a3 = tanh(%h3) : f64[256,32]
  %h4 = matmul(%a3, %w4) : f64[256,4]
  return %h4
}
`

func run(t *testing.T, m *ir.Module, pipeline string) error {
	t.Helper()
	pipe, err := passes.ParsePipeline(pipeline, nil)
	require.NoError(t, err)
	return (&passes.Manager{Inst: passes.Instrumentation{VerifyEach: true}, Workspace: loops.Workspace}).Run(m, pipe)
}

// TestSwapFitsTheBudgetAndKeepsResults: swapped steps fit the device
// budget, compute bit-identical results, get host offsets that the offset
// checker accepts, and report host and swapped bytes.
func TestSwapFitsTheBudgetAndKeepsResults(t *testing.T) {
	for _, recompute := range []string{"true", "false"} {
		before := passtest.Parse(t, mlp)
		require.NoError(t, run(t, before, "autodiff"))
		after := passtest.Clone(t, before)
		arena := swap.ArenaBytes(after.Funcs[0])
		require.NoError(t, run(t, after, "swap{device-budget=0.8,recompute="+recompute+"},assign"))
		f := after.Funcs[0]
		require.LessOrEqual(t, f.Attrs.Int("arena", 0), arena*4/5, "recompute=%s", recompute)
		require.NoError(t, liveness.CheckOffsets(f))
		info := liveness.Analyze(f)
		if recompute == "false" {
			require.NotEmpty(t, info.HostBuffers, "nothing was swapped")
			require.Positive(t, f.Attrs.Int("host_arena", 0))
			require.NotContains(t, f.String(), "recomputed")
		}
		passtest.Equivalent(t, before.Funcs[0], f, 0)
		// Every tensor copied out comes back at least once, or is a
		// gradient returned from host memory.
		offloaded := 0
		for _, r := range f.Results {
			if ir.HostResult(r.Value) {
				offloaded++
			}
		}
		require.GreaterOrEqual(t, strings.Count(f.String(), "swap_in(")+offloaded, strings.Count(f.String(), "swap_out("))
		require.Equal(t, int64(len(info.HostBuffers)), int64(strings.Count(f.String(), "swap_out(")))
	}
}

// TestSwapOffloadsFinishedGradients: in a step whose weight gradients are
// most of the arena (wide layers, four rows), swapping activations cannot
// reach half the arena; finished gradients go to host memory for good
// (ZeRO-Offload) and are returned from there. Results stay bit-identical
// in the interpreter and the LLVM program, the offsets check, and the
// launch plan keeps within the budget.
func TestSwapOffloadsFinishedGradients(t *testing.T) {
	const wide = `func @wide(%x: f64[4,128], %w1: f64[128,128] {param}, %w2: f64[128,128] {param}, %w3: f64[128,128] {param}) -> (f64[4,128]) {
  %h1 = matmul(%x, %w1) : f64[4,128]
  %a1 = tanh(%h1) : f64[4,128]
  %h2 = matmul(%a1, %w2) : f64[4,128]
  %a2 = tanh(%h2) : f64[4,128]
  %h3 = matmul(%a2, %w3) : f64[4,128]
  return %h3
}`
	before := passtest.Parse(t, wide)
	require.NoError(t, run(t, before, "autodiff"))
	after := passtest.Clone(t, before)
	device, err := swap.DeviceBytes(after.Funcs[0], loops.Workspace)
	require.NoError(t, err)
	budget := device / 2
	require.NoError(t, run(t, after, fmt.Sprintf("swap{device-budget=%d},assign", budget)))
	f := after.Funcs[0]
	offloaded := 0
	for _, r := range f.Results {
		if ir.HostResult(r.Value) {
			require.Equal(t, ir.RoleGrad, r.Role(), "only gradients are returned from host memory")
			offloaded++
		}
	}
	require.Positive(t, offloaded, "no gradient was offloaded")
	got, err := swap.DeviceBytes(f, loops.Workspace)
	require.NoError(t, err)
	require.LessOrEqual(t, got, budget)
	require.NoError(t, liveness.CheckOffsets(f))
	passtest.Equivalent(t, before.Funcs[0], f, 0)
	m := before.Funcs[0]
	t.Logf("%d of %d gradients offloaded; device arena %d -> %d bytes (budget %d)", offloaded, len(m.Results)-1, device, got, budget)
}

// TestSwapOffloadsParametersAndState: a step with Adam whose parameters
// and moments are most of the device (wide layers, four rows) reaches a
// third of its device memory only by holding parameters and moments in
// host memory: the device swaps each parameter in for its readers, the
// gradient goes out once made and the update runs on the host. The
// results and the updated parameters and moments stay bit-identical, the
// offsets check, and the budget counts the arguments left on the device.
func TestSwapOffloadsParametersAndState(t *testing.T) {
	const wide = `func @wide(%x: f64[4,128], %w1: f64[128,128] {param}, %w2: f64[128,128] {param}, %w3: f64[128,128] {param}) -> (f64[4,128]) {
  %h1 = matmul(%x, %w1) : f64[4,128]
  %a1 = tanh(%h1) : f64[4,128]
  %h2 = matmul(%a1, %w2) : f64[4,128]
  %a2 = tanh(%h2) : f64[4,128]
  %h3 = matmul(%a2, %w3) : f64[4,128]
  return %h3
}`
	for _, opt := range []string{"sgd", "momentum", "adam"} {
		for _, placement := range []string{"early", "end"} {
			for _, part := range []int64{2, 3} { // a fifth is below one gradient and what its gemm reads
				name := fmt.Sprintf("%s/%s/1:%d", opt, placement, part)
				before := passtest.Parse(t, wide)
				require.NoError(t, run(t, before, fmt.Sprintf("autodiff,optimizer{kind=%s,lr=0.01,placement=%s}", opt, placement)))
				after := passtest.Clone(t, before)
				device, err := swap.DeviceBytes(after.Funcs[0], loops.Workspace)
				require.NoError(t, err)
				budget := device / part
				// VerifyEach checks that no copy reads a parameter after its update wrote it.
				require.NoError(t, run(t, after, fmt.Sprintf("swap{device-budget=%d},assign", budget)), name)
				f := after.Funcs[0]
				info := liveness.Analyze(f)
				require.Positive(t, info.HostArgBytes, "%s: nothing was offloaded", name)
				hosted := map[*ir.Value]bool{}
				for _, a := range f.Args {
					if ir.HostArg(a) {
						require.NotEqual(t, ir.ArgData, a.Arg.Kind, "%s: %s is an input", name, a.Ref())
						hosted[a] = true
					}
				}
				onHost := 0
				for _, op := range f.Body {
					if ir.OnHost(op) {
						onHost++
						for _, k := range op.Def().Writes {
							require.True(t, hosted[op.Operands[k]], "%s: %s writes %s on the host, which is on the device", name, op.Kind, op.Operands[k].Ref())
						}
					}
				}
				require.Positive(t, onHost, "%s: no update runs on the host", name)
				got, err := swap.DeviceBytes(f, loops.Workspace)
				require.NoError(t, err)
				require.LessOrEqual(t, got, budget, name)
				was := liveness.Analyze(before.Funcs[0])
				require.Equal(t, was.ParamBytes+was.StateBytes+was.InputBytes, info.ParamBytes+info.StateBytes+info.InputBytes+info.HostArgBytes, name)
				require.NoError(t, liveness.CheckOffsets(f), name)
				// The report's bytes by dtype are the device's.
				rep := memreport.Build(f, nil, costmodel.Default)
				require.Equal(t, info.HostArgBytes, rep.OffloadedBytes, name)
				require.LessOrEqual(t, rep.BytesByDType["f64"], rep.PlannedBytes, "%s: the bytes by dtype count host memory", name)
				passtest.Equivalent(t, before.Funcs[0], f, 0)
				t.Logf("%s: %d of %d arguments offloaded (%d bytes), %d updates on the host; device %d -> %d bytes (budget %d)", name, len(hosted), len(f.Args), info.HostArgBytes, onHost, device, got, budget)
			}
		}
	}
}

// TestSwapLeavesInputsOnTheHostLast: in input_at_peak.kir only the input
// %x can leave the device at the peak: without inputs=true swap stops there, with it
// %x stays in host memory, each reader fetching a copy, and the step
// computes the same values.
func TestSwapLeavesInputsOnTheHostLast(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/steps/input_at_peak.kir")
	require.NoError(t, err)
	src := string(raw)
	before := passtest.Parse(t, src)
	const budget = 17 << 10
	require.ErrorContains(t, run(t, passtest.Clone(t, before), fmt.Sprintf("swap{device-budget=%d,peak=true}", budget)), "can't keep the device memory under")
	after := passtest.Clone(t, before)
	require.NoError(t, run(t, after, fmt.Sprintf("swap{device-budget=%d,peak=true,inputs=true}", budget)))
	f := after.Funcs[0]
	require.True(t, ir.HostArg(f.Args[0]), "the input stays on the device")
	require.LessOrEqual(t, liveness.Analyze(f).Peak, int64(budget))
	copies := 0
	for _, op := range f.Body {
		if op.Kind == "swap_in" && op.Operands[0] == f.Args[0] {
			copies++
		}
	}
	require.Equal(t, 2, copies, "one copy per reader of %%x:\n%s", f)
	passtest.Equivalent(t, before.Funcs[0], f, 0)
	// Launch plans cannot take a data input in host memory: an error, not
	// a plan that reads host memory from a kernel.
	require.NoError(t, run(t, after, "assign"))
	_, err = cuda.Lower(f, costmodel.Default)
	require.ErrorContains(t, err, "data input %x is in host memory")
}

// TestSwapBoundsThePeak: with peak=true the budget bounds the bytes live
// on the device, as remat's does (what --budget hands on to swap), not
// the device memory with its workspace and packing.
func TestSwapBoundsThePeak(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/examples/wide.kir")
	require.NoError(t, err)
	before := passtest.Parse(t, string(raw))
	require.NoError(t, run(t, before, "autodiff,optimizer{kind=adam,lr=0.01},fuse,reorder"))
	after := passtest.Clone(t, before)
	peak := liveness.Analyze(after.Funcs[0]).Peak
	budget := peak / 4
	require.NoError(t, run(t, after, fmt.Sprintf("swap{device-budget=%d,peak=true}", budget)))
	got := liveness.Analyze(after.Funcs[0]).Peak
	require.LessOrEqual(t, got, budget)
	passtest.Equivalent(t, before.Funcs[0], after.Funcs[0], 0)
	t.Logf("peak %d -> %d bytes (budget %d)", peak, got, budget)
}

// TestSwapErrorsWhenTheBudgetCannotBeMet names what stays live.
func TestSwapErrorsWhenTheBudgetCannotBeMet(t *testing.T) {
	m := passtest.Parse(t, mlp)
	require.NoError(t, run(t, m, "autodiff"))
	err := run(t, m, "swap{device-budget=64}")
	require.ErrorContains(t, err, "can't keep the device memory under 64 B")
	require.ErrorContains(t, err, "Largest:")
}

// TestVerifierRejectsHostReads: only swap_in reads host memory (a host
// tensor may be a result: an offloaded gradient).
func TestVerifierRejectsHostReads(t *testing.T) {
	for src, msg := range map[string]string{
		`func @f(%x: f32[4]) -> (f32[4]) {
  %h = swap_out(%x) : f32[4]
  %y = neg(%h) : f32[4]
  return %y
}`: "neg reads %h, which is in host memory",
		`func @f(%x: f32[4]) -> (f32[4]) {
  %y = swap_in(%x) : f32[4]
  return %y
}`: "swap_in reads %x, which is not in host memory",
		`func @f(%x: f32[4], %w: f32[4] {param, host = true}) -> (f32[4]) {
  %y = mul(%x, %w) : f32[4]
  return %y
}`: "mul reads %w, which is in host memory",
		`func @f(%x: f32[4], %w: f32[4] {param, inout, host = true}, %lr: f32[] {state}) -> (f32[4]) {
  %wd = swap_in(%w) : f32[4]
  %y = mul(%x, %wd) : f32[4]
  sgd_update(%w, %y, %lr)
  return %y
}`: "sgd_update reads %w, which is in host memory",
		`func @f(%w: f32[4] {param, host = 1}) -> (f32[4]) {
  %y = swap_in(%w) : f32[4]
  return %y
}`: "argument %w: host must be true or false",
	} {
		m, err := parseOnly(src)
		require.NoError(t, err)
		require.ErrorContains(t, ir.Verify(m), msg)
	}
	// A data input may live in host memory too, read through swap_in.
	m, err := parseOnly(`func @f(%x: f32[4] {host = true}) -> (f32[4]) {
  %y = swap_in(%x) : f32[4]
  return %y
}`)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	// An update that reads only host memory runs on the host.
	m, err = parseOnly(`func @f(%x: f32[4], %w: f32[4] {param, inout, host = true}, %lr: f32[] {state, host = true}) -> (f32[4]) {
  %wd = swap_in(%w) : f32[4]
  %y = mul(%x, %wd) : f32[4]
  %yh = swap_out(%y) : f32[4]
  sgd_update(%w, %yh, %lr)
  return %y
}`)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	require.True(t, ir.OnHost(m.Funcs[0].Body[3]))
	require.Equal(t, int64(16+4), liveness.Analyze(m.Funcs[0]).HostArgBytes, "the parameter and the learning rate")
}

// TestZooCIStepsAtHalfTheArena: the CI-sized zoo training steps fit their
// arguments and half their arena, and the cost model's step time grows by
// at most 25%.
func TestZooCIStepsAtHalfTheArena(t *testing.T) {
	if testing.Short() {
		t.Skip("imports three models")
	}
	for _, name := range []string{"resnet50_ci", "bert_base_ci", "gpt2_small_ci"} {
		m, err := onnx.ImportFile("../../testdata/models/ci/"+name+".onnx", onnx.Options{})
		require.NoError(t, err)
		require.NoError(t, run(t, m, "autodiff,optimizer{kind=sgd,lr=0.01},fuse,reorder"))
		f := m.Funcs[0]
		device, err := swap.DeviceBytes(f, loops.Workspace)
		require.NoError(t, err)
		arena := swap.ArenaBytes(f)
		budget := device - arena/2
		before := costmodel.Default.Simulate(f)
		res, err := swap.Swap(f, budget, swap.Options{Device: costmodel.Default, Workspace: loops.Workspace, Recompute: true})
		require.NoError(t, err, name)
		require.LessOrEqual(t, res.Arena, budget, name)
		require.NoError(t, ir.Verify(m))
		slow := res.After.Seconds / before.Seconds
		t.Logf("%s: device %d -> %d bytes, %d swapped (%d bytes), %d recomputed, %d parameters offloaded (%d bytes), step %.1f -> %.1f µs (%.3fx)",
			name, device, res.Arena, res.Swapped, res.SwappedBytes, res.Recomputed, res.Offloaded, res.OffloadedBytes, before.Seconds*1e6, res.After.Seconds*1e6, slow)
		require.Less(t, slow, 1.25, name)
	}
}

func parseOnly(src string) (*ir.Module, error) { return parser.Parse("test.kir", src) }
