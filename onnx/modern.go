package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Converters for operators that newer exporters write (opsets 9 to 24),
// each as Kiln ops that compute what the specification's formula or
// function body computes, and differentiable through its parts.

// chain emits ops until the first error, which it keeps: a converter
// writes its formula as a sequence of calls and checks err once.
type chain struct {
	im  *importer
	err error
}

func (c *chain) op(kind string, attrs ir.Attrs, in ...entry) entry {
	if c.err != nil {
		return entry{}
	}
	e, err := c.im.one(kind, attrs, in...)
	c.err = err
	return e
}

// num is a rank-0 constant of x's dtype.
func num(x entry, v float64) entry { return scalarConst(x.typ().DType, v) }

// reduceOver is op over axes with kept dimensions.
func (c *chain) reduceOver(op string, x entry, axes []int64) entry {
	return c.op(op, ir.Attrs{"axes": ir.IntsAttr(axes...), "keepdims": ir.BoolAttr(true)}, x)
}

func (c *chain) cast(x entry, to ir.DType) entry {
	if c.err == nil && x.typ().DType == to {
		return x
	}
	return c.op("cast", ir.Attrs{"to": ir.TypeAttr(to)}, x)
}

func (c *chain) done(out ...entry) ([]entry, error) {
	if c.err != nil {
		return nil, c.err
	}
	return out, nil
}

// trailingAxes are the axes from axis to the last of a rank-r value.
func (im *importer) trailingAxes(axis int64, r int) ([]int64, error) {
	ax, err := ir.NormalizeAxis(axis, r)
	if err != nil {
		return nil, im.errorf("%v", err)
	}
	var out []int64
	for a := ax; a < r; a++ {
		out = append(out, int64(a))
	}
	return out, nil
}

// stashType is the dtype a stash_type attribute names (default f32).
func (im *importer) stashType(n *node) (ir.DType, error) {
	d, ok := dtypeOf(attrInt(n, "stash_type", 1))
	if !ok || !d.IsFloat() {
		return 0, im.errorf("stash_type %d is not a floating-point type", attrInt(n, "stash_type", 1))
	}
	return d, nil
}

func init() {
	for op, a := range map[string][2]int{"ReverseSequence": {2, 2}, "Col2Im": {3, 3}, "CenterCropPad": {2, 2}, "HannWindow": {1, 1}, "HammingWindow": {1, 1}, "BlackmanWindow": {1, 1}, "BitShift": {2, 2}, "LpPool": {1, 1}, "CastLike": {2, 2}, "ThresholdedRelu": {1, 1}, "IsNaN": {1, 1}, "IsInf": {1, 1},
		"EyeLike": {1, 1}, "Hardmax": {1, 1}, "LpNormalization": {1, 1}, "MeanVarianceNormalization": {1, 1},
		"RMSNormalization": {2, 2}, "Swish": {1, 1}} {
		arity[op] = a
	}
	for op, v := range map[string]int64{"ReverseSequence": 10, "Col2Im": 18, "CenterCropPad": 18, "HannWindow": 17, "HammingWindow": 17, "BlackmanWindow": 17, "BitShift": 11, "LpPool": 2, "CastLike": 15, "ThresholdedRelu": 10, "IsNaN": 9, "IsInf": 10, "EyeLike": 9,
		"MeanVarianceNormalization": 9, "RMSNormalization": 23, "Swish": 24} {
		introduced[op] = v
	}

	// The window functions (opset 17): constants of the given size,
	// w[i] over N = size (periodic, the default) or size - 1.
	for name, w := range map[string]func(i, n float64) float64{
		"HannWindow":    func(i, n float64) float64 { return math.Pow(math.Sin(math.Pi*i/n), 2) },
		"HammingWindow": func(i, n float64) float64 { return 25.0/46 - (1-25.0/46)*math.Cos(2*math.Pi*i/n) },
		"BlackmanWindow": func(i, n float64) float64 {
			return 0.42 - 0.5*math.Cos(2*math.Pi*i/n) + 0.08*math.Cos(4*math.Pi*i/n)
		},
	} {
		converters[name] = func(im *importer, n *node, in []entry) ([]entry, error) {
			size, err := im.constInts(in, 0, "the window size")
			if err != nil {
				return nil, err
			}
			if len(size) != 1 || size[0] < 0 || size[0] > foldLimit {
				return nil, im.errorf("the size must be one integer from 0 to %d", foldLimit)
			}
			dt, ok := dtypeOf(attrInt(n, "output_datatype", 1))
			if !ok {
				return nil, im.errorf("output_datatype %s: %s", onnxTypeName(attrInt(n, "output_datatype", 1)), unreadableType(attrInt(n, "output_datatype", 1)))
			}
			span := float64(size[0])
			if attrInt(n, "periodic", 1) == 0 {
				span--
			}
			vals := make([]float64, size[0])
			for i := range vals {
				vals[i] = ir.RoundTo(dt, w(float64(i), span))
			}
			t := ir.Type{DType: dt, Shape: ir.Shape{size[0]}}
			if !dt.IsFloat() {
				ints := make([]int64, len(vals))
				for i, v := range vals {
					ints[i] = int64(v)
				}
				return []entry{{k: interp.FromInts(t, ints)}}, nil
			}
			return []entry{{k: interp.FromFloats(t, vals)}}, nil
		}
	}
	// BitShift on unsigned integers: x · 2^y (LEFT) or x / 2^y (RIGHT),
	// exact on the non-negative values; the result wraps to the type.
	converters["BitShift"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, y := in[0], in[1]
		if !x.typ().DType.IsUnsigned() {
			return nil, im.errorf("BitShift of %s: the operator shifts unsigned integers", x.typ())
		}
		// In 64 bits (u64 for a uint64, where 2^64 wraps to 0, and
		// x · 0 and x / 0 are both 0), the shift clipped to the type's
		// width (a wider one gives 0 both ways, as the width itself
		// does: x < 2^bits).
		wide := ir.I64
		if x.typ().DType == ir.U64 {
			wide = ir.U64
		}
		c := &chain{im: im}
		bits := 8 * x.typ().DType.Size()
		y64 := c.op("max", nil, c.op("min", nil, c.cast(y, wide), scalarConst(wide, float64(bits))), scalarConst(wide, 0))
		p := c.op("pow", nil, scalarConst(wide, 2), y64)
		x64 := c.cast(x, wide)
		switch dir := attrString(n, "direction", ""); dir {
		case "LEFT":
			return c.done(c.cast(c.op("mul", nil, x64, p), x.typ().DType))
		case "RIGHT":
			return c.done(c.cast(c.op("div", nil, x64, p), x.typ().DType))
		default:
			return nil, im.errorf("direction %q is neither LEFT nor RIGHT", dir)
		}
	}
	// LpPool: (Σ |x|^p over the window)^(1/p), padding counted as 0: an
	// average pool of |x|^p that counts the padding, times the window
	// size. 2-D windows.
	converters["LpPool"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		if x.typ().Rank() != 4 || !x.typ().DType.IsFloat() {
			return nil, im.errorf("LpPool of %s: Kiln reads 2-D pooling of floating-point values", x.typ())
		}
		w, err := im.readWindow(n, 2, nil, x.typ().Shape[2:])
		if err != nil {
			return nil, err
		}
		if attrInt(n, "ceil_mode", 0) != 0 {
			return nil, im.errorf("ceil_mode=1 is not supported for LpPool")
		}
		p := float64(attrInt(n, "p", 2))
		if p < 1 {
			return nil, im.errorf("p=%g: LpPool needs p >= 1", p)
		}
		a := w.attrs2d(0, 1)
		a["kernel"] = ir.IntsAttr(w.kernel...)
		a["count_include_pad"] = ir.BoolAttr(true)
		c := &chain{im: im}
		xp := c.op("pow", nil, c.op("abs", nil, x), num(x, p))
		sum := c.op("mul", nil, c.op("avg_pool2d", a, xp), num(x, float64(w.kernel[0]*w.kernel[1])))
		return c.done(c.op("pow", nil, sum, num(x, 1/p)))
	}
	// CenterCropPad (opset 18): each listed axis cropped to the target
	// size around its centre, or padded with zeros on both sides (the
	// odd element at the end, as the reference's integer halves put it).
	converters["CenterCropPad"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		r := x.typ().Rank()
		shape, err := im.constInts(in, 1, "the shape")
		if err != nil {
			return nil, err
		}
		axes := attrInts(n, "axes")
		if axes == nil {
			for a := 0; a < r; a++ {
				axes = append(axes, int64(a))
			}
		}
		if len(axes) != len(shape) {
			return nil, im.errorf("shape has %d entries for %d axes", len(shape), len(axes))
		}
		pads := make([]int64, 2*r)
		padded := false
		for i, a := range axes {
			ax, err := ir.NormalizeAxis(a, r)
			if err != nil {
				return nil, im.errorf("axes: %v", err)
			}
			dim, want := x.typ().Shape[ax], shape[i]
			switch {
			case want < 0:
				return nil, im.errorf("shape %v has a negative size", shape)
			case want < dim:
				start := (dim - want) / 2
				if x, err = im.sliceAxis(x, ax, start, start+want, 1); err != nil {
					return nil, err
				}
			case want > dim:
				pads[ax], pads[r+ax] = (want-dim)/2, want-dim-(want-dim)/2
				padded = true
			}
		}
		if !padded {
			return []entry{x}, nil
		}
		c := &chain{im: im}
		return c.done(c.op("pad", ir.Attrs{"pads": ir.IntsAttr(pads...)}, x))
	}
	// Col2Im (opset 18): the adjoint of im2col, which is a transposed
	// convolution of the columns [N, C·kh·kw, oh, ow] with a weight that
	// sends column channel c·kh·kw + i·kw + j to channel c at tap (i, j)
	// (C groups of kh·kw one-hot filters): overlapping taps add, as the
	// operator specifies. 2-D images.
	converters["Col2Im"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		img, err := im.constInts(in, 1, "image_shape")
		if err != nil {
			return nil, err
		}
		blk, err := im.constInts(in, 2, "block_shape")
		if err != nil {
			return nil, err
		}
		if len(img) != 2 || len(blk) != 2 || x.typ().Rank() != 3 {
			return nil, im.errorf("Col2Im of %s into an image of %v by blocks of %v: Kiln reads 2-D images", x.typ(), img, blk)
		}
		xs := x.typ().Shape
		if blk[0] < 1 || blk[1] < 1 || blk[0] > ir.MaxExtent || blk[1] > ir.MaxExtent || img[0] < 1 || img[1] < 1 || img[0] > ir.MaxExtent || img[1] > ir.MaxExtent {
			return nil, im.errorf("Col2Im's image %v and block %v must be positive (and at most 2^40)", img, blk)
		}
		k := blk[0] * blk[1]
		if k <= 0 || xs[1]%k != 0 || !x.typ().DType.IsFloat() {
			return nil, im.errorf("input %s does not hold columns of %v blocks", x.typ(), blk)
		}
		ch := xs[1] / k
		w, err := im.readWindow(n, 2, blk, img)
		if err != nil {
			return nil, err
		}
		var oh, ow int64
		for i, size := range img {
			o := (size+w.pads[i]+w.pads[2+i]-(w.dilations[i]*(blk[i]-1)+1))/w.strides[i] + 1
			if o < 1 {
				return nil, im.errorf("the blocks %v do not fit the image %v", blk, img)
			}
			if i == 0 {
				oh = o
			} else {
				ow = o
			}
		}
		if oh*ow != xs[2] {
			return nil, im.errorf("input %s has %d columns, the image %v gives %d", x.typ(), xs[2], img, oh*ow)
		}
		if k > foldLimit || ch > foldLimit/(k*k) {
			return nil, im.errorf("Col2Im's scatter weight of %d channels by %d taps is too large to fold", ch, k)
		}
		wt := interp.New(ir.Type{DType: x.typ().DType, Shape: ir.Shape{ch * k, 1, blk[0], blk[1]}})
		for c := int64(0); c < ch; c++ {
			for t := int64(0); t < k; t++ {
				wt.F[(c*k+t)*k+t] = 1
			}
		}
		cols, err := im.reshapeTo(x, ir.Shape{xs[0], xs[1], oh, ow})
		if err != nil {
			return nil, err
		}
		a := w.attrs2d(0, 1)
		a["groups"] = ir.IntAttr(ch)
		a["input_shape"] = ir.IntsAttr(xs[0], ch, img[0], img[1])
		return im.emit("conv2d_grad_input", []entry{cols, {k: wt}}, a)
	}
	// ReverseSequence (opset 10): along time_axis, the first
	// sequence_lens[b] elements of batch b reversed, the rest kept: a
	// gather_elements at t' = len - 1 - t where t < len, else t (the
	// lengths are data, so the indices are computed).
	converters["ReverseSequence"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, lens := in[0], in[1]
		xs := x.typ().Shape
		tAx, bAx := attrInt(n, "time_axis", 0), attrInt(n, "batch_axis", 1)
		if len(xs) < 2 || !(tAx == 0 && bAx == 1 || tAx == 1 && bAx == 0) {
			return nil, im.errorf("time_axis %d and batch_axis %d of %s: ONNX allows 0 and 1, one each", tAx, bAx, x.typ())
		}
		if lens.typ().Rank() != 1 || lens.typ().Shape[0] != xs[bAx] {
			return nil, im.errorf("sequence_lens %s does not match batch axis %d of %s", lens.typ(), bAx, x.typ())
		}
		c := &chain{im: im}
		steps := interp.New(ir.Type{DType: ir.I64, Shape: onesBut(len(xs), int(tAx), xs[tAx])})
		for i := range steps.I {
			steps.I[i] = int64(i)
		}
		l, err := im.reshapeTo(c.cast(lens, ir.I64), onesBut(len(xs), int(bAx), xs[bAx]))
		if err != nil || c.err != nil {
			return nil, firstErr(err, c.err)
		}
		t := entry{k: steps}
		from := c.op("where", nil, c.op("lt", nil, t, l), c.op("sub", nil, c.op("sub", nil, l, scalarConst(ir.I64, 1)), t), t)
		from = c.op("expand", ir.Attrs{"shape": ir.IntsAttr(xs...)}, from)
		return c.done(c.op("gather_elements", ir.Attrs{"axis": ir.IntAttr(tAx)}, x, from))
	}
	// CastLike(x, like) is Cast to like's element type.
	converters["CastLike"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		to := in[1].typ().DType
		a := ir.Attrs{"to": ir.TypeAttr(to)}
		if im.opset >= 19 && attrInt(n, "saturate", 1) == 0 && (to == ir.F8E4M3 || to == ir.F8E5M2) {
			a["saturate"] = ir.BoolAttr(false)
		}
		return im.emit("cast", in[:1], a)
	}
	// ThresholdedRelu: x where x > alpha, else 0.
	converters["ThresholdedRelu"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		x := in[0]
		keep := c.op("gt", nil, x, num(x, float64(f32(attrFloat(n, "alpha", 1)))))
		return c.done(c.op("where", nil, keep, x, num(x, 0)))
	}
	// IsNaN: x != x.
	converters["IsNaN"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		return c.done(c.op("ne", nil, in[0], in[0]))
	}
	// IsInf: x == +inf (detect_positive) or x == -inf (detect_negative).
	converters["IsInf"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		x := in[0]
		pos, neg := attrInt(n, "detect_positive", 1) != 0, attrInt(n, "detect_negative", 1) != 0
		var out entry
		switch {
		case pos && neg:
			out = c.op("eq", nil, c.op("abs", nil, x), num(x, math.Inf(1)))
		case pos:
			out = c.op("eq", nil, x, num(x, math.Inf(1)))
		case neg:
			out = c.op("eq", nil, x, num(x, math.Inf(-1)))
		default:
			out = c.op("ne", nil, x, x)
			out = c.op("and", nil, out, c.op("not", nil, out)) // false everywhere, of x's shape
		}
		return c.done(out)
	}
	// EyeLike: ones on the k-th diagonal of a 2-D tensor of the input's
	// shape, in dtype (default: the input's).
	converters["EyeLike"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		t := in[0].typ()
		if t.Rank() != 2 {
			return nil, im.errorf("the input must be 2-D, not %s", t)
		}
		dt := t.DType
		if a := attr(n, "dtype"); a != nil {
			var ok bool
			if dt, ok = dtypeOf(a.I); !ok {
				return nil, im.errorf("dtype %s: %s", onnxTypeName(a.I), unreadableType(a.I))
			}
		}
		rows, cols, k := t.Shape[0], t.Shape[1], attrInt(n, "k", 0)
		if cols > 0 && rows > foldLimit/cols {
			return nil, im.errorf("EyeLike of %d by %d elements is too large to fold", rows, cols)
		}
		y := interp.New(ir.Type{DType: dt, Shape: ir.Shape{rows, cols}})
		for i := int64(0); i < rows; i++ {
			if j := i + k; j >= 0 && j < cols {
				if dt.IsFloat() {
					y.F[i*cols+j] = 1
				} else {
					y.I[i*cols+j] = 1
				}
			}
		}
		return []entry{{k: y}}, nil
	}
	// Hardmax: 1 at the first maximum along axis, 0 elsewhere. Before
	// opset 13 the input is coerced to 2-D at axis (default 1).
	converters["Hardmax"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		s := x.typ().Shape
		axis := attrInt(n, "axis", -1)
		if im.opset < 13 {
			axis = attrInt(n, "axis", 1)
		}
		ax, err := ir.NormalizeAxis(axis, len(s))
		if err != nil {
			return nil, im.errorf("%v", err)
		}
		c := &chain{im: im}
		if im.opset < 13 {
			x, c.err = im.reshapeTo(x, coerced2D(s, ax))
			ax = 1
		}
		if c.err != nil {
			return nil, c.err
		}
		idx, _, err := im.argmax(x, ax, false, true, nil)
		if err != nil {
			return nil, err
		}
		d := x.typ().Shape[ax]
		pos := interp.New(ir.Type{DType: ir.I64, Shape: onesBut(x.typ().Rank(), ax, d)})
		for i := range pos.I {
			pos.I[i] = int64(i)
		}
		y := c.cast(c.op("eq", nil, entry{k: pos}, idx), x.typ().DType)
		if c.err == nil && !y.typ().Shape.Equal(s) {
			y, c.err = im.reshapeTo(y, s)
		}
		return c.done(y)
	}
	// LpNormalization: x / ||x||_p along axis (p 1 or 2); 0 where the
	// norm is 0 (opset 22's definition).
	converters["LpNormalization"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		ax, err := ir.NormalizeAxis(attrInt(n, "axis", -1), x.typ().Rank())
		if err != nil {
			return nil, im.errorf("%v", err)
		}
		c := &chain{im: im}
		var norm entry
		switch p := attrInt(n, "p", 2); p {
		case 1:
			norm = c.reduceOver("reduce_sum", c.op("abs", nil, x), []int64{int64(ax)})
		case 2:
			norm = c.op("sqrt", nil, c.reduceOver("reduce_sum", c.op("mul", nil, x, x), []int64{int64(ax)}))
		default:
			return nil, im.errorf("p=%d: LpNormalization takes p 1 or 2", p)
		}
		zero := c.op("eq", nil, norm, num(x, 0))
		safe := c.op("where", nil, zero, num(x, 1), norm)
		return c.done(c.op("where", nil, zero, num(x, 0), c.op("div", nil, x, safe)))
	}
	// MeanVarianceNormalization: (x - mean) / (std + 1e-9) over axes
	// (default [0, 2, 3]), std the population standard deviation.
	converters["MeanVarianceNormalization"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		axes := []int64{0, 2, 3}
		if a := attr(n, "axes"); a != nil {
			axes = a.Ints
		}
		for i, a := range axes {
			ax, err := ir.NormalizeAxis(a, x.typ().Rank())
			if err != nil {
				return nil, im.errorf("axes: %v", err)
			}
			axes[i] = int64(ax)
		}
		c := &chain{im: im}
		centred := c.op("sub", nil, x, c.reduceOver("reduce_mean", x, axes))
		std := c.op("sqrt", nil, c.reduceOver("reduce_mean", c.op("mul", nil, centred, centred), axes))
		return c.done(c.op("div", nil, centred, c.op("add", nil, std, num(x, 1e-9))))
	}
	// RMSNormalization (opset 23): x / sqrt(mean(x², axes from axis) +
	// epsilon), computed in stash_type and cast back, times scale.
	converters["RMSNormalization"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, scale := in[0], in[1]
		axes, err := im.trailingAxes(attrInt(n, "axis", -1), x.typ().Rank())
		if err != nil {
			return nil, err
		}
		stash, err := im.stashType(n)
		if err != nil {
			return nil, err
		}
		c := &chain{im: im}
		xs := c.cast(x, stash)
		ms := c.reduceOver("reduce_mean", c.op("mul", nil, xs, xs), axes)
		rms := c.op("sqrt", nil, c.op("add", nil, ms, scalarConst(stash, float64(f32(attrFloat(n, "epsilon", 1e-5))))))
		normed := c.cast(c.op("div", nil, xs, rms), x.typ().DType)
		return c.done(c.op("mul", nil, normed, scale))
	}
	// Swish (opset 24): x * sigmoid(alpha * x).
	converters["Swish"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		x := in[0]
		alpha := float64(f32(attrFloat(n, "alpha", 1)))
		if alpha == 1 {
			return c.done(c.op("silu", nil, x))
		}
		return c.done(c.op("mul", nil, x, c.op("sigmoid", nil, c.op("mul", nil, x, num(x, alpha)))))
	}
}

// powMixed is Pow of a base and an exponent of different types (opset
// 12 on): the result has the base's type. A float base takes the
// exponent cast to it; an integer base is raised in f64 and the result
// truncated to the base's type, as ONNX's reference computes it.
func (im *importer) powMixed(in []entry) ([]entry, error) {
	c := &chain{im: im}
	base, exp := in[0], in[1]
	if d := base.typ().DType; d.IsFloat() {
		return c.done(c.op("pow", nil, base, c.cast(exp, d)))
	}
	p := c.op("pow", nil, c.cast(base, ir.F64), c.cast(exp, ir.F64))
	return c.done(c.cast(p, base.typ().DType))
}

// onesBut is a rank-r shape of ones with d at axis ax.
func onesBut(r, ax int, d int64) ir.Shape {
	s := make(ir.Shape, r)
	for i := range s {
		s[i] = 1
	}
	s[ax] = d
	return s
}

// firstErr is the first non-nil error.
func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func init() {
	arity["DFT"] = [2]int{1, 3}
	introduced["DFT"] = 17
	converters["DFT"] = dft
}

// dft is DFT (opsets 17 and 20) as two matrix products with constant
// cosine and sine matrices along the signal axis: X[k] = Σ x[n]·e^(∓2πikn/N)
// (1/N and + when inverse), real or complex input ([..., 1] or [..., 2]),
// dft_length zero-padding or truncating the signal, onesided keeping the
// first N/2 + 1 frequencies.
func dft(im *importer, n *node, in []entry) ([]entry, error) {
	x := in[0]
	xs := x.typ().Shape
	r := len(xs)
	if r < 3 || (xs[r-1] != 1 && xs[r-1] != 2) || !x.typ().DType.IsFloat() {
		return nil, im.errorf("the input %s must be [batch, ..., signal, ..., 1 or 2]", x.typ())
	}
	axis := attrInt(n, "axis", 1)
	if im.opset >= 20 {
		axis = -2
		if axes, err := im.constInts(in, 2, "the axis"); err != nil {
			return nil, err
		} else if len(axes) == 1 {
			axis = axes[0]
		}
	}
	ax, err := ir.NormalizeAxis(axis, r)
	if err != nil || ax == 0 || ax == r-1 {
		return nil, im.errorf("the signal axis %d must lie between the batch axis and the last (complex) axis of %s", axis, x.typ())
	}
	inverse, onesided := attrInt(n, "inverse", 0) != 0, attrInt(n, "onesided", 0) != 0
	if inverse && onesided {
		return nil, im.errorf("inverse with onesided is not supported")
	}
	size := xs[ax]
	if lens, err := im.constInts(in, 1, "dft_length"); err != nil {
		return nil, err
	} else if len(lens) == 1 {
		size = lens[0]
	}
	return im.dftAlong(x, ax, size, inverse, onesided)
}

// dftAlong is the DFT of x [..., 1 or 2] along axis ax over size points
// (the signal zero-padded or truncated to them).
func (im *importer) dftAlong(x entry, ax int, size int64, inverse, onesided bool) ([]entry, error) {
	xs := x.typ().Shape
	r := len(xs)
	freqs := size
	if onesided {
		freqs = size/2 + 1
	}
	if size < 1 || size*freqs > foldLimit {
		return nil, im.errorf("a DFT of %d points is out of range (1 to a %d-element matrix)", size, foldLimit)
	}
	c := &chain{im: im}
	dt := x.typ().DType
	// The real and imaginary parts, the signal axis last: [..., N].
	part := func(i int64) entry {
		if i >= xs[r-1] {
			return entry{}
		}
		p := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(int64(r - 1)), "starts": ir.IntsAttr(i), "ends": ir.IntsAttr(i + 1), "steps": ir.IntsAttr(1)}, x)
		if c.err != nil {
			return entry{}
		}
		p, c.err = im.reshapeTo(p, xs[:r-1])
		perm := []int64{}
		for a := 0; a < r-1; a++ {
			if a != ax {
				perm = append(perm, int64(a))
			}
		}
		p = c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(append(perm, int64(ax))...)}, p)
		// dft_length pads with zeros or truncates the signal.
		if have := xs[ax]; c.err == nil && have != size {
			last := len(perm)
			if have > size {
				p, c.err = im.sliceAxis(p, last, 0, size, 1)
			} else {
				pads := make([]int64, 2*(last+1))
				pads[2*last+1] = size - have
				p = c.op("pad", ir.Attrs{"pads": ir.IntsAttr(pads...)}, p)
			}
		}
		return p
	}
	re, imag := part(0), part(1)
	cosM := interp.New(ir.Type{DType: dt, Shape: ir.Shape{size, freqs}})
	sinM := interp.New(ir.Type{DType: dt, Shape: ir.Shape{size, freqs}})
	sign, norm := -1.0, 1.0
	if inverse {
		sign, norm = 1, 1/float64(size)
	}
	for t := int64(0); t < size; t++ {
		for k := int64(0); k < freqs; k++ {
			// (t·k) mod size keeps the angle exact for long signals.
			th := 2 * math.Pi * float64((t*k)%size) / float64(size)
			cosM.F[t*freqs+k] = ir.RoundTo(dt, norm*math.Cos(th))
			sinM.F[t*freqs+k] = ir.RoundTo(dt, sign*norm*math.Sin(th))
		}
	}
	// (re + i·im)(cos + i·s) = re·cos - im·s + i(re·s + im·cos).
	outR := c.op("matmul", nil, re, entry{k: cosM})
	outI := c.op("matmul", nil, re, entry{k: sinM})
	if !imag.missing() {
		outR = c.op("sub", nil, outR, c.op("matmul", nil, imag, entry{k: sinM}))
		outI = c.op("add", nil, outI, c.op("matmul", nil, imag, entry{k: cosM}))
	}
	if c.err != nil {
		return nil, c.err
	}
	// Back to [..., freqs at ax, ...] and the complex axis.
	moved := outR.typ().Shape
	back := make([]int64, r-1)
	j := 0
	for a := 0; a < r-1; a++ {
		if a == ax {
			back[a] = int64(len(moved) - 1)
		} else {
			back[a] = int64(j)
			j++
		}
	}
	full := append(append(ir.Shape(nil), xs[:r-1]...), 1)
	full[ax] = freqs
	finish := func(p entry) entry {
		p = c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(back...)}, p)
		if c.err != nil {
			return entry{}
		}
		p, c.err = im.reshapeTo(p, full)
		return p
	}
	return c.done(c.op("concat", ir.Attrs{"axis": ir.IntAttr(int64(r - 1))}, finish(outR), finish(outI)))
}

func init() {
	arity["STFT"] = [2]int{2, 4}
	introduced["STFT"] = 17
	// STFT: frames of frame_length samples every frame_step, times the
	// window, each transformed (onesided by default).
	converters["STFT"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		xs := x.typ().Shape
		if len(xs) != 3 || (xs[2] != 1 && xs[2] != 2) || !x.typ().DType.IsFloat() {
			return nil, im.errorf("the signal %s must be [batch, length, 1 or 2]", x.typ())
		}
		step, err := im.constInts(in, 1, "frame_step")
		if err != nil {
			return nil, err
		}
		window, hasWindow := optional(in, 2)
		length := int64(-1)
		if fl, err := im.constInts(in, 3, "frame_length"); err != nil {
			return nil, err
		} else if len(fl) == 1 {
			length = fl[0]
		}
		if hasWindow {
			if window.typ().Rank() != 1 || length >= 0 && window.typ().Shape[0] != length {
				return nil, im.errorf("the window %s does not match frame_length %d", window.typ(), length)
			}
			length = window.typ().Shape[0]
		}
		if len(step) != 1 || step[0] < 1 || length < 1 || length > xs[1] {
			return nil, im.errorf("frame_step %v and frame_length %d do not frame a signal of %d samples", step, length, xs[1])
		}
		frames := (xs[1]-length)/step[0] + 1
		if frames*length > foldLimit {
			return nil, im.errorf("%d frames of %d samples are too many to index", frames, length)
		}
		idx := interp.New(ir.Type{DType: ir.I64, Shape: ir.Shape{frames, length}})
		for f := int64(0); f < frames; f++ {
			for t := int64(0); t < length; t++ {
				idx.I[f*length+t] = f*step[0] + t
			}
		}
		c := &chain{im: im}
		framed := c.op("gather", ir.Attrs{"axis": ir.IntAttr(1)}, x, entry{k: idx}) // [batch, frames, length, comps]
		if hasWindow && c.err == nil {
			var w entry
			w, c.err = im.reshapeTo(c.cast(window, x.typ().DType), ir.Shape{1, 1, length, 1})
			framed = c.op("mul", nil, framed, w)
		}
		if c.err != nil {
			return nil, c.err
		}
		return im.dftAlong(framed, 2, length, false, attrInt(n, "onesided", 1) != 0)
	}
}

// The random operators draw from random_uniform, Kiln's counter-based
// generator (the same numbers in every backend; the training runtime
// keeps its state), seeded by the node's seed or, as Dropout, by the
// node's place in the graph. Normal draws are Box-Muller from two
// uniform ones.
func init() {
	for op, a := range map[string][2]int{"RandomUniformLike": {1, 1}, "RandomNormalLike": {1, 1}, "RandomUniform": {0, 0}, "RandomNormal": {0, 0}, "Bernoulli": {1, 1}} {
		arity[op] = a
	}
	introduced["Bernoulli"] = 15
	for _, op := range []string{"RandomUniformLike", "RandomNormalLike", "RandomUniform", "RandomNormal"} {
		converters[op] = func(im *importer, n *node, in []entry) ([]entry, error) {
			dt, shape := ir.F32, ir.Shape(attrInts(n, "shape"))
			if len(in) == 1 {
				dt, shape = in[0].typ().DType, in[0].typ().Shape
			}
			if a := attr(n, "dtype"); a != nil {
				var ok bool
				if dt, ok = dtypeOf(a.I); !ok {
					return nil, im.errorf("dtype %s: %s", onnxTypeName(a.I), unreadableType(a.I))
				}
			}
			if !dt.IsFloat() {
				return nil, im.errorf("dtype %s: random numbers are floating-point", dt)
			}
			for _, d := range shape {
				if d < 0 {
					return nil, im.errorf("shape %v has a negative dimension", shape)
				}
			}
			count, ok := shape.NumElements()
			if !ok || count > 1<<40 {
				return nil, im.errorf("shape %v is too large", shape)
			}
			c := &chain{im: im}
			u := im.uniform(c, n, dt, shape, 0)
			if op == "RandomUniformLike" || op == "RandomUniform" {
				lo, hi := float64(attrFloat(n, "low", 0)), float64(attrFloat(n, "high", 1))
				return c.done(c.op("add", nil, c.op("mul", nil, u, scalarConst(dt, hi-lo)), scalarConst(dt, lo)))
			}
			// Box-Muller: sqrt(-2 ln(1 - u1)) cos(2π u2), 1 - u1 in (0, 1].
			u2 := im.uniform(c, n, dt, shape, count)
			radius := c.op("sqrt", nil, c.op("mul", nil, c.op("log", nil, c.op("sub", nil, scalarConst(dt, 1), u)), scalarConst(dt, -2)))
			z := c.op("mul", nil, radius, c.op("cos", nil, c.op("mul", nil, u2, scalarConst(dt, 2*math.Pi))))
			mean, scale := float64(attrFloat(n, "mean", 0)), float64(attrFloat(n, "scale", 1))
			return c.done(c.op("add", nil, c.op("mul", nil, z, scalarConst(dt, scale)), scalarConst(dt, mean)))
		}
	}
	// Bernoulli: 1 where a uniform draw is below p, else 0, in dtype
	// (default p's).
	converters["Bernoulli"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		p := in[0]
		dt := p.typ().DType
		if a := attr(n, "dtype"); a != nil {
			var ok bool
			if dt, ok = dtypeOf(a.I); !ok {
				return nil, im.errorf("dtype %s: %s", onnxTypeName(a.I), unreadableType(a.I))
			}
		}
		if !p.typ().DType.IsFloat() {
			return nil, im.errorf("the probabilities %s must be floating-point", p.typ())
		}
		c := &chain{im: im}
		u := im.uniform(c, n, p.typ().DType, p.typ().Shape, 0)
		return c.done(c.cast(c.op("lt", nil, u, p), dt))
	}
}

// uniform is a random_uniform draw of shape, seeded by the node's seed
// (a float attribute) or its place among the graph's random nodes,
// starting at number offset of that stream.
func (im *importer) uniform(c *chain, n *node, dt ir.DType, shape ir.Shape, offset int64) entry {
	seed := int64(0)
	if a := attr(n, "seed"); a != nil {
		seed = int64(a.F)
	} else {
		if offset == 0 {
			im.seeds++
		}
		seed = im.seeds
	}
	a := ir.Attrs{"shape": ir.IntsAttr(shape...), "dtype": ir.TypeAttr(dt), "seed": ir.IntAttr(seed)}
	if offset != 0 {
		a["offset"] = ir.IntAttr(offset)
	}
	return c.op("random_uniform", a)
}
