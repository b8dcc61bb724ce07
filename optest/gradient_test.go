package optest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes/autodiff"
)

// TestGradientsMatchFiniteDifferences differentiates every instance of
// every differentiable op, widened to f64: the loss is sum(result0 · w)
// for fixed random w, and the gradient of every float operand is compared
// with central differences (step h = 1e-6). Their error is about
// h²·|f”'|/6 from truncation plus ε·|f|/h ≈ 2e-10·|f| from rounding, so
// a relative error (over each gradient) of 1e-6 leaves two orders of
// magnitude. Inputs avoid the ops' singularities (log and sqrt of
// positive values, division by values away from 0).
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	checked := map[string]bool{}
	for k, in := range allInstances() {
		d := ir.Lookup(in.op)
		if d.Grad == ir.NoGrad || in.large {
			continue
		}
		in = widen(in)
		if in.in == nil {
			continue
		}
		fwd, params := gradFunc(t, in, uint64(k))
		if fwd == nil || len(params) == 0 {
			continue
		}
		checked[in.op] = true
		t.Run(fmt.Sprint(k, in), func(t *testing.T) {
			args := gradInputs(fwd, in, uint64(k))
			step := fwd.Clone()
			_, err := autodiff.Differentiate(step, "sum", false)
			require.NoError(t, err)
			got, err := interp.Run(step, args, interp.Options{})
			require.NoError(t, err)
			loss := func(args []*interp.Tensor) float64 {
				r, err := interp.Run(fwd, args, interp.Options{})
				require.NoError(t, err)
				s := 0.0
				for _, v := range r[0].F {
					s += v
				}
				return s
			}
			const h = 1e-6
			for gi, p := range params {
				g := got[1+gi]
				var num, den float64
				for j := range args[p].F {
					x := args[p].F[j]
					args[p].F[j] = x + h
					up := loss(args)
					args[p].F[j] = x - h
					down := loss(args)
					args[p].F[j] = x
					fd := (up - down) / (2 * h)
					num += (fd - g.F[j]) * (fd - g.F[j])
					den += fd * fd
				}
				if den == 0 {
					require.LessOrEqual(t, math.Sqrt(num), 1e-9, "gradient of %s", fwd.Args[p].Name)
					continue
				}
				require.LessOrEqual(t, math.Sqrt(num/den), 1e-6, "gradient of %s", fwd.Args[p].Name)
			}
		})
	}
	for _, name := range ir.OpNames() {
		if d := ir.Lookup(name); d.Grad != ir.NoGrad && !d.HasRegion && !checked[name] {
			t.Errorf("op %s is differentiable, but no instance checks its gradient", name)
		}
	}
}

// widen turns an instance's f32 operands into f64 (nil operands: the
// instance has no f64 form worth checking).
func widen(in instance) instance {
	out := in
	out.in = nil
	for _, t := range in.in {
		if t.DType.IsFloat() {
			t.DType = ir.F64
		}
		out.in = append(out.in, t)
	}
	if in.op == "cast" {
		to := in.attrs["to"].DType
		if !to.IsFloat() || to.Size() < 4 || !in.in[0].DType.IsFloat() {
			out.in = nil
		}
		out.attrs = ir.Attrs{"to": ir.TypeAttr(ir.F64)}
	}
	return out
}

// gradFunc builds f(args) = result0(args) · w with every float operand a
// param; it returns nil when result 0 is not a float.
func gradFunc(t *testing.T, in instance, seed uint64) (*ir.Func, []int) {
	f := &ir.Func{Name: "g"}
	var params []int
	var operands []*ir.Value
	for j, ty := range in.in {
		a := &ir.Value{Name: fmt.Sprintf("a%d", j), Type: ty, Index: j, Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
		if ty.DType.IsFloat() {
			a.Arg.Kind = ir.ArgParam
			params = append(params, j)
		}
		f.Args = append(f.Args, a)
		operands = append(operands, a)
	}
	op, err := f.NewOp(in.op, operands, in.attrs, ir.Location{}, "r")
	require.NoError(t, err, in.String())
	if len(op.Results) == 0 || !op.Results[0].Type.DType.IsFloat() {
		return nil, nil
	}
	w := interp.New(op.Results[0].Type)
	rng := rand.New(rand.NewPCG(seed, 3))
	for i := range w.F {
		w.F[i] = rng.NormFloat64()
	}
	c, err := f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(w.ToDense())}, ir.Location{}, "w")
	require.NoError(t, err)
	mul, err := f.NewOp("mul", []*ir.Value{op.Results[0], c.Results[0]}, nil, ir.Location{}, "weighted")
	require.NoError(t, err)
	f.Body = append(f.Body, op, c, mul)
	f.Results = []ir.Result{{Value: mul.Results[0]}}
	require.NoError(t, ir.Verify(&ir.Module{Funcs: []*ir.Func{f}}))
	return f, params
}

// gradInputs draws arguments, keeping operands inside the op's domain.
func gradInputs(f *ir.Func, in instance, seed uint64) []*interp.Tensor {
	args := interp.RandomArgs(f, seed)
	for j, a := range args {
		// asin, acos, atanh take |x| < 1 and acosh x > 1 (their _grad
		// ops read x as operand 1).
		switch {
		case slices.Contains([]string{"asin", "acos", "atanh"}, in.op) && j == 0,
			slices.Contains([]string{"asin_grad", "acos_grad", "atanh_grad"}, in.op) && j == 1:
			for i, v := range a.F {
				a.F[i] = 0.9 * math.Tanh(v)
			}
		case in.op == "acosh" && j == 0, in.op == "acosh_grad" && j == 1:
			for i, v := range a.F {
				a.F[i] = math.Abs(v) + 1.5
			}
		}
		positive := false
		switch in.op {
		case "log", "sqrt", "reciprocal", "log_grad", "sqrt_grad":
			positive = true
		case "pow":
			positive = j == 0
		case "div":
			positive = j == 1
		case "batch_norm_infer":
			positive = j == 4 // the variance
		}
		if positive {
			for i, v := range a.F {
				a.F[i] = math.Abs(v) + 0.5
			}
		}
	}
	return args
}
