package interp

import (
	"github.com/kiln-compiler/kiln/ir"
)

// kernel computes an op's results from its operands. out holds the
// result types the verifier checked.
type kernel func(op *ir.Op, in []*Tensor, out []ir.Type, rt *runtime) ([]*Tensor, error)

// kernels holds the ops whose record has no Scalar (elementwise ops run
// through elementwise, in scalar.go).
var kernels = map[string]kernel{}

func init() {
	kernels["constant"] = func(op *ir.Op, _ []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
		return []*Tensor{FromDense(op.Attr().Dense("value"))}, nil
	}
}

// eachBroadcast calls fn for every element i of out with the flat indices
// of the two broadcast operands.
func eachBroadcast(out, a, b ir.Shape, fn func(i, ia, ib int64)) {
	n, _ := out.NumElements()
	o := newOdometer(out, broadcastStrides(a, out), broadcastStrides(b, out))
	for i := int64(0); i < n; i++ {
		fn(i, o.pos[0], o.pos[1])
		o.next()
	}
}

// unflatten is the multi-index of flat element i of shape s.
func unflatten(s ir.Shape, i int64) []int64 {
	idx := make([]int64, len(s))
	for d := len(s) - 1; d >= 0; d-- {
		if s[d] > 0 {
			idx[d] = i % s[d]
			i /= s[d]
		}
	}
	return idx
}

// HasKernel reports whether the interpreter can run ops of kind name.
func HasKernel(name string) bool { return kernels[name] != nil }

// Kernel computes an op's results from its operands, for RegisterKernel.
type Kernel func(op *ir.Op, in []*Tensor, out []ir.Type) ([]*Tensor, error)

// RegisterKernel gives the interpreter the meaning of an op registered
// outside Kiln's records (an op a pass plugin or a test adds to the
// registry). Registering a kind that has a kernel panics.
func RegisterKernel(kind string, k Kernel) {
	if kernels[kind] != nil {
		panic("interp: op " + kind + " has a kernel already")
	}
	kernels[kind] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) { return k(op, in, out) }
}
