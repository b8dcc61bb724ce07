package interp

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// reinterpret returns x's elements under a new type (views and reshapes).
func reinterpret(x *Tensor, t ir.Type) *Tensor {
	return &Tensor{Type: t, F: x.F, I: x.I}
}

// copyElem copies element si of src into element di of dst.
func copyElem(dst *Tensor, di int64, src *Tensor, si int64) {
	if dst.F != nil {
		dst.F[di] = src.F[si]
	} else {
		dst.I[di] = src.I[si]
	}
}

func init() {
	for _, name := range []string{"reshape", "flatten", "squeeze", "unsqueeze"} {
		kernels[name] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
			return []*Tensor{reinterpret(in[0], out[0])}, nil
		}
	}
	// Swaps between device and host memory are copies.
	for _, name := range []string{"swap_out", "swap_in"} {
		kernels[name] = func(_ *ir.Op, in []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
			return []*Tensor{in[0].Clone()}, nil
		}
	}
	kernels["transpose"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x := in[0]
		perm := op.Attr().Ints("perm")
		xs := x.Type.Shape.Strides()
		st := make([]int64, len(perm))
		for i, p := range perm {
			st[i] = xs[p]
		}
		y := New(out[0])
		n := out[0].NumElements()
		o := newOdometer(out[0].Shape, st)
		for i := int64(0); i < n; i++ {
			copyElem(y, i, x, o.pos[0])
			o.next()
		}
		return []*Tensor{y}, nil
	}
	kernels["expand"] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := New(out[0])
		n := out[0].NumElements()
		o := newOdometer(out[0].Shape, broadcastStrides(in[0].Type.Shape, out[0].Shape))
		for i := int64(0); i < n; i++ {
			copyElem(y, i, in[0], o.pos[0])
			o.next()
		}
		return []*Tensor{y}, nil
	}
	kernels["concat"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := New(out[0])
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), out[0].Rank())
		outer, _ := out[0].Shape[:ax].NumElements()
		inner, _ := out[0].Shape[ax+1:].NumElements()
		rowLen := out[0].Shape[ax] * inner
		off := int64(0)
		for _, x := range in {
			w := x.Type.Shape[ax] * inner
			for o := int64(0); o < outer; o++ {
				for j := int64(0); j < w; j++ {
					copyElem(y, o*rowLen+off+j, x, o*w+j)
				}
			}
			off += w
		}
		return []*Tensor{y}, nil
	}
	kernels["split"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x := in[0]
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), x.Type.Rank())
		outer, _ := x.Type.Shape[:ax].NumElements()
		inner, _ := x.Type.Shape[ax+1:].NumElements()
		rowLen := x.Type.Shape[ax] * inner
		var res []*Tensor
		off := int64(0)
		for _, t := range out {
			y := New(t)
			w := t.Shape[ax] * inner
			for o := int64(0); o < outer; o++ {
				for j := int64(0); j < w; j++ {
					copyElem(y, o*w+j, x, o*rowLen+off+j)
				}
			}
			off += w
			res = append(res, y)
		}
		return res, nil
	}
	sliceMap := func(op *ir.Op, full ir.Shape, fn func(outIdx, inIdx int64)) {
		sl, _ := ir.SliceOf(full, op.Attr())
		fs := full.Strides()
		st := make([]int64, len(full))
		base := int64(0)
		for i := range full {
			st[i] = fs[i] * sl.Step[i]
			base += sl.Start[i] * fs[i]
		}
		n, _ := sl.Out.NumElements()
		o := newOdometer(sl.Out, st)
		for i := int64(0); i < n; i++ {
			fn(i, base+o.pos[0])
			o.next()
		}
	}
	kernels["slice"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := New(out[0])
		sliceMap(op, in[0].Type.Shape, func(i, j int64) { copyElem(y, i, in[0], j) })
		return []*Tensor{y}, nil
	}
	kernels["slice_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dx := New(out[0])
		sliceMap(op, out[0].Shape, func(i, j int64) { dx.F[j] = in[0].F[i] }) // a slice hits each element once
		return []*Tensor{dx}, nil
	}
	gatherMap := func(op *ir.Op, data ir.Shape, idx *Tensor, fn func(outIdx, dataIdx int64)) error {
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), len(data))
		outer, _ := data[:ax].NumElements()
		inner, _ := data[ax+1:].NumElements()
		d := data[ax]
		ni := int64(len(idx.I))
		for o := int64(0); o < outer; o++ {
			for k := int64(0); k < ni; k++ {
				j := idx.I[k]
				if j < 0 && op.Attr().Bool(ir.AttrNegative) {
					j += d
				}
				if j < 0 || j >= d {
					return fmt.Errorf("gather index %d is out of range for dimension %d of size %d", idx.I[k], ax, d)
				}
				for in := int64(0); in < inner; in++ {
					fn((o*ni+k)*inner+in, (o*d+j)*inner+in)
				}
			}
		}
		return nil
	}
	kernels["gather"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := New(out[0])
		err := gatherMap(op, in[0].Type.Shape, in[1], func(i, j int64) { copyElem(y, i, in[0], j) })
		return []*Tensor{y}, err
	}
	kernels["gather_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dx := New(out[0])
		err := gatherMap(op, out[0].Shape, in[1], func(i, j int64) { addElem(dx, j, in[0], i) })
		dx.round()
		return []*Tensor{dx}, err
	}
	// elementsMap calls fn(i, j) for each position i of the indices and the
	// position j of data it addresses (i with its axis coordinate
	// replaced by the index).
	elementsMap := func(op *ir.Op, data ir.Shape, idx *Tensor, fn func(i, j int64)) error {
		ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), len(data))
		ds := data.Strides()
		n := int64(len(idx.I))
		o := newOdometer(idx.Type.Shape)
		for i := int64(0); i < n; i++ {
			k := idx.I[i]
			if k < 0 && op.Attr().Bool(ir.AttrNegative) {
				k += data[ax]
			}
			if k < 0 || k >= data[ax] {
				return fmt.Errorf("gather_elements index %d is out of range for dimension %d of size %d", idx.I[i], ax, data[ax])
			}
			j := int64(0)
			for d, c := range o.idx {
				if d == ax {
					c = k
				}
				j += c * ds[d]
			}
			fn(i, j)
			o.next()
		}
		return nil
	}
	kernels["gather_elements"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := New(out[0])
		err := elementsMap(op, in[0].Type.Shape, in[1], func(i, j int64) { copyElem(y, i, in[0], j) })
		return []*Tensor{y}, err
	}
	kernels["gather_elements_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dx := New(out[0])
		err := elementsMap(op, out[0].Shape, in[1], func(i, j int64) { addElem(dx, j, in[0], i) })
		dx.round()
		return []*Tensor{dx}, err
	}
	kernels["pad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x := in[0]
		pads := op.Attr().Ints("pads")
		r := x.Type.Rank()
		y := New(out[0])
		v := op.Attr().Float("value")
		for i := range y.F {
			y.F[i] = v
		}
		fill := scalar.SaturatingInt(v)
		if x.Type.DType == ir.U64 {
			fill = scalar.SaturatingUint(v)
		}
		for i := range y.I {
			y.I[i] = fill
		}
		ys := out[0].Shape.Strides()
		n := x.Type.NumElements()
		o := newOdometer(x.Type.Shape)
		for i := int64(0); i < n; i++ {
			at, inside := int64(0), true
			for d := 0; d < r; d++ {
				p := o.idx[d] + pads[d]
				if p < 0 || p >= out[0].Shape[d] {
					inside = false
					break
				}
				at += p * ys[d]
			}
			if inside {
				copyElem(y, at, x, i)
			}
			o.next()
		}
		return []*Tensor{y}, nil
	}
}

// addElem adds element i of x to element j of y (integers wrap in 64
// bits; the caller rounds y to its dtype once).
func addElem(y *Tensor, j int64, x *Tensor, i int64) {
	if y.F != nil {
		y.F[j] += x.F[i]
	} else {
		y.I[j] += x.I[i]
	}
}
