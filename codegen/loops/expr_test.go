package loops_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
	"github.com/kiln-compiler/kiln/passtest"
)

// stageExprs calls fn for every expression the stages of steps read.
func stageExprs(steps []loops.Step, fn func(loops.Expr)) {
	var walk func(x loops.Expr)
	walk = func(x loops.Expr) {
		if x == nil {
			return
		}
		fn(x)
		for _, c := range loops.Children(x) {
			walk(c)
		}
	}
	for _, s := range steps {
		switch s := s.(type) {
		case *loops.Loop:
			stageExprs(s.Body, fn)
		case *loops.Stage:
			for _, x := range s.Index {
				walk(x)
			}
			walk(s.Value)
			walk(s.Guard)
			if s.Matmul != nil {
				walk(s.Matmul.A)
				walk(s.Matmul.B)
			}
		}
	}
}

// TestReshapedReadsStayLinear: a batch-norm gradient fused after a ReLU
// gradient reads the ReLU gradient through its [N, C, H·W] view. Each
// read of the ReLU gradient's operands then gets its 4-D index as
// divisions and remainders of the view's flat index; merged back, every
// load's offset is affine in the loop variables (no division or
// remainder anywhere in an index), as the unfused kernel's are. Split,
// the kernel ran 8x slower on ResNet-18's 56² layers.
func TestReshapedReadsStayLinear(t *testing.T) {
	src := `func @f(%g: f32[4,8,6,5], %r: f32[4,8,6,5], %x: f32[4,8,6,5], %s: f32[8], %m: f32[8], %i: f32[8]) -> (f32[4,8,6,5], f32[8], f32[8]) {
  %d = relu_grad(%g, %r) : f32[4,8,6,5]
  %dx, %ds, %db = batch_norm_grad(%d, %x, %s, %m, %i) : f32[4,8,6,5], f32[8], f32[8]
  return %dx, %ds, %db
}
`
	m := passtest.CheckPipeline(t, src, "fuse,assign", 0)
	p, err := loops.Lower(m.Funcs[0])
	require.NoError(t, err)
	require.Len(t, p.Kernels, 1)
	require.NotNil(t, p.Kernels[0].Op.Region, "relu_grad and batch_norm_grad fuse")
	loads := 0
	stageExprs(p.Kernels[0].Steps, func(x loops.Expr) {
		l, ok := x.(*loops.Load)
		if !ok {
			return
		}
		loads++
		for _, ix := range l.Index {
			stageExprs([]loops.Step{&loops.Stage{Value: ix}}, func(y loops.Expr) {
				if b, ok := y.(*loops.Binary); ok {
					require.NotContains(t, []scalar.Prim{scalar.Div, scalar.Rem}, b.Op, "a load of %s divides its index", l.Buf.Name)
				}
			})
		}
	})
	require.Greater(t, loads, 6)
}

// TestInvariantReduces: the search for a max-pool window's first maximum
// reads the window's maximum at every tap; that reduction reads none of
// the search's variables and is the one InvariantReduces finds. None is
// found under a Guarded's value, in a reduction over an empty domain, or
// where the inner reduction reads the outer one's variable.
func TestInvariantReduces(t *testing.T) {
	src := `func @f(%dy: f32[2,3,4,4], %x: f32[2,3,8,8]) -> (f32[2,3,8,8]) {
  %dx = max_pool2d_grad(%dy, %x) {kernel = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : f32[2,3,8,8]
  return %dx
}
`
	m := passtest.CheckPipeline(t, src, "assign", 0)
	p, err := loops.Lower(m.Funcs[0])
	require.NoError(t, err)
	var search *loops.Reduce
	stageExprs(p.Kernels[0].Steps, func(x loops.Expr) {
		if r, ok := x.(*loops.Reduce); ok && r.Op == scalar.Min {
			search = r
		}
	})
	require.NotNil(t, search, "the first-maximum search")
	inv := loops.InvariantReduces(search)
	require.Len(t, inv, 1)
	require.Equal(t, scalar.Max, inv[0].Op, "the window's maximum")

	v, w := &loops.Var{ID: 1}, &loops.Var{ID: 2}
	inner := &loops.Reduce{Op: scalar.Add, Vars: []*loops.Var{w}, Extents: []int64{3}, Body: &loops.Convert{To: loops.F64, X: w}, Acc: loops.F64}
	outer := func(body loops.Expr, n int64) *loops.Reduce {
		return &loops.Reduce{Op: scalar.Add, Vars: []*loops.Var{v}, Extents: []int64{n}, Body: body, Acc: loops.F64}
	}
	require.Equal(t, []*loops.Reduce{inner}, loops.InvariantReduces(outer(inner, 4)))
	require.Empty(t, loops.InvariantReduces(outer(inner, 0)), "an empty domain evaluates nothing")
	guarded := &loops.Guarded{Cond: &loops.Compare{Pred: scalar.Lt, A: v, B: loops.Int{V: 2}}, X: inner}
	require.Empty(t, loops.InvariantReduces(outer(guarded, 4)), "a guarded reduction runs only where its guard holds")
	reads := &loops.Reduce{Op: scalar.Add, Vars: []*loops.Var{w}, Extents: []int64{3}, Body: &loops.Convert{To: loops.F64, X: &loops.Binary{Op: scalar.Add, A: v, B: w}}, Acc: loops.F64}
	require.Empty(t, loops.InvariantReduces(outer(reads, 4)), "it reads the outer variable")
	// Σv (v + Σw (w + Σu (w + u))): the innermost reads the middle one's
	// variable, which is bound only inside it.
	u := &loops.Var{ID: 3}
	innermost := &loops.Reduce{Op: scalar.Add, Vars: []*loops.Var{u}, Extents: []int64{2}, Body: &loops.Convert{To: loops.F64, X: &loops.Binary{Op: scalar.Add, A: w, B: u}}, Acc: loops.F64}
	middle := &loops.Reduce{Op: scalar.Add, Vars: []*loops.Var{w}, Extents: []int64{3}, Acc: loops.F64,
		Body: &loops.Binary{Op: scalar.Add, A: &loops.Convert{To: loops.F64, X: &loops.Binary{Op: scalar.Add, A: v, B: w}}, B: innermost}}
	require.Empty(t, loops.InvariantReduces(outer(middle, 4)), "a reduction inside one that reads the outer variable")
	// A guarded load's index may be computed only where the guard holds.
	buf := &loops.Buffer{Name: "b", Type: ir.TensorOf(ir.F64, 8)}
	load := &loops.Load{Buf: buf, Index: []loops.Expr{&loops.Convert{To: loops.I64, X: inner}}, Guard: &loops.Compare{Pred: scalar.Lt, A: v, B: loops.Int{V: 2}}}
	require.Empty(t, loops.InvariantReduces(outer(load, 4)), "a reduction in a guarded load's index")
}

// TestNarrowWeightGradsByBackend: a weight gradient of 16 output channels
// and 72 taps over the batch is dw = DY · colᵀ (rows: the 16 channels)
// by default, as the CUDA backend's cuBLAS calls expect, and dwᵀ = col ·
// DYᵀ (rows: the 72 taps) where the backend asks for it. Either way its
// whole batch's im2col (1.8 MiB) fits the default bound, so it is one
// product over all 32 · 196 positions, not chunks of images.
func TestNarrowWeightGradsByBackend(t *testing.T) {
	src := `func @f(%dy: f32[32,16,14,14], %x: f32[32,8,14,14]) -> (f32[16,8,3,3]) {
  %dw = conv2d_grad_weight(%dy, %x) {pads = [1, 1, 1, 1], weight_shape = [16, 8, 3, 3]} : f32[16,8,3,3]
  return %dw
}
`
	for _, c := range []struct {
		opts loops.Options
		rows int64
	}{{loops.Options{}, 16}, {loops.Options{Im2colBytes: 8 << 20, TransposeNarrowWeightGrads: true}, 72}} {
		m := passtest.CheckPipeline(t, src, "assign", 0)
		p, err := loops.LowerWith(m.Funcs[0], c.opts)
		require.NoError(t, err)
		var rows []int64
		var find func([]loops.Step)
		find = func(steps []loops.Step) {
			for _, s := range steps {
				switch s := s.(type) {
				case *loops.Loop:
					find(s.Body)
				case *loops.Stage:
					if s.Matmul != nil {
						rows = append(rows, s.Extents[0])
						require.Equal(t, int64(32*196), s.Matmul.Extent, "one product over the batch")
					}
				}
			}
		}
		find(p.Kernels[0].Steps)
		require.Equal(t, []int64{c.rows}, rows, "%+v", c.opts)
	}
}

// TestConvTapsByBackend: with Options.ConvPanels a convolution whose
// columns are read at stride 1 (or 2, from an f32 buffer), with 4 or
// more output channels per group
// and f32 (or narrower) values, and the input gradient of one of stride
// 1, are one product over the batch whose B is restated as Taps (and
// store no im2col); without the option, and for strides, f64 values or
// fewer output channels, the im2col stays.
func TestConvTapsByBackend(t *testing.T) {
	for _, c := range []struct {
		name, src string
		taps      bool
		cols      int64
	}{
		{"3x3", `func @f(%x: f32[4,8,10,10], %w: f32[16,8,3,3]) -> (f32[4,16,10,10]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f32[4,16,10,10]
  return %y
}
`, true, 400},
		{"row stride", `func @f(%x: f32[4,8,10,10], %w: f32[16,8,3,3]) -> (f32[4,16,5,10]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1], strides = [2, 1]} : f32[4,16,5,10]
  return %y
}
`, true, 200},
		{"column stride 2", `func @f(%x: f32[4,8,10,10], %w: f32[16,8,3,3]) -> (f32[4,16,10,5]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1], strides = [1, 2]} : f32[4,16,10,5]
  return %y
}
`, true, 200},
		{"column stride 2, bf16", `func @f(%x: bf16[4,8,10,10], %w: bf16[16,8,3,3]) -> (bf16[4,16,10,5]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1], strides = [1, 2]} : bf16[4,16,10,5]
  return %y
}
`, false, 0},
		{"column stride 3", `func @f(%x: f32[4,8,10,10], %w: f32[16,8,3,3]) -> (f32[4,16,10,4]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1], strides = [1, 3]} : f32[4,16,10,4]
  return %y
}
`, false, 0},
		{"f64", `func @f(%x: f64[4,8,10,10], %w: f64[16,8,3,3]) -> (f64[4,16,10,10]) {
  %y = conv2d(%x, %w) {pads = [1, 1, 1, 1]} : f64[4,16,10,10]
  return %y
}
`, false, 0},
		{"depthwise", `func @f(%x: f32[4,8,10,10], %w: f32[8,1,3,3]) -> (f32[4,8,10,10]) {
  %y = conv2d(%x, %w) {groups = 8, pads = [1, 1, 1, 1]} : f32[4,8,10,10]
  return %y
}
`, false, 0},
		{"input gradient", `func @f(%dy: f32[4,16,10,10], %w: f32[16,8,3,3]) -> (f32[4,8,10,10]) {
  %dx = conv2d_grad_input(%dy, %w) {input_shape = [4, 8, 10, 10], pads = [1, 1, 1, 1]} : f32[4,8,10,10]
  return %dx
}
`, true, 400},
		{"input gradient, f64", `func @f(%dy: f64[4,16,10,10], %w: f64[16,8,3,3]) -> (f64[4,8,10,10]) {
  %dx = conv2d_grad_input(%dy, %w) {input_shape = [4, 8, 10, 10], pads = [1, 1, 1, 1]} : f64[4,8,10,10]
  return %dx
}
`, false, 0},
		{"input gradient, 2 input channels per group", `func @f(%dy: f32[4,16,10,10], %w: f32[16,2,3,3]) -> (f32[4,8,10,10]) {
  %dx = conv2d_grad_input(%dy, %w) {input_shape = [4, 8, 10, 10], groups = 4, pads = [1, 1, 1, 1]} : f32[4,8,10,10]
  return %dx
}
`, false, 0},
		{"input gradient, row stride", `func @f(%dy: f32[4,16,5,10], %w: f32[16,8,3,3]) -> (f32[4,8,10,10]) {
  %dx = conv2d_grad_input(%dy, %w) {input_shape = [4, 8, 10, 10], pads = [1, 1, 1, 1], strides = [2, 1]} : f32[4,8,10,10]
  return %dx
}
`, false, 0},
	} {
		for _, on := range []bool{false, true} {
			m := passtest.CheckPipeline(t, c.src, "assign", 0)
			p, err := loops.LowerWith(m.Funcs[0], loops.Options{ConvPanels: on})
			require.NoError(t, err)
			k := p.Kernels[0]
			taps := 0
			var find func([]loops.Step)
			find = func(steps []loops.Step) {
				for _, s := range steps {
					switch s := s.(type) {
					case *loops.Loop:
						find(s.Body)
					case *loops.Stage:
						if s.Matmul != nil && s.Matmul.Taps != nil {
							taps++
							require.Equal(t, c.cols, s.Extents[1], "%s: one product over the batch", c.name)
						}
					}
				}
			}
			find(k.Steps)
			want := c.taps && on
			require.Equal(t, want, taps == 1, "%s, ConvPanels %v: product read under the taps", c.name, on)
			cols := 0
			for _, b := range k.Temps {
				if strings.HasPrefix(b.Name, "col") {
					cols++
				}
			}
			require.Equal(t, !want, cols > 0, "%s, ConvPanels %v: an im2col stored", c.name, on)
		}
	}
}
