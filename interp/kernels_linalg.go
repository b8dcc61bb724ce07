package interp

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

func init() {
	kernels["matmul"] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		return []*Tensor{batchedMatmul(in[0], in[1], out[0])}, nil
	}
	kernels["gemm"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		a, b := in[0], in[1]
		m, n, k, _ := ir.GemmDims(a.Type, b.Type, op.Attr())
		av, bv := a.F, b.F
		if op.Attr().Bool("trans_a") {
			av = make([]float64, m*k)
			transposeInto(av, a.F, int(k), int(m))
		}
		if op.Attr().Bool("trans_b") {
			bv = make([]float64, k*n)
			transposeInto(bv, b.F, int(n), int(k))
		}
		y := New(out[0])
		matmulInto(y.F, av, bv, int(m), int(n), int(k), false)
		alpha, beta := op.Attr().Float("alpha"), op.Attr().Float("beta")
		for i := range y.F {
			y.F[i] *= alpha
		}
		if len(in) == 3 {
			c := in[2]
			eachBroadcast(out[0].Shape, out[0].Shape, c.Type.Shape, func(i, _, ic int64) { y.F[i] += beta * c.F[ic] })
		}
		return []*Tensor{y}, nil
	}
	for _, name := range []string{"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"} {
		kernels[name] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
			x := in[0]
			axes, _ := ir.ReduceAxes(op.Attr(), x.Type.Rank())
			keep := ir.ReducedShape(x.Type.Shape, axes, true)
			y := reduceTo(x, keep, op.Kind)
			y.Type = out[0]
			return []*Tensor{y}, nil
		}
	}
	kernels["sum_to"] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x := in[0]
		// Align the target to x's rank with leading ones, then reduce.
		keep := make(ir.Shape, x.Type.Rank())
		off := x.Type.Rank() - out[0].Rank()
		for i := range keep {
			keep[i] = 1
			if i >= off {
				keep[i] = out[0].Shape[i-off]
			}
		}
		y := reduceTo(x, keep, "reduce_sum")
		y.Type = out[0]
		return []*Tensor{y}, nil
	}
}

// reduceTo reduces x to shape keep (same rank, each dimension equal to x's
// or 1), summing pairwise-free in float64 (exact enough for the oracle).
func reduceTo(x *Tensor, keep ir.Shape, kind string) *Tensor {
	y := New(ir.Type{DType: x.Type.DType, Shape: keep})
	n := x.Type.NumElements()
	count := float64(n) / float64(max(y.Type.NumElements(), 1))
	u64 := x.Type.DType == ir.U64
	switch kind {
	case "reduce_max":
		for i := range y.F {
			y.F[i] = math.Inf(-1)
		}
		for i := range y.I {
			y.I[i] = math.MinInt64
			if u64 {
				y.I[i] = 0
			}
		}
	case "reduce_min":
		for i := range y.F {
			y.F[i] = math.Inf(1)
		}
		for i := range y.I {
			y.I[i] = math.MaxInt64
			if u64 {
				y.I[i] = -1 // all ones: the largest u64
			}
		}
	}
	o := newOdometer(x.Type.Shape, broadcastStrides(keep, x.Type.Shape))
	for i := int64(0); i < n; i++ {
		j := o.pos[0]
		if y.F != nil {
			v := x.F[i]
			switch {
			case kind == "reduce_max":
				if v > y.F[j] || v != v {
					y.F[j] = v
				}
			case kind == "reduce_min":
				if v < y.F[j] || v != v {
					y.F[j] = v
				}
			default:
				y.F[j] += v
			}
		} else {
			switch {
			case kind == "reduce_max" && u64:
				y.I[j] = int64(max(uint64(y.I[j]), uint64(x.I[i])))
			case kind == "reduce_max":
				y.I[j] = max(y.I[j], x.I[i])
			case kind == "reduce_min" && u64:
				y.I[j] = int64(min(uint64(y.I[j]), uint64(x.I[i])))
			case kind == "reduce_min":
				y.I[j] = min(y.I[j], x.I[i])
			default:
				y.I[j] += x.I[i]
			}
		}
		o.next()
	}
	if kind == "reduce_mean" {
		for i := range y.F {
			y.F[i] /= count
		}
		for i := range y.I {
			if x.Type.DType == ir.U64 {
				y.I[i] = int64(uint64(y.I[i]) / uint64(count))
			} else {
				y.I[i] /= int64(count)
			}
		}
	}
	return y
}

// batchedMatmul is NumPy matmul: 1-D operands are promoted and the batch
// dimensions broadcast.
func batchedMatmul(a, b *Tensor, out ir.Type) *Tensor {
	as, bs := a.Type.Shape, b.Type.Shape
	if len(as) == 1 {
		as = ir.Shape{1, as[0]}
	}
	if len(bs) == 1 {
		bs = ir.Shape{bs[0], 1}
	}
	m, k, n := as[len(as)-2], as[len(as)-1], bs[len(bs)-1]
	batch, _ := ir.BroadcastShapes(as[:len(as)-2], bs[:len(bs)-2])
	nb, _ := batch.NumElements()
	sa := broadcastStrides(as[:len(as)-2], batch)
	sb := broadcastStrides(bs[:len(bs)-2], batch)
	y := New(out)
	o := newOdometer(batch, sa, sb)
	type job struct{ ia, ib, iy int64 }
	jobs := make([]job, nb)
	for i := int64(0); i < nb; i++ {
		jobs[i] = job{o.pos[0], o.pos[1], i}
		o.next()
	}
	run := func(j job) {
		matmulInto(y.F[j.iy*m*n:(j.iy+1)*m*n], a.F[j.ia*m*k:(j.ia+1)*m*k], b.F[j.ib*k*n:(j.ib+1)*k*n], int(m), int(n), int(k), false)
	}
	if nb > 1 {
		parallelFor(int(nb), func(i int) { run(jobs[i]) })
	} else {
		run(jobs[0])
	}
	return y
}
