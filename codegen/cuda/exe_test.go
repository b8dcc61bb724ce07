package cuda_test

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// executable writes the CUDA program of a plan and builds its CPU
// emulation (testdata/kiln_cuda_emulate.h) with build.sh.
func executable(t *testing.T, model, pipeline string, batch int64) (string, *cuda.Output, *ir.Module) {
	t.Helper()
	clang := clangCUDA()
	if clang == "" {
		passtest.Missing(t, "clang is not installed (.ci/run installs clang-14)")
	}
	dir, out, m := compileWith(t, model, pipeline, onnx.Options{Batch: batch})
	files, err := out.Executable(1)
	require.NoError(t, err)
	for name, b := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	rebuild(t, dir)
	return dir, out, m
}

// rebuild runs dir/build.sh for the CPU emulation.
func rebuild(t *testing.T, dir string) {
	t.Helper()
	clang := clangCUDA()
	emulate, err := filepath.Abs("testdata")
	require.NoError(t, err)
	cxx := strings.Replace(clang, "clang", "clang++", 1)
	cmd := exec.Command("sh", filepath.Join(dir, "build.sh"))
	cmd.Env = append(os.Environ(), "KILN_CUDA_EMULATE="+emulate, "CC="+clang, "CXX="+cxx, "TMPDIR="+dir)
	msg, err := cmd.CombinedOutput()
	require.NoError(t, err, "build.sh: %s", msg)
}

// runProgram runs dir/step on args for steps steps (env added to the
// environment) and reads its results and final arguments; stderr is its
// report.
func runProgram(t *testing.T, dir string, f *ir.Func, args []*interp.Tensor, steps int, env ...string) (res, final []*interp.Tensor, stderr string) {
	t.Helper()
	run, err := os.MkdirTemp(dir, "run")
	require.NoError(t, err)
	in := filepath.Join(run, "in")
	writeArgs(t, in, f, args)
	out := filepath.Join(run, "out")
	cmd := exec.Command(filepath.Join(dir, "step"), "--inputs", in, "--output-dir", out, "--steps", fmt.Sprint(steps), "--report-memory")
	cmd.Env = append(append(os.Environ(), "KILN_EMU_REPORT=1"), env...)
	var errb strings.Builder
	cmd.Stderr = &errb
	require.NoError(t, cmd.Run(), "the program: %s", errb.String())
	for i := range f.Results {
		res = append(res, passtest.LoadNpy(t, filepath.Join(out, llvm.FileName(f.ResultName(i))+".npy")))
	}
	for i, a := range f.Args {
		if a.Arg.InOut {
			final = append(final, passtest.LoadNpy(t, filepath.Join(out, llvm.FileName("updated."+a.Name)+".npy")))
		} else {
			final = append(final, args[i])
		}
	}
	return res, final, errb.String()
}

// writeArgs writes f's arguments as DIR/NAME.npy files, the folder made.
func writeArgs(t *testing.T, dir string, f *ir.Func, args []*interp.Tensor) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for i, a := range f.Args {
		w, err := os.Create(filepath.Join(dir, llvm.FileName(a.Name)+".npy"))
		require.NoError(t, err)
		require.NoError(t, npy.Write(w, args[i]))
		require.NoError(t, w.Close())
	}
}

// batchArg names f's first floating data input with three rows or more
// (OrderFloor rotates its rows).
func batchArg(f *ir.Func) string {
	for _, a := range f.Args {
		if a.Arg.Kind == ir.ArgData && a.Type.DType.IsFloat() && a.Type.Rank() > 0 && a.Type.Shape[0] >= 3 {
			return a.Name
		}
	}
	return ""
}

var emulated = regexp.MustCompile(`emulated: (\d+) bytes in (\d+) allocations, (\d+) streams, (\d+) events, (\d+) graphs held; (\d+) launches issued, (\d+) graph launches`)

// TestExecutableMatchesInterpreter builds the CUDA programs of training
// steps (with swaps, events, host functions for offloaded parameters,
// f16 and bf16 with fp8 saved values, cuBLASLt bias epilogues) as their
// CPU emulation, which runs
// the generated kernels, step.cu and the runtime as written (one thread,
// in issue order), and checks:
//   - one step's results and updates equal the interpreter's within the
//     order floor (passtest.OrderFloor), the f32 model (passtest.F32Bound,
//     passtest.F32Resolution; one rounding of 16-bit values, withinULP) and twice
//     the distance of the CPU program of the same step;
//   - two steps in one process equal one step run on the state the first
//     left, bit for bit (state stays on the device between steps; the
//     first run issues the nodes, the second captures and launches a
//     graph), and equal the nodes issued without a graph
//     (KILN_CUDA_GRAPH=0);
//   - the runtime frees every allocation, stream, event and graph, and
//     reports the device bytes the plan names.
func TestExecutableMatchesInterpreter(t *testing.T) {
	for _, c := range []struct {
		name, model, pipeline string
		batch                 int64 // an ONNX model's batch (0: its own)
		short                 bool  // in -short
	}{
		// A batch of 4: the order floor rotates 3 rows or more.
		{"cnn-swap", "../../testdata/models/small_cnn/model.onnx", "autodiff,optimizer{kind=momentum,lr=0.1},fuse,reorder,swap{device-budget=0.95,params=false},assign", 4, true},
		// A batch of 32: batch norm's statistics fold 8192 terms per
		// channel, split into partial sums (reduce.go).
		{"cnn-batch-32", "../../testdata/models/small_cnn/model.onnx", "autodiff,optimizer{kind=momentum,lr=0.1},fuse,reorder,assign", 32, false},
		// Offloaded parameters: host functions update them. (Momentum, not
		// Adam: Adam's update g/(√v+ε) turns the rounding noise of a
		// mathematically zero gradient into a full step of either sign.)
		{"bert-offloaded", "../../testdata/models/ci/bert_base_ci.onnx", "autodiff,optimizer{kind=momentum,lr=0.01},fuse,reorder,swap{device-budget=0.4},assign", 0, false},
		{"mlp-f16-swap", "testdata/mlp_f16.kir", "autodiff,optimizer{kind=momentum,lr=0.001},fuse,reorder,swap{device-budget=0.5},assign", 0, true},
		// bf16 activations and products with f32 master weights: bf16 GEMMs.
		{"cnn-bf16", "../../testdata/models/small_cnn/model.onnx", "autodiff,precision{dtype=bf16},optimizer{kind=momentum,lr=0.1},fuse,reorder,assign", 4, false},
		// fp8 saved values: the narrowing (max and min folds, a division
		// rounded to e4m3), the restores and the scaled products.
		{"cnn-fp8-saved", "../../testdata/models/small_cnn/model.onnx", "autodiff,precision{dtype=bf16,saved=fp8},optimizer{kind=momentum,lr=0.1},fuse,reorder,assign", 4, false},
		// Linear layers whose biases cuBLASLt adds in the GEMMs' epilogues.
		{"bias-epilogue", "testdata/bias.kir", "autodiff,optimizer{kind=momentum,lr=0.1},fuse,reorder,assign", 0, true},
	} {
		if testing.Short() && !c.short {
			continue // -short: an offloaded CNN, f16 with host functions, cuBLASLt's epilogue
		}
		t.Run(c.name, func(t *testing.T) {
			dir, out, m := executable(t, c.model, c.pipeline, c.batch)
			f := m.Funcs[0]
			args := interp.RandomArgs(f, 7)
			// The order floor where the batch has 3 rows or more; the f32
			// model alone where it cannot (BERT's export fixed a batch of 2).
			var want, wantArgs []*interp.Tensor
			floors := passtest.Floors{Results: make([]float64, len(f.Results)), Updates: make([]float64, len(f.Args))}
			if batch := batchArg(f); batch != "" {
				want, wantArgs, floors = passtest.OrderFloor(t, f, args, batch)
			} else {
				var err error
				want, wantArgs, err = interp.RunWithUpdates(f, interp.CloneAll(args), interp.Options{})
				require.NoError(t, err)
			}
			got, gotArgs, report := runProgram(t, dir, f, args, 1)
			// The CPU program of the same step (validated against the
			// interpreter by the LLVM backend's tests) measures how far
			// another f32 evaluation of this step lies: a step whose
			// gradients cancel (BERT's with random weights) moves further
			// than the f32 model says.
			p, err := llvm.Lower(f)
			require.NoError(t, err)
			cpu, cpuArgs, err := llvm.Run(p, interp.CloneAll(args))
			require.NoError(t, err)
			acc := passtest.F32Bound(f)
			for i := range want {
				if narrow(f.Results[i].Value.Type.DType) {
					withinULP(t, got[i], want[i], acc, f.ResultName(i))
					continue
				}
				bound := passtest.OrderBound(floors.Results[i]) + acc + 2*passtest.RelErr(cpu[i], want[i])
				require.LessOrEqual(t, passtest.RelErr(got[i], want[i]), bound, "result %s", f.ResultName(i))
			}
			for i, a := range f.Args {
				if a.Arg.InOut && narrow(a.Type.DType) {
					withinULP(t, gotArgs[i], wantArgs[i], acc, a.Name)
				} else if a.Arg.InOut {
					e := passtest.UpdateErr(gotArgs[i], wantArgs[i], args[i])
					require.False(t, math.IsNaN(e) || math.IsNaN(floors.Updates[i]), "the update of %s: %v, want %v from %v (floor %g)", a.Name, head(gotArgs[i]), head(wantArgs[i]), head(args[i]), floors.Updates[i])
					bound := passtest.OrderBound(floors.Updates[i]) + acc + passtest.F32Resolution(wantArgs[i], args[i]) + 2*passtest.UpdateErr(cpuArgs[i], wantArgs[i], args[i])
					require.LessOrEqual(t, e, bound, "the update of %s", a.Name)
				}
			}
			// The emulation held nothing at exit; the runtime's device
			// bytes are the plan's.
			mm := emulated.FindStringSubmatch(report)
			require.NotNil(t, mm, "the emulation's report: %s", report)
			require.Equal(t, []string{"0", "0", "0", "0", "0"}, mm[1:6], "what the program left allocated: %s", report)
			require.Equal(t, "0", mm[7], "graph launches in one step (the first issues the nodes)")
			var own, measured, planned, workspace int64
			_, err = fmt.Sscanf(report[strings.Index(report, "device:"):], "device: %d bytes allocated, %d bytes measured (cudaMemGetInfo), %d bytes planned, %d bytes of library workspace", &own, &measured, &planned, &workspace)
			require.NoError(t, err, report)
			device := out.Plan.Arena.SizeBytes
			for _, b := range out.Plan.Buffers {
				if b.Space == "param" || b.Space == "input" {
					device += b.SizeBytes
				}
			}
			require.Equal(t, device, planned, "the plan's device bytes")
			require.Equal(t, own, measured, "allocated and measured device bytes (the emulation counts exactly)")
			library := 0
			for _, n := range out.Plan.Nodes {
				if n.Kind == "library" {
					library++
				}
			}
			require.Positive(t, library, "library calls in the plan")
			if strings.HasSuffix(c.model, "bias.kir") {
				lt := 0
				for _, n := range out.Plan.Nodes {
					if n.Kind == "library" && n.Library.Call == cuda.LtCall {
						lt++
					}
				}
				require.Equal(t, 2, lt, "GEMMs with a bias epilogue")
				require.NotContains(t, out.Kernels, "_epilogue(", "a GEMM epilogue left in a kernel")
			}
			if c.batch == 32 {
				require.Contains(t, out.Kernels, "= kiln_block_fold(", "reductions folded by blocks")
			}
			if strings.Contains(c.pipeline, "saved=fp8") {
				require.Regexp(t, `= kiln_f32_to_f8e4m3\(`, out.Kernels, "kernels that store fp8")
				require.Regexp(t, `kiln_f8e4m3_to_f32\(`, out.Kernels, "kernels that read fp8")
			}
			require.Equal(t, int64(cuda.BLASWorkspace), workspace, "cuBLAS's workspace")
			require.LessOrEqual(t, own, planned+workspace+int64(len(out.Plan.Buffers)), "allocated against planned (a byte for each empty allocation at most)")

			two, twoArgs, report2 := runProgram(t, dir, f, args, 2)
			again, againArgs, _ := runProgram(t, dir, f, gotArgs, 1)
			direct, directArgs, report3 := runProgram(t, dir, f, args, 2, "KILN_CUDA_GRAPH=0")
			require.Contains(t, report2, "0 bytes in 0 allocations")
			require.Contains(t, report2, " 1 graph launches")
			require.Contains(t, report3, " 0 graph launches")
			for i := range two {
				require.True(t, sameBits(two[i], again[i]), "result %d of step 2: in one process and from files", i)
				require.True(t, sameBits(two[i], direct[i]), "result %d of step 2: graph and direct", i)
			}
			for i := range twoArgs {
				require.True(t, sameBits(twoArgs[i], againArgs[i]), "%s after step 2: in one process and from files", f.Args[i].Name)
				require.True(t, sameBits(twoArgs[i], directArgs[i]), "%s after step 2: graph and direct", f.Args[i].Name)
			}
		})
	}
}

// narrow reports whether d is a 16-bit float.
func narrow(d ir.DType) bool { return d == ir.F16 || d == ir.BF16 }

// withinULP checks a 16-bit float tensor elementwise: the program and the
// interpreter compute it in f32 to within the f32 model (acc, relative to
// the tensor's largest value), then round to 16 bits, where a value
// whose f32 forms lie on either side of a rounding boundary moves by one
// unit in the last place (2^-10 of its binade for f16, 2^-7 for bf16).
// NaNs must agree.
func withinULP(t *testing.T, got, want *interp.Tensor, acc float64, name string) {
	t.Helper()
	bits := 10
	if want.Type.DType == ir.BF16 {
		bits = 7
	}
	largest := 0.0
	for i := 0; i < want.Len(); i++ {
		if v := math.Abs(want.At(i)); !math.IsNaN(v) {
			largest = max(largest, v)
		}
	}
	for i := 0; i < want.Len(); i++ {
		g, w := got.At(i), want.At(i)
		if math.IsNaN(w) || math.IsNaN(g) {
			require.True(t, math.IsNaN(w) && math.IsNaN(g), "%s[%d]: %v, want %v", name, i, g, w)
			continue
		}
		_, e := math.Frexp(w)
		ulp := math.Ldexp(1, e-1-bits)
		require.LessOrEqual(t, math.Abs(g-w), ulp+acc*largest, "%s[%d]: %v, want %v", name, i, g, w)
	}
}

// sameBits reports whether a and b hold the same numbers (NaNs alike).
func sameBits(a, b *interp.Tensor) bool {
	if a.Len() != b.Len() {
		return false
	}
	for i := 0; i < a.Len(); i++ {
		x, y := a.At(i), b.At(i)
		if x != y && !(math.IsNaN(x) && math.IsNaN(y)) {
			return false
		}
	}
	return true
}

// head is a tensor's first values, for messages.
func head(x *interp.Tensor) []float64 {
	var out []float64
	for i := 0; i < min(x.Len(), 8); i++ {
		out = append(out, x.At(i))
	}
	return out
}

// TestSeveralRanksMatchTheInterpreter: the CUDA programs of training
// steps over several ranks, built as their emulation with NCCL over MPI
// and run under mpirun, give each rank the interpreter's results and
// updates within the f32 error model, their first step issued and their
// second launched as a captured graph: two data-parallel ranks with
// ZeRO-3 (parameters, gradients and Adam's moments sharded: all-gathers,
// reduce-scatters and an all-reduce of the loss), and four ranks of two
// data-parallel groups of two tensor-parallel ones (groups of ranks one
// and two apart: each rank's communicators split by color and key).
func TestSeveralRanksMatchTheInterpreter(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		passtest.Missing(t, "mpirun is not installed (.ci/run installs openmpi-bin)")
	}
	for _, c := range []struct {
		parallel string
		ranks    int
		groups   int
	}{
		{"dp=2,zero=3", 2, 1},
		{"dp=2,tp=2", 4, 2},
	} {
		t.Run(c.parallel, func(t *testing.T) {
			dir, out, m := executable(t, "testdata/mlp.kir", "autodiff{loss=sum},optimizer{kind=adam,placement=early},parallel{"+c.parallel+"},canonicalize,dce,cse,fuse,reorder,assign", 0)
			f := m.Funcs[0]
			require.Equal(t, c.ranks, out.Plan.Ranks)
			groups := map[[2]int64]bool{}
			for _, n := range out.Plan.Nodes {
				if n.Kind == "collective" {
					groups[[2]int64{n.Collective.Size, n.Collective.Stride}] = true
				}
			}
			require.Len(t, groups, c.groups, "groups of ranks the collectives run over: %v", groups)
			args := make([][]*interp.Tensor, c.ranks)
			for r := range args {
				args[r] = interp.RandomArgs(f, uint64(11+r))
				for i, a := range f.Args {
					if a.Arg.Attrs.String("role", "") == "optimizer_state" {
						args[r][i] = interp.New(a.Type) // Adam's moments start at 0 (a random v < 0 has no square root)
					}
				}
			}
			run := filepath.Join(dir, "ranks")
			for r, rargs := range args {
				writeArgs(t, filepath.Join(run, "in", fmt.Sprintf("rank%d", r)), f, rargs)
			}
			// One step from the files, then two in one process (the second a
			// graph launch), against the interpreter's one and two steps.
			for _, steps := range []int{1, 2} {
				cloned := make([][]*interp.Tensor, len(args))
				for r := range args {
					cloned[r] = interp.CloneAll(args[r])
				}
				want, wantArgs, err := interp.RunRanks(f, cloned, interp.Options{})
				require.NoError(t, err)
				if steps == 2 {
					want, wantArgs, err = interp.RunRanks(f, wantArgs, interp.Options{})
					require.NoError(t, err)
				}
				o := filepath.Join(run, fmt.Sprintf("out%d", steps))
				cmdArgs := []string{"-np", fmt.Sprint(c.ranks), "--oversubscribe"}
				if os.Geteuid() == 0 {
					cmdArgs = append(cmdArgs, "--allow-run-as-root")
				}
				cmd := exec.Command(mpirun, append(cmdArgs, filepath.Join(dir, "step"), "--inputs", filepath.Join(run, "in"), "--output-dir", o, "--steps", fmt.Sprint(steps))...)
				cmd.Env = append(os.Environ(), "KILN_EMU_REPORT=1")
				msg, err := cmd.CombinedOutput()
				require.NoError(t, err, "mpirun: %s", msg)
				require.Equal(t, c.ranks, strings.Count(string(msg), fmt.Sprintf(" %d graph launches", steps-1)), "%s", msg)
				funcs := make([]*ir.Func, len(args))
				for r := range funcs {
					funcs[r] = f
				}
				checkRanks(t, o, funcs, args, want, wantArgs, steps)
			}
		})
	}
}

// TestPipelineStagesMatchTheInterpreter builds the CUDA programs of a
// pipeline's stages (each an emulation linked with MPI and NCCL over
// MPI) and runs them together under mpirun (mpirun -np R stage0/step :
// -np R stage1/step), one step from files and two in one process (the
// second a graph launch), against the interpreter's run of the stage
// functions together (interp.RunPrograms) within the f32 error model:
// two stages of one rank with two microbatches (activations sent
// forward and gradients back, 1F1B), and two stages of two
// data-parallel ranks (sends two ranks apart, beside each stage's
// all-reduces, whose communicators every rank of the world splits
// together).
func TestPipelineStagesMatchTheInterpreter(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		passtest.Missing(t, "mpirun is not installed (.ci/run installs openmpi-bin)")
	}
	for _, c := range []struct {
		parallel string
		ranks    int // each stage's
	}{
		{"pp=2,microbatches=2", 1},
		{"dp=2,pp=2", 2},
	} {
		t.Run(c.parallel, func(t *testing.T) {
			if testing.Short() && c.ranks > 1 {
				t.Skip("-short runs the pipeline of one rank a stage")
			}
			src, err := os.ReadFile("testdata/mlp.kir")
			require.NoError(t, err)
			m, err := parser.Parse("mlp.kir", string(src))
			require.NoError(t, err)
			passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=momentum,lr=0.1},parallel{"+c.parallel+"},canonicalize,dce,cse,fuse,reorder,assign")
			stages := parallel.Stages(m)
			require.Len(t, stages, 2)
			dir := t.TempDir()
			var funcs []*ir.Func // the function each world rank runs
			var args [][]*interp.Tensor
			cmdArgs := []string{"--oversubscribe"}
			if os.Geteuid() == 0 {
				cmdArgs = append(cmdArgs, "--allow-run-as-root")
			}
			run := filepath.Join(dir, "run")
			sends := 0
			for s, f := range stages {
				out, err := cuda.Lower(f, costmodel.Default)
				require.NoError(t, err)
				for _, n := range out.Plan.Nodes {
					if n.Kind == "collective" && (n.Collective.Call == "ncclSend" || n.Collective.Call == "ncclRecv") {
						require.Equal(t, int64(c.ranks)*map[bool]int64{true: 1, false: -1}[s == 0], n.Collective.Peer, "stage %d's %s", s, n.Collective.Call)
						sends++
					}
				}
				files, err := out.Executable(1)
				require.NoError(t, err)
				sd := filepath.Join(dir, fmt.Sprintf("stage%d", s))
				require.NoError(t, cuda.Write(sd, out, m, files, nil))
				rebuild(t, sd)
				for range c.ranks {
					r := len(funcs)
					funcs = append(funcs, f)
					args = append(args, interp.RandomArgs(f, uint64(31+r)))
					writeArgs(t, filepath.Join(run, "in", fmt.Sprintf("rank%d", r)), f, args[r])
				}
				if s > 0 {
					cmdArgs = append(cmdArgs, ":")
				}
				cmdArgs = append(cmdArgs, "-np", fmt.Sprint(c.ranks), filepath.Join(sd, "step"), "--inputs", filepath.Join(run, "in"))
			}
			require.GreaterOrEqual(t, sends, 8, "sends and receives: activations and gradients of 2 microbatches, each way")
			for _, steps := range []int{1, 2} {
				cloned := make([][]*interp.Tensor, len(args))
				for r := range args {
					cloned[r] = interp.CloneAll(args[r])
				}
				want, wantArgs, err := interp.RunPrograms(funcs, cloned, interp.Options{})
				require.NoError(t, err)
				if steps == 2 {
					want, wantArgs, err = interp.RunPrograms(funcs, wantArgs, interp.Options{})
					require.NoError(t, err)
				}
				o := filepath.Join(run, fmt.Sprintf("out%d", steps))
				var line []string
				for _, a := range cmdArgs {
					line = append(line, a)
					if strings.HasSuffix(a, "/step") {
						line = append(line, "--output-dir", o, "--steps", fmt.Sprint(steps))
					}
				}
				cmd := exec.Command(mpirun, line...)
				cmd.Env = append(os.Environ(), "KILN_EMU_REPORT=1")
				msg, err := cmd.CombinedOutput()
				require.NoError(t, err, "mpirun: %s", msg)
				require.Equal(t, len(funcs), strings.Count(string(msg), fmt.Sprintf(" %d graph launches", steps-1)), "%s", msg)
				require.Equal(t, len(funcs), strings.Count(string(msg), "emulated: 0 bytes in 0 allocations, 0 streams, 0 events, 0 graphs held"), "what the ranks left: %s", msg)
				checkRanks(t, o, funcs, args, want, wantArgs, steps)
			}
		})
	}
}

// checkRanks compares what each rank r (running funcs[r] from args[r]
// for steps steps) wrote under dir/rankR with the interpreter's results
// want[r] and updated arguments wantArgs[r], within the f32 error model
// of that many steps.
func checkRanks(t *testing.T, dir string, funcs []*ir.Func, args, want, wantArgs [][]*interp.Tensor, steps int) {
	t.Helper()
	for r, f := range funcs {
		acc := float64(steps) * passtest.F32Bound(f)
		rd := filepath.Join(dir, fmt.Sprintf("rank%d", r))
		for i := range f.Results {
			got := passtest.LoadNpy(t, filepath.Join(rd, llvm.FileName(f.ResultName(i))+".npy"))
			require.LessOrEqual(t, passtest.RelErr(got, want[r][i]), acc, "rank %d, %d steps: result %s", r, steps, f.ResultName(i))
		}
		for i, a := range f.Args {
			if !a.Arg.InOut {
				continue
			}
			got := passtest.LoadNpy(t, filepath.Join(rd, llvm.FileName("updated."+a.Name)+".npy"))
			bound := acc + passtest.F32Resolution(wantArgs[r][i], args[r][i])
			e := passtest.UpdateErr(got, wantArgs[r][i], args[r][i])
			require.False(t, math.IsNaN(e), "rank %d, %d steps: the update of %s: %v, want %v", r, steps, a.Name, head(got), head(wantArgs[r][i]))
			require.LessOrEqual(t, e, bound, "rank %d, %d steps: the update of %s: %v, want %v, from %v", r, steps, a.Name, head(got), head(wantArgs[r][i]), head(args[r][i]))
		}
	}
}
