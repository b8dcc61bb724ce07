package planner_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/kiln-compiler/kiln/planner"
)

// edgeValues are the floats where rewrites that hold for real numbers
// fail for IEEE ones: signed zeros, infinities, NaN, tiny and huge values.
var edgeValues = []float64{0, math.Copysign(0, -1), 1, -1, 2, 0.5, math.Inf(1), math.Inf(-1), math.NaN(), 1e-30, -3e38}

// TestLevelsAgreeOnEdgeValues: 300 random elementwise graphs over
// constants and inputs drawn from edgeValues give bit for bit the same
// values (every one a result) at -O0 and -O2 (NaNs equal as NaNs): every rewrite of the
// -O2 pipeline (canonicalize, cse, fusion, reordering) keeps IEEE
// semantics, signed zeros included.
func TestLevelsAgreeOnEdgeValues(t *testing.T) {
	r := rand.New(rand.NewPCG(40, 1))
	binary := []string{"add", "sub", "mul", "div", "max", "min", "pow"}
	unary := []string{"neg", "relu", "abs", "exp", "tanh", "sqrt", "sigmoid", "log", "reciprocal", "floor", "ceil", "sign", "erf", "gelu", "softplus", "leaky_relu", "elu", "hard_sigmoid", "silu"}
	const n = 4
	ty := fmt.Sprintf("f32[%d]", n)
	for g := 0; g < 300; g++ {
		var b strings.Builder
		fmt.Fprintf(&b, "func @f(%%x: %s, %%y: %s) -> (%s) {\n", ty, ty, strings.TrimSuffix(strings.Repeat(ty+", ", 10), ", "))
		vals := []string{"%x", "%y"}
		for c, v := range edgeValues {
			if r.IntN(3) == 0 {
				lit := fmt.Sprintf("%g", v)
				switch {
				case math.IsNaN(v):
					lit = "nan"
				case math.IsInf(v, 1):
					lit = "inf"
				case math.IsInf(v, -1):
					lit = "-inf"
				case v == 0 && math.Signbit(v):
					lit = "-0.0"
				case !strings.ContainsAny(lit, ".e"):
					lit += ".0"
				}
				fmt.Fprintf(&b, "  %%c%d = constant() {value = dense<f32[]: %s>} : f32[]\n", c, lit)
				vals = append(vals, fmt.Sprintf("%%c%d", c))
			}
		}
		pick := func() string { return vals[r.IntN(len(vals))] }
		tensor := func(v string) bool { return !strings.HasPrefix(v, "%c") }
		pickTensor := func() string {
			for {
				if v := pick(); tensor(v) {
					return v
				}
			}
		}
		var made []string
		for i := 0; i < 10; i++ {
			name := fmt.Sprintf("%%v%d", i)
			if r.IntN(3) == 0 {
				fmt.Fprintf(&b, "  %s = %s(%s) : %s\n", name, unary[r.IntN(len(unary))], pickTensor(), ty)
			} else {
				a, c := pick(), pick()
				if !tensor(a) && !tensor(c) {
					a = pickTensor() // keep the result a tensor
				}
				fmt.Fprintf(&b, "  %s = %s(%s, %s) : %s\n", name, binary[r.IntN(len(binary))], a, c, ty)
			}
			vals = append(vals, name)
			made = append(made, name)
		}
		fmt.Fprintf(&b, "  return %s\n}\n", strings.Join(made, ", ")) // every value: a -0 for a +0 anywhere shows
		src := b.String()
		m := passtest.Parse(t, src)
		args := make([]*interp.Tensor, 2)
		for i := range args {
			v := make([]float64, n)
			for j := range v {
				v[j] = edgeValues[r.IntN(len(edgeValues))]
			}
			args[i] = interp.FromFloats(ir.Type{DType: ir.F32, Shape: ir.Shape{n}}, v)
		}
		want, err := interp.Run(m.Funcs[0], interp.CloneAll(args), interp.Options{})
		require.NoError(t, err, src)
		passtest.Run(t, m, planner.LevelPipeline(2))
		got, err := interp.Run(m.Funcs[0], interp.CloneAll(args), interp.Options{})
		require.NoError(t, err, src)
		for k := range want {
			for j := range want[k].F {
				w, o := want[k].F[j], got[k].F[j]
				same := math.Float64bits(w) == math.Float64bits(o) || math.IsNaN(w) && math.IsNaN(o)
				require.True(t, same, "graph %d, result %d, element %d: -O0 gives %v, -O2 %v; inputs %v %v:\n%s", g, k, j, w, o, args[0].F, args[1].F, src)
			}
		}
	}
}
