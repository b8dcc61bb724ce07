package optest

import (
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
	"github.com/kiln-compiler/kiln/passes"
	_ "github.com/kiln-compiler/kiln/passes/assign"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestDifferential runs every instance on random inputs and on edge
// inputs (NaN, ±Inf, -0, huge, tiny and subnormal values, casts that
// overflow, large logits) three ways: the interpreter (the reference),
// constant folding, and code compiled by the LLVM backend. Folding must
// give the interpreter's bits. Compiled code must agree within the error
// model of the instance (errmodel_test.go for elementwise ops; see
// compare for the rest).
func TestDifferential(t *testing.T) {
	if _, err := exec.LookPath("clang-14"); err != nil {
		if _, err := exec.LookPath("clang"); err != nil {
			passtest.Missing(t, "clang is not installed (.ci/run installs clang-14)")
		}
	}
	insts := allInstances()
	f, uses, err := combine("ops", insts)
	require.NoError(t, err)
	type run struct {
		name                  string
		args, want, wantFinal []*interp.Tensor
	}
	var runs []run
	for _, mode := range []struct {
		name string
		edge bool
	}{{"random", false}, {"edge", true}} {
		args := inputs(f, uses, mode.edge, 1)
		want, wantFinal, err := interp.RunWithUpdates(f, cloneAll(args), interp.Options{})
		require.NoError(t, err, mode.name)
		runs = append(runs, run{mode.name, args, want, wantFinal})
	}
	// One program serves both modes: only the arguments differ.
	m := &ir.Module{Funcs: []*ir.Func{f}}
	pipe, err := passes.ParsePipeline("assign", nil)
	require.NoError(t, err)
	require.NoError(t, (&passes.Manager{}).Run(m, pipe))
	prog, err := llvm.Lower(f)
	require.NoError(t, err)
	exe, err := llvm.Compile(prog, llvm.Options{})
	require.NoError(t, err)
	defer exe.Close()
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			args, want, wantFinal := r.args, r.want, r.wantFinal
			checkFolding(t, uses, args, want)
			got, gotFinal, err := exe.Run(cloneAll(args), llvm.RunOptions{})
			require.NoError(t, err)

			disagreements := 0
			for _, u := range uses {
				for k, ri := range u.results {
					if msg := compare(u, args, want[ri], got[ri]); msg != "" {
						t.Errorf("%s result %d: %s", u.inst, k, msg)
						disagreements++
					}
				}
				for _, ai := range u.written {
					if msg := compare(u, args, wantFinal[ai], gotFinal[ai]); msg != "" {
						t.Errorf("%s updated %s: %s", u.inst, f.Args[ai].Ref(), msg)
						disagreements++
					}
				}
			}
			t.Logf("%d instances of %d ops, %d disagreements", len(uses), len(ir.OpNames()), disagreements)
		})
	}
}

// TestEveryOpCompilesToCUDA lowers every instance to a CUDA launch plan
// and checks kernels.cu with clang's CUDA front end (-Werror): the same
// loops as the LLVM backend, printed as CUDA C.
func TestEveryOpCompilesToCUDA(t *testing.T) {
	clang := ""
	for _, c := range []string{"clang-14", "clang"} {
		if p, err := exec.LookPath(c); err == nil {
			clang = p
			break
		}
	}
	if clang == "" {
		passtest.Missing(t, "clang is not installed (.ci/run installs clang-14)")
	}
	f, _, err := combine("ops", allInstances())
	require.NoError(t, err)
	m := &ir.Module{Funcs: []*ir.Func{f}}
	pipe, err := passes.ParsePipeline("assign", nil)
	require.NoError(t, err)
	require.NoError(t, (&passes.Manager{}).Run(m, pipe))
	out, err := cuda.Lower(f, costmodel.Default)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, cuda.Write(dir, out, m, nil, nil))
	cmd := exec.Command(clang, "-x", "cuda", "-nocudainc", "-nocudalib", "--cuda-gpu-arch="+cuda.Arch, "-fsyntax-only", "-Werror",
		"-Wno-unknown-cuda-version", filepath.Join(dir, "kernels.cu"))
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clang rejects kernels.cu: %v\n%s", err, msg)
	}
}

func cloneAll(ts []*interp.Tensor) []*interp.Tensor {
	out := make([]*interp.Tensor, len(ts))
	for i, x := range ts {
		out[i] = x.Clone()
	}
	return out
}

// checkFolding folds every pure instance whose operands are constants
// and requires the interpreter's result, bit for bit.
func checkFolding(t *testing.T, uses []use, args, want []*interp.Tensor) {
	canon := passes.Lookup("canonicalize")
	folded := 0
	for _, u := range uses {
		d := u.op.Def()
		if d.Impure || len(d.Writes) > 0 || len(u.results) != 1 || u.inst.op == "constant" || d.Host || u.inst.op == "swap_in" {
			continue
		}
		g := &ir.Func{Name: "fold"}
		var operands []*ir.Value
		for _, ai := range u.args {
			c, err := g.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(args[ai].ToDense())}, ir.Location{}, "c")
			require.NoError(t, err)
			g.Body = append(g.Body, c)
			operands = append(operands, c.Results[0])
		}
		op, err := g.NewOp(u.inst.op, operands, u.inst.attrs, ir.Location{}, "r")
		require.NoError(t, err)
		g.Body = append(g.Body, op)
		g.Results = []ir.Result{{Value: op.Results[0]}}
		ctx, err := passes.NewContext(canon, nil)
		require.NoError(t, err)
		require.NoError(t, canon.Run(ctx, &ir.Module{Funcs: []*ir.Func{g}}))
		def := g.Results[0].Value.Def
		if def == nil || def.Kind != "constant" {
			t.Errorf("%s: canonicalize did not fold it", u.inst)
			continue
		}
		got := interp.FromDense(def.Attr().Dense("value"))
		if msg := compareExact(want[u.results[0]], got); msg != "" {
			t.Errorf("%s: the fold differs from the interpreter: %s", u.inst, msg)
		}
		folded++
	}
	if folded == 0 {
		t.Error("nothing folded")
	}
}

// compare checks a compiled result c against the interpreter's r by the
// instance's error model. Integer and bool results are always exact.
//
//   - modelExact: bit for bit (any NaN matches any NaN).
//   - modelScalar: the running error analysis of errmodel_test.go.
//   - modelSum: a sum of k products, accumulated in the compute precision:
//     |c - r| <= (k+2)·u·s + 2·uo·|r|, where s is the op evaluated on the
//     absolute values of its float operands (Σ|terms|), the standard
//     bound of recursive summation. Where s passes the format's range the
//     compiled partial sums may overflow where float64's do not, and c may
//     also be non-finite.
//   - modelRelative: statistics computed in float64 and each element with
//     a few operations in the compute precision: ‖c - r‖ / ‖r‖ over the
//     finite elements at most 2^-16 in f32 (2^-40 in f64), the non-finite
//     elements identical.
func compare(u use, args []*interp.Tensor, r, c *interp.Tensor) string {
	if !r.Type.DType.IsFloat() || u.inst.model == modelExact {
		return compareExact(r, c)
	}
	p := f32
	for _, x := range append([]*interp.Tensor{r}, operandTensors(u, args)...) {
		if x.Type.DType == ir.F64 {
			p = f64
		}
	}
	uo := unitRoundoff(r.Type.DType)
	switch u.inst.model {
	case modelScalar:
		return compareScalar(u, args, r, c, p, uo)
	case modelSum:
		s := absEval(u, args)
		for i := range r.F {
			tol := float64(u.inst.k+2)*p.u*s.F[i] + 2*uo*math.Abs(r.F[i]) + p.tiny
			if sameClass(r.F[i], c.F[i]) && (math.IsInf(r.F[i], 0) || math.IsNaN(r.F[i])) {
				continue
			}
			if math.Abs(c.F[i]-r.F[i]) <= tol {
				continue
			}
			if s.F[i] > p.max && (math.IsInf(c.F[i], 0) || math.IsNaN(c.F[i])) {
				continue // f32 partial sums overflowed (stated above)
			}
			return fmt.Sprintf("element %d: compiled %g, interpreter %g, bound %g (Σ|terms| %g)", i, c.F[i], r.F[i], tol, s.F[i])
		}
		return ""
	}
	limit := 0x1p-16
	if p == f64 {
		limit = 0x1p-40
	}
	var num, den float64
	for i := range r.F {
		if math.IsInf(r.F[i], 0) || math.IsNaN(r.F[i]) {
			if !sameClass(r.F[i], c.F[i]) {
				return fmt.Sprintf("element %d: compiled %g, interpreter %g", i, c.F[i], r.F[i])
			}
			continue
		}
		d := c.F[i] - r.F[i]
		num += d * d
		den += r.F[i] * r.F[i]
	}
	if num > limit*limit*den {
		return fmt.Sprintf("relative error %g > %g", math.Sqrt(num/den), limit)
	}
	return ""
}

func operandTensors(u use, args []*interp.Tensor) []*interp.Tensor {
	out := make([]*interp.Tensor, len(u.args))
	for i, a := range u.args {
		out[i] = args[a]
	}
	return out
}

// compareScalar applies the running error analysis to every element.
// Ops without a Scalar record (dropout, random_uniform) compute one
// multiplication by a constant: their bound is 4·u·|r|.
func compareScalar(u use, args []*interp.Tensor, r, c *interp.Tensor, p precision, uo float64) string {
	d := u.op.Def()
	ins := operandTensors(u, args)
	var typed *scalar.Typed
	if d.Scalar != nil {
		types := make([]ir.Type, len(ins))
		kinds := make([]scalar.Kind, len(ins))
		for i, x := range ins {
			types[i], kinds[i] = x.Type, ir.KindOf(x.Type.DType)
		}
		var err error
		typed, err = scalar.Resolve(d.Scalar(u.op.Attr(), types, r.Type), kinds, ir.KindOf(r.Type.DType))
		if err != nil {
			return err.Error()
		}
	}
	idx := broadcastIndex(r.Type.Shape, ins)
	xs := make([]float64, len(ins))
	for i := range r.F {
		if typed == nil {
			if tol := 4*p.u*math.Abs(r.F[i]) + p.tiny; !(math.Abs(c.F[i]-r.F[i]) <= tol) && !sameClass(r.F[i], c.F[i]) {
				return fmt.Sprintf("element %d: compiled %g, interpreter %g", i, c.F[i], r.F[i])
			}
			continue
		}
		for k, x := range ins {
			xs[k] = x.At(int(idx(k, i)))
		}
		if r.F[i] == c.F[i] || math.IsNaN(r.F[i]) && math.IsNaN(c.F[i]) {
			continue
		}
		b := analyze(typed, xs, p)
		if b.flip != nil {
			b.e = math.Max(b.e, math.Abs(b.flip.v-b.v)+b.flip.e)
			b.nobnd = b.nobnd || b.flip.nobnd
		}
		if b.nobnd {
			if !sameClass(r.F[i], c.F[i]) || r.F[i] != c.F[i] && !math.IsNaN(r.F[i]) {
				return fmt.Sprintf("element %d (operands %v): compiled %g, interpreter %g, outside the error model: they must be equal", i, xs, c.F[i], r.F[i])
			}
			continue
		}
		tol := p.ref*b.e + 2*uo*math.Abs(r.F[i])
		if !(math.Abs(c.F[i]-r.F[i]) <= tol) {
			return fmt.Sprintf("element %d (operands %v): compiled %g, interpreter %g, bound %g", i, xs, c.F[i], r.F[i], tol)
		}
	}
	return ""
}

// broadcastIndex maps (operand k, result element i) to operand k's flat
// index under NumPy broadcasting.
func broadcastIndex(out ir.Shape, ins []*interp.Tensor) func(k, i int) int64 {
	strides := make([][]int64, len(ins))
	for k, x := range ins {
		s := x.Type.Shape
		st := make([]int64, len(out))
		own := s.Strides()
		off := len(out) - len(s)
		for d := range s {
			if s[d] != 1 {
				st[d+off] = own[d]
			}
		}
		strides[k] = st
	}
	return func(k, i int) int64 {
		flat, at := int64(i), int64(0)
		for d := len(out) - 1; d >= 0; d-- {
			at += (flat % out[d]) * strides[k][d]
			flat /= out[d]
		}
		return at
	}
}

// absEval runs the instance's op on the absolute values of its float
// operands (all but a routing operand: max_pool2d_grad's input decides
// where each gradient goes).
func absEval(u use, args []*interp.Tensor) *interp.Tensor {
	ins := operandTensors(u, args)
	abs := make([]*interp.Tensor, len(ins))
	for i, x := range ins {
		abs[i] = x.Clone()
		if u.inst.op == "max_pool2d_grad" && i == 1 {
			continue
		}
		for j, v := range abs[i].F {
			abs[i].F[j] = math.Abs(v)
		}
	}
	attrs := u.op.Attrs.Clone()
	for _, k := range []string{"alpha", "beta"} {
		if a, ok := attrs[k]; ok {
			attrs[k] = ir.FloatAttr(math.Abs(a.Float))
		}
	}
	op := &ir.Op{Kind: u.op.Kind, Operands: u.op.Operands, Results: u.op.Results, Attrs: attrs}
	if u.inst.op == "swap_in" {
		return abs[0]
	}
	if u.inst.op == "lerp_gather_grad" {
		return lerpGradTerms(u.op, ins)
	}
	out, err := interp.EvalOp(op, abs)
	if err != nil {
		panic(err)
	}
	return out[0]
}

// lerpGradTerms is Σ|terms| of lerp_gather_grad: each element of dy adds
// |dy − dy·w| ≤ |dy|·(1 + |w|) at lo and |dy·w| at hi.
func lerpGradTerms(op *ir.Op, in []*interp.Tensor) *interp.Tensor {
	dy, lo, hi, w := in[0], in[1], in[2], in[3]
	data := ir.Shape(op.Attr().Ints("data_shape"))
	s := interp.New(ir.Type{DType: dy.Type.DType, Shape: data})
	ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), len(data))
	outer, _ := data[:ax].NumElements()
	inner, _ := data[ax+1:].NumElements()
	d, n := data[ax], dy.Type.Shape[ax]
	for o := int64(0); o < outer; o++ {
		for k := int64(0); k < n; k++ {
			for i := int64(0); i < inner; i++ {
				g := math.Abs(dy.F[(o*n+k)*inner+i])
				s.F[(o*d+lo.I[k])*inner+i] += g * (1 + math.Abs(w.F[k]))
				s.F[(o*d+hi.I[k])*inner+i] += g * math.Abs(w.F[k])
			}
		}
	}
	return s
}

func unitRoundoff(d ir.DType) float64 {
	switch d {
	case ir.F64:
		return 0x1p-53
	case ir.F16:
		return 0x1p-11
	case ir.BF16:
		return 0x1p-8
	case ir.F8E4M3:
		return 0x1p-4
	case ir.F8E5M2:
		return 0x1p-3
	}
	return 0x1p-24
}

func sameClass(a, b float64) bool {
	switch {
	case math.IsNaN(a) || math.IsNaN(b):
		return math.IsNaN(a) && math.IsNaN(b)
	case math.IsInf(a, 0) || math.IsInf(b, 0):
		return a == b
	}
	return true
}

// compareExact requires the same values: bits for floats (any NaN
// matching any NaN, and -0 differing from 0), equality for the rest.
func compareExact(r, c *interp.Tensor) string {
	if !r.Type.Equal(c.Type) {
		return fmt.Sprintf("type %s, want %s", c.Type, r.Type)
	}
	var bad []string
	for i := range r.F {
		if math.Float64bits(r.F[i]) != math.Float64bits(c.F[i]) && !(math.IsNaN(r.F[i]) && math.IsNaN(c.F[i])) {
			bad = append(bad, fmt.Sprintf("element %d: %g, want %g", i, c.F[i], r.F[i]))
		}
	}
	for i := range r.I {
		if r.I[i] != c.I[i] {
			bad = append(bad, fmt.Sprintf("element %d: %d, want %d", i, c.I[i], r.I[i]))
		}
	}
	if len(bad) > 3 {
		bad = append(bad[:3], fmt.Sprintf("and %d more", len(bad)-3))
	}
	return strings.Join(bad, "; ")
}
