package llvm_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/golden"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"

	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/fuse"
	_ "github.com/kiln-compiler/kiln/passes/reorder"
)

// sources returns every Kiln text in the repository's testdata: .kir
// files and the .kir files inside golden cases, by a name for the test.
func sources(t *testing.T) map[string]string {
	out := map[string]string{}
	root := "../../testdata"
	err := filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch {
		case strings.HasSuffix(path, ".kir"):
			out[rel] = string(data)
		case strings.HasSuffix(path, ".txtar"):
			for _, f := range golden.Parse(data).Files {
				if strings.HasSuffix(f.Name, ".kir") && !strings.HasPrefix(f.Name, "want/") {
					out[rel+"/"+f.Name] = string(f.Data)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// compileAndCompare runs every function of src through pipeline, the
// compiled program and the interpreter on the same random arguments, and
// compares results and updated arguments.
func compileAndCompare(t *testing.T, src, pipeline string, tol float64) {
	m, err := parser.Parse("in.kir", src)
	if err != nil || ir.Verify(m) != nil {
		t.Skip("not a valid module (an error case)")
	}
	for _, f := range m.Funcs {
		if liveness.CheckOffsets(f) != nil {
			t.Skip("an invalid buffer assignment (a checker error case)")
		}
	}
	pipelineOn(t, m, pipeline)
	for _, f := range m.Funcs {
		args := interp.RandomArgs(f, 7)
		want, wantFinal, err := interp.RunWithUpdates(f, cloneAll(args), interp.Options{})
		if err != nil {
			t.Logf("@%s: the interpreter rejects the random arguments: %v", f.Name, err)
			continue
		}
		p, err := llvm.Lower(f)
		require.NoError(t, err, "@%s", f.Name)
		got, gotFinal, err := llvm.Run(p, args)
		require.NoError(t, err, "@%s", f.Name)
		for i := range want {
			e := passtest.RelErr(got[i], want[i])
			require.True(t, e <= tol, "@%s result %d: relative error %g", f.Name, i, e)
		}
		for i := range wantFinal {
			e := passtest.RelErr(gotFinal[i], wantFinal[i])
			require.True(t, e <= tol, "@%s updated argument %s: relative error %g", f.Name, f.Args[i].Name, e)
		}
	}
}

func pipelineOn(t testing.TB, m *ir.Module, pipeline string) {
	pipe, err := passes.ParsePipeline(pipeline, nil)
	require.NoError(t, err)
	require.NoError(t, (&passes.Manager{Inst: passes.Instrumentation{VerifyEach: true}, Workspace: loops.Workspace}).Run(m, pipe))
}

func cloneAll(ts []*interp.Tensor) []*interp.Tensor {
	out := make([]*interp.Tensor, len(ts))
	for i, x := range ts {
		c := *x
		c.F = append([]float64(nil), x.F...)
		c.I = append([]int64(nil), x.I...)
		out[i] = &c
	}
	return out
}

func requireClang(t *testing.T) {
	if _, err := llvm.Clang(); err != nil {
		passtest.Missing(t, "%v", err)
	}
}

// TestTestdataCompiledMatchesInterpreter: every function in testdata,
// compiled at -O0 (assign only) and through fusion and reordering, gives
// the interpreter's results within 1e-5. The functions of one device that
// the interpreter runs in a moment are compiled together, as one program
// per pipeline (each a part of it with its own arguments and results);
// those of several ranks, and the large, one by one.
func TestTestdataCompiledMatchesInterpreter(t *testing.T) {
	requireClang(t)
	srcs := sources(t)
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	sort.Strings(names)
	pipes := []string{"assign", "fuse,reorder,assign"}
	if testing.Short() {
		// Op by op (assign alone) is what optest's differential matrix
		// covers; the fused kernels are this test's own.
		pipes = pipes[1:]
	}
	var small []*ir.Func
	var from []string
	for _, n := range names {
		m, ok := validModule(srcs[n])
		if !ok {
			continue
		}
		for _, f := range m.Funcs {
			switch {
			case len(f.Attrs) > 0 || len(m.Funcs) > 1:
				// Ranks, stages or an assignment of its own: alone, as written.
				for _, pipe := range pipes {
					t.Run(fmt.Sprintf("%s/%s", n, pipe), func(t *testing.T) {
						t.Parallel()
						compileAndCompare(t, srcs[n], pipe, 1e-5)
					})
				}
			case stepFLOPs(f) > 5e7 && testing.Short():
				// The interpreter alone takes seconds (a 4096² product):
				// the full run compares it.
			case interpRuns(f):
				small = append(small, f)
				from = append(from, n)
			}
		}
	}
	for _, pipe := range pipes {
		t.Run("together/"+pipe, func(t *testing.T) {
			t.Parallel()
			all, parts := joinFuncs(small)
			m := &ir.Module{Funcs: []*ir.Func{all}}
			pipelineOn(t, m, pipe)
			args := interp.RandomArgs(all, 7)
			want, wantFinal, err := interp.RunWithUpdates(all, cloneAll(args), interp.Options{})
			require.NoError(t, err)
			p, err := llvm.Lower(all)
			require.NoError(t, err)
			got, gotFinal, err := llvm.Run(p, args)
			require.NoError(t, err)
			for k, part := range parts {
				for _, i := range part.results {
					e := passtest.RelErr(got[i], want[i])
					require.True(t, e <= 1e-5, "%s @%s result %s: relative error %g", from[k], small[k].Name, all.ResultName(i), e)
				}
				for _, i := range part.args {
					e := passtest.RelErr(gotFinal[i], wantFinal[i])
					require.True(t, e <= 1e-5, "%s @%s updated argument %s: relative error %g", from[k], small[k].Name, all.Args[i].Name, e)
				}
			}
		})
	}
}

// validModule parses src, which must verify and carry valid offsets (the
// error cases of testdata do not).
func validModule(src string) (*ir.Module, bool) {
	m, err := parser.Parse("in.kir", src)
	if err != nil || ir.Verify(m) != nil {
		return nil, false
	}
	for _, f := range m.Funcs {
		if liveness.CheckOffsets(f) != nil {
			return nil, false
		}
	}
	return m, true
}

// stepFLOPs is the work of one run of f.
func stepFLOPs(f *ir.Func) int64 {
	var n int64
	for _, op := range f.Body {
		n += ir.OpCost(op).FLOPs
	}
	return n
}

// interpRuns reports whether the interpreter takes f's random arguments
// (an index drawn out of range is an error case).
func interpRuns(f *ir.Func) bool {
	_, _, err := interp.RunWithUpdates(f, interp.RandomArgs(f, 7), interp.Options{})
	return err == nil
}

// part is where one function lies in a joined one: its argument indices
// (those it updates in place) and its result indices.
type part struct{ args, results []int }

// joinFuncs is one function computing every function of fs side by side,
// each on arguments of its own (their values renamed apart), with their
// results in order.
func joinFuncs(fs []*ir.Func) (*ir.Func, []part) {
	all := &ir.Func{Name: "together"}
	var parts []part
	for k, f := range fs {
		g := f.Clone()
		prefix := fmt.Sprintf("f%d.", k)
		var p part
		for _, a := range g.Args {
			a.Name = prefix + a.Name
			a.Index = len(all.Args)
			a.Offset = ir.NoOffset
			if a.Arg.InOut {
				p.args = append(p.args, len(all.Args))
			}
			all.Args = append(all.Args, a)
		}
		g.Walk(func(op *ir.Op) {
			for _, r := range op.Results {
				r.Name = prefix + r.Name
				r.Offset = ir.NoOffset
			}
			if op.Region != nil {
				for _, a := range op.Region.Args {
					a.Name = prefix + a.Name
				}
			}
		})
		all.Body = append(all.Body, g.Body...)
		for _, r := range g.Results {
			p.results = append(p.results, len(all.Results))
			r.Name, r.Attrs = "", nil // roles name the parts' own arguments
			all.Results = append(all.Results, r)
		}
		parts = append(parts, p)
	}
	return all, parts
}

// TestDropoutGradientCompiled: the backward pass regenerates dropout's
// mask from its seed; compiled (alone and fused with its neighbours) it
// draws the mask the forward pass drew, as the interpreter does.
func TestDropoutGradientCompiled(t *testing.T) {
	requireClang(t)
	src := `func @f(%x: f32[6,37] {param}, %w: f32[6,37] {param}) -> (f32[]) {
  %a = mul(%x, %w) : f32[6,37]
  %d, %m = dropout(%a) {ratio = 0.4, seed = 9} : f32[6,37], bool[6,37]
  %t = tanh(%d) : f32[6,37]
  %s = reduce_sum(%t) : f32[]
  return %s
}
`
	for _, pipe := range []string{"autodiff,assign", "autodiff,fuse,reorder,assign"} {
		compileAndCompare(t, src, pipe, 1e-5)
	}
}

// TestSoftmaxLargeLogits: softmax and log_softmax of rows of large logits
// (1e5, 1e9; a squeezenet's logits reach such values). The lowering used
// to round max + log Σ to f32 before subtracting it: rows summed to
// 1.0015 at 1e5 and every output was 1.0 at 1e9. In f32 the result is
// exp((x - max) - log Σ) with x - max exact, so each output is within
// a few ulps of the interpreter's and every row sums to 1 within n ulps.
func TestSoftmaxLargeLogits(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%x: f32[3,4]) -> (f32[3,4], f32[3,4]) {
  %s = softmax(%x) : f32[3,4]
  %l = log_softmax(%x) : f32[3,4]
  return %s, %l
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	f := m.Funcs[0]
	x := interp.FromFloats(ir.TensorOf(ir.F32, 3, 4), []float64{1e5, 1e5 + 1, 1e5 - 1, 99990, 1e9, 1e9 - 64, 1e9 + 64, 0, -1e9, -1e9 + 128, 3, 2})
	want, err := interp.Run(f, []*interp.Tensor{x}, interp.Options{})
	require.NoError(t, err)
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	got, _, err := llvm.Run(p, []*interp.Tensor{x})
	require.NoError(t, err)
	for row := 0; row < 3; row++ {
		sum := 0.0
		for j := 0; j < 4; j++ {
			i := row*4 + j
			sum += got[0].F[i]
			require.InDelta(t, want[0].F[i], got[0].F[i], 1e-6, "softmax row %d", row)
			require.InDelta(t, want[1].F[i], got[1].F[i], 1e-6*math.Max(1, math.Abs(want[1].F[i])), "log_softmax row %d", row)
		}
		require.InDelta(t, 1, sum, 4*0x1p-23, "row %d sums to %g", row, sum)
	}
}

// TestIndexOutOfRangeIsAnError: an embedding index or a label outside its
// dimension is an error of the compiled program, as it is of the
// interpreter, and never a read outside a buffer. In-range indices
// (negative ones count from the end, unless the gather says negative =
// false) run normally.
func TestIndexOutOfRangeIsAnError(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%e: f32[5,3] {param}, %i: i64[4], %x: f32[4,6], %y: i64[4], %j: i64[2]) -> (f32[]) {
  %g = gather(%e, %i) {axis = 0} : f32[4,3]
  %k = gather(%e, %j) {axis = 0, negative = false} : f32[2,3]
  %gs = reduce_sum(%g) : f32[]
  %ks = reduce_sum(%k) : f32[]
  %s = add(%gs, %ks) : f32[]
  %l = softmax_cross_entropy(%x, %y) : f32[]
  %t = add(%s, %l) : f32[]
  return %t
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "autodiff,fuse,assign")
	f := m.Funcs[0]
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	e := interp.FromFloats(ir.TensorOf(ir.F32, 5, 3), []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	x := interp.FromFloats(ir.TensorOf(ir.F32, 4, 6), make([]float64, 24))
	ints := func(v ...int64) *interp.Tensor {
		return interp.FromInts(ir.TensorOf(ir.I64, int64(len(v))), v)
	}
	j := ints(4, 0)
	good := []*interp.Tensor{e, ints(0, 4, -1, 2), x, ints(0, 5, 3, 1), j}
	want, err := interp.Run(f, good, interp.Options{})
	require.NoError(t, err)
	exe, err := llvm.Compile(p, llvm.Options{})
	require.NoError(t, err)
	defer exe.Close()
	got, _, err := exe.Run(good, llvm.RunOptions{})
	require.NoError(t, err)
	require.InDelta(t, want[0].F[0], got[0].F[0], 1e-4)
	for _, bad := range [][]*interp.Tensor{
		{e, ints(0, 5, 1, 2), x, ints(0, 1, 2, 3), j},
		{e, ints(0, -6, 1, 2), x, ints(0, 1, 2, 3), j},
		{e, ints(0, 1, 1, 2), x, ints(0, 6, 2, 3), j},
		{e, ints(0, 1, 1, 2), x, ints(0, -1, 2, 3), j},
		{e, ints(0, 1, 1, 2), x, ints(0, 1, 2, 3), ints(-1, 0)},
		{e, ints(0, 1, 1, 2), x, ints(0, 1, 2, 3), ints(0, 5)},
	} {
		_, err := interp.Run(f, bad, interp.Options{})
		require.Error(t, err)
		_, _, err = exe.Run(bad, llvm.RunOptions{})
		require.ErrorContains(t, err, "index out of range")
	}
}

// TestOffloadedGradientsCompiled: a step whose finished gradients were
// offloaded to host memory by swap returns them from the program's host
// arena; they match the interpreter's within the f32 error model of the
// other compiled tests (1e-5).
func TestOffloadedGradientsCompiled(t *testing.T) {
	requireClang(t)
	raw, err := os.ReadFile("../../testdata/examples/wide.kir")
	require.NoError(t, err)
	wide := string(raw)
	compileAndCompare(t, wide, "autodiff,fuse,reorder,swap{device-budget=0.75,params=false},assign", 1e-5)
	m, err := parser.Parse("in.kir", wide)
	require.NoError(t, err)
	pipelineOn(t, m, "autodiff,fuse,reorder,swap{device-budget=0.75,params=false},assign")
	require.Contains(t, m.String(), "swap_out", "the gradients went to host memory")
}

// TestOffloadedParametersCompiled: a step with Adam whose parameters and
// moments swap moved to host memory runs its updates on the host (the
// program's params) and its forward and backward on swapped-in copies;
// results and updated arguments match the interpreter's. Error model:
// 1e-5 relative where the gradient is signal (the other compiled tests'
// f32 bound), and Adam moves an element whose gradient is rounding noise
// (|g| near eps = 1e-8, where m/(sqrt(v)+eps) swings between 0 and 1) by
// up to lr either way in either backend: with at most 1% of the elements
// such (12 of 16384 in w2 measured) and weights of unit size, that adds
// lr·sqrt(0.01·n)/sqrt(n) = 1e-3.
func TestOffloadedParametersCompiled(t *testing.T) {
	requireClang(t)
	raw, err := os.ReadFile("../../testdata/examples/wide.kir")
	require.NoError(t, err)
	const pipeline = "autodiff,optimizer{kind=adam,lr=0.01},fuse,reorder,swap{device-budget=0.3},assign"
	compileAndCompare(t, string(raw), pipeline, 1e-5+1e-3)
	m, err := parser.Parse("in.kir", string(raw))
	require.NoError(t, err)
	pipelineOn(t, m, pipeline)
	require.Contains(t, m.String(), "host = true", "the parameters went to host memory")
}

// TestHostInputsCompiled: a data input that swap left in host memory
// (inputs=true) is read through its copies by the compiled program too.
// Error model: f32 sums of up to 2048 terms, at most 2048·2⁻²⁴ ≈ 1.2e-4
// apart in another order; a copy that read the wrong memory would be off
// by O(1).
func TestHostInputsCompiled(t *testing.T) {
	requireClang(t)
	raw, err := os.ReadFile("../../testdata/steps/input_at_peak.kir")
	require.NoError(t, err)
	src := string(raw)
	const pipeline = "swap{device-budget=17408,peak=true,inputs=true},assign"
	compileAndCompare(t, src, pipeline, 2e-4)
	m, err := parser.Parse("in.kir", src)
	require.NoError(t, err)
	pipelineOn(t, m, pipeline)
	require.Contains(t, m.String(), "%x: f32[1024] {host = true}", "the input went to host memory")
}

// TestNarrowIntegersCompiled: u8, i16, u16 and u32 load with the right
// extension (zero for unsigned), compute in 64 bits and wrap when they
// are stored, in the interpreter and compiled alike: 250 + 10 is 4 in
// u8, 65535 > 1 holds in u16 (a sign-extending load would read -1), a
// u32 of 4e9 divides and converts to f32 as 4e9, and -3 in i16 stays -3.
func TestNarrowIntegersCompiled(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%a: u8[3], %b: i16[3], %c: u16[3], %d: u32[3]) -> (u8[3], i16[3], bool[3], u32[3], f32[3], u8[3]) {
  %k = constant() {value = dense<u8[3]: 10>} : u8[3]
  %s = add(%a, %k) : u8[3]
  %n = neg(%b) : i16[3]
  %one = constant() {value = dense<u16[3]: 1>} : u16[3]
  %g = gt(%c, %one) : bool[3]
  %two = constant() {value = dense<u32[3]: 2>} : u32[3]
  %h = div(%d, %two) : u32[3]
  %f = cast(%d) {to = f32} : f32[3]
  %w = cast(%b) {to = u8} : u8[3]
  return %s, %n, %g, %h, %f, %w
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "fuse,assign")
	f := m.Funcs[0]
	args := []*interp.Tensor{
		interp.FromInts(ir.TensorOf(ir.U8, 3), []int64{250, 0, 7}),
		interp.FromInts(ir.TensorOf(ir.I16, 3), []int64{-3, 32767, -32768}),
		interp.FromInts(ir.TensorOf(ir.U16, 3), []int64{65535, 1, 0}),
		interp.FromInts(ir.TensorOf(ir.U32, 3), []int64{4000000000, 7, 1}),
	}
	wantInts := [][]int64{{4, 10, 17}, {3, -32767, -32768}, {1, 0, 0}, {2000000000, 3, 0}, nil, {253, 255, 0}}
	interpreted, compiled := interpretedAndCompiled(t, f, args)
	for name, got := range map[string][]*interp.Tensor{"interpreter": interpreted, "compiled": compiled} {
		requireInts(t, name, wantInts, got)
		require.Equal(t, []float64{4e9, 7, 1}, got[4].F, "%s: u32 to f32", name)
	}
}

// requireInts holds each result with a want (nil: not checked here) to it.
func requireInts(t *testing.T, name string, want [][]int64, got []*interp.Tensor) {
	t.Helper()
	for i, w := range want {
		if w != nil {
			require.Equal(t, w, got[i].I, "%s: result %d", name, i)
		}
	}
}

// TestUint64Compiled: u64 keeps its 64 bits and reads them unsigned
// wherever that differs from i64, in the interpreter and compiled alike:
// with a = 2^64-2 (which i64 reads as -2), a / 3, a % 3, a > 1, max(a,
// 1), the maximum and minimum over a row, the conversion to f64 (2^64-2 rounds to
// 2^64) and a^2 (wrapping to 4); from f32, -5 saturates to 0 and 3e19 to
// 2^64-1; a u64 constant above 2^63 round-trips the text format.
func TestUint64Compiled(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%a: u64[3], %x: f32[3]) -> (u64[3], u64[3], bool[3], u64[3], u64[1], f64[3], u64[3], u64[3], u64[3], u64[1]) {
  %three = constant() {value = dense<u64[3]: 3>} : u64[3]
  %big = constant() {value = dense<u64[3]: 18446744073709551615>} : u64[3]
  %q = div(%a, %three) : u64[3]
  %r = mod(%a, %three) : u64[3]
  %one = constant() {value = dense<u64[3]: 1>} : u64[3]
  %g = gt(%a, %one) : bool[3]
  %mx = max(%a, %one) : u64[3]
  %rm = reduce_max(%a) {axes = [0], keepdims = true} : u64[1]
  %f = cast(%a) {to = f64} : f64[3]
  %two = constant() {value = dense<u64[3]: 2>} : u64[3]
  %p = pow(%a, %two) : u64[3]
  %c = cast(%x) {to = u64} : u64[3]
  %m = min(%a, %big) : u64[3]
  %rn = reduce_min(%a) {axes = [0], keepdims = true} : u64[1]
  return %q, %r, %g, %mx, %rm, %f, %p, %c, %m, %rn
}
`)
	require.NoError(t, err)
	require.Contains(t, m.String(), "dense<u64[3]: 18446744073709551615>")
	pipelineOn(t, m, "fuse,assign")
	f := m.Funcs[0]
	const top = -1 // 2^64-1 as int64 bits
	args := []*interp.Tensor{
		interp.FromInts(ir.TensorOf(ir.U64, 3), []int64{top - 1, 7, 0}),
		interp.FromFloats(ir.TensorOf(ir.F32, 3), []float64{-5, 3e19, 12.7}),
	}
	wantInts := [][]int64{
		{int64(uint64(1<<64-2) / 3), 2, 0},
		{int64(uint64(1<<64-2) % 3), 1, 0},
		{1, 1, 0},
		{top - 1, 7, 1},
		{top - 1},
		nil,
		{4, 49, 0},
		{0, top, 12},
		{top - 1, 7, 0},
		{0}, // i64 would read 2^64-2 as -2, the smallest
	}
	interpreted, compiled := interpretedAndCompiled(t, f, args)
	for name, got := range map[string][]*interp.Tensor{"interpreter": interpreted, "compiled": compiled} {
		requireInts(t, name, wantInts, got)
		require.Equal(t, []float64{0x1p64, 7, 0}, got[5].F, "%s: u64 to f64", name)
	}
}

// TestBoolReductionsCompiled: reduce_max of bools is any, reduce_min all,
// their folds starting from false and true.
func TestBoolReductionsCompiled(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%b: bool[3,4]) -> (bool[3], bool[3]) {
  %any = reduce_max(%b) {axes = [1]} : bool[3]
  %all = reduce_min(%b) {axes = [1]} : bool[3]
  return %any, %all
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	f := m.Funcs[0]
	b := interp.FromInts(ir.TensorOf(ir.Bool, 3, 4), []int64{0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1})
	interpreted, compiled := interpretedAndCompiled(t, f, []*interp.Tensor{b})
	for name, got := range map[string][]*interp.Tensor{"interpreter": interpreted, "compiled": compiled} {
		requireInts(t, name, [][]int64{{0, 1, 1}, {0, 0, 1}}, got)
	}
}

// TestFP8DivisionCompiled: a division whose result_dtype is fp8 (how
// precision{saved=fp8} stores a value by its scale) rounds as the f32
// division and a cast do, in the interpreter and compiled alike: both
// round the quotient to f32 first. On -1.9217348 / 0.007065201 rounding
// the f64 quotient straight to e4m3 gives -288 where the f32 one gives
// -256.
func TestFP8DivisionCompiled(t *testing.T) {
	requireClang(t)
	const n = 4096
	m, err := parser.Parse("in.kir", strings.ReplaceAll(`func @f(%x: f32[N], %s: f32[]) -> (f8e4m3[N], f8e4m3[N]) {
  %q = div(%x, %s) {result_dtype = f8e4m3} : f8e4m3[N]
  %d = div(%x, %s) : f32[N]
  %c = cast(%d) {to = f8e4m3} : f8e4m3[N]
  return %q, %c
}
`, "N", strconv.Itoa(n)))
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	f := m.Funcs[0]
	rng := rand.New(rand.NewPCG(3, 4))
	xs := make([]float64, n)
	xs[0] = float64(float32(-1.9217348))
	for i := 1; i < n; i++ {
		xs[i] = float64(float32(rng.NormFloat64() * 2))
	}
	args := []*interp.Tensor{interp.FromFloats(ir.TensorOf(ir.F32, n), xs), interp.FromFloats(ir.Type{DType: ir.F32, Shape: ir.Shape{}}, []float64{float64(float32(0.007065201))})}
	want, got := interpretedAndCompiled(t, f, args)
	require.Equal(t, -256.0, want[0].F[0])
	for name, r := range map[string][]*interp.Tensor{"interpreter": want, "compiled": got} {
		require.Equal(t, r[1].F, r[0].F, "%s: the fp8 division and the f32 division cast", name)
	}
	require.Equal(t, want[0].F, got[0].F, "interpreter and compiled")
}

// TestFP8CastsCompiled: casts to fp8 follow ONNX's Cast in the
// interpreter and in compiled code alike (compiled code failed with an
// internal error): e4m3 saturates at ±448 and, with saturate = false,
// gives NaN above 464 (where rounding would pass 448; 464 itself rounds to
// even, 448) and for infinities;
// e5m2 saturates at ±57344 and, with saturate = false, overflows to ±inf
// from 61440 (it rounds 59000 to 57344). NaN stays NaN; both round to
// nearest even (0.3 is 0.3125 in e4m3 and e5m2), and read back exactly.
func TestFP8CastsCompiled(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("in.kir", `func @f(%x: f32[8]) -> (f32[8], f32[8], f32[8], f32[8]) {
  %a = cast(%x) {to = f8e4m3} : f8e4m3[8]
  %b = cast(%x) {to = f8e4m3, saturate = false} : f8e4m3[8]
  %c = cast(%x) {to = f8e5m2} : f8e5m2[8]
  %d = cast(%x) {to = f8e5m2, saturate = false} : f8e5m2[8]
  %a32 = cast(%a) {to = f32} : f32[8]
  %b32 = cast(%b) {to = f32} : f32[8]
  %c32 = cast(%c) {to = f32} : f32[8]
  %d32 = cast(%d) {to = f32} : f32[8]
  return %a32, %b32, %c32, %d32
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "fuse,assign")
	f := m.Funcs[0]
	inf, nan := math.Inf(1), math.NaN()
	x := interp.FromFloats(ir.TensorOf(ir.F32, 8), []float64{1000, 464, 470, -inf, nan, 0.3, 59000, -70000})
	want := [][]float64{
		{448, 448, 448, -448, nan, 0.3125, 448, -448},
		{nan, 448, nan, nan, nan, 0.3125, nan, nan},
		{1024, 448, 448, -57344, nan, 0.3125, 57344, -57344},
		{1024, 448, 448, -inf, nan, 0.3125, 57344, -inf},
	}
	interpreted, err := interp.Run(f, []*interp.Tensor{x}, interp.Options{})
	require.NoError(t, err)
	p, err := llvm.Lower(f)
	require.NoError(t, err)
	compiled, _, err := llvm.Run(p, []*interp.Tensor{x})
	require.NoError(t, err)
	for name, got := range map[string][]*interp.Tensor{"interpreter": interpreted, "compiled": compiled} {
		for i, w := range want {
			for j := range w {
				if math.IsNaN(w[j]) {
					require.True(t, math.IsNaN(got[i].F[j]), "%s: result %d element %d is %g, want NaN", name, i, j, got[i].F[j])
				} else {
					require.Equal(t, w[j], got[i].F[j], "%s: result %d element %d", name, i, j)
				}
			}
		}
	}
	// Every f32 whose low 16 bits are 0, 0x8000 (ties of the narrower
	// formats' roundings sit at such bits) or 0x7fff: the compiled
	// conversions (runtime C) and the interpreter's (Go) agree bit for bit.
	if testing.Short() {
		return // model-scale: runs in the full suite
	}
	m, err = parser.Parse("in.kir", strings.ReplaceAll(`func @f(%x: f32[N]) -> (f32[N], f32[N], f32[N], f32[N]) {
  %a = cast(%x) {to = f8e4m3} : f8e4m3[N]
  %b = cast(%x) {to = f8e4m3, saturate = false} : f8e4m3[N]
  %c = cast(%x) {to = f8e5m2} : f8e5m2[N]
  %d = cast(%x) {to = f8e5m2, saturate = false} : f8e5m2[N]
  %a32 = cast(%a) {to = f32} : f32[N]
  %b32 = cast(%b) {to = f32} : f32[N]
  %c32 = cast(%c) {to = f32} : f32[N]
  %d32 = cast(%d) {to = f32} : f32[N]
  return %a32, %b32, %c32, %d32
}
`, "N", "196608"))
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	f = m.Funcs[0]
	all := interp.New(ir.TensorOf(ir.F32, 196608))
	for i := range 65536 {
		for j, low := range []uint32{0, 0x8000, 0x7fff} {
			all.F[3*i+j] = float64(math.Float32frombits(uint32(i)<<16 | low))
		}
	}
	interpreted, err = interp.Run(f, []*interp.Tensor{all}, interp.Options{})
	require.NoError(t, err)
	p, err = llvm.Lower(f)
	require.NoError(t, err)
	compiled, _, err = llvm.Run(p, []*interp.Tensor{all})
	require.NoError(t, err)
	for i := range interpreted {
		for j, w := range interpreted[i].F {
			if g := compiled[i].F[j]; !(g == w || math.IsNaN(g) && math.IsNaN(w)) || math.Signbit(g) != math.Signbit(w) && !math.IsNaN(w) {
				t.Fatalf("result %d, x = %g (bits %#x): compiled %g, interpreter %g", i, all.F[j], math.Float32bits(float32(all.F[j])), g, w)
			}
		}
	}
}
