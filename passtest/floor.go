package passtest

import (
	"math"
	"testing"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Floors are the summation-order floors of a step, as relative errors
// (RelErr): one per result, and one per argument the step updates in place,
// of its update (updated − initial, see UpdateErr) rather than its updated
// value, which a small learning rate would make agree to any precision.
// An update's floor is never below the resolution of updated − initial
// (updateResolution).
type Floors struct {
	Results []float64
	Updates []float64 // by argument index; 0 for arguments not updated
}

// Max is the largest floor.
func (fl Floors) Max() float64 {
	m := 0.0
	for _, v := range append(append([]float64(nil), fl.Results...), fl.Updates...) {
		m = max(m, v)
	}
	return m
}

// OrderFloor runs f on args, and again with the rows of its argument
// named batch rotated by one, which changes no result mathematically
// (the step sums over its batch) but changes the order of every sum over
// the batch. It returns the first run's results and updated arguments,
// and each result's and update's relative error between the two runs: the
// floor of summation order, below which no step computing the same sums
// in another order can be expected to agree.
func OrderFloor(t testing.TB, f *ir.Func, args []*interp.Tensor, batch string) (res, updated []*interp.Tensor, floors Floors) {
	t.Helper()
	res, updated, err := interp.RunWithUpdates(f, interp.CloneAll(args), interp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Rotated, not reversed: a pairwise sum of 4 rows is the same sum
	// reversed, term for term.
	rotated := interp.CloneAll(args)
	found := false
	for i, a := range f.Args {
		if a.Name != batch || a.Type.Rank() == 0 || len(args[i].F) == 0 {
			continue
		}
		found = true
		x, n := rotated[i], int(a.Type.Shape[0])
		if n < 3 {
			// Two rows rotated are two rows reversed, and a sum of two
			// terms is the same in either order: no floor would show.
			t.Fatalf("@%s: %q has %d rows; the order floor needs 3 or more", f.Name, batch, n)
		}
		row := x.Len() / n
		for r := range n {
			src := (r + 1) % n
			copy(x.F[r*row:(r+1)*row], args[i].F[src*row:(src+1)*row])
		}
	}
	if !found {
		t.Fatalf("@%s has no floating argument %q", f.Name, batch)
	}
	otherRes, other, err := interp.RunWithUpdates(f, rotated, interp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	floors.Results = make([]float64, len(res))
	for i := range res {
		floors.Results[i] = RelErr(otherRes[i], res[i])
	}
	floors.Updates = make([]float64, len(f.Args))
	for i, a := range f.Args {
		if a.Arg.InOut {
			floors.Updates[i] = max(UpdateErr(other[i], updated[i], args[i]), updateResolution(updated[i], args[i]))
		}
	}
	return res, updated, floors
}

// updateResolution is the least relative error an update recovered as
// updated − initial can be known to: each updated value is rounded once,
// by up to 2⁻⁵³ of itself, so two orders' updates can differ by
// 2·2⁻⁵³·‖updated‖ / ‖update‖ however alike their sums were (a floor of
// 0 measured where the learning rate makes the update small says
// nothing).
func updateResolution(updated, initial *interp.Tensor) float64 {
	return resolution(updated, initial, 0x1p-53)
}

// resolution is 2·u·‖updated‖ / ‖updated − initial‖: two roundings of
// unit roundoff u of the updated values, relative to the update (0 when
// there is none).
func resolution(updated, initial *interp.Tensor, u float64) float64 {
	num, den := 0.0, 0.0
	for i := 0; i < updated.Len(); i++ {
		num += updated.At(i) * updated.At(i)
		d := updated.At(i) - initial.At(i)
		den += d * d
	}
	if den == 0 {
		return 0
	}
	return 2 * u * math.Sqrt(num/den)
}

// UpdateErr is the relative error (as RelErr, NaN in both places
// agreeing) of the update got − initial against want − initial.
func UpdateErr(got, want, initial *interp.Tensor) float64 {
	num, den := 0.0, 0.0
	for i := 0; i < want.Len(); i++ {
		if math.IsNaN(got.At(i)) && math.IsNaN(want.At(i)) {
			continue
		}
		d := got.At(i) - want.At(i)
		w := want.At(i) - initial.At(i)
		num += d * d
		den += w * w
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// OrderBound is the error allowed to a value computed with its sums in
// yet another order, given its floor: 10 times the floor (summation errors
// grow with the number of terms that change place, and two orders need not
// sit at the same distance from the exact sum), and never below 10 times
// ten f64 roundings (10·2⁻⁵³): a floor under that only says that the two
// orders happened to round alike, while a sum in a third order still moves
// by a few roundings, more where its terms cancel.
func OrderBound(floor float64) float64 {
	return 10 * max(floor, 10*0x1p-53)
}

// F32Bound is the error model of a program that accumulates in f32 (the
// CUDA kernels) against the interpreter (f32 storage, f64 accumulation):
// a sum of K terms in f32 errs by about sqrt(K)·u normwise when its
// rounding errors are independent (Higham and Mary, 2019), u = 2^-24;
// errors of successive reductions add, and every reduction of the step
// (contractions, sums, norms: an op computing more than one FLOP per
// output element, inside fused kernels too) is counted as if all lay on
// one path, with K the longest among them. Three times that allows for
// the constant of the probabilistic bound.
func F32Bound(f *ir.Func) float64 {
	depth, k := 0, int64(1)
	f.Walk(func(op *ir.Op) {
		if op.Region != nil || len(op.Results) == 0 {
			return
		}
		elems := op.Results[0].Type.NumElements()
		if elems == 0 {
			return
		}
		if n := ir.OpCost(op).FLOPs / (2 * elems); n > 1 {
			depth++
			k = max(k, n)
		}
	})
	return 3 * float64(depth) * math.Sqrt(float64(k)) * math.Ldexp(1, -24)
}

// F32Resolution is the relative error an update recovered as updated −
// initial carries when the updated value is computed in f32 (the
// program's arithmetic) rather than rounded once from f64 (the
// interpreter's): a rounding of each of the two f32 operations, 2·2^-24
// of ‖updated‖, against ‖update‖ (a small learning rate makes it large).
func F32Resolution(updated, initial *interp.Tensor) float64 {
	return resolution(updated, initial, 0x1p-24)
}
