package precision_test

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/microbatch"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	"github.com/kiln-compiler/kiln/passes/precision"
	"github.com/kiln-compiler/kiln/passtest"
)

// pipeline runs p, allowing the narrower saved values that p asks for by
// name (precision{saved=...}).
func pipeline(t *testing.T, m *ir.Module, p string) {
	passtest.RunAllowing(t, m, p, precision.BF16Saved, precision.F16Saved, precision.FP8Saved)
}

func cosine(a, b *interp.Tensor) float64 {
	dot, na, nb := 0.0, 0.0, 0.0
	for i := 0; i < a.Len(); i++ {
		dot += a.At(i) * b.At(i)
		na += a.At(i) * a.At(i)
		nb += b.At(i) * b.At(i)
	}
	if na == 0 && nb == 0 {
		return 1
	}
	return dot / math.Sqrt(na*nb)
}

// smallModel imports a small zoo model with its weights, makes its loss
// the sum of squared outputs (a plain sum of logits cancels, and its
// relative error would measure the cancellation) and runs p.
func smallModel(t *testing.T, dir, p string) (*ir.Func, []*interp.Tensor) {
	m, err := onnx.ImportFile(filepath.Join(dir, "model.onnx"), onnx.Options{})
	require.NoError(t, err)
	f := m.Funcs[0]
	out := f.Results[0].Value
	sq, err := f.NewOp("mul", []*ir.Value{out, out}, nil, ir.Location{}, "squared")
	require.NoError(t, err)
	f.Body = append(f.Body, sq)
	f.Results[0].Value = sq.Results[0]
	pipeline(t, m, p)
	args := make([]*interp.Tensor, len(f.Args))
	for i, a := range f.Args {
		if a.Arg.Kind == ir.ArgData {
			fh, err := os.Open(filepath.Join(dir, "input.npy"))
			require.NoError(t, err)
			args[i], err = npy.Read(fh)
			fh.Close()
			require.NoError(t, err)
		} else {
			args[i] = interp.FromDense(a.Arg.Init)
		}
	}
	return f, args
}

// TestMixedPrecisionAccuracy: on the small models with real weights, the
// bf16 and f16 steps give the f32 step's loss within 1e-2 and gradients
// within 5e-2 relative error with cosine similarity >= 0.999 (the
// target), and fp8 saved values stay within the bounds measured for
// them (TestSavedBF16Error derives the bound for bf16 saved values).
func TestMixedPrecisionAccuracy(t *testing.T) {
	dirs, _ := filepath.Glob("../../testdata/models/*/model.onnx")
	require.NotEmpty(t, dirs)
	for _, path := range dirs {
		dir := filepath.Dir(path)
		ref, args := smallModel(t, dir, "autodiff")
		want, err := interp.Run(ref, args, interp.Options{})
		require.NoError(t, err)
		for _, c := range []struct {
			p                  string
			loss, grad, cosine float64
		}{
			{"precision{dtype=bf16}", 1e-2, 5e-2, 0.999},
			{"precision{dtype=f16,loss-scale=1024}", 1e-2, 5e-2, 0.999},
			// fp8 e4m3 keeps 3 mantissa bits: a trade of accuracy for memory.
			{"precision{dtype=f32,saved=fp8}", 5e-2, 0.3, 0.95},
			{"precision{dtype=bf16,saved=fp8}", 5e-2, 0.3, 0.95},
			// f16 with fp8: the products that read the stored bytes make
			// x/scale (up to 448/max|x| times x) in f32, not f16.
			{"precision{dtype=f16,saved=fp8,loss-scale=1024}", 5e-2, 0.3, 0.95},
		} {
			p := c.p
			f, fargs := smallModel(t, dir, "autodiff,"+p)
			got, err := interp.Run(f, fargs, interp.Options{})
			require.NoError(t, err)
			name := filepath.Base(dir) + " " + p
			require.LessOrEqual(t, passtest.RelErr(got[0], want[0]), c.loss, "%s: loss", name)
			worstE, worstC := 0.0, 1.0
			for i := 1; i < len(want); i++ {
				if maxAbs(want[i]) < 1e-5 {
					continue // a mathematically zero gradient: rounding noise
				}
				e, cs := passtest.RelErr(got[i], want[i]), cosine(got[i], want[i])
				worstE, worstC = max(worstE, e), min(worstC, cs)
				require.LessOrEqual(t, e, c.grad, "%s: %s", name, f.ResultName(i))
				require.GreaterOrEqual(t, cs, c.cosine, "%s: %s", name, f.ResultName(i))
				require.Equal(t, want[i].Type, got[i].Type, "gradients stay f32")
			}
			t.Logf("%s: loss %.2e, worst gradient %.2e, cosine %.5f", name, passtest.RelErr(got[0], want[0]), worstE, worstC)
		}
	}
}

func maxAbs(x *interp.Tensor) float64 {
	m := 0.0
	for i := 0; i < x.Len(); i++ {
		m = max(m, math.Abs(x.At(i)))
	}
	return m
}

// TestDynamicLossScale: with f16 the default dynamic loss scale starts at
// 2^15, which overflows the small transformer's backward pass: that step
// reports grads.finite = false, leaves the parameters and momentum buffers as
// they were and halves the scale. Fed its own updated state, the step
// retries until the gradients are finite, then updates the parameters as
// the f32 step does (within the f16 tolerance) and counts a good step;
// with growth-interval=1 the next good step doubles the scale.
func TestDynamicLossScale(t *testing.T) {
	dir := "../../testdata/models/one_layer_transformer"
	ref, refArgs := smallModel(t, dir, "autodiff,optimizer{kind=momentum,lr=0.01,keep-grads=true}")
	want, wantArgs, err := interp.RunWithUpdates(ref, refArgs, interp.Options{})
	require.NoError(t, err)
	for _, c := range []struct {
		interval  int
		regrowths int
	}{{2000, 0}, {1, 1}} {
		f, args := smallModel(t, dir, fmt.Sprintf("autodiff,precision{dtype=f16,growth-interval=%d},optimizer{kind=momentum,lr=0.01,keep-grads=true}", c.interval))
		idx := map[string]int{}
		for i, a := range f.Args {
			idx[a.Name] = i
		}
		scaleAt, goodAt := idx["loss_scale"], idx["loss_scale.good"]
		finiteAt := len(f.Results) - 1
		require.Equal(t, precision.FiniteResult, f.ResultName(finiteAt))
		scale := 32768.0
		skipped := 0
		for step := 0; ; step++ {
			require.Less(t, step, 16, "the scale never got low enough")
			got, updated, err := interp.RunWithUpdates(f, args, interp.Options{})
			require.NoError(t, err)
			if got[finiteAt].I[0] == 0 {
				skipped++
				for i, a := range f.Args {
					if a.Arg.Kind == ir.ArgParam || strings.HasPrefix(a.Name, "momentum.") {
						require.Equal(t, args[i].F, updated[i].F, "skipped step changed %s", a.Name)
					}
				}
				require.Equal(t, scale/2, updated[scaleAt].F[0])
				require.Equal(t, 0.0, updated[goodAt].F[0])
				scale /= 2
				args = updated
				continue
			}
			for i := 1; i < len(want); i++ {
				require.Equal(t, ref.ResultName(i), f.ResultName(i))
				require.LessOrEqual(t, passtest.RelErr(got[i], want[i]), 5e-2, ref.ResultName(i))
			}
			for i, a := range ref.Args {
				if a.Arg.Kind == ir.ArgParam {
					require.LessOrEqual(t, passtest.RelErr(updated[idx[a.Name]], wantArgs[i]), 1e-2, a.Name)
				}
			}
			if c.interval == 1 {
				require.Equal(t, 2*scale, updated[scaleAt].F[0], "one good step doubles the scale")
				require.Equal(t, 0.0, updated[goodAt].F[0])
			} else {
				require.Equal(t, scale, updated[scaleAt].F[0])
				require.Equal(t, 1.0, updated[goodAt].F[0])
			}
			break
		}
		t.Logf("growth-interval %d: %d steps skipped, scale %g", c.interval, skipped, scale)
		require.Greater(t, skipped, 0, "2^15 overflows this model's f16 backward pass")
	}
}

// TestSavedBF16Error: narrowing the saved values alone to bf16 changes
// the step by exactly the sum of its parts.
//
// Error model: the step's gradients g are a smooth function of the saved
// values (the backward pass reads them through products, sums and
// normalisations). Rounding saved value s alone moves g by a measured
// e_s (the interpreter runs the pass's step with every other narrowing
// undone); rounding all of them moves it by the sum of those first-order
// terms plus second-order ones, so by at most Σ e_s + (Σ e_s)² (the
// triangle inequality, and a square for the products of two roundings
// that a normalisation's backward forms). With every narrowing undone the
// step must equal the f32 step exactly: the pass changes nothing else.
// Cosine similarity follows as sqrt(1 - bound²). The sum attributes the
// error: on small_cnn the stem weight's gradient, behind a batch-2 batch
// norm, takes most of its error from its bf16-saved input, which sits
// far from zero relative to its spread (x - mean loses the digits the
// two share).
func TestSavedBF16Error(t *testing.T) {
	checkSavedError(t, "autodiff,precision{dtype=f32,saved=bf16}", ir.BF16)
}

// TestSavedFP8Error: the same derivation for fp8 (e4m3, 3 mantissa bits,
// with a per-tensor scale). Undoing an fp8 narrowing leaves the scale's
// division and multiplication, two f32 roundings of each saved value, so
// the step with every narrowing undone equals the f32 step within f32
// rounding rather than exactly; that difference joins the bound.
func TestSavedFP8Error(t *testing.T) {
	checkSavedError(t, "autodiff,precision{dtype=f32,saved=fp8}", ir.F8E4M3)
}

// checkSavedError holds the small models' gradients under pipeline p,
// which narrows saved values to d, to the bound TestSavedBF16Error derives.
func checkSavedError(t *testing.T, p string, d ir.DType) {
	dirs, _ := filepath.Glob("../../testdata/models/*/model.onnx")
	require.NotEmpty(t, dirs)
	for _, path := range dirs {
		dir := filepath.Dir(path)
		ref, args := smallModel(t, dir, "autodiff")
		want, err := interp.Run(ref, args, interp.Options{})
		require.NoError(t, err)
		f, fargs := smallModel(t, dir, p)
		got, err := interp.Run(f, fargs, interp.Options{})
		require.NoError(t, err)
		saved := savedCasts(f)
		require.NotEmpty(t, saved, "no saved value narrowed")
		kept := precision.KeptByDesign(f)
		for _, op := range saved {
			require.Equal(t, d, op.Results[0].Type.DType, "%s", op.Results[0].Name)
			// Statistics keep f32 (as the low-precision step keeps them);
			// a constant is made again, not stored.
			x := op.Operands[0]
			require.NotEqual(t, "statistic", kept[x], "%s narrows a statistic", op.Results[0].Name)
			require.False(t, ir.IsConstant(x.Def), "%s narrows a constant", op.Results[0].Name)
		}
		run := func(keep int) []*interp.Tensor { // keep: the one narrowing left (-1: none)
			v, vargs := smallModel(t, dir, p)
			for k, op := range savedCasts(v) {
				if k != keep {
					undoNarrowing(v, op)
				}
			}
			require.NoError(t, ir.Verify(&ir.Module{Funcs: []*ir.Func{v}}))
			res, err := interp.Run(v, vargs, interp.Options{})
			require.NoError(t, err)
			return res
		}
		undone := run(-1)
		base := make([]float64, len(want)) // what undoing leaves: 0 for bf16
		for i, r := range undone {
			if d == ir.BF16 {
				require.Equal(t, want[i].F, r.F, "%s with every narrowing undone", f.ResultName(i))
				continue
			}
			if maxAbs(want[i]) < 1e-5 {
				continue // a mathematically zero gradient: rounding noise
			}
			base[i] = passtest.RelErr(r, want[i])
			require.LessOrEqual(t, base[i], 1e-4, "%s with every narrowing undone: f32 rounding of the scaled values", f.ResultName(i))
		}
		sum := make([]float64, len(want))
		for k := range saved {
			res := run(k)
			for i := range want {
				sum[i] += passtest.RelErr(res[i], want[i])
			}
		}
		for i := 1; i < len(want); i++ {
			if maxAbs(want[i]) < 1e-5 {
				continue // a mathematically zero gradient: rounding noise
			}
			bound := sum[i] + sum[i]*sum[i] + base[i]
			e, cs := passtest.RelErr(got[i], want[i]), cosine(got[i], want[i])
			name := filepath.Base(dir) + " " + f.ResultName(i)
			require.LessOrEqual(t, e, bound, "%s", name)
			require.GreaterOrEqual(t, cs, math.Sqrt(1-min(bound*bound, 1))-1e-9, "%s", name)
			if e > 1e-2 {
				t.Logf("%s: %.2e, bound %.2e from %d saved values", name, e, bound, len(saved))
			}
		}
	}
}

// savedCasts lists the ops by which the precision pass narrows a saved
// value (named NAME.saved: a cast, or for fp8 the division by the scale
// rounded to fp8), in body order.
func savedCasts(f *ir.Func) []*ir.Op {
	var out []*ir.Op
	for _, op := range f.Body {
		if (op.Kind == "cast" || op.Kind == "div") && strings.HasSuffix(op.Results[0].Name, ".saved") {
			out = append(out, op)
		}
	}
	return out
}

// undoNarrowing makes the narrowing op keep its operand's dtype.
func undoNarrowing(f *ir.Func, op *ir.Op) {
	from := op.Operands[0].Type.DType
	if op.Kind == "cast" {
		op.Attrs["to"] = ir.TypeAttr(from)
	} else {
		op.Attrs["result_dtype"] = ir.TypeAttr(from)
	}
	op.Results[0].Type.DType = from
}

// TestBF16ThenExactMicrobatch: a bf16 step with batch normalisation
// splits into microbatches that keep the whole batch's statistics (the
// decomposed batch norm reads the bf16 activation into its f32
// parameters' dtype, as the op does), and computes the unsplit bf16
// step's gradients within bf16 rounding (the decomposition sums in
// another order and rounds its f32 results once more each).
func TestBF16ThenExactMicrobatch(t *testing.T) {
	dir := "../../testdata/models/small_cnn"
	whole, args := smallModel(t, dir, "autodiff,precision{dtype=bf16}")
	want, err := interp.Run(whole, args, interp.Options{})
	require.NoError(t, err)
	split, sargs := smallModel(t, dir, "autodiff,precision{dtype=bf16},microbatch{n=2,exact-bn=true}")
	got, err := interp.Run(split, sargs, interp.Options{})
	require.NoError(t, err)
	for i := 1; i < len(want); i++ {
		if maxAbs(want[i]) < 1e-5 {
			continue // zero in exact arithmetic (a bias before batch norm): noise
		}
		require.LessOrEqual(t, passtest.RelErr(got[i], want[i]), 2e-2, "%s", whole.ResultName(i))
	}
}

// TestFP8ScaleOfZeroValueInF16: a saved value that is all zero has the
// smallest scale, not 0: in f16 the scale is computed in f32 (1e-30 and
// amax/448 underflow in f16), so the weight gradient read through it is 0,
// not NaN.
func TestFP8ScaleOfZeroValueInF16(t *testing.T) {
	m := passtest.Parse(t, `func @f(%x: f32[8,4], %w: f32[4,4] {param}) -> (f32[8,4]) {
  %zero = constant() {value = dense<f32[]: 0.0>} : f32[]
  %z = mul(%x, %zero) : f32[8,4]
  %h = tanh(%z) : f32[8,4]
  %y = matmul(%h, %w) : f32[8,4]
  return %y
}`)
	pipeline(t, m, "autodiff,precision{dtype=f16,saved=fp8,loss-scale=1}")
	f := m.Funcs[0]
	res, err := interp.Run(f, interp.RandomArgs(f, 3), interp.Options{})
	require.NoError(t, err)
	for i, r := range res {
		for k := 0; k < r.Len(); k++ {
			require.False(t, math.IsNaN(r.At(k)) || math.IsInf(r.At(k), 0), "%s[%d] = %v", f.ResultName(i), k, r.At(k))
		}
	}
	require.Equal(t, 0.0, maxAbs(res[1]), "grad.w of an all-zero activation")
}

// TestAccumulatorStaysF32: a step of an accumulator chain (an imported
// CumSum) stays f32 under bf16, also where it reads a parameter as it is.
func TestAccumulatorStaysF32(t *testing.T) {
	m := passtest.Parse(t, `func @f(%x: f32[4,8], %p: f32[4,8] {param}) -> (f32[4,8]) {
  %s = slice(%p) {axes = [1], starts = [0], ends = [7]} : f32[4,7]
  %sh = pad(%s) {pads = [0, 1, 0, 0], accumulator = true} : f32[4,8]
  %c = add(%p, %sh) {accumulator = true} : f32[4,8]
  %y = mul(%c, %x) : f32[4,8]
  return %y
}`)
	pipeline(t, m, "autodiff,precision{dtype=bf16}")
	for _, op := range m.Funcs[0].Body {
		if op.Results[0].Name == "c" {
			require.Equal(t, ir.F32, op.Results[0].Type.DType, "%s", op.Results[0].Name)
			return
		}
	}
	t.Fatal("no value named c")
}

// TestFP8ReadersComputeInTheirDType: a product that reads a value stored
// in fp8 computes it scaled (x/scale, up to 448/max|x| times x) before
// multiplying the scale back. A bf16 step computes that in bf16, which
// has f32's exponent range: an f32 copy beside the bf16 result would
// sit at the peak (it kept video_2plus1d at 0.391 of f32's float bytes
// there, 0.317 now). An f16 step computes it in f32, where f16 would
// overflow.
func TestFP8ReadersComputeInTheirDType(t *testing.T) {
	for _, c := range []struct {
		pipeline string
		low      ir.DType // the step's low dtype
		raw      ir.DType // what a reader with a result in it computes in
	}{
		{"autodiff,precision{dtype=bf16,saved=fp8}", ir.BF16, ir.BF16},
		{"autodiff,precision{dtype=f16,saved=fp8,loss-scale=1024}", ir.F16, ir.F32},
	} {
		f, _ := smallModel(t, "../../testdata/models/breadth/video_2plus1d", c.pipeline)
		low := 0
		for _, op := range f.Body {
			if op.Kind != "mul" || !strings.HasSuffix(op.Operands[0].Name, ".fp8") {
				continue
			}
			raw, res := op.Operands[0], op.Results[0]
			want := ir.F32 // an f32 result (a weight gradient) is computed in f32
			if res.Type.DType == c.low {
				want = c.raw
				low++
			}
			require.Equal(t, want, raw.Type.DType, "%s: %s for %s", c.pipeline, raw.Name, res.Name)
		}
		require.Positive(t, low, "%s: no product with a %s result reads a stored fp8 value", c.pipeline, c.low)
	}
}

// TestIntegerResultsKeepTheirDType: an op that makes an integer result of
// a function (a count returned beside a float result) is left as it is;
// only float results round once into their dtype.
func TestIntegerResultsKeepTheirDType(t *testing.T) {
	for _, dtype := range []string{"bf16", "f16"} {
		m := passtest.Parse(t, `func @f(%x: f32[4,8], %w: f32[8,2] {param}, %m: i64[2,4]) -> (y: f32[4,2], n: i64[]) {
  %y = matmul(%x, %w) : f32[4,2]
  %n = reduce_sum(%m) : i64[]
  return %y, %n
}`)
		pipeline(t, m, "precision{dtype="+dtype+"}")
		f := m.Funcs[0]
		n := f.Results[1].Value
		require.Equal(t, ir.I64, n.Type.DType)
		_, has := n.Def.Attrs["result_dtype"]
		require.False(t, has, "the integer sum takes no result_dtype")
		require.Equal(t, ir.F32, f.Results[0].Value.Type.DType, "the float result")
	}
}

// TestSavedConstantsAreNotNarrowed: a constant the backward pass reads
// (here the factor of a product) is made again, not stored: saved=fp8
// narrows the activations only.
func TestSavedConstantsAreNotNarrowed(t *testing.T) {
	m := passtest.Parse(t, `func @f(%x: f32[8,4], %w: f32[4,4] {param}) -> (f32[8,4]) {
  %c = constant() {value = dense<f32[8,4]: 0.5>} : f32[8,4]
  %h = matmul(%x, %w) : f32[8,4]
  %z = mul(%h, %c) : f32[8,4]
  %y = tanh(%z) : f32[8,4]
  return %y
}`)
	pipeline(t, m, "autodiff,precision{dtype=f32,saved=fp8}")
	saved := savedCasts(m.Funcs[0])
	require.NotEmpty(t, saved, "the activations are narrowed")
	for _, op := range saved {
		require.False(t, ir.IsConstant(op.Operands[0].Def), "%s narrows a constant", op.Results[0].Name)
	}
}
