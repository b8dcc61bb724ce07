package passtest

import (
	"fmt"
	"math/rand"
	"strings"
)

// Mixing kinds of RandomBatchStep: what a step's ops do across its batch.
const (
	MixNone       = 0         // every op treats the rows of the batch apart
	MixStatistics = 1 << iota // a statistic over the batch the rows read (mean subtracted, batch norm)
	MixSoftmax                // a softmax or log-softmax over the batch
	MixGather                 // rows gathered along the batch by fixed indices
	MixShift                  // rows shifted along the batch (a slice and a concat)
	MixRoll                   // rows rolled along the batch by RollOp, an op that declares no axes
	MixRandom                 // dropout, whose masks cover the whole batch
)

// RollOp names an op that tests register without per-axis semantics (a
// shift by one row along dimension 0): passes that split must refuse it.
const RollOp = "test_roll"

// BatchStep is a random forward function whose batch (dimension 0 of %x,
// of Rows rows) its ops may mix: Mix says how (the kinds above, or-ed).
type BatchStep struct {
	Src  string
	Mix  int
	Rows int
}

// RandomBatchStep writes a random f64 forward function of [rows, 6]
// values: matmuls with weights, elementwise ops, layer norms and softmaxes
// along the features, and, when mixing, ops that mix the batch (a mean or
// max over it subtracted back, batch normalisation, softmax over it,
// gathers and shifts along it, dropout). Every value feeds the result
// (their sum), so no op is dead.
func RandomBatchStep(r *rand.Rand, rows int, mixing bool) BatchStep {
	const cols = 6
	t := fmt.Sprintf("f64[%d,%d]", rows, cols)
	var args []string
	var body strings.Builder
	vals := []string{"%x"}
	params, states := 0, 0
	mix := 0
	param := func(shape string) string {
		w := fmt.Sprintf("%%w%d", params)
		params++
		args = append(args, fmt.Sprintf("%s: f64%s {param}", w, shape))
		return w
	}
	pick := func() string {
		if r.Intn(3) == 0 {
			return vals[r.Intn(len(vals))]
		}
		return vals[len(vals)-1-r.Intn(min(2, len(vals)))]
	}
	n := 6 + r.Intn(8)
	for i := 0; i < n; i++ {
		v := fmt.Sprintf("%%v%d", i)
		k := r.Intn(10)
		if mixing && r.Intn(3) == 0 {
			k = 10 + r.Intn(8)
		}
		switch k {
		case 0, 1:
			fmt.Fprintf(&body, "  %s = matmul(%s, %s) : %s\n", v, pick(), param(fmt.Sprintf("[%d,%d]", cols, cols)), t)
		case 2, 3:
			op := []string{"tanh", "sigmoid", "relu", "neg", "exp"}[r.Intn(5)]
			x := pick()
			if op == "exp" {
				fmt.Fprintf(&body, "  %s.t = tanh(%s) : %s\n", v, x, t)
				x = v + ".t"
			}
			fmt.Fprintf(&body, "  %s = %s(%s) : %s\n", v, op, x, t)
		case 4, 5:
			op := []string{"add", "mul", "sub"}[r.Intn(3)]
			fmt.Fprintf(&body, "  %s = %s(%s, %s) : %s\n", v, op, pick(), pick(), t)
		case 6:
			fmt.Fprintf(&body, "  %s, %s.mu, %s.rs = layer_norm(%s, %s) : %s, f64[%d,1], f64[%d,1]\n", v, v, v, pick(), param(fmt.Sprintf("[%d]", cols)), t, rows, rows)
		case 7:
			fmt.Fprintf(&body, "  %s = softmax(%s) {axis = 1} : %s\n", v, pick(), t)
		case 8:
			fmt.Fprintf(&body, "  %s.s = reduce_sum(%s) {axes = [1], keepdims = true} : f64[%d,1]\n  %s = mul(%s, %s.s) : %s\n", v, pick(), rows, v, pick(), v, t)
		case 9:
			b := param(fmt.Sprintf("[%d]", cols))
			fmt.Fprintf(&body, "  %s = add(%s, %s) : %s\n", v, pick(), b, t)
		case 10, 11:
			red := []string{"reduce_mean", "reduce_max", "reduce_sum"}[r.Intn(3)]
			op := []string{"sub", "mul", "add"}[r.Intn(3)]
			fmt.Fprintf(&body, "  %s.m = %s(%s) {axes = [0], keepdims = true} : f64[1,%d]\n  %s = %s(%s, %s.m) : %s\n", v, red, pick(), cols, v, op, pick(), v, t)
			mix |= MixStatistics
		case 12:
			g, b := param(fmt.Sprintf("[%d]", cols)), param(fmt.Sprintf("[%d]", cols))
			m, s := fmt.Sprintf("%%s%d", states), fmt.Sprintf("%%s%d", states+1)
			states += 2
			args = append(args, fmt.Sprintf("%s: f64[%d] {state}", m, cols), fmt.Sprintf("%s: f64[%d] {state}", s, cols))
			fmt.Fprintf(&body, "  %s, %s.rm, %s.rv, %s.sm, %s.si = batch_norm_train(%s, %s, %s, %s, %s) {epsilon = 1e-05, momentum = 0.9} : %s, f64[%d], f64[%d], f64[%d], f64[%d]\n",
				v, v, v, v, v, pick(), g, b, m, s, t, cols, cols, cols, cols)
			mix |= MixStatistics
		case 13:
			op := []string{"softmax", "log_softmax"}[r.Intn(2)]
			fmt.Fprintf(&body, "  %s = %s(%s) {axis = 0} : %s\n", v, op, pick(), t)
			mix |= MixSoftmax
		case 14:
			idx := make([]string, rows)
			for j := range idx {
				idx[j] = fmt.Sprint((j*3 + 1) % rows)
			}
			fmt.Fprintf(&body, "  %s.i = constant() {value = dense<i64[%d]: [%s]>} : i64[%d]\n  %s = gather(%s, %s.i) {axis = 0} : %s\n", v, rows, strings.Join(idx, ", "), rows, v, pick(), v, t)
			mix |= MixGather
		case 15:
			x := pick()
			fmt.Fprintf(&body, "  %s.a = slice(%s) {starts = [1], ends = [%d], axes = [0]} : f64[%d,%d]\n  %s.b = slice(%s) {starts = [0], ends = [1], axes = [0]} : f64[1,%d]\n  %s = concat(%s.a, %s.b) {axis = 0} : %s\n",
				v, x, rows, rows-1, cols, v, x, cols, v, v, v, t)
			mix |= MixShift
		case 16:
			fmt.Fprintf(&body, "  %s = %s(%s) : %s\n", v, RollOp, pick(), t)
			mix |= MixRoll
		case 17:
			fmt.Fprintf(&body, "  %s, %s.k = dropout(%s) {ratio = 0.3, seed = %d} : %s, bool[%d,%d]\n", v, v, pick(), 11+i, t, rows, cols)
			mix |= MixRandom
		}
		vals = append(vals, v)
	}
	// The result sums every value through a last product, so each op is
	// live and its rows reach the loss.
	acc := vals[1]
	for i, v := range vals[2:] {
		fmt.Fprintf(&body, "  %%acc%d = add(%s, %s) : %s\n", i, acc, v, t)
		acc = fmt.Sprintf("%%acc%d", i)
	}
	fmt.Fprintf(&body, "  %%out = matmul(%s, %s) : %s\n", acc, param(fmt.Sprintf("[%d,%d]", cols, cols)), t)
	src := fmt.Sprintf("func @step(%%x: %s, %s) -> (%s) {\n%s  return %%out\n}\n", t, strings.Join(args, ", "), t, body.String())
	return BatchStep{Src: src, Mix: mix, Rows: rows}
}
