package interp

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

// poolWindow calls fn for every input position (ih, iw) inside the
// window of output (oh, ow), and reports the window's size counted as
// average pooling divides (padding included when count_include_pad).
func poolWindow(p ir.PoolGeometry, oh, ow int64, fn func(ih, iw int64)) int64 {
	count := int64(0)
	for kh := int64(0); kh < p.KH; kh++ {
		ih := oh*p.SH - p.PT + kh*p.DH
		for kw := int64(0); kw < p.KW; kw++ {
			iw := ow*p.SW - p.PL + kw*p.DW
			inside := ih >= 0 && ih < p.H && iw >= 0 && iw < p.W
			if inside {
				fn(ih, iw)
				count++
			} else if p.CountIncludePad && ih < p.H+p.PB && iw < p.W+p.PR {
				count++
			}
		}
	}
	return count
}

// argmaxWindow returns the flat position within the plane of the first
// maximum of a window, or -1 when the window holds no input.
func argmaxWindow(p ir.PoolGeometry, plane []float64, oh, ow int64) int64 {
	best, at := math.Inf(-1), int64(-1)
	poolWindow(p, oh, ow, func(ih, iw int64) {
		v := plane[ih*p.W+iw]
		if at < 0 || v > best || v != v && best == best {
			best, at = v, ih*p.W+iw
		}
	})
	return at
}

func init() {
	kernels["max_pool2d"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		p, _ := ir.PoolGeometryOf(in[0].Type.Shape, op.Attr())
		y := New(out[0])
		parallelFor(int(p.N*p.C), func(nc int) {
			plane := in[0].F[int64(nc)*p.H*p.W:]
			for oh := int64(0); oh < p.OH; oh++ {
				for ow := int64(0); ow < p.OW; ow++ {
					v := math.Inf(-1)
					if at := argmaxWindow(p, plane, oh, ow); at >= 0 {
						v = plane[at]
					}
					y.F[(int64(nc)*p.OH+oh)*p.OW+ow] = v
				}
			}
		})
		return []*Tensor{y}, nil
	}
	kernels["max_pool2d_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dy, x := in[0], in[1]
		p, _ := ir.PoolGeometryOf(x.Type.Shape, op.Attr())
		dx := New(out[0])
		parallelFor(int(p.N*p.C), func(nc int) {
			plane := x.F[int64(nc)*p.H*p.W:]
			for oh := int64(0); oh < p.OH; oh++ {
				for ow := int64(0); ow < p.OW; ow++ {
					if at := argmaxWindow(p, plane, oh, ow); at >= 0 {
						dx.F[int64(nc)*p.H*p.W+at] += dy.F[(int64(nc)*p.OH+oh)*p.OW+ow]
					}
				}
			}
		})
		return []*Tensor{dx}, nil
	}
	kernels["avg_pool2d"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		p, _ := ir.PoolGeometryOf(in[0].Type.Shape, op.Attr())
		y := New(out[0])
		parallelFor(int(p.N*p.C), func(nc int) {
			plane := in[0].F[int64(nc)*p.H*p.W:]
			for oh := int64(0); oh < p.OH; oh++ {
				for ow := int64(0); ow < p.OW; ow++ {
					s := 0.0
					cnt := poolWindow(p, oh, ow, func(ih, iw int64) { s += plane[ih*p.W+iw] })
					y.F[(int64(nc)*p.OH+oh)*p.OW+ow] = s / float64(max(cnt, 1))
				}
			}
		})
		return []*Tensor{y}, nil
	}
	kernels["avg_pool2d_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		p, _ := ir.PoolGeometryOf(out[0].Shape, op.Attr())
		dx := New(out[0])
		parallelFor(int(p.N*p.C), func(nc int) {
			plane := dx.F[int64(nc)*p.H*p.W:]
			for oh := int64(0); oh < p.OH; oh++ {
				for ow := int64(0); ow < p.OW; ow++ {
					cnt := poolWindow(p, oh, ow, func(int64, int64) {})
					g := in[0].F[(int64(nc)*p.OH+oh)*p.OW+ow] / float64(max(cnt, 1))
					poolWindow(p, oh, ow, func(ih, iw int64) { plane[ih*p.W+iw] += g })
				}
			}
		})
		return []*Tensor{dx}, nil
	}
	kernels["global_avg_pool"] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		y := reduceTo(in[0], out[0].Shape, "reduce_mean")
		return []*Tensor{y}, nil
	}

	kernels["batch_norm_train"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x, scale, bias, rm, rv := in[0], in[1], in[2], in[3], in[4]
		eps, mom := op.Attr().Float("epsilon"), op.Attr().Float("momentum")
		n, c, inner := bnDims(x.Type.Shape)
		y, nrm, nrv, sm, si := New(out[0]), New(out[1]), New(out[2]), New(out[3]), New(out[4])
		cnt := float64(n * inner)
		for ch := int64(0); ch < c; ch++ {
			mean, m2 := 0.0, 0.0
			for b := int64(0); b < n; b++ {
				for _, v := range x.F[(b*c+ch)*inner : (b*c+ch+1)*inner] {
					mean += v
				}
			}
			mean /= cnt
			for b := int64(0); b < n; b++ {
				for _, v := range x.F[(b*c+ch)*inner : (b*c+ch+1)*inner] {
					m2 += (v - mean) * (v - mean)
				}
			}
			variance := m2 / cnt
			invstd := 1 / math.Sqrt(variance+eps)
			for b := int64(0); b < n; b++ {
				base := (b*c + ch) * inner
				for i := base; i < base+inner; i++ {
					y.F[i] = (x.F[i]-mean)*invstd*scale.F[ch] + bias.F[ch]
				}
			}
			unbiased := variance
			if cnt > 1 && op.Attr().Bool("unbiased") {
				unbiased = m2 / (cnt - 1)
			}
			// ONNX: running = running * momentum + batch * (1 - momentum).
			nrm.F[ch] = rm.F[ch]*mom + mean*(1-mom)
			nrv.F[ch] = rv.F[ch]*mom + unbiased*(1-mom)
			sm.F[ch], si.F[ch] = mean, invstd
		}
		return []*Tensor{y, nrm, nrv, sm, si}, nil
	}
	kernels["batch_norm_infer"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x, scale, bias, mean, variance := in[0], in[1], in[2], in[3], in[4]
		eps := op.Attr().Float("epsilon")
		n, c, inner := bnDims(x.Type.Shape)
		y := New(out[0])
		for b := int64(0); b < n; b++ {
			for ch := int64(0); ch < c; ch++ {
				k := scale.F[ch] / math.Sqrt(variance.F[ch]+eps)
				base := (b*c + ch) * inner
				for i := base; i < base+inner; i++ {
					y.F[i] = (x.F[i]-mean.F[ch])*k + bias.F[ch]
				}
			}
		}
		return []*Tensor{y}, nil
	}
	kernels["batch_norm_grad"] = func(_ *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dy, x, scale, mean, invstd := in[0], in[1], in[2], in[3], in[4]
		n, c, inner := bnDims(x.Type.Shape)
		dx, ds, db := New(out[0]), New(out[1]), New(out[2])
		cnt := float64(n * inner)
		for ch := int64(0); ch < c; ch++ {
			sdy, sdyx := 0.0, 0.0
			for b := int64(0); b < n; b++ {
				base := (b*c + ch) * inner
				for i := base; i < base+inner; i++ {
					sdy += dy.F[i]
					sdyx += dy.F[i] * (x.F[i] - mean.F[ch]) * invstd.F[ch]
				}
			}
			db.F[ch], ds.F[ch] = sdy, sdyx
			k := scale.F[ch] * invstd.F[ch]
			for b := int64(0); b < n; b++ {
				base := (b*c + ch) * inner
				for i := base; i < base+inner; i++ {
					xhat := (x.F[i] - mean.F[ch]) * invstd.F[ch]
					dx.F[i] = k * (dy.F[i] - sdy/cnt - xhat*sdyx/cnt)
				}
			}
		}
		return []*Tensor{dx, ds, db}, nil
	}

	kernels["layer_norm"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x, scale := in[0], in[1]
		eps := op.Attr().Float("epsilon")
		center := op.Attr().Bool("center")
		rows, cols := lnDims(x.Type.Shape, op.Attrs)
		y, mean, inv := New(out[0]), New(out[1]), New(out[2])
		parallelRows(int(rows), int(8*cols), func(lo, hi int) {
			for r := int64(lo); r < int64(hi); r++ {
				row := x.F[r*cols : (r+1)*cols]
				mu := 0.0
				if center {
					for _, v := range row {
						mu += v
					}
					mu /= float64(cols)
				}
				v2 := 0.0
				for _, v := range row {
					v2 += (v - mu) * (v - mu)
				}
				is := 1 / math.Sqrt(v2/float64(cols)+eps)
				yr := y.F[r*cols : (r+1)*cols]
				for j, v := range row {
					yr[j] = (v - mu) * is * scale.F[j]
					if len(in) == 3 {
						yr[j] += in[2].F[j]
					}
				}
				mean.F[r], inv.F[r] = mu, is
			}
		})
		return []*Tensor{y, mean, inv}, nil
	}
	kernels["layer_norm_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dy, x, scale, mean, inv := in[0], in[1], in[2], in[3], in[4]
		rows, cols := lnDims(x.Type.Shape, op.Attrs)
		dx, ds, db := New(out[0]), New(out[1]), New(out[2])
		for r := int64(0); r < rows; r++ {
			a, b := 0.0, 0.0 // mean of g and of g*xhat, with g = dy*scale
			for j := int64(0); j < cols; j++ {
				i := r*cols + j
				xhat := (x.F[i] - mean.F[r]) * inv.F[r]
				g := dy.F[i] * scale.F[j]
				a += g
				b += g * xhat
				ds.F[j] += dy.F[i] * xhat
				db.F[j] += dy.F[i]
			}
			a /= float64(cols)
			b /= float64(cols)
			if !op.Attr().Bool("center") {
				a = 0 // the mean is not subtracted, so it passes no gradient
			}
			for j := int64(0); j < cols; j++ {
				i := r*cols + j
				xhat := (x.F[i] - mean.F[r]) * inv.F[r]
				dx.F[i] = inv.F[r] * (dy.F[i]*scale.F[j] - a - xhat*b)
			}
		}
		return []*Tensor{dx, ds, db}, nil
	}

	softmaxKernel := func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x := in[0]
		y := New(out[0])
		log := op.Kind == "log_softmax"
		eachLine(x.Type.Shape, op.Attr().Int("axis"), func(idx func(int64) int64, n int64) {
			m := math.Inf(-1)
			for j := int64(0); j < n; j++ {
				m = math.Max(m, x.F[idx(j)])
			}
			s := 0.0
			for j := int64(0); j < n; j++ {
				s += math.Exp(x.F[idx(j)] - m)
			}
			for j := int64(0); j < n; j++ {
				if log {
					y.F[idx(j)] = x.F[idx(j)] - m - math.Log(s)
				} else {
					y.F[idx(j)] = math.Exp(x.F[idx(j)]-m) / s
				}
			}
		})
		return []*Tensor{y}, nil
	}
	kernels["softmax"] = softmaxKernel
	kernels["log_softmax"] = softmaxKernel
	softmaxGrad := func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dy, y := in[0], in[1]
		dx := New(out[0])
		log := op.Kind == "log_softmax_grad"
		eachLine(y.Type.Shape, op.Attr().Int("axis"), func(idx func(int64) int64, n int64) {
			s := 0.0
			for j := int64(0); j < n; j++ {
				if log {
					s += dy.F[idx(j)]
				} else {
					s += dy.F[idx(j)] * y.F[idx(j)]
				}
			}
			for j := int64(0); j < n; j++ {
				i := idx(j)
				if log {
					dx.F[i] = dy.F[i] - math.Exp(y.F[i])*s
				} else {
					dx.F[i] = y.F[i] * (dy.F[i] - s)
				}
			}
		})
		return []*Tensor{dx}, nil
	}
	kernels["softmax_grad"] = softmaxGrad
	kernels["log_softmax_grad"] = softmaxGrad

	kernels["dropout"] = func(op *ir.Op, in []*Tensor, out []ir.Type, rt *runtime) ([]*Tensor, error) {
		ratio := op.Attr().Float("ratio")
		seed, offset := uint64(op.Attr().Int("seed")), randomStart(op, in, rt)
		y, mask := New(out[0]), New(out[1])
		scale := 1 / (1 - ratio)
		for i, v := range in[0].F {
			if DropoutKeep(seed, offset+uint64(i), ratio) {
				mask.I[i] = 1
				y.F[i] = v * scale
			}
		}
		return []*Tensor{y, mask}, nil
	}
	kernels["dropout_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, rt *runtime) ([]*Tensor, error) {
		ratio := op.Attr().Float("ratio")
		scale := 1 / (1 - ratio)
		seed, offset := uint64(op.Attr().Int("seed")), randomStart(op, in, rt)
		masked := len(in) == 2 && ir.RandomKey(op) == nil
		dx := New(out[0])
		for i, g := range in[0].F {
			keep := !masked && DropoutKeep(seed, offset+uint64(i), ratio) || masked && in[1].I[i] != 0
			if keep {
				dx.F[i] = g * scale
			}
		}
		return []*Tensor{dx}, nil
	}
	kernels["random_uniform"] = func(op *ir.Op, in []*Tensor, out []ir.Type, rt *runtime) ([]*Tensor, error) {
		y := New(out[0])
		seed, offset := uint64(op.Attr().Int("seed")), randomStart(op, in, rt)
		for i := range y.F {
			y.F[i] = Uniform(seed, offset+uint64(i))
		}
		return []*Tensor{y}, nil
	}

	kernels["softmax_cross_entropy"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		loss := 0.0
		count := 0
		err := crossEntropy(in[0], in[1], func(logZ float64, label int64, idx func(int64) int64) {
			loss -= in[0].F[idx(label)] - logZ
			count++
		})
		if err != nil {
			return nil, err
		}
		if op.Attr().String("reduction") == "mean" && count > 0 {
			loss /= float64(count)
		}
		y := New(out[0])
		y.F[0] = loss
		return []*Tensor{y}, nil
	}
	kernels["softmax_cross_entropy_grad"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dl, logits, labels := in[0], in[1], in[2]
		dx := New(out[0])
		scale := dl.F[0]
		if op.Attr().String("reduction") == "mean" {
			scale /= float64(labels.Len())
		}
		k := logits.Type.Shape[1]
		err := crossEntropy(logits, labels, func(logZ float64, label int64, idx func(int64) int64) {
			for j := int64(0); j < k; j++ {
				g := math.Exp(logits.F[idx(j)] - logZ)
				if j == label {
					g--
				}
				dx.F[idx(j)] = g * scale
			}
		})
		return []*Tensor{dx}, err
	}
}

// crossEntropy visits each (sample, position) of logits[N,K,...] with the
// log partition function, its label and an index function over classes.
func crossEntropy(logits, labels *Tensor, fn func(logZ float64, label int64, idx func(int64) int64)) error {
	var err error
	k := logits.Type.Shape[1]
	p := make([]float64, k)
	i := int64(0)
	eachLine(logits.Type.Shape, 1, func(idx func(int64) int64, n int64) {
		m := math.Inf(-1)
		for j := int64(0); j < n; j++ {
			p[j] = logits.F[idx(j)]
			m = math.Max(m, p[j])
		}
		s := 0.0
		for j := int64(0); j < n; j++ {
			s += math.Exp(p[j] - m)
		}
		label := labels.I[i]
		if label < 0 || label >= k {
			if err == nil {
				err = &labelError{label: label, classes: k}
			}
			i++
			return
		}
		fn(m+math.Log(s), label, idx)
		i++
	})
	return err
}

type labelError struct{ label, classes int64 }

func (e *labelError) Error() string {
	return "label " + itoa(e.label) + " is outside [0, " + itoa(e.classes) + ")"
}

// eachLine calls fn for every 1-D line of shape s along axis, in row-major
// order of the other dimensions, with a function from position along the
// line to flat index.
func eachLine(s ir.Shape, axis int64, fn func(idx func(int64) int64, n int64)) {
	ax, _ := ir.NormalizeAxis(axis, len(s))
	outer, _ := s[:ax].NumElements()
	inner, _ := s[ax+1:].NumElements()
	n := s[ax]
	for o := int64(0); o < outer; o++ {
		for in := int64(0); in < inner; in++ {
			base := o*n*inner + in
			fn(func(j int64) int64 { return base + j*inner }, n)
		}
	}
}

func bnDims(s ir.Shape) (n, c, inner int64) {
	inner, _ = s[2:].NumElements()
	return s[0], s[1], inner
}

func lnDims(s ir.Shape, a ir.Attrs) (rows, cols int64) {
	ax, _ := ir.NormalizeAxis(a.Int("axis", -1), len(s))
	rows, _ = s[:ax].NumElements()
	cols, _ = s[ax:].NumElements()
	return rows, cols
}

// randomOffset is where a random op's counter starts on the rank rt runs
// (ir.RandomOffset; rank 0 without ranks).
func randomOffset(op *ir.Op, rt *runtime) uint64 {
	rank := int64(0)
	if rt != nil {
		rank = rt.rank
	}
	return uint64(ir.RandomOffset(op.Attr(), rank))
}

// randomStart is the number a random op draws for its first element: its
// offset (randomOffset) past its key operand's position, if it has one.
func randomStart(op *ir.Op, in []*Tensor, rt *runtime) uint64 {
	off := randomOffset(op, rt)
	if ir.RandomKey(op) != nil {
		off += uint64(in[len(in)-1].I[0])
	}
	return off
}

// DropoutKeep is the dropout mask: element i of a dropout op with the given
// seed is kept when a counter-based hash of (seed, i) falls at or above
// ratio. Recomputing the op therefore reproduces the mask exactly.
func DropoutKeep(seed, i uint64, ratio float64) bool { return Uniform(seed, i) >= ratio }

// Uniform is element i of the counter-based uniform [0,1) sequence of
// seed (dropout's masks and random_uniform).
func Uniform(seed, i uint64) float64 {
	h := Mix64(seed*0x9E3779B97F4A7C15 ^ Mix64(i+0x632BE59BD9B4E019))
	return float64(h>>11) / (1 << 53)
}

// Mix64 is the SplitMix64 finaliser.
func Mix64(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func itoa(v int64) string {
	if v < 0 {
		return "-" + itoa(-v)
	}
	if v < 10 {
		return string(rune('0' + v))
	}
	return itoa(v/10) + string(rune('0'+v%10))
}
