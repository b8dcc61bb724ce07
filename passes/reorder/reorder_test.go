package reorder

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passtest"
)

// randomDAG writes a random function of n ops over 1-D f32 tensors of
// varied sizes: negations (in place), concatenations, slices, sums and
// adds, with one or two results.
func randomDAG(r *rand.Rand, n int) string {
	var b strings.Builder
	type val struct {
		name string
		size int64
	}
	vals := []val{{"x", 4 + r.Int64N(12)}, {"y", 4 + r.Int64N(12)}}
	fmt.Fprintf(&b, "func @f(%%x: f32[%d], %%y: f32[%d]) -> (", vals[0].size, vals[1].size)
	var body strings.Builder
	for i := 0; i < n; i++ {
		a := vals[r.IntN(len(vals))]
		c := vals[r.IntN(len(vals))]
		name := fmt.Sprintf("v%d", i)
		var out val
		switch r.IntN(5) {
		case 0:
			out = val{name, a.size}
			fmt.Fprintf(&body, "  %%%s = neg(%%%s) : f32[%d]\n", name, a.name, a.size)
		case 1:
			out = val{name, a.size + c.size}
			fmt.Fprintf(&body, "  %%%s = concat(%%%s, %%%s) {axis = 0} : f32[%d]\n", name, a.name, c.name, out.size)
		case 2:
			k := 1 + r.Int64N(a.size)
			out = val{name, k}
			fmt.Fprintf(&body, "  %%%s = slice(%%%s) {ends = [%d], starts = [0]} : f32[%d]\n", name, a.name, k, k)
		case 3:
			out = val{name, 1}
			fmt.Fprintf(&body, "  %%%s = reduce_sum(%%%s) {keepdims = true} : f32[1]\n", name, a.name)
		default:
			if a.size == c.size {
				out = val{name, a.size}
				fmt.Fprintf(&body, "  %%%s = add(%%%s, %%%s) : f32[%d]\n", name, a.name, c.name, a.size)
			} else {
				out = val{name, a.size * 3}
				fmt.Fprintf(&body, "  %%%s = concat(%%%s, %%%s, %%%s) {axis = 0} : f32[%d]\n", name, a.name, a.name, a.name, out.size)
			}
		}
		vals = append(vals, out)
	}
	results := []val{vals[len(vals)-1]}
	if n > 2 && r.IntN(2) == 0 {
		results = append(results, vals[2+r.IntN(n-1)])
	}
	var types, refs []string
	for _, v := range results {
		types = append(types, fmt.Sprintf("f32[%d]", v.size))
		refs = append(refs, "%"+v.name)
	}
	fmt.Fprintf(&b, "%s) {\n%s  return %s\n}\n", strings.Join(types, ", "), body.String(), strings.Join(refs, ", "))
	return b.String()
}

func parse(t testing.TB, src string) *ir.Func {
	m, err := parser.Parse("dag.kir", src)
	require.NoError(t, err, src)
	require.NoError(t, ir.Verify(m), src)
	return m.Funcs[0]
}

// eachOrder calls visit with every topological order of g until visit
// returns false.
func eachOrder(g *graph, visit func(order []int) bool) {
	indeg := make([]int, g.n)
	for i := range g.preds {
		indeg[i] = len(g.preds[i])
	}
	order := make([]int, 0, g.n)
	stop := false
	var rec func()
	rec = func() {
		if stop {
			return
		}
		if len(order) == g.n {
			stop = !visit(order)
			return
		}
		for i := 0; i < g.n; i++ {
			if indeg[i] != 0 {
				continue
			}
			indeg[i] = -1
			for _, s := range g.succs[i] {
				indeg[s]--
			}
			order = append(order, i)
			rec()
			order = order[:len(order)-1]
			for _, s := range g.succs[i] {
				indeg[s]++
			}
			indeg[i] = 0
		}
	}
	rec()
}

// bruteForce returns the lowest peak over every topological order.
func bruteForce(g *graph) int64 {
	best := int64(1 << 62)
	eachOrder(g, func(order []int) bool {
		best = min(best, peakOf(g, order))
		return true
	})
	return best
}

func TestExactMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for iter := 0; iter < 120; iter++ {
		n := 2 + r.IntN(8)
		f := parse(t, randomDAG(r, n))
		g := newGraph(f)
		id := make([]int, g.n)
		for i := range id {
			id[i] = i
		}
		exact := g.exactOrder(id, 1<<22)
		require.NotNil(t, exact)
		require.True(t, g.isTopological(exact))
		require.Equal(t, bruteForce(g), peakOf(g, exact), "DAG:\n%s", f)
	}
}

// TestExactOnTwentyOps: DAGs of up to 20 ops, against brute force where the
// number of orders is small enough to enumerate.
func TestExactOnTwentyOps(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for iter := 0; iter < 8; iter++ {
		n := 14 + r.IntN(7)
		f := parse(t, randomDAG(r, n))
		g := newGraph(f)
		if countOrders(g, 2_000_000) >= 2_000_000 {
			continue
		}
		id := make([]int, g.n)
		for i := range id {
			id[i] = i
		}
		exact := g.exactOrder(id, 1<<22)
		require.NotNil(t, exact)
		require.Equal(t, bruteForce(g), peakOf(g, exact))
	}
}

func countOrders(g *graph, limit int) int {
	count := 0
	eachOrder(g, func([]int) bool {
		count++
		return count < limit
	})
	return count
}

// TestReorderIsValidAndExact: every algorithm gives a topological order
// with a peak no higher than before and bit-identical results (on 60
// random graphs; the first 20 with -short).
func TestReorderIsValidAndExact(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	graphs := 60
	if testing.Short() {
		graphs = 20
	}
	for iter := 0; iter < graphs; iter++ {
		src := randomDAG(r, 3+r.IntN(30))
		for _, algo := range []string{"best", "list", "dfs", "rpo", "exact"} {
			before := parse(t, src)
			after := parse(t, src)
			res := Reorder(after, Options{Algo: algo})
			require.NoError(t, ir.Verify(&ir.Module{Funcs: []*ir.Func{after}}))
			require.LessOrEqual(t, res.After, res.Before, algo)
			require.Equal(t, liveness.Analyze(after).Peak, res.After)
			passtest.Equivalent(t, before, after, 0, 1, 2)
		}
	}
}

// synthetic builds a chain (k=1) or a ladder of k parallel chains joined
// at every step, with n ops in all.
func synthetic(n, k int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "func @f(%%x: f32[64]) -> (f32[64]) {\n")
	prev := make([]string, k)
	for j := range prev {
		prev[j] = "x"
	}
	count := 0
	last := "x"
	for count < n {
		for j := 0; j < k && count < n; j++ {
			name := fmt.Sprintf("c%d_%d", j, count)
			fmt.Fprintf(&b, "  %%%s = add(%%%s, %%%s) : f32[64]\n", name, prev[j], last)
			prev[j] = name
			count++
		}
		last = prev[0]
	}
	fmt.Fprintf(&b, "  return %%%s\n}\n", last)
	return b.String()
}

// BenchmarkReorderScaling times the default mode on chains and ladders of
// 1,000 to 100,000 ops and on a 10,000-op training graph.
func BenchmarkReorderScaling(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		for _, k := range []int{1, 4} {
			f := parse(b, synthetic(n, k))
			start := time.Now()
			Reorder(f, Options{Algo: "best"})
			b.Logf("%d ops, width %d: %v", n, k, time.Since(start))
		}
	}
}

// deepMLP writes a forward MLP of the given depth; after autodiff its
// training step has about nine ops per layer.
func deepMLP(layers int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "func @mlp(%%x: f32[8,16]")
	for i := 0; i < layers; i++ {
		fmt.Fprintf(&b, ", %%w%d: f32[16,16] {param}, %%b%d: f32[16] {param}", i, i)
	}
	fmt.Fprintf(&b, ") -> (f32[8,16]) {\n")
	prev := "x"
	for i := 0; i < layers; i++ {
		fmt.Fprintf(&b, "  %%m%d = matmul(%%%s, %%w%d) : f32[8,16]\n  %%a%d = add(%%m%d, %%b%d) : f32[8,16]\n  %%h%d = relu(%%a%d) : f32[8,16]\n", i, prev, i, i, i, i, i, i)
		prev = fmt.Sprintf("h%d", i)
	}
	fmt.Fprintf(&b, "  return %%%s\n}\n", prev)
	return b.String()
}

// BenchmarkReorderTrainingGraph times the default mode on a training step
// of about 10,000 ops.
func BenchmarkReorderTrainingGraph(b *testing.B) {
	m, err := parser.Parse("mlp.kir", deepMLP(1100))
	require.NoError(b, err)
	f := m.Funcs[0]
	require.NoError(b, autodiffForTest(f))
	start := time.Now()
	res := Reorder(f, Options{Algo: "best"})
	b.Logf("%d ops: %v, peak %d -> %d (%s)", len(f.Body), time.Since(start), res.Before, res.After, res.Winner)
}
