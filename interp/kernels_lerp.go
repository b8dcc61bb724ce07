package interp

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
)

// lerpMap calls fn(i, k, lo, hi) for every position i of lerp_gather's
// result: k its index along axis, lo and hi the positions of the data
// elements it interpolates (data of shape data, result of shape out).
func lerpMap(op *ir.Op, data, out ir.Shape, lo, hi *Tensor, fn func(i, k, lo, hi int64)) error {
	ax, err := ir.NormalizeAxis(op.Attr().Int("axis"), len(data))
	if err != nil {
		return err
	}
	outer, _ := data[:ax].NumElements()
	inner, _ := data[ax+1:].NumElements()
	d, n := data[ax], out[ax]
	for k := int64(0); k < n; k++ {
		for _, j := range []int64{lo.I[k], hi.I[k]} {
			if j < 0 || j >= d {
				return fmt.Errorf("lerp_gather index %d is out of range for dimension %d of size %d", j, ax, d)
			}
		}
	}
	for o := int64(0); o < outer; o++ {
		for k := int64(0); k < n; k++ {
			for in := int64(0); in < inner; in++ {
				fn((o*n+k)*inner+in, k, (o*d+lo.I[k])*inner+in, (o*d+hi.I[k])*inner+in)
			}
		}
	}
	return nil
}

func init() {
	kernels["lerp_gather"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x, w, dt := in[0], in[3], out[0].DType
		y := New(out[0])
		// As the sub, mul and add it stands for, each rounded.
		err := lerpMap(op, x.Type.Shape, out[0].Shape, in[1], in[2], func(i, k, lo, hi int64) {
			d := ir.RoundTo(dt, x.F[hi]-x.F[lo])
			y.F[i] = ir.RoundTo(dt, x.F[lo]+ir.RoundTo(dt, d*w.F[k]))
		})
		return []*Tensor{y}, err
	}
	kernels["lerp_gather_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dy, w, dt := in[0], in[3], out[0].DType
		dx := New(out[0])
		err := lerpMap(op, out[0].Shape, dy.Type.Shape, in[1], in[2], func(i, k, lo, hi int64) {
			t := ir.RoundTo(dt, dy.F[i]*w.F[k])
			dx.F[lo] += ir.RoundTo(dt, dy.F[i]-t)
			dx.F[hi] += t
		})
		return []*Tensor{dx}, err
	}
}
