package cuda_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/parser"
	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/fuse"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	_ "github.com/kiln-compiler/kiln/passes/parallel"
	_ "github.com/kiln-compiler/kiln/passes/precision"
	_ "github.com/kiln-compiler/kiln/passes/reorder"
	"github.com/kiln-compiler/kiln/passes/swap"
	"github.com/kiln-compiler/kiln/passtest"
)

// compile runs pipeline on the model and lowers it to a plan in a
// temporary directory.
func compile(t *testing.T, model, pipeline string) (string, *cuda.Output, *ir.Module) {
	t.Helper()
	return compileWith(t, model, pipeline, onnx.Options{})
}

// compileWith is compile, importing an ONNX model with opt.
func compileWith(t *testing.T, model, pipeline string, opt onnx.Options) (string, *cuda.Output, *ir.Module) {
	t.Helper()
	var m *ir.Module
	var err error
	if strings.HasSuffix(model, ".kir") {
		var src []byte
		src, err = os.ReadFile(model)
		require.NoError(t, err)
		m, err = parser.Parse(model, string(src))
	} else {
		m, err = onnx.ImportFile(model, opt)
	}
	require.NoError(t, err)
	passtest.RunAllowing(t, m, pipeline, "fp8-saved") // pipelines that name precision{saved=fp8} ask for it
	out, err := cuda.Lower(m.Funcs[0], costmodel.Default)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, cuda.Write(dir, out, m, nil, nil))
	return dir, out, m
}

// clangCUDA is the clang that checks kernels.cu, or "" when none is
// installed.
func clangCUDA() string {
	for _, c := range []string{"clang-14", "clang"} {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	return ""
}

// TestKernelsAreValidCUDA: kernels.cu of training steps (with swaps),
// and the host side of their executables, pass clang's CUDA front end
// against kiln_cuda.h.
func TestKernelsAreValidCUDA(t *testing.T) {
	clang := clangCUDA()
	if clang == "" {
		passtest.Missing(t, "clang is not installed (.ci/run installs clang-14)")
	}
	for _, c := range []struct {
		model, pipeline string
		host            bool // the plan calls host functions
		short           bool // in -short
	}{
		{"../../testdata/models/small_cnn/model.onnx", "autodiff,optimizer{kind=momentum,lr=0.1},fuse,reorder,swap{device-budget=0.9,params=false},assign", false, true},
		{"../../testdata/models/ci/bert_base_ci.onnx", "autodiff,optimizer{kind=adam,lr=0.001},fuse,reorder,swap{device-budget=0.7,params=false},assign", false, false},
		// Parameters and moments in host memory: host functions run the updates.
		{"../../testdata/models/ci/bert_base_ci.onnx", "autodiff,optimizer{kind=adam,lr=0.001},fuse,reorder,swap{device-budget=0.4},assign", true, false},
		// ... with bf16 copies of f32 master weights: the host functions
		// convert between the encodings.
		{"../../testdata/models/ci/bert_base_ci.onnx", "autodiff,precision{dtype=bf16},optimizer{kind=adam,lr=0.001},fuse,reorder,swap{device-budget=0.4},assign", true, true},
		{"../../testdata/models/small_cnn/model.onnx", "autodiff,precision{dtype=f16,loss-scale=1024},optimizer{kind=momentum,lr=0.1},fuse,reorder,swap{device-budget=0.75},assign", true, false},
		{"testdata/mlp_f16.kir", "autodiff,optimizer{kind=adam,lr=0.001},fuse,reorder,swap{device-budget=0.5},assign", true, true},
		// bf16 with fp8 saved values: products read f32 and bf16 operands
		// (result_dtype), the restore reads fp8 bytes and a bf16 scale.
		{"../../testdata/models/small_cnn/model.onnx", "autodiff,precision{dtype=bf16,saved=fp8},optimizer{kind=momentum,lr=0.1},fuse,reorder,assign", false, true},
		// u64: unsigned division, comparison, conversion and reduction.
		{"testdata/uint64.kir", "fuse,assign", false, true},
		// Two data-parallel ranks with ZeRO-3: NCCL calls, MPI start-up.
		{"testdata/mlp.kir", "autodiff{loss=sum},optimizer{kind=adam,placement=early},parallel{dp=2,zero=3},canonicalize,dce,cse,fuse,reorder,assign", false, false},
		// A pipeline's first stage: NCCL sends and receives.
		{"testdata/mlp.kir", "autodiff{loss=sum},optimizer{kind=momentum,lr=0.1},parallel{pp=2,microbatches=2},canonicalize,dce,cse,fuse,reorder,assign", false, true},
		// cuBLASLt calls with bias epilogues.
		{"testdata/bias.kir", "autodiff,optimizer{kind=momentum,lr=0.1},fuse,reorder,assign", false, true},
	} {
		if testing.Short() && !c.short {
			continue // -short: one plan without host functions, bf16 and f16 with them, fp8 saved values, u64, a pipeline stage, cuBLASLt
		}
		dir, out, _ := compile(t, c.model, c.pipeline)
		src, err := os.ReadFile(filepath.Join(dir, "kernels.cu"))
		require.NoError(t, err)
		require.Equal(t, c.host, strings.Contains(string(src), "// kiln host:"), "%s: host functions in kernels.cu", c.pipeline)
		// The executable's host side too: step.cu (which includes
		// kernels.cu) and the runtime.
		files, err := out.Executable(0)
		require.NoError(t, err)
		for name, b := range files {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
		}
		flags := []string{"-x", "cuda", "-nocudainc", "-nocudalib", "--cuda-gpu-arch=" + cuda.Arch, "-fsyntax-only", "-Werror", "-Wno-unknown-cuda-version"}
		if out.Plan.Ranks > 1 || out.Plan.Stages > 1 {
			flags = append(flags, append([]string{"-DKILN_NCCL=1"}, mpiIncludes(t)...)...)
		}
		for _, name := range []string{"kernels.cu", "step.cu", "kiln_cuda_runtime.cu"} {
			cmd := exec.Command(clang, append(flags, filepath.Join(dir, name))...)
			outb, err := cmd.CombinedOutput()
			if err != nil {
				src, _ := os.ReadFile(filepath.Join(dir, name))
				if len(src) > 4000 {
					src = src[:4000]
				}
				t.Fatalf("%s: clang rejects %s: %v\n%s\n%s", c.model, name, err, outb, src)
			}
		}
	}
}

// TestSwapBudgetCountsWorkspace: the launch plan of a step swapped under
// a device budget in bytes keeps its arguments, arena and the kernels'
// workspace after it within the budget, for CNNs whose im2col kernels
// need workspace.
func TestSwapBudgetCountsWorkspace(t *testing.T) {
	for _, model := range []string{"../../testdata/models/small_cnn/model.onnx", "../../testdata/models/breadth/mobilenetish/model.onnx"} {
		m, err := onnx.ImportFile(model, onnx.Options{})
		require.NoError(t, err)
		passtest.Run(t, m, "autodiff,fuse,reorder")
		whole, err := swap.DeviceBytes(m.Funcs[0], loops.Workspace)
		require.NoError(t, err)
		budget := whole * 9 / 10
		passtest.Run(t, m, fmt.Sprintf("swap{device-budget=%d,params=false},assign", budget))
		out, err := cuda.Lower(m.Funcs[0], costmodel.Default)
		require.NoError(t, err)
		require.Positive(t, out.Plan.Workspace.SizeBytes, "%s: the plan has workspace", model)
		device := out.Plan.Arena.SizeBytes
		for _, b := range out.Plan.Buffers {
			if b.Space == "param" || b.Space == "input" {
				device += b.SizeBytes
			}
		}
		require.LessOrEqual(t, device, budget, "%s: arguments, arena and workspace (%d bytes) within the budget", model, out.Plan.Workspace.SizeBytes)
	}
}

// mpiIncludes are the -I flags of Open MPI's headers (mpicc says where).
func mpiIncludes(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("mpicc", "--showme:incdirs").Output()
	if err != nil {
		passtest.Missing(t, "mpicc is not installed (.ci/run installs libopenmpi-dev)")
	}
	var flags []string
	for _, d := range strings.Fields(string(out)) {
		flags = append(flags, "-I"+d)
	}
	return flags
}
