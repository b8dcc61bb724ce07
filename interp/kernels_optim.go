package interp

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

// Optimizer updates overwrite their operands' tensors in place, as the
// arguments they are; they return no results. An update whose optional
// condition operand is false leaves everything as it was.

// skipped reports whether an update with n operands of its own was given
// a condition that is false.
func skipped(in []*Tensor, n int) bool { return len(in) > n && in[n].I[0] == 0 }

func init() {
	kernels["overwrite"] = func(_ *ir.Op, in []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
		copy(in[0].F, in[1].F)
		copy(in[0].I, in[1].I)
		return nil, nil
	}
	kernels["sgd_update"] = func(op *ir.Op, in []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
		if skipped(in, 3) {
			return nil, nil
		}
		p, g := in[0], in[1]
		lr, wd := in[2].F[0], op.Attr().Float("weight_decay")
		for i := range p.F {
			p.F[i] -= lr * (g.F[i] + wd*p.F[i])
		}
		p.round()
		return nil, nil
	}
	kernels["momentum_update"] = func(op *ir.Op, in []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
		if skipped(in, 5) {
			return nil, nil
		}
		p, g, buf := in[0], in[1], in[2]
		lr, mu, wd := in[3].F[0], in[4].F[0], op.Attr().Float("weight_decay")
		nesterov := op.Attr().Bool("nesterov")
		for i := range p.F {
			d := g.F[i] + wd*p.F[i]
			buf.F[i] = mu*buf.F[i] + d
			if nesterov {
				p.F[i] -= lr * (d + mu*buf.F[i])
			} else {
				p.F[i] -= lr * buf.F[i]
			}
		}
		buf.round()
		p.round()
		return nil, nil
	}
	adam := func(amsgrad bool) func(op *ir.Op, in []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
		return func(op *ir.Op, in []*Tensor, _ []ir.Type, _ *runtime) ([]*Tensor, error) {
			n := 4
			if amsgrad {
				n = 5
			}
			if skipped(in, n+4) {
				return nil, nil
			}
			p, g, m, v := in[0], in[1], in[2], in[3]
			a := op.Attr()
			lr, wd, eps := in[n].F[0], a.Float("weight_decay"), a.Float("eps")
			t := in[n+1].F[0] + 1 // the steps taken before this one, and this one
			b1, b2 := in[n+2].F[0], in[n+3].F[0]
			decoupled := a.Bool("decoupled")
			bc1, bc2 := 1-math.Pow(b1, t), 1-math.Pow(b2, t)
			for i := range p.F {
				d := g.F[i]
				if decoupled {
					p.F[i] *= 1 - lr*wd
				} else {
					d += wd * p.F[i]
				}
				m.F[i] = b1*m.F[i] + (1-b1)*d
				v.F[i] = b2*v.F[i] + (1-b2)*d*d
				second := v.F[i]
				if amsgrad {
					vmax := in[4]
					if v.F[i] != v.F[i] || v.F[i] > vmax.F[i] { // NaN propagates, as torch.maximum
						vmax.F[i] = v.F[i]
					}
					second = vmax.F[i]
				}
				denom := math.Sqrt(second)/math.Sqrt(bc2) + eps
				p.F[i] -= lr / bc1 * m.F[i] / denom
			}
			m.round()
			v.round()
			if amsgrad {
				in[4].round()
			}
			p.round()
			return nil, nil
		}
	}
	kernels["adam_update"] = adam(false)
	kernels["amsgrad_update"] = adam(true)
}
