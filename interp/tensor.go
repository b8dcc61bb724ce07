package interp

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
)

// Tensor is a concrete value. Floating dtypes keep their elements in F
// (already rounded to the dtype); integer and bool dtypes in I.
type Tensor struct {
	Type ir.Type
	F    []float64
	I    []int64
}

// CloneAll clones every tensor of ts.
func CloneAll(ts []*Tensor) []*Tensor {
	out := make([]*Tensor, len(ts))
	for i, x := range ts {
		out[i] = x.Clone()
	}
	return out
}

// New returns a zero tensor of type t.
func New(t ir.Type) *Tensor {
	n := t.NumElements()
	if t.DType.IsFloat() {
		return &Tensor{Type: t, F: make([]float64, n)}
	}
	return &Tensor{Type: t, I: make([]int64, n)}
}

// FromFloats builds a floating tensor, rounding the values to the dtype.
func FromFloats(t ir.Type, vals []float64) *Tensor {
	x := &Tensor{Type: t, F: append([]float64(nil), vals...)}
	x.round()
	return x
}

// FromInts builds an integer or bool tensor.
func FromInts(t ir.Type, vals []int64) *Tensor {
	return &Tensor{Type: t, I: append([]int64(nil), vals...)}
}

// FromDense expands a constant (splats included).
func FromDense(d *ir.Dense) *Tensor {
	x := New(d.Type)
	for i := range x.F {
		x.F[i] = d.Float(int64(i))
	}
	for i := range x.I {
		x.I[i] = d.Int(int64(i))
	}
	return x
}

// Len is the number of elements.
func (x *Tensor) Len() int {
	if x.Type.DType.IsFloat() {
		return len(x.F)
	}
	return len(x.I)
}

// At returns element i as a float64.
func (x *Tensor) At(i int) float64 {
	if x.F != nil || x.Type.DType.IsFloat() {
		return x.F[i]
	}
	return float64(x.I[i])
}

// Clone returns a deep copy.
func (x *Tensor) Clone() *Tensor {
	return &Tensor{Type: ir.Type{DType: x.Type.DType, Shape: x.Type.Shape.Clone()},
		F: append([]float64(nil), x.F...), I: append([]int64(nil), x.I...)}
}

// round rounds every element to the tensor's dtype: floats to the
// nearest value of the dtype, integers keep their low bits, bools are 0 or 1.
func (x *Tensor) round() {
	d := x.Type.DType
	switch d {
	case ir.F64, ir.I64:
		return
	}
	if !d.IsFloat() {
		for i, v := range x.I {
			x.I[i] = d.WrapInt(v)
		}
		return
	}
	if d == ir.F32 {
		for i, v := range x.F {
			x.F[i] = float64(float32(v))
		}
		return
	}
	for i, v := range x.F {
		x.F[i] = ir.RoundTo(d, v)
	}
}

func (x *Tensor) String() string {
	return fmt.Sprintf("%s%v%v", x.Type, x.F, x.I)
}

// broadcastStrides returns strides for reading an operand of shape in as
// if it had shape out (0 along broadcast dimensions).
func broadcastStrides(in, out ir.Shape) []int64 {
	st := make([]int64, len(out))
	own := in.Strides()
	off := len(out) - len(in)
	for i := range in {
		if in[i] != 1 {
			st[i+off] = own[i]
		}
	}
	return st
}

// odometer walks the flat indices of several operands in step with the
// multi-index of an output shape.
type odometer struct {
	shape ir.Shape
	idx   []int64
	st    [][]int64
	pos   []int64
}

func newOdometer(out ir.Shape, st ...[]int64) *odometer {
	return &odometer{shape: out, idx: make([]int64, len(out)), st: st, pos: make([]int64, len(st))}
}

// next advances to the next output element.
func (o *odometer) next() {
	for d := len(o.shape) - 1; d >= 0; d-- {
		o.idx[d]++
		for k := range o.st {
			o.pos[k] += o.st[k][d]
		}
		if o.idx[d] < o.shape[d] {
			return
		}
		for k := range o.st {
			o.pos[k] -= o.st[k][d] * o.shape[d]
		}
		o.idx[d] = 0
	}
}

// Round rounds x's elements to its dtype in place (as a run stores them)
// and returns x.
func (x *Tensor) Round() *Tensor {
	x.round()
	return x
}
