package optest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// use is one instance placed in a combined function: where its operands
// and results are.
type use struct {
	inst    instance
	op      *ir.Op
	args    []int // the function arguments that are its operands
	results []int // the function results that are its results
	written []int // arguments it updates in place (their final values are its results)
}

// combine builds one function that computes every instance from
// arguments of its own, so that one compilation covers them all.
func combine(name string, insts []instance) (*ir.Func, []use, error) {
	f := &ir.Func{Name: name}
	var uses []use
	for k, in := range insts {
		d := ir.Lookup(in.op)
		u := use{inst: in}
		var operands []*ir.Value
		for j, t := range in.in {
			a := &ir.Value{Name: fmt.Sprintf("i%d.a%d", k, j), Type: t, Index: len(f.Args), Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
			for _, w := range d.Writes {
				if w == j {
					a.Arg.Kind, a.Arg.InOut = ir.ArgParam, true
					u.written = append(u.written, len(f.Args))
				}
			}
			u.args = append(u.args, len(f.Args))
			f.Args = append(f.Args, a)
			operands = append(operands, a)
		}
		kind := in.op
		if kind == "swap_in" {
			kind = "swap_out" // swap_in reads what swap_out wrote
		}
		op, err := f.NewOp(kind, operands, in.attrs, ir.Location{}, fmt.Sprintf("i%d.r", k))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %v", in, err)
		}
		f.Body = append(f.Body, op)
		if kind == "swap_out" {
			back, err := f.NewOp("swap_in", op.Results, nil, ir.Location{}, fmt.Sprintf("i%d.back", k))
			if err != nil {
				return nil, nil, err
			}
			f.Body = append(f.Body, back)
			op = back
		}
		u.op = op
		for _, r := range op.Results {
			u.results = append(u.results, len(f.Results))
			f.Results = append(f.Results, ir.Result{Name: r.Name, Value: r})
		}
		uses = append(uses, u)
	}
	return f, uses, ir.Verify(&ir.Module{Funcs: []*ir.Func{f}})
}

// Edge values every float operand starts with: signed zeros, infinities
// and NaN, the extremes of f32 and values past them, tiny and subnormal
// values, integers that float-to-int casts saturate on, large logits.
var edgeFloats = []float64{
	math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1, -1, 0.5, -0.5, 2, -3, 3, 6, -6,
	3.4e38, -3.4e38, 1e30, -1e30, 1e20, 1e-30, -1e-30, 1e-40, -1e-44, 1e-310,
	3e9, -3e9, 2147483648, -2147483649, 9.3e18, -9.3e18, 128.5, -129.5,
	88.7, -88.7, 100, -100, 1e5, -1e5, 1e9, 20, -20, 0.1, -0.1, 1e-4, 7.5, -7.5,
}

// Edge values of integer operands: zero, ±1, the extremes of every width.
var edgeInts = []int64{0, 1, -1, 2, -2, 7, -7, 127, -128, 255, 2147483647, -2147483648, 4294967296,
	math.MaxInt64, math.MinInt64, 3, -3, 1 << 53, 1<<53 + 1, 100, -100, 31, 63, 64}

// inputs draws the arguments of f: with edge set, float and integer
// arguments begin with the edge values (so that a [n,1] by [1,n] pair
// meets every pair of them) and continue with normal(0, 1) or small
// integers; index operands stay within their dimension. Large instances
// get rows of large logits.
func inputs(f *ir.Func, uses []use, edge bool, seed uint64) []*interp.Tensor {
	rng := rand.New(rand.NewPCG(seed, 77))
	args := make([]*interp.Tensor, len(f.Args))
	for _, u := range uses {
		for _, i := range u.args {
			a := f.Args[i]
			t := interp.RandomTensor(f, a, rng)
			_, index := interp.IndexBound(f, a)
			switch {
			case u.inst.large && t.F != nil:
				for j := range t.F {
					t.F[j] = []float64{1e9, 1e9 - 64, 1e5, 1e5 + 1, 99999, -1e9, 0, 1e9 + 128}[j%8]
				}
			case edge && t.F != nil:
				copy(t.F, edgeFloats)
			case edge && t.I != nil && !index && a.Type.DType != ir.Bool:
				copy(t.I, edgeInts)
			}
			args[i] = t.Round()
		}
	}
	return args
}
