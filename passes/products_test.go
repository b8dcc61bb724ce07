package passes_test

import (
	"strings"
	"testing"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passtest"
)

// A weight split into three gates, as RNN importers write it: the backward
// of each gate's product is its own gemm, joined by the split's concat, and
// summed over two steps. In f64 the rewritten step differs from the
// original only by the order of the sums: a few ulps of the largest term.
const gatedProducts = `func @f(%h: f64[2,4], %g1: f64[2,3], %g2: f64[2,3], %g3: f64[2,3], %h2: f64[2,4], %k1: f64[2,3], %k2: f64[2,3], %k3: f64[2,3], %a1: f64[3,2], %a2: f64[3,2]) -> (f64[4,9], f64[6,4]) {
  %p1 = gemm(%h, %g1) {trans_a = true} : f64[4,3]
  %p2 = gemm(%h, %g2) {trans_a = true} : f64[4,3]
  %p3 = gemm(%h, %g3) {trans_a = true} : f64[4,3]
  %step1 = concat(%p1, %p2, %p3) {axis = 1} : f64[4,9]
  %q1 = gemm(%h2, %k1) {trans_a = true} : f64[4,3]
  %q2 = gemm(%h2, %k2) {trans_a = true} : f64[4,3]
  %q3 = gemm(%h2, %k3) {trans_a = true} : f64[4,3]
  %step2 = concat(%q1, %q2, %q3) {axis = 1} : f64[4,9]
  %sum = add(%step1, %step2) : f64[4,9]
  %r1 = gemm(%a1, %h) {alpha = 2.0} : f64[3,4]
  %r2 = gemm(%a2, %h) {alpha = 2.0} : f64[3,4]
  %rows = concat(%r1, %r2) {axis = 0} : f64[6,4]
  return %sum, %rows
}
`

func TestMergeProductsJoinsGatesAndAccumulates(t *testing.T) {
	m := passtest.CheckPipeline(t, gatedProducts, "canonicalize", 1e-14)
	f := m.Funcs[0]
	gemms, concats := 0, 0
	var sum *ir.Op
	for _, op := range f.Body {
		switch op.Kind {
		case "gemm":
			gemms++
		case "concat":
			concats++
		case "add":
			t.Errorf("the sum of products was not folded into a gemm:\n%s", m)
		}
		if op.Results[0].Name == "sum" {
			sum = op
		}
	}
	// Three products: one per step (the second adding the first) and one
	// for the rows; three concats of the small operands.
	if gemms != 3 || concats != 3 {
		t.Fatalf("got %d gemms and %d concats, want 3 and 3:\n%s", gemms, concats, m)
	}
	if sum == nil || sum.Kind != "gemm" || len(sum.Operands) != 3 {
		t.Fatalf("%%sum is not a gemm that adds the first step:\n%s", m)
	}
	// The accumulating gemm writes over the running sum.
	info := liveness.Analyze(f)
	if info.BufferOf[sum.Results[0]] != info.BufferOf[sum.Operands[2]] {
		t.Errorf("%%sum does not reuse the first step's buffer:\n%s", m)
	}
}

// What MergeProducts must leave alone: a product read elsewhere, products
// that share nothing, and a join larger than the result.
func TestMergeProductsKeepsWhatItCannotMerge(t *testing.T) {
	src := `func @f(%h: f32[2,4], %x: f32[2,4], %g1: f32[2,3], %g2: f32[2,3], %w: f32[8,2], %e1: f32[8,3], %e2: f32[8,3], %b: f32[4,3]) -> (f32[4,6], f32[4,3], f32[4,6], f32[2,6], f32[4,3]) {
  %p1 = gemm(%h, %g1) {trans_a = true} : f32[4,3]
  %p2 = gemm(%h, %g2) {trans_a = true} : f32[4,3]
  %used = concat(%p1, %p2) {axis = 1} : f32[4,6]
  %o1 = gemm(%h, %g1) {trans_a = true} : f32[4,3]
  %o2 = gemm(%x, %g2) {trans_a = true} : f32[4,3]
  %apart = concat(%o1, %o2) {axis = 1} : f32[4,6]
  %n1 = gemm(%w, %e1) {trans_a = true} : f32[2,3]
  %n2 = gemm(%w, %e2) {trans_a = true} : f32[2,3]
  %wide = concat(%n1, %n2) {axis = 1} : f32[2,6]
  %bias = add(%p1, %b) : f32[4,3]
  return %used, %p1, %apart, %wide, %bias
}
`
	m := passtest.CheckPipeline(t, src, "canonicalize", 0)
	if strings.Contains(m.String(), ".parts") {
		t.Errorf("products were merged:\n%s", m)
	}
	if strings.Contains(m.String(), "gemm(%h, %g1, %b)") {
		t.Errorf("a product read elsewhere was folded into an add:\n%s", m)
	}
}

// TestMergeProductsKeepsProductsBeforeAnUpdate: a product of a weight that
// an optimizer update overwrites before the concat or add stays where it
// is (moved past the update it would read the new weight).
func TestMergeProductsKeepsProductsBeforeAnUpdate(t *testing.T) {
	src := `func @f(%x1: f32[2,2], %x2: f32[2,2], %w: f32[2,4] {param, inout}, %g: f32[2,4], %s: f32[2,4], %lr: f32[] {state}) -> (f32[4,4], f32[2,4]) {
  %p1 = gemm(%x1, %w) : f32[2,4]
  %p2 = gemm(%x2, %w) : f32[2,4]
  %q = gemm(%x1, %w) : f32[2,4]
  sgd_update(%w, %g, %lr)
  %c = concat(%p1, %p2) {axis = 0} : f32[4,4]
  %a = add(%s, %q) : f32[2,4]
  return %c, %a
}
`
	m := passtest.CheckPipeline(t, src, "canonicalize", 0)
	if got := strings.Count(m.String(), "gemm("); got != 3 {
		t.Errorf("got %d gemms, want the 3 of the source:\n%s", got, m)
	}
}
