package passes_test

import (
	"testing"

	"github.com/kiln-compiler/kiln/passtest"
)

// Translation validation of the cleanup passes: outputs are bit-identical.
// (Adding -0 is the identity; adding +0 is not, for -0.)
const cleanupInput = `func @f(%x: f32[4,3], %w: f32[3,5], %b: f32[5]) -> (f32[4,5], f32[5,4]) {
  %zero = constant() {value = dense<f32[]: -0.0>} : f32[]
  %one = constant() {value = dense<f32[5]: 1.0>} : f32[5]
  %two = constant() {value = dense<f32[5]: [1.0, 2.0, 3.0, 4.0, 5.0]>} : f32[5]
  %c = add(%one, %two) : f32[5]
  %h = matmul(%x, %w) : f32[4,5]
  %h2 = matmul(%x, %w) : f32[4,5]
  %a = add(%h, %b) : f32[4,5]
  %a2 = add(%b, %h2) : f32[4,5]
  %s = mul(%a, %one) : f32[4,5]
  %t = add(%s, %zero) : f32[4,5]
  %u = relu(%t) : f32[4,5]
  %v = mul(%u, %c) : f32[4,5]
  %dead = exp(%a2) : f32[4,5]
  %tt = transpose(%v) {perm = [1, 0]} : f32[5,4]
  %t3 = transpose(%tt) {perm = [1, 0]} : f32[4,5]
  %t4 = transpose(%t3) {perm = [1, 0]} : f32[5,4]
  %r = add(%a2, %t3) : f32[4,5]
  return %r, %t4
}
`

func TestCleanupPassesPreserveResults(t *testing.T) {
	for _, pipe := range []string{"dce", "cse", "canonicalize", "canonicalize,cse,dce", "cse,canonicalize,dce,cse"} {
		m := passtest.CheckPipeline(t, cleanupInput, pipe, 0)
		if pipe == "canonicalize,cse,dce" && len(m.Funcs[0].Body) > 7 {
			t.Errorf("%s left %d ops:\n%s", pipe, len(m.Funcs[0].Body), m)
		}
	}
}
