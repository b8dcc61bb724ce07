package loops

import (
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

func init() {
	stageRules["batch_norm_train"] = lowerBatchNormTrain
	stageRules["batch_norm_grad"] = lowerBatchNormGrad
	stageRules["layer_norm"] = lowerLayerNorm
	stageRules["layer_norm_grad"] = lowerLayerNormGrad
	stageRules["softmax"] = lowerSoftmax
	stageRules["log_softmax"] = lowerSoftmax
	stageRules["softmax_grad"] = lowerSoftmaxGrad
	stageRules["log_softmax_grad"] = lowerSoftmaxGrad
	stageRules["softmax_cross_entropy"] = lowerCrossEntropy
	stageRules["softmax_cross_entropy_grad"] = lowerCrossEntropyGrad
	stageRules["sgd_update"] = lowerSGD
	stageRules["momentum_update"] = lowerMomentum
	stageRules["adam_update"] = lowerAdam
	stageRules["amsgrad_update"] = lowerAdam
	stageRules["overwrite"] = func(b *builder, _ *ir.Op, in []Tensor, _ []*Buffer) error {
		b.store(in[0].Buf, func(idx []Expr) Expr { return in[1].At(idx) })
		return nil
	}
}

// f64Temp is a float64 workspace of shape s (statistics are kept in
// double precision, as the interpreter keeps them).
func f64Temp(b *builder, name string, s ...int64) *Buffer {
	return b.temp(name, ir.Type{DType: ir.F64, Shape: ir.Shape(s)})
}

// channels views x[N, C, ...] as [N, C, inner].
func channels(x Tensor) (Tensor, int64, int64, int64) {
	s := x.Type.Shape
	inner := numElements(s[2:])
	return view(x, ir.Shape{s[0], s[1], inner}), s[0], s[1], inner
}

func lowerBatchNormTrain(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	eps, mom := op.Attr().Float("epsilon"), op.Attr().Float("momentum")
	x, n, c, inner := channels(in[0])
	scale, bias, rm, rv := in[1], in[2], in[3], in[4]
	cnt := float64(n * inner)
	mean, m2 := f64Temp(b, "mean", c), f64Temp(b, "m2", c)
	over := []int64{n, inner}
	b.store(mean, func(idx []Expr) Expr {
		return div(b.reduce(scalar.Add, F64, over, func(r []Expr) Expr { return x.At([]Expr{r[0], idx[0], r[1]}) }), like(Float{K: F64}, cnt))
	})
	mu := func(ch Expr) Expr { return &Load{Buf: mean, Index: []Expr{ch}} }
	b.store(m2, func(idx []Expr) Expr {
		return b.reduce(scalar.Add, F64, over, func(r []Expr) Expr {
			d := sub(conv(x.At([]Expr{r[0], idx[0], r[1]}), F64), mu(idx[0]))
			return mul(d, d)
		})
	})
	// invstd per channel in f64, before any f32 arithmetic: the sum of
	// squares can pass f32's range where its inverse square root does not.
	inv := f64Temp(b, "invstd", c)
	b.store(inv, func(idx []Expr) Expr {
		v := div(&Load{Buf: m2, Index: idx}, Float{V: cnt, K: F64})
		return div(Float{V: 1, K: F64}, un(scalar.Sqrt, add(v, Float{V: eps, K: F64})))
	})
	invstd := func(ch Expr) Expr { return &Load{Buf: inv, Index: []Expr{ch}} }
	y := alias(out[0], ir.Shape{n, c, inner})
	b.store(y, func(idx []Expr) Expr {
		return demote(func() Expr {
			ch := idx[1]
			xv := conv(x.At(idx), F64)
			return add(mul(mul(sub(xv, mu(ch)), invstd(ch)), conv(scale.At([]Expr{ch}), F64)), conv(bias.At([]Expr{ch}), F64))
		}(), ComputeKind(out[0].Type.DType))
	})
	unbiased := func(ch Expr) Expr {
		if cnt > 1 && op.Attr().Bool("unbiased") {
			return div(&Load{Buf: m2, Index: []Expr{ch}}, Float{V: cnt - 1, K: F64})
		}
		return div(&Load{Buf: m2, Index: []Expr{ch}}, Float{V: cnt, K: F64})
	}
	b.store(out[1], func(idx []Expr) Expr {
		return add(mul(conv(rm.At(idx), F64), Float{V: mom, K: F64}), mul(mu(idx[0]), Float{V: 1 - mom, K: F64}))
	})
	b.store(out[2], func(idx []Expr) Expr {
		return add(mul(conv(rv.At(idx), F64), Float{V: mom, K: F64}), mul(unbiased(idx[0]), Float{V: 1 - mom, K: F64}))
	})
	b.store(out[3], func(idx []Expr) Expr { return mu(idx[0]) })
	b.store(out[4], func(idx []Expr) Expr { return invstd(idx[0]) })
	return nil
}

// The backward normalisations subtract nearly equal terms (dy, its mean,
// xhat times the mean of dy*xhat): they stay in double precision.

func lowerBatchNormGrad(b *builder, _ *ir.Op, in []Tensor, out []*Buffer) error {
	dy, _, _, _ := channels(in[0])
	x, n, c, inner := channels(in[1])
	scale, mean, invstd := in[2], in[3], in[4]
	cnt := float64(n * inner)
	sdy, sdyx := f64Temp(b, "sdy", c), f64Temp(b, "sdyx", c)
	over := []int64{n, inner}
	xhat := func(i []Expr) Expr {
		ch := []Expr{i[1]}
		return mul(sub(conv(x.At(i), F64), conv(mean.At(ch), F64)), conv(invstd.At(ch), F64))
	}
	b.store(sdy, func(idx []Expr) Expr {
		return b.reduce(scalar.Add, F64, over, func(r []Expr) Expr { return dy.At([]Expr{r[0], idx[0], r[1]}) })
	})
	b.store(sdyx, func(idx []Expr) Expr {
		return b.reduce(scalar.Add, F64, over, func(r []Expr) Expr {
			i := []Expr{r[0], idx[0], r[1]}
			return mul(conv(dy.At(i), F64), xhat(i))
		})
	})
	dx := alias(out[0], ir.Shape{n, c, inner})
	b.store(dx, func(idx []Expr) Expr {
		return func() Expr {
			ch := []Expr{idx[1]}
			k := mul(conv(scale.At(ch), F64), conv(invstd.At(ch), F64))
			a := div(&Load{Buf: sdy, Index: ch}, Float{V: cnt, K: F64})
			bb := div(&Load{Buf: sdyx, Index: ch}, Float{V: cnt, K: F64})
			return mul(k, sub(sub(conv(dy.At(idx), F64), a), mul(xhat(idx), bb)))
		}()
	})
	b.store(out[1], func(idx []Expr) Expr { return &Load{Buf: sdyx, Index: idx} })
	b.store(out[2], func(idx []Expr) Expr { return &Load{Buf: sdy, Index: idx} })
	return nil
}

// rowsOf views x as [rows, cols] split at the normalisation axis.
func rowsOf(x Tensor, a ir.Attrs) (Tensor, int64, int64) {
	s := x.Type.Shape
	ax, _ := ir.NormalizeAxis(a.Int("axis", -1), len(s))
	rows, cols := numElements(s[:ax]), numElements(s[ax:])
	return view(x, ir.Shape{rows, cols}), rows, cols
}

func lowerLayerNorm(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	eps := op.Attr().Float("epsilon")
	x, rows, cols := rowsOf(in[0], op.Attrs)
	scale := view(in[1], ir.Shape{cols})
	mean, inv := f64Temp(b, "mean", rows), f64Temp(b, "inv", rows)
	center := op.Attr().Bool("center")
	b.store(mean, func(idx []Expr) Expr {
		if !center {
			return Float{V: 0, K: F64} // RMSNorm
		}
		return div(b.reduce(scalar.Add, F64, []int64{cols}, func(r []Expr) Expr { return x.At([]Expr{idx[0], r[0]}) }), Float{V: float64(cols), K: F64})
	})
	mu := func(r Expr) Expr { return &Load{Buf: mean, Index: []Expr{r}} }
	b.store(inv, func(idx []Expr) Expr {
		v := b.reduce(scalar.Add, F64, []int64{cols}, func(r []Expr) Expr {
			d := sub(conv(x.At([]Expr{idx[0], r[0]}), F64), mu(idx[0]))
			return mul(d, d)
		})
		return div(Float{V: 1, K: F64}, un(scalar.Sqrt, add(div(v, Float{V: float64(cols), K: F64}), Float{V: eps, K: F64})))
	})
	y := alias(out[0], ir.Shape{rows, cols})
	b.store(y, func(idx []Expr) Expr {
		return demote(func() Expr {
			v := mul(mul(sub(conv(x.At(idx), F64), mu(idx[0])), &Load{Buf: inv, Index: idx[:1]}), conv(scale.At(idx[1:]), F64))
			if len(in) == 3 {
				v = add(v, conv(view(in[2], ir.Shape{cols}).At(idx[1:]), F64))
			}
			return v
		}(), ComputeKind(out[0].Type.DType))
	})
	b.store(alias(out[1], ir.Shape{rows}), func(idx []Expr) Expr { return mu(idx[0]) })
	b.store(alias(out[2], ir.Shape{rows}), func(idx []Expr) Expr { return &Load{Buf: inv, Index: idx} })
	return nil
}

func lowerLayerNormGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, _, _ := rowsOf(in[0], op.Attrs)
	x, rows, cols := rowsOf(in[1], op.Attrs)
	scale := view(in[2], ir.Shape{cols})
	mean, inv := view(in[3], ir.Shape{rows}), view(in[4], ir.Shape{rows})
	xhat := func(r, j Expr) Expr {
		return mul(sub(conv(x.At([]Expr{r, j}), F64), conv(mean.At([]Expr{r}), F64)), conv(inv.At([]Expr{r}), F64))
	}
	g := func(r, j Expr) Expr { return mul(conv(dy.At([]Expr{r, j}), F64), conv(scale.At([]Expr{j}), F64)) }
	ga, gb := f64Temp(b, "a", rows), f64Temp(b, "b", rows)
	center := op.Attr().Bool("center")
	b.store(ga, func(idx []Expr) Expr {
		if !center {
			return Float{V: 0, K: F64} // RMSNorm: no mean, no gradient through it
		}
		return div(b.reduce(scalar.Add, F64, []int64{cols}, func(j []Expr) Expr { return g(idx[0], j[0]) }), Float{V: float64(cols), K: F64})
	})
	b.store(gb, func(idx []Expr) Expr {
		return div(b.reduce(scalar.Add, F64, []int64{cols}, func(j []Expr) Expr { return mul(g(idx[0], j[0]), xhat(idx[0], j[0])) }), Float{V: float64(cols), K: F64})
	})
	b.store(alias(out[0], ir.Shape{rows, cols}), func(idx []Expr) Expr {
		return func() Expr {
			r, j := idx[0], idx[1]
			return mul(conv(inv.At([]Expr{r}), F64), sub(sub(g(r, j), &Load{Buf: ga, Index: []Expr{r}}), mul(xhat(r, j), &Load{Buf: gb, Index: []Expr{r}})))
		}()
	})
	b.store(alias(out[1], ir.Shape{cols}), func(idx []Expr) Expr {
		return b.reduce(scalar.Add, F64, []int64{rows}, func(r []Expr) Expr {
			return mul(conv(dy.At([]Expr{r[0], idx[0]}), F64), xhat(r[0], idx[0]))
		})
	})
	b.store(alias(out[2], ir.Shape{cols}), func(idx []Expr) Expr {
		return b.reduce(scalar.Add, F64, []int64{rows}, func(r []Expr) Expr { return dy.At([]Expr{r[0], idx[0]}) })
	})
	return nil
}

// lines views x as [outer, n, inner] around axis.
func lines(x Tensor, axis int64) (Tensor, int64, int64, int64) {
	s := x.Type.Shape
	ax, _ := ir.NormalizeAxis(axis, len(s))
	outer, n, inner := numElements(s[:ax]), s[ax], numElements(s[ax+1:])
	return view(x, ir.Shape{outer, n, inner}), outer, n, inner
}

// logPartition stores, per line of x along axis 1 of [outer, n, inner],
// the maximum m and log Σ exp(x - m). The log-probability of x is
// logProb: (x - m) - log Σ, in that order, so that x - m is exact even in
// f32 (m is one of the line's values) and large logits keep the small
// log-sum: rounding m + log Σ to f32 first loses it.
func logPartition(b *builder, x Tensor, outer, n, inner int64) (mx, logsum *Buffer) {
	mx, logsum = f64Temp(b, "max", outer, inner), f64Temp(b, "logsum", outer, inner)
	b.store(mx, func(idx []Expr) Expr {
		return b.reduce(scalar.Max, F64, []int64{n}, func(j []Expr) Expr { return x.At([]Expr{idx[0], j[0], idx[1]}) })
	})
	b.store(logsum, func(idx []Expr) Expr {
		m := &Load{Buf: mx, Index: idx}
		s := b.reduce(scalar.Add, F64, []int64{n}, func(j []Expr) Expr {
			return un(scalar.Exp, sub(conv(x.At([]Expr{idx[0], j[0], idx[1]}), F64), m))
		})
		return un(scalar.Log, s)
	})
	return mx, logsum
}

// logProb is log softmax of element v of line (o, i): (v - m) - log Σ.
func logProb(v Expr, mx, logsum *Buffer, o, i Expr) Expr {
	line := []Expr{o, i}
	return sub(sub(conv(v, F64), &Load{Buf: mx, Index: line}), &Load{Buf: logsum, Index: line})
}

func lowerSoftmax(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	x, outer, n, inner := lines(in[0], op.Attr().Int("axis"))
	mx, logsum := logPartition(b, x, outer, n, inner)
	log := op.Kind == "log_softmax"
	b.store(alias(out[0], ir.Shape{outer, n, inner}), func(idx []Expr) Expr {
		return demote(func() Expr {
			v := logProb(x.At(idx), mx, logsum, idx[0], idx[2])
			if log {
				return v
			}
			return un(scalar.Exp, v)
		}(), ComputeKind(out[0].Type.DType))
	})
	return nil
}

func lowerSoftmaxGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, _, _, _ := lines(in[0], op.Attr().Int("axis"))
	y, outer, n, inner := lines(in[1], op.Attr().Int("axis"))
	log := op.Kind == "log_softmax_grad"
	s := f64Temp(b, "s", outer, inner)
	b.store(s, func(idx []Expr) Expr {
		return b.reduce(scalar.Add, F64, []int64{n}, func(j []Expr) Expr {
			i := []Expr{idx[0], j[0], idx[1]}
			if log {
				return dy.At(i)
			}
			return mul(conv(dy.At(i), F64), conv(y.At(i), F64))
		})
	})
	b.store(alias(out[0], ir.Shape{outer, n, inner}), func(idx []Expr) Expr {
		return func() Expr {
			sv := &Load{Buf: s, Index: []Expr{idx[0], idx[2]}}
			g, yv := conv(dy.At(idx), F64), conv(y.At(idx), F64)
			if log {
				return sub(g, mul(un(scalar.Exp, yv), sv))
			}
			return mul(yv, sub(g, sv))
		}()
	})
	return nil
}

// label reads the class of sample position (o, i), wrapped into range.
func label(labels Tensor, o, i Expr, inner, k int64) Expr {
	return checkedIndex(conv(view(labels, ir.Shape{numElements(labels.Type.Shape) / inner, inner}).At([]Expr{o, i}), I64), k)
}

func lowerCrossEntropy(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	x, outer, k, inner := lines(in[0], 1)
	mx, logsum := logPartition(b, x, outer, k, inner)
	count := outer * inner
	b.store(out[0], func([]Expr) Expr {
		loss := b.reduce(scalar.Add, F64, []int64{outer, inner}, func(r []Expr) Expr {
			l := label(in[1], r[0], r[1], inner, k)
			return sub(Float{V: 0, K: F64}, logProb(x.At([]Expr{r[0], l, r[1]}), mx, logsum, r[0], r[1]))
		})
		if op.Attr().String("reduction") == "mean" && count > 0 {
			loss = div(loss, Float{V: float64(count), K: F64})
		}
		return loss
	})
	return nil
}

func lowerCrossEntropyGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	x, outer, k, inner := lines(in[1], 1)
	mx, logsum := logPartition(b, x, outer, k, inner)
	scale := conv(in[0].At(nil), F64)
	if op.Attr().String("reduction") == "mean" {
		scale = div(scale, Float{V: float64(numElements(in[2].Type.Shape)), K: F64})
	}
	b.store(alias(out[0], ir.Shape{outer, k, inner}), func(idx []Expr) Expr {
		return demote(func() Expr {
			p := un(scalar.Exp, logProb(x.At(idx), mx, logsum, idx[0], idx[2]))
			hit := cmp(scalar.Eq, idx[1], label(in[2], idx[0], idx[2], inner, k))
			return mul(sub(p, sel(hit, Float{V: 1, K: F64}, Float{V: 0, K: F64})), scale)
		}(), ComputeKind(out[0].Type.DType))
	})
	return nil
}

// The optimizer updates write their operands, which are arguments in
// memory: each stage overwrites one of them, in an order that reads every
// old value before it is replaced.

// updateStore stores like b.store, except that when the update has its
// condition operand (after its n own ones) a false condition stores the
// old value of t back.
func updateStore(b *builder, in []Tensor, n int) func(t Tensor, fn func(idx []Expr) Expr) {
	return func(t Tensor, fn func(idx []Expr) Expr) {
		if len(in) == n {
			b.store(t.Buf, fn)
			return
		}
		ok := conv(in[n].At(nil), Bool)
		b.store(t.Buf, func(idx []Expr) Expr { return sel(ok, conv(fn(idx), F64), conv(t.At(idx), F64)) })
	}
}

// scalarOperand reads a scalar operand (a learning rate, a step number)
// in f64.
func scalarOperand(t Tensor) Expr { return conv(t.At(nil), F64) }

func lowerSGD(b *builder, op *ir.Op, in []Tensor, _ []*Buffer) error {
	wd := op.Attr().Float("weight_decay")
	p, g, lr := in[0], in[1], scalarOperand(in[2])
	store := updateStore(b, in, 3)
	store(p, func(idx []Expr) Expr {
		pv, gv := conv(p.At(idx), F64), conv(g.At(idx), F64)
		return sub(pv, mul(lr, add(gv, mul(Float{V: wd, K: F64}, pv))))
	})
	return nil
}

func lowerMomentum(b *builder, op *ir.Op, in []Tensor, _ []*Buffer) error {
	wd, nesterov := op.Attr().Float("weight_decay"), op.Attr().Bool("nesterov")
	p, g, buf, lr, mu := in[0], in[1], in[2], scalarOperand(in[3]), scalarOperand(in[4])
	store := updateStore(b, in, 5)
	d := func(idx []Expr) Expr {
		return add(conv(g.At(idx), F64), mul(Float{V: wd, K: F64}, conv(p.At(idx), F64)))
	}
	store(buf, func(idx []Expr) Expr {
		return add(mul(mu, conv(buf.At(idx), F64)), d(idx))
	})
	store(p, func(idx []Expr) Expr {
		step := conv(buf.At(idx), F64) // the buffer just stored
		if nesterov {
			step = add(d(idx), mul(mu, step))
		}
		return sub(conv(p.At(idx), F64), mul(lr, step))
	})
	return nil
}

// lowerAdam lowers adam_update and, with vmax, amsgrad_update.
func lowerAdam(b *builder, op *ir.Op, in []Tensor, _ []*Buffer) error {
	a := op.Attr()
	wd, eps, decoupled := a.Float("weight_decay"), a.Float("eps"), a.Bool("decoupled")
	n := 4
	if op.Kind == "amsgrad_update" {
		n = 5
	}
	p, g, m, v := in[0], in[1], in[2], in[3]
	f := func(x float64) Expr { return Float{V: x, K: F64} }
	lr, t := scalarOperand(in[n]), add(scalarOperand(in[n+1]), f(1)) // t: the steps taken before this one, and this one
	b1, b2 := scalarOperand(in[n+2]), scalarOperand(in[n+3])
	bc1, bc2 := sub(f(1), bin(scalar.Pow, b1, t)), sub(f(1), bin(scalar.Pow, b2, t))
	store := updateStore(b, in, n+4)
	d := func(idx []Expr) Expr {
		gv := conv(g.At(idx), F64)
		if decoupled {
			return gv
		}
		return add(gv, mul(f(wd), conv(p.At(idx), F64)))
	}
	store(m, func(idx []Expr) Expr {
		return add(mul(b1, conv(m.At(idx), F64)), mul(sub(f(1), b1), d(idx)))
	})
	store(v, func(idx []Expr) Expr {
		dv := d(idx)
		return add(mul(b2, conv(v.At(idx), F64)), mul(sub(f(1), b2), mul(dv, dv)))
	})
	second := v
	if n == 5 {
		vmax := in[4]
		store(vmax, func(idx []Expr) Expr {
			return bin(scalar.Max, conv(vmax.At(idx), F64), conv(v.At(idx), F64))
		})
		second = vmax
	}
	store(p, func(idx []Expr) Expr {
		pv := conv(p.At(idx), F64)
		if decoupled {
			pv = mul(pv, sub(f(1), mul(lr, f(wd))))
		}
		denom := add(div(un(scalar.Sqrt, conv(second.At(idx), F64)), un(scalar.Sqrt, bc2)), f(eps))
		return sub(pv, div(mul(div(lr, bc1), conv(m.At(idx), F64)), denom))
	})
	return nil
}
