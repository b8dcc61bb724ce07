package loops

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// stageRule lowers an op that needs loops of its own (reductions,
// contractions, scatters, in-place updates) into stages that write its
// results to out.
type stageRule func(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error

var stageRules = map[string]stageRule{}

// reduceInto folds x into out, whose shape is x's with reduced dimensions
// set to 1 (keep) and then possibly squeezed.
func reduceInto(b *builder, x Tensor, keep ir.Shape, out *Buffer, kind string) {
	var axes []int
	var ext []int64
	for i, d := range x.Type.Shape {
		if keep[i] == 1 && d != 1 {
			axes = append(axes, i)
			ext = append(ext, d)
		}
	}
	o := alias(out, keep)
	k := ComputeKind(x.Type.DType)
	acc := k
	op := map[string]scalar.Prim{"reduce_max": scalar.Max, "reduce_min": scalar.Min}[kind]
	if op == 0 {
		op = scalar.Add
		if k == F32 {
			acc = F64 // sums accumulate in f64
		}
	}
	count := numElements(x.Type.Shape) / max(numElements(keep), 1)
	b.store(o, func(idx []Expr) Expr {
		r := b.reduce(op, acc, ext, func(r []Expr) Expr {
			src := append([]Expr(nil), idx...)
			for j, a := range axes {
				src[a] = r[j]
			}
			return x.At(src)
		})
		if kind == "reduce_mean" {
			r = div(r, like(r, float64(count)))
		}
		return r
	})
}

// keepShape aligns target to x's rank with leading ones.
func keepShape(x ir.Shape, target ir.Shape) ir.Shape {
	keep := make(ir.Shape, len(x))
	off := len(x) - len(target)
	for i := range keep {
		keep[i] = 1
		if i >= off {
			keep[i] = target[i-off]
		}
	}
	return keep
}

func init() {
	for _, name := range []string{"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"} {
		stageRules[name] = func(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
			axes, err := ir.ReduceAxes(op.Attr(), in[0].Type.Rank())
			if err != nil {
				return err
			}
			reduceInto(b, in[0], ir.ReducedShape(in[0].Type.Shape, axes, true), out[0], op.Kind)
			return nil
		}
	}
	stageRules["sum_to"] = func(b *builder, _ *ir.Op, in []Tensor, out []*Buffer) error {
		reduceInto(b, in[0], keepShape(in[0].Type.Shape, out[0].Type.Shape), out[0], "reduce_sum")
		return nil
	}
	stageRules["global_avg_pool"] = func(b *builder, _ *ir.Op, in []Tensor, out []*Buffer) error {
		reduceInto(b, in[0], out[0].Type.Shape, out[0], "reduce_mean")
		return nil
	}
	stageRules["matmul"] = lowerMatmul
	stageRules["gemm"] = lowerGemm
	stageRules["conv2d"] = lowerConv
	stageRules["conv2d_grad_input"] = lowerConvGradInput
	stageRules["conv2d_grad_weight"] = lowerConvGradWeight
	stageRules["max_pool2d"] = lowerMaxPool
	stageRules["max_pool2d_grad"] = lowerMaxPoolGrad
	stageRules["avg_pool2d"] = lowerAvgPool
	stageRules["avg_pool2d_grad"] = lowerAvgPoolGrad
	stageRules["gather_grad"] = lowerGatherGrad
	stageRules["lerp_gather"] = lowerLerpGather
	stageRules["lerp_gather_grad"] = lowerLerpGatherGrad
	stageRules["gather_elements_grad"] = lowerGatherElementsGrad
}

func lowerMatmul(b *builder, _ *ir.Op, in []Tensor, out []*Buffer) error {
	as, bs := in[0].Type.Shape, in[1].Type.Shape
	if len(as) == 1 {
		as = ir.Shape{1, as[0]}
	}
	if len(bs) == 1 {
		bs = ir.Shape{bs[0], 1}
	}
	if len(bs) == 2 && len(as) > 2 {
		// B has no batch dimensions: A's rows, batches included, form one
		// matrix (the [seq, batch, hidden] layout of attention projections).
		as = ir.Shape{numElements(as[:len(as)-1]), as[len(as)-1]}
	}
	m, k, n := as[len(as)-2], as[len(as)-1], bs[len(bs)-1]
	batch, err := ir.BroadcastShapes(as[:len(as)-2], bs[:len(bs)-2])
	if err != nil {
		return err
	}
	A, B := view(in[0], as), view(in[1], bs)
	nb := numElements(batch)
	o := alias(out[0], ir.Shape{nb, m, n})
	b.loop(nb, func(bv *Var) {
		bi := unflatten(bv, batch)
		ai, bbi := bcast(bi, as[:len(as)-2], batch), bcast(bi, bs[:len(bs)-2], batch)
		b.matmul(o, m, n, k,
			func(mm, nn Expr) []Expr { return []Expr{bv, mm, nn} },
			func(mm, kk Expr) Expr { return A.At(append(append([]Expr(nil), ai...), mm, kk)) },
			func(kk, nn Expr) Expr { return B.At(append(append([]Expr(nil), bbi...), kk, nn)) },
			nil, false)
	})
	return nil
}

func lowerGemm(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	m, n, k, err := ir.GemmDims(in[0].Type, in[1].Type, op.Attr())
	if err != nil {
		return err
	}
	ta, tb := op.Attr().Bool("trans_a"), op.Attr().Bool("trans_b")
	alpha, beta := op.Attr().Float("alpha"), op.Attr().Float("beta")
	a := func(mm, kk Expr) Expr {
		if ta {
			return in[0].At([]Expr{kk, mm})
		}
		return in[0].At([]Expr{mm, kk})
	}
	bv := func(kk, nn Expr) Expr {
		if tb {
			return in[1].At([]Expr{nn, kk})
		}
		return in[1].At([]Expr{kk, nn})
	}
	s := out[0].Type.Shape
	var epi func(acc, m, n Expr) Expr
	if alpha != 1 || len(in) == 3 {
		epi = func(acc, mm, nn Expr) Expr {
			r := mul(acc, like(acc, alpha))
			if len(in) == 3 {
				c := in[2].At(bcast([]Expr{mm, nn}, in[2].Type.Shape, s))
				r = add(r, mul(conv(c, acc.Kind()), like(acc, beta)))
			}
			return r
		}
	}
	b.matmul(out[0], m, n, k, func(mm, nn Expr) []Expr { return []Expr{mm, nn} }, a, bv, epi, false)
	return nil
}

// convDims are the matrix sizes of a convolution per image and group.
func convDims(g ir.ConvGeometry) (cg, mg, kdim, ohw int64) {
	cg, mg = g.C/g.Groups, g.M/g.Groups
	return cg, mg, cg * g.KH * g.KW, g.OH * g.OW
}

func pointwise(g ir.ConvGeometry) bool {
	return g.KH == 1 && g.KW == 1 && g.SH == 1 && g.SW == 1 && g.PT == 0 && g.PL == 0 && g.PB == 0 && g.PR == 0
}

// im2col stores, for image n and group gr, col[r, p] = x under kernel tap
// r = (c, kh, kw) at output position p = (oh, ow) (0 in the padding); with
// transposed it stores col[p, r] instead.
//
// Only output rows [oh0, oh0+rows) are stored (a chunk that bounds the
// workspace); transposed always stores all of them.
func im2col(b *builder, x Tensor, g ir.ConvGeometry, n, gr, oh0 Expr, rows int64, transposed bool) *Buffer {
	_, _, kdim, _ := convDims(g)
	shape := ir.Shape{kdim, rows, g.OW}
	if transposed {
		shape = ir.Shape{g.OH, g.OW, kdim}
	}
	col := b.temp("col", ir.Type{DType: x.Type.DType, Shape: shape})
	b.store(col, func(idx []Expr) Expr {
		r, oh, ow := idx[0], add(oh0, idx[1]), idx[2]
		if transposed {
			oh, ow, r = idx[0], idx[1], idx[2]
		}
		return tap(x, g, n, gr, r, oh, ow)
	})
	if transposed {
		return alias(col, ir.Shape{g.OH * g.OW, kdim})
	}
	return alias(col, ir.Shape{kdim, rows * g.OW})
}

// tap is the input under kernel tap r = (c, kh, kw) of group gr at output
// position (oh, ow) of image n: 0 in the padding.
func tap(x Tensor, g ir.ConvGeometry, n, gr, r, oh, ow Expr) Expr {
	cg := g.C / g.Groups
	t := unflatten(r, ir.Shape{cg, g.KH, g.KW})
	ih := add(sub(mul(oh, Int{g.SH}), Int{g.PT}), mul(t[1], Int{g.DH}))
	iw := add(sub(mul(ow, Int{g.SW}), Int{g.PL}), mul(t[2], Int{g.DW}))
	ok := and(inRange(ih, g.H), inRange(iw, g.W))
	return &Guarded{Cond: ok, X: x.At([]Expr{n, add(mul(gr, Int{cg}), t[0]), ih, iw})}
}

// im2colImages stores im2col for images [n0, n0+nb) of the batch at
// once, for group gr: col[r, i·OH·OW + p] for image n0+i (transposed:
// col[i·OH·OW + p, r]). A convolution then runs as one matrix product per
// group over nb images (convImages) rather than one per image, each too
// small to share among threads or to fill the product's register tiles.
func im2colImages(b *builder, x Tensor, g ir.ConvGeometry, n0 Expr, nb int64, gr Expr, transposed bool) *Buffer {
	_, _, kdim, ohw := convDims(g)
	shape := ir.Shape{kdim, nb, g.OH, g.OW}
	if transposed {
		shape = ir.Shape{nb, g.OH, g.OW, kdim}
	}
	col := b.temp("col", ir.Type{DType: x.Type.DType, Shape: shape})
	b.store(col, func(idx []Expr) Expr {
		r, i, oh, ow := idx[0], idx[1], idx[2], idx[3]
		if transposed {
			i, oh, ow, r = idx[0], idx[1], idx[2], idx[3]
		}
		return tap(x, g, add(n0, i), gr, r, oh, ow)
	})
	if transposed {
		return alias(col, ir.Shape{nb * ohw, kdim})
	}
	return alias(col, ir.Shape{kdim, nb * ohw})
}

// convImages is how many images a convolution's products cover at a
// time, a divisor of the batch (1: one product per image, its im2col in
// chunks of output rows): the whole batch when its im2col fits
// im2colBytes, else 1, unless Options.Im2colBytes is set and wide says
// the per-image product is the narrow one: then the fewest images whose
// output positions make a product of wideColumns columns, if their
// im2col fits that bound, else the most that fit it.
func (b *builder) convImages(g ir.ConvGeometry, elem int64, wide bool) int64 {
	_, _, kdim, ohw := convDims(g)
	per, ok := (ir.Shape{kdim, ohw, elem}).NumElements()
	if g.N <= 1 || pointwise(g) || !ok {
		return 1
	}
	if per <= im2colBytes/g.N {
		return g.N
	}
	if b.opts.Im2colBytes == 0 || !wide {
		return 1
	}
	best := int64(1)
	for d := int64(1); d <= g.N; d++ {
		if g.N%d != 0 {
			continue
		}
		if per > b.opts.Im2colBytes/d {
			break
		}
		best = d
		if d*ohw >= wideColumns {
			break
		}
	}
	return best
}

// wideColumns is the output positions a convolution's product spans when
// the backend allows (Options.Im2colBytes): four of the LLVM
// microkernel's packed panels, so that its threads split the product by
// panels.
const wideColumns = 512

// imageChunks runs body for each chunk of nb images of a batch of N, n0
// its first image: once, with n0 = 0, when the chunk is the batch.
func (b *builder) imageChunks(N, nb int64, body func(n0 Expr)) {
	if nb == N {
		body(Int{0})
		return
	}
	b.loop(N/nb, func(c *Var) { body(mul(c, Int{nb})) })
}

// imagePos splits a column q of a product over several images into its
// image (counted from the chunk's first) and its output position: q =
// n·OH·OW + p.
func imagePos(q Expr, ohw int64) (n, p Expr) { return div(q, Int{ohw}), rem(q, Int{ohw}) }

// im2colBytes bounds the workspace of one im2col chunk.
const im2colBytes = 2 << 20

// chunkRows is the largest divisor of OH whose im2col chunk fits
// im2colBytes (at least 1).
func chunkRows(g ir.ConvGeometry, kdim, elem int64) int64 {
	best := int64(1)
	for r := int64(1); r <= g.OH; r++ {
		if g.OH%r == 0 && kdim*r*g.OW*elem <= im2colBytes {
			best = r
		}
	}
	return best
}

// convBias is the epilogue adding a convolution's bias (in[2]) to the
// sums of group gr's mg output channels, or nil without one.
func convBias(in []Tensor, gr Expr, mg int64) func(acc, m, q Expr) Expr {
	if len(in) < 3 {
		return nil
	}
	return func(acc, m, _ Expr) Expr {
		return add(acc, conv(in[2].At([]Expr{add(mul(gr, Int{mg}), m)}), acc.Kind()))
	}
}

func lowerConv(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	x, w := in[0], in[1]
	g, err := ir.ConvGeometryOf(x.Type.Shape, w.Type.Shape, op.Attr())
	if err != nil {
		return err
	}
	cg, mg, kdim, ohw := convDims(g)
	W := view(w, ir.Shape{g.M, kdim})
	o := alias(out[0], ir.Shape{g.N, g.M, ohw})
	if b.opts.ImplicitGemm {
		implicitConv(b, in, g, out[0])
		return nil
	}
	// Columns read at stride 2 only from an f32 buffer, which the LLVM
	// packer copies with vector loads and a shuffle (element by element
	// the strided reads became gathers, slower than the im2col).
	strideOK := g.SW == 1 || g.SW == 2 && x.Buf != nil && x.Type.DType == ir.F32
	if b.opts.ConvPanels && mg >= 4 && strideOK && ComputeKind(x.Type.DType) == F32 && !pointwise(g) {
		// One product per group over the whole batch, B read from the
		// input under the taps (no im2col stored): the backend packs its
		// panels from the input's rows. (Products over fewer images, each
		// store of a result linear in its columns, were no faster on
		// ResNet-18's convolutions, and the Fashion-MNIST CNN's first one,
		// per image, too small to share among threads.)
		tapProduct(b, out[0], x, g, func(gr, m, r Expr) Expr { return W.At([]Expr{add(mul(gr, Int{mg}), m), r}) },
			func(gr Expr) func(acc, m, q Expr) Expr { return convBias(in, gr, mg) })
		return nil
	}
	if nb := b.convImages(g, x.Type.DType.Size(), true); nb > 1 {
		b.imageChunks(g.N, nb, func(n0 Expr) {
			b.loop(g.Groups, func(gr *Var) {
				col := FromBuffer(im2colImages(b, x, g, n0, nb, gr, false))
				b.matmul(o, mg, nb*ohw, kdim,
					func(m, q Expr) []Expr {
						n, p := imagePos(q, ohw)
						return []Expr{add(n0, n), add(mul(gr, Int{mg}), m), p}
					},
					func(m, r Expr) Expr { return W.At([]Expr{add(mul(gr, Int{mg}), m), r}) },
					func(r, q Expr) Expr { return col.At([]Expr{r, q}) },
					convBias(in, gr, mg), false)
			})
		})
		return nil
	}
	b.loop(g.N, func(n *Var) {
		b.loop(g.Groups, func(gr *Var) {
			epi := convBias(in, gr, mg)
			a := func(m, r Expr) Expr { return W.At([]Expr{add(mul(gr, Int{mg}), m), r}) }
			if pointwise(g) {
				xs := view(x, ir.Shape{g.N, g.C, ohw})
				b.matmul(o, mg, ohw, kdim,
					func(m, p Expr) []Expr { return []Expr{n, add(mul(gr, Int{mg}), m), p} },
					a, func(r, p Expr) Expr { return xs.At([]Expr{n, add(mul(gr, Int{cg}), r), p}) },
					epi, false)
				return
			}
			// im2col a chunk of output rows at a time, then multiply.
			rows := chunkRows(g, kdim, x.Type.DType.Size())
			b.loop(g.OH/rows, func(c *Var) {
				oh0 := mul(c, Int{rows})
				col := FromBuffer(im2col(b, x, g, n, gr, oh0, rows, false))
				b.matmul(o, mg, rows*g.OW, kdim,
					func(m, p Expr) []Expr { return []Expr{n, add(mul(gr, Int{mg}), m), add(mul(oh0, Int{g.OW}), p)} },
					a, func(r, p Expr) Expr { return col.At([]Expr{r, p}) },
					epi, false)
			})
		})
	})
	return nil
}

func lowerConvGradInput(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, w := in[0], in[1]
	g, err := ir.ConvGeometryOf(out[0].Type.Shape, w.Type.Shape, op.Attr())
	if err != nil {
		return err
	}
	cg, mg, kdim, ohw := convDims(g)
	if b.opts.ImplicitGemm {
		implicitConvGradInput(b, dy, w, g, out[0])
		return nil
	}
	if b.opts.ConvPanels && g.SH == 1 && g.SW == 1 && cg >= 4 && ComputeKind(out[0].Type.DType) == F32 && !pointwise(g) {
		convTransposedTaps(b, dy, w, g, out[0])
		return nil
	}
	W := view(w, ir.Shape{g.M, kdim})
	DY := view(dy, ir.Shape{g.N, g.M, ohw})
	// Per image, the product's rows are the kdim taps, many enough to
	// share among threads: over several images its columns' im2col
	// outgrows the caches (ResNet-18's 14² and 7² input gradients 1.3x
	// slower over 4 and 8 images).
	if nb := b.convImages(g, out[0].Type.DType.Size(), false); nb > 1 {
		b.imageChunks(g.N, nb, func(n0 Expr) {
			b.loop(g.Groups, func(gr *Var) {
				col := b.temp("col", ir.Type{DType: sumDType(out[0].Type.DType), Shape: ir.Shape{kdim, nb * ohw}})
				b.matmul(col, kdim, nb*ohw, mg, func(r, q Expr) []Expr { return []Expr{r, q} },
					func(r, m Expr) Expr { return W.At([]Expr{add(mul(gr, Int{mg}), m), r}) },
					func(m, q Expr) Expr {
						n, p := imagePos(q, ohw)
						return DY.At([]Expr{add(n0, n), add(mul(gr, Int{mg}), m), p})
					}, nil, false)
				vs := b.vars(4)
				i, c, ih, iw := vs[0], vs[1], vs[2], vs[3]
				b.add(&Stage{Vars: vs, Extents: []int64{nb, cg, g.H, g.W}, Out: out[0],
					Index: []Expr{add(n0, i), add(mul(gr, Int{cg}), c), ih, iw},
					Value: col2im(b, g, col, c, ih, iw, mul(i, Int{ohw}), ComputeKind(out[0].Type.DType))})
			})
		})
		return nil
	}
	b.loop(g.N, func(n *Var) {
		b.loop(g.Groups, func(gr *Var) {
			wt := func(r, m Expr) Expr { return W.At([]Expr{add(mul(gr, Int{mg}), m), r}) }
			dyg := func(m, p Expr) Expr { return DY.At([]Expr{n, add(mul(gr, Int{mg}), m), p}) }
			if pointwise(g) {
				o := alias(out[0], ir.Shape{g.N, g.C, ohw})
				b.matmul(o, cg, ohw, mg, func(c, p Expr) []Expr { return []Expr{n, add(mul(gr, Int{cg}), c), p} }, wt, dyg, nil, false)
				return
			}
			col := b.temp("col", ir.Type{DType: sumDType(out[0].Type.DType), Shape: ir.Shape{kdim, ohw}})
			b.matmul(col, kdim, ohw, mg, func(r, p Expr) []Expr { return []Expr{r, p} }, wt, dyg, nil, false)
			dx := alias(out[0], ir.Shape{g.N, g.C, g.H, g.W})
			vs := b.vars(3)
			c, ih, iw := vs[0], vs[1], vs[2]
			b.add(&Stage{Vars: vs, Extents: []int64{cg, g.H, g.W}, Out: dx,
				Index: []Expr{n, add(mul(gr, Int{cg}), c), ih, iw},
				Value: col2im(b, g, col, c, ih, iw, Int{0}, ComputeKind(out[0].Type.DType))})
		})
	})
	return nil
}

// convTransposedTaps stores the input gradient dx of a convolution of
// stride 1 as the convolution of dy with the kernel flipped and its
// channels swapped: dx[n, c, ih, iw] = Σ w[m, c, kh, kw] · dy[n, m, ih
// + PT - kh·DH, iw + PL - kw·DW], and with kh' = KH-1-kh the row read is
// ih - ((KH-1)·DH - PT) + kh'·DH: taps of dy under padding (KH-1)·DH -
// PT (and so on). One product per group over the batch, its B read
// under those taps (Options.ConvPanels) and A the flipped kernel stored
// first, so no im2col and no col2im pass.
func convTransposedTaps(b *builder, dy, w Tensor, g ir.ConvGeometry, dx *Buffer) {
	cg, mg, _, _ := convDims(g)
	t := ir.ConvGeometry{N: g.N, C: g.M, H: g.OH, W: g.OW, M: g.C, KH: g.KH, KW: g.KW, OH: g.H, OW: g.W,
		SH: 1, SW: 1, DH: g.DH, DW: g.DW, Groups: g.Groups,
		PT: (g.KH-1)*g.DH - g.PT, PL: (g.KW-1)*g.DW - g.PL, PB: (g.KH-1)*g.DH - g.PB, PR: (g.KW-1)*g.DW - g.PR}
	kdim := mg * g.KH * g.KW
	flipped := b.temp("flipped", ir.Type{DType: w.Type.DType, Shape: ir.Shape{g.C, mg, g.KH, g.KW}})
	b.store(flipped, func(idx []Expr) Expr {
		gr, c := div(idx[0], Int{cg}), rem(idx[0], Int{cg})
		return w.At([]Expr{add(mul(gr, Int{mg}), idx[1]), c, sub(Int{g.KH - 1}, idx[2]), sub(Int{g.KW - 1}, idx[3])})
	})
	A := FromBuffer(alias(flipped, ir.Shape{g.C, kdim}))
	tapProduct(b, dx, dy, t, func(gr, c, r Expr) Expr { return A.At([]Expr{add(mul(gr, Int{cg}), c), r}) }, nil)
}

// tapProduct stores the convolution of x (geometry g) as one product per
// group over the whole batch: out[n, gr·Mg + m, p] = epi(Σr a(gr, m, r) ·
// x under tap r at output position p of image n), with B read under the
// taps (Matmul.Taps, Options.ConvPanels) and epi(gr) nil or the
// epilogue of group gr. Callers ensure Mg ≥ 4 output channels per group:
// fewer make matmul emit dot products, which carry no Taps.
func tapProduct(b *builder, out *Buffer, x Tensor, g ir.ConvGeometry, a func(gr, m, r Expr) Expr, epi func(gr Expr) func(acc, m, q Expr) Expr) {
	cg, mg, kdim, ohw := convDims(g)
	o := alias(out, ir.Shape{g.N, g.M, ohw})
	b.loop(g.Groups, func(gr *Var) {
		var e func(acc, m, q Expr) Expr
		if epi != nil {
			e = epi(gr)
		}
		b.matmul(o, mg, g.N*ohw, kdim,
			func(m, q Expr) []Expr {
				n, p := imagePos(q, ohw)
				return []Expr{n, add(mul(gr, Int{mg}), m), p}
			},
			func(m, r Expr) Expr { return a(gr, m, r) },
			func(r, q Expr) Expr {
				n, p := imagePos(q, ohw)
				return tap(x, g, n, gr, r, div(p, Int{g.OW}), rem(p, Int{g.OW}))
			}, e, false)
		vs := b.vars(4)
		b.lastStage().Matmul.Taps = &Taps{Geometry: g, N: vs[0], C: vs[1], H: vs[2], W: vs[3],
			X: conv(x.At([]Expr{vs[0], add(mul(gr, Int{cg}), vs[1]), vs[2], vs[3]}), F32)}
	})
}

// implicitConv stores the convolution of in[0] by in[1] (bias in[2])
// for Options.ImplicitGemm: one product per group over the whole batch,
// B the input under the taps. A pointwise convolution of one group is a
// product per image with B the image itself.
func implicitConv(b *builder, in []Tensor, g ir.ConvGeometry, out *Buffer) {
	x, w := in[0], in[1]
	_, mg, kdim, ohw := convDims(g)
	W := view(w, ir.Shape{g.M, kdim})
	o := alias(out, ir.Shape{g.N, g.M, ohw})
	if pointwise(g) && g.Groups == 1 {
		xs := view(x, ir.Shape{g.N, g.C, ohw})
		b.loop(g.N, func(n *Var) {
			b.matmul(o, g.M, ohw, g.C, func(m, p Expr) []Expr { return []Expr{n, m, p} },
				func(m, r Expr) Expr { return W.At([]Expr{m, r}) },
				func(r, p Expr) Expr { return xs.At([]Expr{n, r, p}) }, convBias(in, Int{0}, mg), false)
		})
		return
	}
	b.perGroup(g.Groups, func(gr Expr) {
		b.matmul(o, mg, g.N*ohw, kdim,
			func(m, q Expr) []Expr {
				n, p := imagePos(q, ohw)
				return []Expr{n, add(mul(gr, Int{mg}), m), p}
			},
			func(m, r Expr) Expr { return W.At([]Expr{add(mul(gr, Int{mg}), m), r}) },
			func(r, q Expr) Expr {
				n, p := imagePos(q, ohw)
				return tap(x, g, n, gr, r, div(p, Int{g.OW}), rem(p, Int{g.OW}))
			}, convBias(in, gr, mg), false)
	})
}

// implicitConvGradInput stores the input gradient dx of a convolution
// (geometry g) of kernel w for Options.ImplicitGemm: per group, dx[n,
// gr·Cg + c, ih, iw] = Σ over k = (m, kh, kw) of w[gr·Mg + m, c, kh, kw]
// · dy[n, gr·Mg + m, oh, ow] where ih + PT - kh·DH = oh·SH and iw + PL -
// kw·DW = ow·SW inside dy (0 elsewhere): one product over the whole
// batch, any stride, no col2im. A pointwise one of one group is wᵀ · dy
// per image.
func implicitConvGradInput(b *builder, dy, w Tensor, g ir.ConvGeometry, dx *Buffer) {
	cg, mg, _, ohw := convDims(g)
	DY := view(dy, ir.Shape{g.N, g.M, ohw})
	if pointwise(g) && g.Groups == 1 {
		W := view(w, ir.Shape{g.M, g.C})
		o := alias(dx, ir.Shape{g.N, g.C, ohw})
		b.loop(g.N, func(n *Var) {
			b.matmul(o, g.C, ohw, g.M, func(c, p Expr) []Expr { return []Expr{n, c, p} },
				func(c, m Expr) Expr { return W.At([]Expr{m, c}) },
				func(m, p Expr) Expr { return DY.At([]Expr{n, m, p}) }, nil, false)
		})
		return
	}
	hw := g.H * g.W
	o := alias(dx, ir.Shape{g.N, g.C, hw})
	taps := ir.Shape{mg, g.KH, g.KW}
	b.perGroup(g.Groups, func(gr Expr) {
		b.matmul(o, cg, g.N*hw, mg*g.KH*g.KW,
			func(c, q Expr) []Expr {
				n, s := imagePos(q, hw)
				return []Expr{n, add(mul(gr, Int{cg}), c), s}
			},
			func(c, k Expr) Expr {
				t := unflatten(k, taps)
				return w.At([]Expr{add(mul(gr, Int{mg}), t[0]), c, t[1], t[2]})
			},
			func(k, q Expr) Expr {
				t := unflatten(k, taps)
				n, s := imagePos(q, hw)
				at, ok := outputUnder(g, div(s, Int{g.W}), rem(s, Int{g.W}), t[1], t[2])
				return &Guarded{Cond: ok, X: DY.At([]Expr{n, add(mul(gr, Int{mg}), t[0]), at})}
			}, nil, false)
	})
}

// perGroup runs body for each group gr of a convolution: once, with gr
// = 0, for one group (no loop around it).
func (b *builder) perGroup(groups int64, body func(gr Expr)) {
	if groups == 1 {
		body(Int{0})
		return
	}
	b.loop(groups, func(gr *Var) { body(gr) })
}

// sumDType is the dtype of partial sums of a result of dtype d: f32 for
// the narrow floats (bf16, f16, fp8), whose results round once, when
// stored, as the interpreter's do; d otherwise.
func sumDType(d ir.DType) ir.DType {
	if d.IsFloat() && d != ir.F64 {
		return ir.F32
	}
	return d
}

// outputUnder is the output position (oh·OW + ow, clamped inside the
// output) whose tap (kh, kw) reads input pixel (ih, iw), and whether
// there is one: ih + PT - kh·DH = oh·SH and iw + PL - kw·DW = ow·SW
// inside the output.
func outputUnder(g ir.ConvGeometry, ih, iw, kh, kw Expr) (at, ok Expr) {
	dh := sub(add(ih, Int{g.PT}), mul(kh, Int{g.DH}))
	dw := sub(add(iw, Int{g.PL}), mul(kw, Int{g.DW}))
	oh, ow := div(dh, Int{g.SH}), div(dw, Int{g.SW})
	ok = and(and(cmp(scalar.Ge, dh, Int{0}), cmp(scalar.Ge, dw, Int{0})), and(inRange(oh, g.OH), inRange(ow, g.OW)))
	if g.SH != 1 {
		ok = and(ok, cmp(scalar.Eq, rem(dh, Int{g.SH}), Int{0}))
	}
	if g.SW != 1 {
		ok = and(ok, cmp(scalar.Eq, rem(dw, Int{g.SW}), Int{0}))
	}
	return add(mul(clamp(oh, g.OH), Int{g.OW}), clamp(ow, g.OW)), ok
}

// col2im is input pixel (c, ih, iw)'s gradient read from the columns
// col[r, base + p] of the input gradient's product: a gather (each pixel
// sums the taps that read it), so that no two threads add into one.
func col2im(b *builder, g ir.ConvGeometry, col *Buffer, c, ih, iw, base Expr, k Kind) Expr {
	cg := g.C / g.Groups
	return b.reduce(scalar.Add, k, []int64{g.KH, g.KW}, func(t []Expr) Expr {
		at, ok := outputUnder(g, ih, iw, t[0], t[1])
		r := flatten([]Expr{c, t[0], t[1]}, ir.Shape{cg, g.KH, g.KW})
		p := add(base, at)
		return &Load{Buf: col, Index: []Expr{r, p}, Guard: ok}
	})
}

func lowerConvGradWeight(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, x := in[0], in[1]
	g, err := ir.ConvGeometryOf(x.Type.Shape, out[0].Type.Shape, op.Attr())
	if err != nil {
		return err
	}
	cg, mg, kdim, ohw := convDims(g)
	dw := alias(out[0], ir.Shape{g.M, kdim})
	DY := view(dy, ir.Shape{g.N, g.M, ohw})
	if b.opts.ImplicitGemm {
		// dw[gr·Mg + m, r] = Σ over images n and positions p of dy[n,
		// gr·Mg + m, p] · x under tap r at p: one product of K = N·OH·OW.
		b.perGroup(g.Groups, func(gr Expr) {
			b.matmul(dw, mg, kdim, g.N*ohw,
				func(m, r Expr) []Expr { return []Expr{add(mul(gr, Int{mg}), m), r} },
				func(m, k Expr) Expr {
					n, p := imagePos(k, ohw)
					return DY.At([]Expr{n, add(mul(gr, Int{mg}), m), p})
				},
				func(k, r Expr) Expr {
					n, p := imagePos(k, ohw)
					return tap(x, g, n, gr, r, div(p, Int{g.OW}), rem(p, Int{g.OW}))
				}, nil, false)
		})
		return nil
	}
	transposedForm := !pointwise(g) && mg >= 32 && ohw >= 128
	if nb := b.convImages(g, x.Type.DType.Size(), !transposedForm); nb > 1 {
		if nb < g.N {
			b.fill(dw, 0) // each chunk of images adds its share
		}
		b.imageChunks(g.N, nb, func(n0 Expr) {
			b.loop(g.Groups, func(gr *Var) {
				dy := func(m, q Expr) Expr {
					n, p := imagePos(q, ohw)
					return DY.At([]Expr{add(n0, n), add(mul(gr, Int{mg}), m), p})
				}
				if b.opts.TransposeNarrowWeightGrads && mg < 32 && kdim >= 32 {
					// dwᵀ = col · DYᵀ, the im2col stored along positions: the
					// product is a few MFLOP and the im2col stored tap by tap
					// would cost more than it (the Fashion-MNIST CNN's 8 → 16
					// channel weight gradient over 32 images 1.4 → 0.4-0.8 ms;
					// its 1 → 8 one, 9 taps, and ResNet-18's 512-channel ones
					// are faster as below).
					c := FromBuffer(im2colImages(b, x, g, n0, nb, gr, false))
					b.matmul(dw, kdim, mg, nb*ohw,
						func(r, m Expr) []Expr { return []Expr{add(mul(gr, Int{mg}), m), r} },
						func(r, q Expr) Expr { return c.At([]Expr{r, q}) },
						func(q, m Expr) Expr { return dy(m, q) }, nil, nb < g.N)
					return
				}
				c := FromBuffer(im2colImages(b, x, g, n0, nb, gr, true))
				b.matmul(dw, mg, kdim, nb*ohw,
					func(m, r Expr) []Expr { return []Expr{add(mul(gr, Int{mg}), m), r} },
					dy,
					func(q, r Expr) Expr { return c.At([]Expr{q, r}) }, nil, nb < g.N)
			})
		})
		return nil
	}
	b.fill(dw, 0)
	if transposedForm {
		// dwᵀ = col · DYᵀ per image: the im2col is stored along output
		// positions (contiguous reads of the input), and the product's
		// rows are the kdim taps, many enough to share among threads
		// (ResNet-18's 3×3 weight gradients at 56², 28² and 14² 1.4-2.5x
		// faster, its stem 2.5x, than dw = DY · colᵀ with the im2col
		// stored tap by tap). The form below stays where its columns
		// would be few (a depthwise convolution's one output channel per
		// group) or where few positions make the transposed stores of
		// dw outweigh the product (7²: 4x slower).
		b.loop(g.N, func(n *Var) {
			b.loop(g.Groups, func(gr *Var) {
				c := FromBuffer(im2col(b, x, g, n, gr, Int{0}, g.OH, false))
				b.matmul(dw, kdim, mg, ohw,
					func(r, m Expr) []Expr { return []Expr{add(mul(gr, Int{mg}), m), r} },
					func(r, p Expr) Expr { return c.At([]Expr{r, p}) },
					func(p, m Expr) Expr { return DY.At([]Expr{n, add(mul(gr, Int{mg}), m), p}) }, nil, true)
			})
		})
		return nil
	}
	b.loop(g.N, func(n *Var) {
		b.loop(g.Groups, func(gr *Var) {
			var colT func(p, r Expr) Expr
			if pointwise(g) {
				X := view(x, ir.Shape{g.N, g.C, ohw})
				colT = func(p, r Expr) Expr { return X.At([]Expr{n, add(mul(gr, Int{cg}), r), p}) }
			} else {
				c := FromBuffer(im2col(b, x, g, n, gr, Int{0}, g.OH, true))
				colT = func(p, r Expr) Expr { return c.At([]Expr{p, r}) }
			}
			b.matmul(dw, mg, kdim, ohw,
				func(m, r Expr) []Expr { return []Expr{add(mul(gr, Int{mg}), m), r} },
				func(m, p Expr) Expr { return DY.At([]Expr{n, add(mul(gr, Int{mg}), m), p}) },
				colT, nil, true)
		})
	})
	return nil
}

// window gives, for output (oh, ow) and tap (kh, kw), the input position
// and whether it is inside the image.
func window(p ir.PoolGeometry, oh, ow, kh, kw Expr) (ih, iw, inside Expr) {
	ih = add(sub(mul(oh, Int{p.SH}), Int{p.PT}), mul(kh, Int{p.DH}))
	iw = add(sub(mul(ow, Int{p.SW}), Int{p.PL}), mul(kw, Int{p.DW}))
	if windowsInside(p) {
		return ih, iw, BoolConst{V: true}
	}
	return ih, iw, and(inRange(ih, p.H), inRange(iw, p.W))
}

// windowsInside reports whether every tap of every window lies inside
// the input (a 2×2 pool of stride 2 without padding): the pools then
// need neither guards nor clamped indices.
func windowsInside(p ir.PoolGeometry) bool {
	return p.PT == 0 && p.PL == 0 && p.OH > 0 && p.OW > 0 &&
		(p.OH-1)*p.SH+(p.KH-1)*p.DH < p.H && (p.OW-1)*p.SW+(p.KW-1)*p.DW < p.W
}

// tapAt is x's index at input position (ih, iw) of image n, channel c:
// clamped into the input unless every window lies inside it.
func tapAt(p ir.PoolGeometry, n, c, ih, iw Expr) []Expr {
	if windowsInside(p) {
		return []Expr{n, c, ih, iw}
	}
	return []Expr{n, c, clamp(ih, p.H), clamp(iw, p.W)}
}

func lowerMaxPool(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	p, err := ir.PoolGeometryOf(in[0].Type.Shape, op.Attr())
	if err != nil {
		return err
	}
	x := in[0]
	b.store(out[0], func(idx []Expr) Expr {
		return windowMax(b, p, x, idx)
	})
	return nil
}

func windowMax(b *builder, p ir.PoolGeometry, x Tensor, idx []Expr) Expr {
	k := ComputeKind(x.Type.DType)
	return b.reduce(scalar.Max, k, []int64{p.KH, p.KW}, func(t []Expr) Expr {
		ih, iw, ok := window(p, idx[2], idx[3], t[0], t[1])
		v := x.At(tapAt(p, idx[0], idx[1], ih, iw))
		return sel(ok, v, fconst(k, negInf))
	})
}

func lowerMaxPoolGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, x := in[0], in[1]
	p, err := ir.PoolGeometryOf(x.Type.Shape, op.Attr())
	if err != nil {
		return err
	}
	b.fill(out[0], 0)
	// The gradient goes to the first maximum of each window (flat tap
	// position kh*KW+kw), as in the interpreter.
	b.scatter(out[0], []int64{p.N, p.C, p.OH, p.OW},
		func(idx []Expr) []Expr {
			m := windowMax(b, p, x, idx)
			first := b.reduce(scalar.Min, I64, []int64{p.KH, p.KW}, func(t []Expr) Expr {
				ih, iw, ok := window(p, idx[2], idx[3], t[0], t[1])
				v := x.At(tapAt(p, idx[0], idx[1], ih, iw))
				hit := and(ok, &Binary{Op: scalar.Or, A: cmp(scalar.Eq, v, m), B: and(cmp(scalar.Ne, v, v), cmp(scalar.Ne, m, m))})
				return sel(hit, add(mul(t[0], Int{p.KW}), t[1]), Int{math.MaxInt64})
			})
			kh, kw := div(first, Int{p.KW}), rem(first, Int{p.KW})
			ih, iw, _ := window(p, idx[2], idx[3], clamp(kh, p.KH), kw)
			return tapAt(p, idx[0], idx[1], ih, iw)
		},
		nil,
		func(idx []Expr) Expr { return dy.At(idx) })
	return nil
}

// poolCount is the divisor of average pooling at (oh, ow).
func poolCount(b *builder, p ir.PoolGeometry, oh, ow Expr) Expr {
	return b.reduce(scalar.Add, I64, []int64{p.KH, p.KW}, func(t []Expr) Expr {
		ih, iw, ok := window(p, oh, ow, t[0], t[1])
		if p.CountIncludePad {
			ok = &Binary{Op: scalar.Or, A: ok, B: and(cmp(scalar.Lt, ih, Int{p.H + p.PB}), cmp(scalar.Lt, iw, Int{p.W + p.PR}))}
		}
		return sel(ok, Int{1}, Int{0})
	})
}

func lowerAvgPool(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	p, err := ir.PoolGeometryOf(in[0].Type.Shape, op.Attr())
	if err != nil {
		return err
	}
	x := in[0]
	k := ComputeKind(x.Type.DType)
	b.store(out[0], func(idx []Expr) Expr {
		s := b.reduce(scalar.Add, k, []int64{p.KH, p.KW}, func(t []Expr) Expr {
			ih, iw, ok := window(p, idx[2], idx[3], t[0], t[1])
			v := x.At(tapAt(p, idx[0], idx[1], ih, iw))
			return sel(ok, v, like(v, 0))
		})
		return div(s, conv(maxE(poolCount(b, p, idx[2], idx[3]), Int{1}), k))
	})
	return nil
}

func lowerAvgPoolGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	p, err := ir.PoolGeometryOf(out[0].Type.Shape, op.Attr())
	if err != nil {
		return err
	}
	dy := in[0]
	k := ComputeKind(out[0].Type.DType)
	b.fill(out[0], 0)
	b.scatter(out[0], []int64{p.N, p.C, p.OH, p.OW, p.KH, p.KW},
		func(idx []Expr) []Expr {
			ih, iw, _ := window(p, idx[2], idx[3], idx[4], idx[5])
			return tapAt(p, idx[0], idx[1], ih, iw)
		},
		func(idx []Expr) Expr {
			_, _, ok := window(p, idx[2], idx[3], idx[4], idx[5])
			return ok
		},
		func(idx []Expr) Expr {
			return div(conv(dy.At(idx[:4]), k), conv(maxE(poolCount(b, p, idx[2], idx[3]), Int{1}), k))
		})
	return nil
}

func lowerGatherGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, ind := in[0], in[1]
	data := out[0].Type.Shape
	ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), len(data))
	r := ind.Type.Rank()
	d := data[ax]
	b.fill(out[0], 0)
	b.scatter(out[0], dy.Type.Shape.Clone(),
		func(idx []Expr) []Expr {
			j := conv(ind.At(idx[ax:ax+r]), I64)
			j = indexInto(j, d, op.Attr().Bool(ir.AttrNegative))
			return append(append(append([]Expr(nil), idx[:ax]...), j), idx[ax+r:]...)
		},
		nil,
		func(idx []Expr) Expr { return dy.At(idx) })
	return nil
}

// lerpIndex is lerp_gather's data index for result index idx, with the
// axis coordinate taken from the index vector ind at idx[ax] (checked
// against the extent d).
func lerpIndex(idx []Expr, ax int, ind Tensor, d int64) []Expr {
	j := checkedIndex(conv(ind.At([]Expr{idx[ax]}), I64), d)
	out := append([]Expr(nil), idx...)
	out[ax] = j
	return out
}

func lowerLerpGather(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	x, lo, hi, w := in[0], in[1], in[2], in[3]
	ax, err := ir.NormalizeAxis(op.Attr().Int("axis"), x.Type.Rank())
	if err != nil {
		return err
	}
	d := x.Type.Shape[ax]
	b.store(out[0], func(idx []Expr) Expr {
		a := x.At(lerpIndex(idx, ax, lo, d))
		return add(a, mul(sub(x.At(lerpIndex(idx, ax, hi, d)), a), w.At([]Expr{idx[ax]})))
	})
	return nil
}

func lowerLerpGatherGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, lo, hi, w := in[0], in[1], in[2], in[3]
	data := out[0].Type.Shape
	ax, err := ir.NormalizeAxis(op.Attr().Int("axis"), len(data))
	if err != nil {
		return err
	}
	d := data[ax]
	t := func(idx []Expr) Expr { return mul(dy.At(idx), w.At([]Expr{idx[ax]})) }
	b.fill(out[0], 0)
	b.scatter(out[0], dy.Type.Shape.Clone(), func(idx []Expr) []Expr { return lerpIndex(idx, ax, lo, d) }, nil,
		func(idx []Expr) Expr { return sub(dy.At(idx), t(idx)) })
	b.scatter(out[0], dy.Type.Shape.Clone(), func(idx []Expr) []Expr { return lerpIndex(idx, ax, hi, d) }, nil, t)
	return nil
}

func lowerGatherElementsGrad(b *builder, op *ir.Op, in []Tensor, out []*Buffer) error {
	dy, ind := in[0], in[1]
	data := out[0].Type.Shape
	ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), len(data))
	d := data[ax]
	b.fill(out[0], 0)
	b.scatter(out[0], ind.Type.Shape.Clone(),
		func(idx []Expr) []Expr {
			j := conv(ind.At(idx), I64)
			j = indexInto(j, d, op.Attr().Bool(ir.AttrNegative))
			dst := append([]Expr(nil), idx...)
			dst[ax] = j
			return dst
		},
		nil,
		func(idx []Expr) Expr { return dy.At(idx) })
	return nil
}
