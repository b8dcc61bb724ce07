package optest

import (
	"testing"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes/autodiff"
)

// TestEveryOpIsComplete fails when an op lacks an interpreter kernel, a
// loop lowering, a gradient decision that autodiff honours, or an
// instance in the differential and gradient tests.
func TestEveryOpIsComplete(t *testing.T) {
	covered := map[string]bool{}
	for _, in := range allInstances() {
		covered[in.op] = true
	}
	for _, name := range ir.OpNames() {
		d := ir.Lookup(name)
		if d.HasRegion {
			continue // a fused kernel runs and lowers through its body
		}
		if !interp.HasKernel(name) {
			t.Errorf("op %s has no interpreter kernel", name)
		}
		if !loops.HasLowering(name) {
			t.Errorf("op %s has no loop lowering (LLVM and CUDA)", name)
		}
		switch d.Grad {
		case ir.GradRule, ir.GradZero:
			if !autodiff.HasRule(name) {
				t.Errorf("op %s is marked differentiable, but autodiff has no rule for it", name)
			}
		case ir.NoGrad:
			if autodiff.HasRule(name) {
				t.Errorf("op %s is marked not differentiable, but autodiff has a rule for it", name)
			}
		}
		// send and recv need a peer: their differential test is across
		// ranks (interp's TestSendRecv, codegen/llvm's TestSendRecvUnderMPI).
		if !covered[name] && !ir.IsPointToPoint(name) {
			t.Errorf("op %s has no instance in the differential test (instances_test.go)", name)
		}
	}
}
