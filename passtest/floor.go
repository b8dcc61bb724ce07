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
			floors.Updates[i] = UpdateErr(other[i], updated[i], args[i])
		}
	}
	return res, updated, floors
}

// UpdateErr is the relative error (as RelErr) of the update got − initial
// against want − initial.
func UpdateErr(got, want, initial *interp.Tensor) float64 {
	num, den := 0.0, 0.0
	for i := 0; i < want.Len(); i++ {
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
