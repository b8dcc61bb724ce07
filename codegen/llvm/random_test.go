package llvm_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// randomFunc builds a function of random ops on random shapes: unary and
// broadcasting binary ops, reductions, transposes, slices, concats,
// softmax and matmuls, returning a few of the values it made.
func randomFunc(rng *rand.Rand, n int) *ir.Func {
	f := &ir.Func{Name: fmt.Sprintf("r%d", n)}
	dims := []int64{1, 3, 4, 7, 16}
	shape := func() ir.Shape {
		s := make(ir.Shape, 1+rng.IntN(3))
		for i := range s {
			s[i] = dims[rng.IntN(len(dims))]
		}
		return s
	}
	var vals []*ir.Value
	for i := 0; i < 3; i++ {
		a := &ir.Value{Name: fmt.Sprintf("a%d", i), Type: ir.Type{DType: ir.F32, Shape: shape()}, Index: i, Arg: &ir.ArgInfo{Kind: ir.ArgData}, Offset: ir.NoOffset}
		f.Args = append(f.Args, a)
		vals = append(vals, a)
	}
	pick := func() *ir.Value { return vals[rng.IntN(len(vals))] }
	add := func(kind string, operands []*ir.Value, attrs ir.Attrs) {
		op, err := f.NewOp(kind, operands, attrs, ir.Location{}, "")
		if err != nil {
			return // the random choice does not type-check: skip it
		}
		f.Body = append(f.Body, op)
		vals = append(vals, op.Results...)
	}
	for len(f.Body) < 12 {
		x := pick()
		r := x.Type.Rank()
		choice := rng.IntN(9)
		if r == 0 {
			choice = rng.IntN(3) // a scalar: unary and binary ops only
		}
		switch choice {
		case 0:
			add([]string{"relu", "tanh", "sigmoid", "neg", "abs", "gelu", "silu"}[rng.IntN(7)], []*ir.Value{x}, nil)
		case 1, 2:
			add([]string{"add", "sub", "mul", "max", "min"}[rng.IntN(5)], []*ir.Value{x, pick()}, nil)
		case 3:
			add([]string{"reduce_sum", "reduce_mean", "reduce_max"}[rng.IntN(3)], []*ir.Value{x},
				ir.Attrs{"axes": ir.IntsAttr(int64(rng.IntN(r))), "keepdims": ir.BoolAttr(rng.IntN(2) == 0)})
		case 4:
			perm := rng.Perm(r)
			p := make([]int64, r)
			for i, v := range perm {
				p[i] = int64(v)
			}
			add("transpose", []*ir.Value{x}, ir.Attrs{"perm": ir.IntsAttr(p...)})
		case 5:
			ax := rng.IntN(r)
			d := x.Type.Shape[ax]
			add("slice", []*ir.Value{x}, ir.Attrs{"starts": ir.IntsAttr(d / 3), "ends": ir.IntsAttr(d), "axes": ir.IntsAttr(int64(ax))})
		case 6:
			add("concat", []*ir.Value{x, pick()}, ir.Attrs{"axis": ir.IntAttr(int64(rng.IntN(r)))})
		case 7:
			add("softmax", []*ir.Value{x}, ir.Attrs{"axis": ir.IntAttr(-1)})
		case 8:
			add("matmul", []*ir.Value{x, pick()}, nil)
		}
	}
	for i := 0; i < 3; i++ {
		v := f.Body[len(f.Body)-1-i].Results[0]
		f.Results = append(f.Results, ir.Result{Value: v})
	}
	return f
}

// TestRandomFunctionsCompiled: random functions, fused, reordered and
// assigned, compile and agree with the interpreter within 1e-5 (one
// program each; -short compiles its third of them side by side, as one).
func TestRandomFunctionsCompiled(t *testing.T) {
	t.Parallel()
	requireClang(t)
	rng := rand.New(rand.NewPCG(randomSeed, 2))
	var fs []*ir.Func
	for n := 0; n < randomFunctions; n++ {
		f := randomFunc(rng, n)
		require.NoError(t, ir.Verify(&ir.Module{Funcs: []*ir.Func{f}}), f.String())
		fs = append(fs, f)
	}
	if testing.Short() {
		all, _ := joinFuncs(fs[:randomFunctions/3]) // the same first functions as the full run
		fs = []*ir.Func{all}
	}
	for n, f := range fs {
		m := &ir.Module{Funcs: []*ir.Func{f}}
		pipelineOn(t, m, "fuse,reorder,assign")
		args := interp.RandomArgs(f, uint64(n))
		want, err := interp.Run(f, cloneAll(args), interp.Options{})
		require.NoError(t, err)
		p, err := llvm.Lower(f)
		require.NoError(t, err, m.String())
		got, _, err := llvm.Run(p, args)
		require.NoError(t, err, m.String())
		for i := range want {
			e := passtest.RelErr(got[i], want[i])
			require.True(t, e <= 1e-5, "result %s: relative error %g\n%s", f.ResultName(i), e, m.String())
		}
	}
}

// How many random functions CI compiles, from which seed (raise them by
// hand to search further).
var randomFunctions, randomSeed = 12, uint64(1)
