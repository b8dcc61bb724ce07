package passtest

import (
	"fmt"
	"math/rand"
	"strings"
)

// RandomForward writes a random f64 forward graph: a DAG of matmuls with
// weights, cheap unary ops, dropout and binary ops over earlier values,
// all [rows, 8], whose training step saves a dozen or so values.
func RandomForward(r *rand.Rand, ops, rows int) string {
	const cols = 8
	var b strings.Builder
	var args []string
	vals := []string{"%x"}
	params := 0
	var body strings.Builder
	t := fmt.Sprintf("f64[%d,%d]", rows, cols)
	for i := 0; i < ops; i++ {
		name := fmt.Sprintf("%%v%d", i)
		pick := func() string {
			// Mostly the last values, sometimes an older one (skip links).
			if r.Intn(3) == 0 {
				return vals[r.Intn(len(vals))]
			}
			return vals[len(vals)-1-r.Intn(min(2, len(vals)))]
		}
		switch k := r.Intn(8); {
		case k < 2:
			w := fmt.Sprintf("%%w%d", params)
			params++
			args = append(args, fmt.Sprintf("%s: f64[%d,%d] {param}", w, cols, cols))
			fmt.Fprintf(&body, "  %s = matmul(%s, %s) : %s\n", name, pick(), w, t)
		case k < 5:
			op := []string{"tanh", "sigmoid", "relu", "neg"}[r.Intn(4)]
			fmt.Fprintf(&body, "  %s = %s(%s) : %s\n", name, op, pick(), t)
		case k < 6:
			fmt.Fprintf(&body, "  %s, %%m%d = dropout(%s) {ratio = 0.25, seed = %d} : %s, bool[%d,%d]\n", name, i, pick(), i, t, rows, cols)
		default:
			op := []string{"add", "mul", "sub"}[r.Intn(3)]
			fmt.Fprintf(&body, "  %s = %s(%s, %s) : %s\n", name, op, pick(), pick(), t)
		}
		vals = append(vals, name)
	}
	if params == 0 {
		args = append(args, fmt.Sprintf("%%w0: f64[%d,%d] {param}", cols, cols))
		fmt.Fprintf(&body, "  %%out = matmul(%s, %%w0) : %s\n", vals[len(vals)-1], t)
		vals = append(vals, "%out")
	}
	fmt.Fprintf(&b, "func @random(%%x: %s, %s) -> (%s) {\n%s  return %s\n}\n", t, strings.Join(args, ", "), t, body.String(), vals[len(vals)-1])
	return b.String()
}
