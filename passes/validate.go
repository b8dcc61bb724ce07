package passes

import (
	"fmt"
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// validateRewrite runs each function of before and its namesake in m in
// the interpreter on the same random arguments and compares the results
// and updated arguments. The error model: a rewrite may reorder
// floating-point arithmetic, so a float result agrees when its normwise
// relative difference is at most 1e-4 (f32 and f64: thousands of
// roundings of 6e-8) or 1e-2 (16- and 8-bit floats: a few roundings of
// their unit), with NaNs in the same places; integers and bools agree
// exactly. A function whose signature changed cannot be run on the same
// arguments and is not compared; one the interpreter refuses to run on
// random arguments (an index drawn out of range) neither.
func validateRewrite(before []*ir.Func, m *ir.Module) error {
	for _, f := range before {
		g := m.Func(f.Name)
		if g == nil || Signature(f) != Signature(g) {
			continue
		}
		args := interp.RandomArgs(f, 1)
		want, wantFinal, err := interp.RunWithUpdates(f, interp.CloneAll(args), interp.Options{})
		if err != nil {
			continue
		}
		got, gotFinal, err := interp.RunWithUpdates(g, interp.CloneAll(args), interp.Options{})
		if err != nil {
			return fmt.Errorf("translation validation: @%s fails after the pass on arguments it ran on before: %v", f.Name, err)
		}
		for i := range want {
			if msg := disagree(want[i], got[i]); msg != "" {
				return fmt.Errorf("translation validation: result %s of @%s changed: %s", f.ResultName(i), f.Name, msg)
			}
		}
		for i, a := range f.Args {
			if a.Arg != nil && a.Arg.InOut {
				if msg := disagree(wantFinal[i], gotFinal[i]); msg != "" {
					return fmt.Errorf("translation validation: the update of %s in @%s changed: %s", a.Ref(), f.Name, msg)
				}
			}
		}
	}
	return nil
}

// disagree describes how got differs from want beyond validateRewrite's
// error model, or is "".
func disagree(want, got *interp.Tensor) string {
	if !want.Type.Equal(got.Type) {
		return fmt.Sprintf("%s became %s", want.Type, got.Type)
	}
	if !want.Type.DType.IsFloat() {
		for i := range want.I {
			if want.I[i] != got.I[i] {
				return fmt.Sprintf("element %d is %d, was %d", i, got.I[i], want.I[i])
			}
		}
		return ""
	}
	tol := 1e-4
	if want.Type.DType.Size() <= 2 {
		tol = 1e-2
	}
	var diff, norm float64
	for i := range want.F {
		w, g := want.F[i], got.F[i]
		switch {
		case math.IsNaN(w) || math.IsNaN(g):
			if math.IsNaN(w) != math.IsNaN(g) {
				return fmt.Sprintf("element %d is %g, was %g", i, g, w)
			}
		case math.IsInf(w, 0) || math.IsInf(g, 0):
			if w != g {
				return fmt.Sprintf("element %d is %g, was %g", i, g, w)
			}
		default:
			diff += (w - g) * (w - g)
			norm += w * w
		}
	}
	if d, n := math.Sqrt(diff), math.Sqrt(norm); d > tol*n && d > 0 {
		return fmt.Sprintf("normwise relative difference %.3g, above %g", d/math.Max(n, math.SmallestNonzeroFloat64), tol)
	}
	return ""
}
