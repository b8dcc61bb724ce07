package llvm_test

import (
	"path/filepath"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// widen rewrites every f32 type of f (arguments, results, constants) to
// f64: the same computation without f32 rounding, a reference for how far
// the f32 interpreter itself is from the exact result.
func widen(f *ir.Func) {
	fix := func(t *ir.Type) {
		if t.DType == ir.F32 {
			t.DType = ir.F64
		}
	}
	for _, a := range f.Args {
		fix(&a.Type)
	}
	for _, op := range f.Body {
		for _, r := range op.Results {
			fix(&r.Type)
		}
		for _, at := range op.Attrs {
			if at.Kind == ir.AttrDense {
				fix(&at.Dense.Type)
			}
		}
	}
}

// BenchmarkTrainingStepNoiseFloor measures, on ResNet-50 training steps
// after -O2, how far apart three evaluations of the same step are: the
// interpreter (f32 storage, f64 accumulation), the same step widened to
// f64, and the compiled program (f32 accumulation). It reports the worst
// relative error over the gradients and how many exceed 1e-5. At 224x224
// even the interpreter is far from the f64 result: a ReLU input or a max-
// pool window within rounding of a tie decides differently, and every
// gradient below it moves.
//
//	go test ./codegen/llvm -run '^$' -bench NoiseFloor -benchtime 1x
func BenchmarkTrainingStepNoiseFloor(b *testing.B) {
	if _, err := llvm.Clang(); err != nil {
		b.Skip(err)
	}
	for _, c := range []struct {
		name, path string
		batch      int64
	}{
		{"resnet50_ci (64x64, batch 2)", "ci/resnet50_ci.onnx", 0},
		{"resnet50 (224x224, batch 2)", "resnet50.onnx", 2},
	} {
		load := func(pipeline string) *ir.Func {
			m, err := onnx.ImportFile(filepath.Join("../../testdata/models", c.path), onnx.Options{Batch: c.batch})
			require.NoError(b, err)
			weightOutput(b, m.Funcs[0])
			pipelineOn(b, m, pipeline)
			return m.Funcs[0]
		}
		f := load("autodiff," + o2)
		args := scaledArgs(f, 11)
		f32, err := interp.Run(f, cloneAll(args), interp.Options{})
		require.NoError(b, err)
		g := load("autodiff") // unfused: kernel regions keep their f32 types
		widen(g)
		require.NoError(b, ir.Verify(&ir.Module{Funcs: []*ir.Func{g}}))
		wide := make([]*interp.Tensor, len(args))
		for i, a := range args {
			wide[i] = interp.New(g.Args[i].Type)
			copy(wide[i].F, a.F)
			copy(wide[i].I, a.I)
		}
		f64, err := interp.Run(g, wide, interp.Options{})
		require.NoError(b, err)
		p, err := llvm.Lower(f)
		require.NoError(b, err)
		compiled, _, err := llvm.Run(p, args)
		require.NoError(b, err)
		compare := func(x, y []*interp.Tensor) (worst float64, over int) {
			for i := range y {
				if maxAbs(y[i]) < 1e-5 {
					continue // a mathematically zero gradient (a bias before batch norm)
				}
				e := passtest.RelErr(x[i], y[i])
				worst = max(worst, e)
				if e > 1e-5 {
					over++
				}
			}
			return worst, over
		}
		w1, n1 := compare(f32, f64)
		w2, n2 := compare(compiled, f32)
		w3, n3 := compare(compiled, f64)
		b.Logf("%s, %d results: interpreter vs f64 %.2g (%d over 1e-5); compiled vs interpreter %.2g (%d); compiled vs f64 %.2g (%d)",
			c.name, len(f64), w1, n1, w2, n2, w3, n3)
	}
}
