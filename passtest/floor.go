package passtest

import (
	"testing"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// OrderFloor runs f on args, and again with the rows of its argument
// named batch in reverse order, which changes no result mathematically
// (the step sums over its batch) but changes the order of every sum over
// the batch. It returns the first run's results and updated arguments,
// and the largest relative error between the two runs over the results
// and updated arguments: the floor of summation order, below which no
// step computing the same sums in another order can be expected to agree.
func OrderFloor(t testing.TB, f *ir.Func, args []*interp.Tensor, batch string) (res, updated []*interp.Tensor, floor float64) {
	t.Helper()
	res, updated, err := interp.RunWithUpdates(f, interp.CloneAll(args), interp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reversed := interp.CloneAll(args)
	found := false
	for i, a := range f.Args {
		if a.Name != batch || a.Type.Rank() == 0 || len(args[i].F) == 0 {
			continue
		}
		found = true
		x, n := reversed[i], int(a.Type.Shape[0])
		row := x.Len() / n
		for r := range n {
			copy(x.F[r*row:(r+1)*row], args[i].F[(n-1-r)*row:(n-r)*row])
		}
	}
	if !found {
		t.Fatalf("@%s has no floating argument %q", f.Name, batch)
	}
	otherRes, other, err := interp.RunWithUpdates(f, reversed, interp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range res {
		floor = max(floor, RelErr(otherRes[i], res[i]))
	}
	for i, a := range f.Args {
		if a.Arg.InOut {
			floor = max(floor, RelErr(other[i], updated[i]))
		}
	}
	return res, updated, floor
}
