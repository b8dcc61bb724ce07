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
	for op, a := range map[string][2]int{"CastLike": {2, 2}, "ThresholdedRelu": {1, 1}, "IsNaN": {1, 1}, "IsInf": {1, 1},
		"EyeLike": {1, 1}, "Hardmax": {1, 1}, "LpNormalization": {1, 1}, "MeanVarianceNormalization": {1, 1},
		"RMSNormalization": {2, 2}, "Swish": {1, 1}} {
		arity[op] = a
	}
	for op, v := range map[string]int64{"CastLike": 15, "ThresholdedRelu": 10, "IsNaN": 9, "IsInf": 10, "EyeLike": 9,
		"MeanVarianceNormalization": 9, "RMSNormalization": 23, "Swish": 24} {
		introduced[op] = v
	}

	// CastLike(x, like) is Cast to like's element type.
	converters["CastLike"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		return c.done(c.cast(in[0], in[1].typ().DType))
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
		if rows*cols > foldLimit {
			return nil, im.errorf("EyeLike of %d elements is too large to fold", rows*cols)
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
			outer, inner := int64(1), int64(1)
			for i, d := range s {
				if i < ax {
					outer *= d
				} else {
					inner *= d
				}
			}
			x, c.err = im.reshapeTo(x, ir.Shape{outer, inner})
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

// onesBut is a rank-r shape of ones with d at axis ax.
func onesBut(r, ax int, d int64) ir.Shape {
	s := make(ir.Shape, r)
	for i := range s {
		s[i] = 1
	}
	s[ax] = d
	return s
}
