package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Converters for ONNX operators that Kiln writes as several of its own
// ops: each is exact (the same arithmetic the operator specifies) and
// differentiable through its parts.

// one emits a single-result op.
func (im *importer) one(kind string, attrs ir.Attrs, in ...entry) (entry, error) {
	out, err := im.emit(kind, in, attrs)
	if err != nil {
		return entry{}, err
	}
	return out[0], nil
}

// scalarConst is a rank-0 import-time constant of dtype dt.
func scalarConst(dt ir.DType, v float64) entry {
	t := ir.TensorOf(dt)
	if dt.IsFloat() {
		return entry{k: interp.FromFloats(t, []float64{v})}
	}
	return entry{k: interp.FromInts(t, []int64{int64(v)})}
}

// reshapeTo reshapes e to shape (no-op when it already has it).
func (im *importer) reshapeTo(e entry, shape ir.Shape) (entry, error) {
	if e.typ().Shape.Equal(shape) {
		return e, nil
	}
	return im.one("reshape", ir.Attrs{"shape": ir.IntsAttr(shape...)}, e)
}

// sliceAxis is x[start:end:step] along axis.
func (im *importer) sliceAxis(x entry, axis int, start, end, step int64) (entry, error) {
	return im.one("slice", ir.Attrs{"axes": ir.IntsAttr(int64(axis)), "starts": ir.IntsAttr(start), "ends": ir.IntsAttr(end), "steps": ir.IntsAttr(step)}, x)
}

func init() {
	converters["Pad"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		var pads []int64
		value := 0.0
		if im.opset < 11 {
			pads = attrInts(n, "pads")
			if pads == nil {
				pads = attrInts(n, "paddings")
			}
			value = attrFloat(n, "value", 0)
		} else {
			var err error
			if pads, err = im.constInts(in, 1, "the pads"); err != nil {
				return nil, err
			}
			if value, err = im.constFloat(in, 2, 0, "the padding value"); err != nil {
				return nil, err
			}
			axes, err := im.constInts(in, 3, "the axes")
			if err != nil {
				return nil, err
			}
			if axes != nil {
				if len(pads) != 2*len(axes) {
					return nil, im.errorf("%d pads for %d axes", len(pads), len(axes))
				}
				r := in[0].typ().Rank()
				full := make([]int64, 2*r)
				for i, ax := range axes {
					a, err := ir.NormalizeAxis(ax, r)
					if err != nil {
						return nil, im.errorf("%v", err)
					}
					full[a], full[a+r] = pads[i], pads[i+len(axes)]
				}
				pads = full
			}
		}
		r := in[0].typ().Rank()
		if len(pads) != 2*r {
			return nil, im.errorf("%d pads for an input of rank %d", len(pads), r)
		}
		switch mode := attrString(n, "mode", "constant"); mode {
		case "constant":
			a := ir.Attrs{"pads": ir.IntsAttr(pads...)}
			if value != 0 {
				a["value"] = ir.FloatAttr(value)
			}
			return im.emit("pad", in[:1], a)
		case "reflect", "edge", "wrap":
			x := in[0]
			for ax := 0; ax < r; ax++ {
				var err error
				if x, err = im.padAxis(x, ax, pads[ax], pads[ax+r], mode); err != nil {
					return nil, err
				}
			}
			return []entry{x}, nil
		default:
			return nil, im.errorf("mode=%q is not an ONNX padding mode", mode)
		}
	}
	converters["PRelu"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, slope := in[0], in[1]
		xs, ss := x.typ().Shape, slope.typ().Shape
		// Before opset 7 a slope of one axis is per channel (axis 1).
		if im.opset < 7 && len(ss) == 1 && len(xs) > 2 && ss[0] == xs[1] && ss[0] != xs[len(xs)-1] {
			shape := ir.Shape{ss[0]}
			for range xs[2:] {
				shape = append(shape, 1)
			}
			var err error
			if slope, err = im.reshapeTo(slope, shape); err != nil {
				return nil, err
			}
		}
		neg, err := im.one("mul", nil, x, slope)
		if err != nil {
			return nil, err
		}
		pos, err := im.one("gt", nil, x, scalarConst(x.typ().DType, 0))
		if err != nil {
			return nil, err
		}
		y, err := im.one("where", nil, pos, x, neg)
		if err != nil {
			return nil, err
		}
		if !y.typ().Shape.Equal(xs) {
			return nil, im.errorf("slope %s does not broadcast to the input %s", slope.typ(), x.typ())
		}
		return []entry{y}, nil
	}
	converters["Clip"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		dt := x.typ().DType
		var bounds [2]*entry
		if im.opset < 11 {
			lo, hi := scalarConst(dt, attrFloat(n, "min", math.Inf(-1))), scalarConst(dt, attrFloat(n, "max", math.Inf(1)))
			if attr(n, "min") != nil {
				bounds[0] = &lo
			}
			if attr(n, "max") != nil {
				bounds[1] = &hi
			}
		} else {
			for i := 1; i < len(in) && i < 3; i++ {
				if !in[i].missing() {
					if in[i].typ().Rank() != 0 && in[i].typ().NumElements() != 1 {
						return nil, im.errorf("min and max must be scalars, got %s", in[i].typ())
					}
					b := in[i]
					bounds[i-1] = &b
				}
			}
		}
		var err error
		if dt.IsFloat() {
			// Constant bounds (ReLU6): one clip op, which saves only x.
			lo, hi, ok := math.Inf(-1), math.Inf(1), true
			for i, b := range bounds {
				if b == nil {
					continue
				}
				if b.k == nil || b.k.Len() != 1 {
					ok = false
				} else if i == 0 {
					lo = b.k.At(0)
				} else {
					hi = b.k.At(0)
				}
			}
			if ok {
				y, err := im.one("clip", ir.Attrs{"lo": ir.FloatAttr(lo), "hi": ir.FloatAttr(hi)}, x)
				return []entry{y}, err
			}
		}
		for i, kind := range []string{"max", "min"} { // max(x, lo), then min(., hi)
			if bounds[i] == nil {
				continue
			}
			b, err := im.reshapeTo(*bounds[i], ir.Shape{})
			if err != nil {
				return nil, err
			}
			if x, err = im.one(kind, nil, x, b); err != nil {
				return nil, err
			}
		}
		return []entry{x}, err
	}
	converters["Shrink"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		dt := x.typ().DType
		l, bias := attrFloat(n, "lambd", 0.5), attrFloat(n, "bias", 0)
		below, err := im.one("lt", nil, x, scalarConst(dt, -l))
		if err != nil {
			return nil, err
		}
		above, err := im.one("gt", nil, x, scalarConst(dt, l))
		if err != nil {
			return nil, err
		}
		plus, err := im.one("add", nil, x, scalarConst(dt, bias))
		if err != nil {
			return nil, err
		}
		minus, err := im.one("sub", nil, x, scalarConst(dt, bias))
		if err != nil {
			return nil, err
		}
		inner, err := im.one("where", nil, above, minus, scalarConst(dt, 0))
		if err != nil {
			return nil, err
		}
		y, err := im.one("where", nil, below, plus, inner)
		return []entry{y}, err
	}
	// Tile: x[d0,...] -> reshape [1,d0,1,d1,...] -> expand [r0,d0,r1,d1,...]
	// -> reshape [r0*d0, r1*d1, ...]; the copies are the outer index.
	converters["Tile"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		reps, err := im.constInts(in, 1, "the repeats")
		if err != nil {
			return nil, err
		}
		s := in[0].typ().Shape
		if len(reps) != len(s) {
			return nil, im.errorf("%d repeats for an input of rank %d", len(reps), len(s))
		}
		var inter, wide, out ir.Shape
		for i, d := range s {
			if reps[i] < 0 {
				return nil, im.errorf("repeat %d is negative", reps[i])
			}
			inter = append(inter, 1, d)
			wide = append(wide, reps[i], d)
			out = append(out, reps[i]*d)
		}
		x, err := im.reshapeTo(in[0], inter)
		if err != nil {
			return nil, err
		}
		if x, err = im.one("expand", ir.Attrs{"shape": ir.IntsAttr(wide...)}, x); err != nil {
			return nil, err
		}
		x, err = im.reshapeTo(x, out)
		return []entry{x}, err
	}
	converters["InstanceNormalization"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, scale, bias := in[0], in[1], in[2]
		xt := x.typ()
		if xt.Rank() < 3 {
			return nil, im.errorf("input %s needs a batch, a channel and spatial axes", xt)
		}
		c := xt.Shape[1]
		ones := interp.New(ir.Type{DType: xt.DType, Shape: xt.Shape[2:]})
		for i := range ones.F {
			ones.F[i] = 1
		}
		y, err := im.one("layer_norm", ir.Attrs{"axis": ir.IntAttr(2), "epsilon": ir.FloatAttr(f32(attrFloat(n, "epsilon", 1e-5)))}, x, entry{k: ones})
		if err != nil {
			return nil, err
		}
		perChannel := ir.Shape{c}
		for range xt.Shape[2:] {
			perChannel = append(perChannel, 1)
		}
		y, err = im.scaleShift(y, scale, bias, perChannel)
		return []entry{y}, err
	}
	for onnxName, r := range map[string]struct {
		pre, reduce, post string
	}{
		"ReduceL1":        {"abs", "reduce_sum", ""},
		"ReduceL2":        {"square", "reduce_sum", "sqrt"},
		"ReduceSumSquare": {"square", "reduce_sum", ""},
		"ReduceLogSum":    {"", "reduce_sum", "log"},
	} {
		converters[onnxName] = func(im *importer, n *node, in []entry) ([]entry, error) {
			x := in[0]
			var err error
			switch r.pre {
			case "square":
				x, err = im.one("mul", nil, x, x)
			case "":
			default:
				x, err = im.one(r.pre, nil, x)
			}
			if err != nil {
				return nil, err
			}
			out, err := im.reduce(n, r.reduce, append([]entry{x}, in[1:]...), attrInt(n, "keepdims", 1) == 1)
			if err != nil || r.post == "" {
				return out, err
			}
			y, err := im.one(r.post, nil, out[0])
			return []entry{y}, err
		}
	}
	// ReduceMin and ReduceMax of integers and booleans: in int64 (exact
	// for every integer type but uint64, which reduces in u64; booleans
	// as 0 and 1, where the minimum is all and the maximum any).
	for name, kind := range map[string]string{"ReduceMin": "reduce_min", "ReduceMax": "reduce_max"} {
		float := converters[name]
		converters[name] = func(im *importer, n *node, in []entry) ([]entry, error) {
			d := in[0].typ().DType
			if d.IsFloat() {
				return float(im, n, in)
			}
			wide := ir.I64
			if d == ir.U64 {
				wide = ir.U64
			}
			c := &chain{im: im}
			x := c.cast(in[0], wide)
			if c.err != nil {
				return nil, c.err
			}
			out, err := im.reduce(n, kind, append([]entry{x}, in[1:]...), attrInt(n, "keepdims", 1) == 1)
			if err != nil {
				return nil, err
			}
			return c.done(c.cast(out[0], d))
		}
	}
	// ReduceLogSumExp: m + log(sum(exp(x - m))), m the (kept) maximum, so
	// that large inputs do not overflow.
	converters["ReduceLogSumExp"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		m, err := im.reduce(n, "reduce_max", in, true)
		if err != nil {
			return nil, err
		}
		// An infinite maximum (a fully masked row of -inf, or a +inf)
		// shifts by 0, so that the result is that infinity, not NaN.
		absM, err := im.one("abs", nil, m[0])
		if err != nil {
			return nil, err
		}
		inf, err := im.one("eq", nil, absM, scalarConst(m[0].typ().DType, math.Inf(1)))
		if err != nil {
			return nil, err
		}
		shift, err := im.one("where", nil, inf, scalarConst(m[0].typ().DType, 0), m[0])
		if err != nil {
			return nil, err
		}
		m = []entry{shift}
		shifted, err := im.one("sub", nil, in[0], m[0])
		if err != nil {
			return nil, err
		}
		e, err := im.one("exp", nil, shifted)
		if err != nil {
			return nil, err
		}
		s, err := im.reduce(n, "reduce_sum", append([]entry{e}, in[1:]...), attrInt(n, "keepdims", 1) == 1)
		if err != nil {
			return nil, err
		}
		l, err := im.one("log", nil, s[0])
		if err != nil {
			return nil, err
		}
		mm, err := im.reshapeTo(m[0], l.typ().Shape)
		if err != nil {
			return nil, err
		}
		y, err := im.one("add", nil, l, mm)
		return []entry{y}, err
	}
}

// padAxis pads x along axis with before and after elements copied from x
// itself: "edge" repeats the border element, "reflect" mirrors the
// elements next to the border (excluding it), "wrap" continues from the
// other end. It is written as slices and one concat, so its gradient is
// the sum of the copies' gradients.
func (im *importer) padAxis(x entry, axis int, before, after int64, mode string) (entry, error) {
	if before == 0 && after == 0 {
		return x, nil
	}
	d := x.typ().Shape[axis]
	if before < 0 || after < 0 {
		return entry{}, im.errorf("negative pads are only allowed with mode=constant")
	}
	limit := d
	if mode == "reflect" {
		limit = d - 1
	}
	if d == 0 || before > limit || after > limit {
		return entry{}, im.errorf("pads %d and %d are too large for mode=%s on a dimension of %d", before, after, mode, d)
	}
	part := func(start, end, step, count int64) (entry, error) {
		if mode == "edge" {
			e, err := im.sliceAxis(x, axis, start, start+1, 1)
			if err != nil {
				return entry{}, err
			}
			shape := x.typ().Shape.Clone()
			shape[axis] = count
			return im.one("expand", ir.Attrs{"shape": ir.IntsAttr(shape...)}, e)
		}
		if end < 0 {
			end = -d - 1 // before index 0 for a negative step
		}
		return im.sliceAxis(x, axis, start, end, step)
	}
	var parts []entry
	if before > 0 {
		var p entry
		var err error
		switch mode {
		case "edge":
			p, err = part(0, 0, 1, before)
		case "reflect":
			p, err = part(before, 0, -1, before)
		default: // wrap
			p, err = part(d-before, d, 1, before)
		}
		if err != nil {
			return entry{}, err
		}
		parts = append(parts, p)
	}
	parts = append(parts, x)
	if after > 0 {
		var p entry
		var err error
		switch mode {
		case "edge":
			p, err = part(d-1, d, 1, after)
		case "reflect":
			p, err = part(d-2, d-2-after, -1, after)
		default:
			p, err = part(0, after, 1, after)
		}
		if err != nil {
			return entry{}, err
		}
		parts = append(parts, p)
	}
	return im.one("concat", ir.Attrs{"axis": ir.IntAttr(int64(axis))}, parts...)
}

// legacyBroadcast reshapes b for the broadcast attribute of opsets
// before 7: b's shape matches a contiguous run of a's axes starting at
// axis (default: the trailing axes).
func (im *importer) legacyBroadcast(n *node, a, b entry) (entry, error) {
	as, bs := a.typ().Shape, b.typ().Shape
	axis := int64(len(as) - len(bs))
	if at := attr(n, "axis"); at != nil {
		axis = at.I
		if axis < 0 {
			axis += int64(len(as))
		}
	}
	if axis < 0 || int(axis)+len(bs) > len(as) {
		return entry{}, im.errorf("broadcast of %s at axis %d into %s is out of range", b.typ(), axis, a.typ())
	}
	shape := make(ir.Shape, len(as))
	for i := range shape {
		shape[i] = 1
	}
	copy(shape[axis:], bs)
	return im.reshapeTo(b, shape)
}

func init() {
	arity["DepthToSpace"] = [2]int{1, 1}
	arity["SpaceToDepth"] = [2]int{1, 1}
	// DepthToSpace and SpaceToDepth are a reshape, a transpose and a
	// reshape (ONNX's own definition).
	converters["DepthToSpace"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		s := in[0].typ().Shape
		b := attrInt(n, "blocksize", 0)
		if len(s) != 4 || b < 1 || s[1]%(b*b) != 0 {
			return nil, im.errorf("blocksize %d does not divide the channels of %s", b, in[0].typ())
		}
		c := s[1] / (b * b)
		inner, perm := ir.Shape{s[0], b, b, c, s[2], s[3]}, []int64{0, 3, 4, 1, 5, 2}
		switch mode := attrString(n, "mode", "DCR"); mode {
		case "DCR":
		case "CRD":
			inner, perm = ir.Shape{s[0], c, b, b, s[2], s[3]}, []int64{0, 1, 4, 2, 5, 3}
		default:
			return nil, im.errorf("mode=%s is not DCR or CRD", mode)
		}
		return im.reshuffle(in[0], inner, perm, ir.Shape{s[0], c, s[2] * b, s[3] * b})
	}
	converters["SpaceToDepth"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		s := in[0].typ().Shape
		b := attrInt(n, "blocksize", 0)
		if len(s) != 4 || b < 1 || s[2]%b != 0 || s[3]%b != 0 {
			return nil, im.errorf("blocksize %d does not divide the height and width of %s", b, in[0].typ())
		}
		return im.reshuffle(in[0], ir.Shape{s[0], s[1], s[2] / b, b, s[3] / b, b}, []int64{0, 3, 5, 1, 2, 4}, ir.Shape{s[0], s[1] * b * b, s[2] / b, s[3] / b})
	}
}

// reshuffle is reshape(transpose(reshape(x, inner), perm), out).
func (im *importer) reshuffle(x entry, inner ir.Shape, perm []int64, out ir.Shape) ([]entry, error) {
	y, err := im.reshapeTo(x, inner)
	if err != nil {
		return nil, err
	}
	if y, err = im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(perm...)}, y); err != nil {
		return nil, err
	}
	y, err = im.reshapeTo(y, out)
	return []entry{y}, err
}

func init() {
	arity["LRN"] = [2]int{1, 1}
	// LRN: x / (bias + alpha/size * sum of x^2 over a window of size
	// channels)^beta, the window sum as size shifted slices of the
	// channel-padded squares.
	converters["LRN"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		s := x.typ().Shape
		size := attrInt(n, "size", 0)
		if len(s) < 3 || size < 1 {
			return nil, im.errorf("LRN needs [N, C, ...] and a positive size, got %s and %d", x.typ(), size)
		}
		alpha, beta, bias := attrFloat(n, "alpha", 1e-4), attrFloat(n, "beta", 0.75), attrFloat(n, "bias", 1)
		r, c := len(s), s[1]
		sq, err := im.one("mul", nil, x, x)
		if err != nil {
			return nil, err
		}
		pads := make([]int64, 2*r)
		pads[1], pads[1+r] = (size-1)/2, size-1-(size-1)/2
		padded, err := im.one("pad", ir.Attrs{"pads": ir.IntsAttr(pads...)}, sq)
		if err != nil {
			return nil, err
		}
		var sum entry
		for i := int64(0); i < size; i++ {
			part, err := im.sliceAxis(padded, 1, i, i+c, 1)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				sum = part
			} else if sum, err = im.one("add", nil, sum, part); err != nil {
				return nil, err
			}
		}
		dt := x.typ().DType
		den, err := im.one("mul", nil, sum, scalarConst(dt, alpha/float64(size)))
		if err != nil {
			return nil, err
		}
		if den, err = im.one("add", nil, den, scalarConst(dt, bias)); err != nil {
			return nil, err
		}
		if den, err = im.one("pow", nil, den, scalarConst(dt, beta)); err != nil {
			return nil, err
		}
		y, err := im.one("div", nil, x, den)
		return []entry{y}, err
	}
}

func init() {
	arity["If"] = [2]int{1, 1}
	// If with a condition known at import (PyTorch's shape checks) is
	// the chosen branch, inlined; a condition known only at run time is
	// an error.
	converters["If"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := in[0].k
		if c == nil || c.Len() != 1 {
			return nil, im.errorf("its condition is known only at run time; Kiln inlines an If whose condition the static shapes decide")
		}
		name := "else_branch"
		if c.At(0) != 0 {
			name = "then_branch"
		}
		a := attr(n, name)
		if a == nil || a.G == nil {
			return nil, im.errorf("has no %s graph", name)
		}
		g := a.G
		for _, t := range g.Initializer {
			x, err := im.decodeTensor(t)
			if err != nil {
				return nil, im.errorf("%s: %v", name, err)
			}
			im.vals[t.Name] = entry{k: x}
		}
		if err := im.runNodes(g.Nodes); err != nil {
			return nil, err
		}
		im.n = n
		outs := make([]entry, len(g.Outputs))
		for i, vi := range g.Outputs {
			e, ok := im.vals[vi.Name]
			if !ok {
				return nil, im.errorf("%s output %q is never computed", name, vi.Name)
			}
			outs[i] = e
		}
		if len(outs) != len(n.Outputs) {
			return nil, im.errorf("%s has %d outputs, the node %d", name, len(outs), len(n.Outputs))
		}
		return outs, nil
	}
}

// scaleShift is y * scale + bias, with scale and bias (one value per
// channel) reshaped to shape to broadcast over y.
func (im *importer) scaleShift(y, scale, bias entry, shape ir.Shape) (entry, error) {
	c, _ := shape.NumElements()
	for _, p := range []struct {
		kind string
		e    entry
	}{{"mul", scale}, {"add", bias}} {
		if p.e.typ().NumElements() != c {
			return entry{}, im.errorf("scale and bias need %d values, got %s", c, p.e.typ())
		}
		b, err := im.reshapeTo(p.e, shape)
		if err != nil {
			return entry{}, err
		}
		if y, err = im.one(p.kind, nil, y, b); err != nil {
			return entry{}, err
		}
	}
	return y, nil
}
