package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

// The quantization operators (opsets 10 to 25), written as the float and
// integer ops of their formulas: QuantizeLinear y = saturate(round(x /
// scale) + zero_point) (round half to even; a float8 target casts x /
// scale with the cast's saturation), DequantizeLinear y = (x -
// zero_point) · scale, DynamicQuantizeLinear, and the integer products
// MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv, whose
// integer sums are exact in f64 (8- and 16-bit products over fewer than
// 2^21 terms). Scales and zero points are per tensor or per axis; blocked
// quantization (block_size) is refused.
//
// A DequantizeLinear of a QuantizeLinear to 8 or 16 bits (a fake
// quantiser, as PyTorch exports fake_quantize) reads the quantized values
// as floats, the same numbers, so that the chain x → y stays float. Its
// round is marked straight-through and its saturation is a where that
// keeps values at the bounds: autodiff's gradient through it is 0
// (round's derivative) unless the ste approximation is allowed, and then
// it is PyTorch's fake-quantisation gradient, dy where round(x/s) + z is
// within [lo, hi] (bounds included) and 0 outside.

func init() {
	for op, a := range map[string][2]int{"QuantizeLinear": {2, 3}, "DequantizeLinear": {2, 3}, "DynamicQuantizeLinear": {1, 1},
		"MatMulInteger": {2, 4}, "ConvInteger": {2, 4}, "QLinearMatMul": {8, 8}, "QLinearConv": {8, 9}} {
		arity[op] = a
	}
	for op, v := range map[string]int64{"QuantizeLinear": 10, "DequantizeLinear": 10, "DynamicQuantizeLinear": 11,
		"MatMulInteger": 10, "ConvInteger": 10, "QLinearMatMul": 10, "QLinearConv": 10} {
		introduced[op] = v
	}
	converters["QuantizeLinear"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		if attrInt(n, "block_size", 0) != 0 {
			return nil, im.errorf("blocked quantization (block_size) is not supported")
		}
		out := ir.U8
		zp, hasZP := optional(in, 2)
		if hasZP {
			out = zp.typ().DType
		}
		if od := attrInt(n, "output_dtype", 0); od != 0 {
			d, ok := dtypeOf(od)
			if !ok || hasZP && d != out {
				return nil, im.errorf("output_dtype %s does not match the zero point %s", onnxTypeName(od), out)
			}
			out = d
		}
		c := &chain{im: im}
		work := workType(in[0], in[1])
		scale, err := im.perAxis(n, in[1], in[0])
		if err != nil {
			return nil, err
		}
		q := c.op("div", nil, c.cast(in[0], work), c.cast(scale, work))
		if out == ir.F8E4M3 || out == ir.F8E5M2 {
			a := ir.Attrs{"to": ir.TypeAttr(out)}
			if attrInt(n, "saturate", 1) == 0 {
				a["saturate"] = ir.BoolAttr(false)
			}
			return c.done(c.op("cast", a, q))
		}
		lo, hi, ok := intRange(out)
		if !ok {
			return nil, im.errorf("quantizing to %s is not supported (8-, 16- and 32-bit integers, float8)", out)
		}
		q = c.op("round", ir.Attrs{ir.AttrStraightThrough: ir.BoolAttr(true)}, q)
		if hasZP {
			z, err := im.perAxis(n, zp, in[0])
			if err != nil {
				return nil, err
			}
			q = c.op("add", nil, q, c.cast(z, work))
		}
		// clip(q), written so that its derivative is 1 at the bounds too.
		inside := c.op("and", nil, c.op("ge", nil, q, num(q, lo)), c.op("le", nil, q, num(q, hi)))
		q = c.op("where", nil, inside, q, c.op("clip", ir.Attrs{"lo": ir.FloatAttr(lo), "hi": ir.FloatAttr(hi)}, q))
		if c.err == nil && out.Size() <= 2 && len(n.Outputs) > 0 {
			if im.quantized == nil {
				im.quantized = map[string]entry{}
			}
			im.quantized[n.Outputs[0]] = q // integers below 2^16: exact in f32
		}
		return c.done(c.cast(q, out))
	}
	converters["DequantizeLinear"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		if attrInt(n, "block_size", 0) != 0 {
			return nil, im.errorf("blocked quantization (block_size) is not supported")
		}
		x := in[0]
		out := in[1].typ().DType
		if od := attrInt(n, "output_dtype", 0); od != 0 {
			var ok bool
			if out, ok = dtypeOf(od); !ok || !out.IsFloat() {
				return nil, im.errorf("output_dtype %s is not a floating-point type", onnxTypeName(od))
			}
		}
		c := &chain{im: im}
		scale, err := im.perAxis(n, in[1], x)
		if err != nil {
			return nil, err
		}
		var v entry
		work := workType(in[1], in[1])
		if q, ok := im.quantized[n.Inputs[0]]; ok {
			// A fake quantiser: the quantized values as floats, less the
			// zero point (both integers below 2^16, exact).
			v = c.cast(q, work)
			if zp, ok := optional(in, 2); ok {
				z, err := im.perAxis(n, zp, x)
				if err != nil {
					return nil, err
				}
				v = c.op("sub", nil, v, c.cast(z, work))
			}
		} else if x.typ().DType.IsFloat() {
			v = c.cast(x, ir.F32) // float8
		} else {
			// x - zero_point exactly, in int64.
			v = c.cast(x, ir.I64)
			if zp, ok := optional(in, 2); ok {
				z, err := im.perAxis(n, zp, x)
				if err != nil {
					return nil, err
				}
				v = c.op("sub", nil, v, c.cast(z, ir.I64))
			}
		}
		return c.done(c.cast(c.op("mul", nil, c.cast(v, work), c.cast(scale, work)), out))
	}
	converters["DynamicQuantizeLinear"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		c := &chain{im: im}
		all := make([]int64, x.typ().Rank())
		for i := range all {
			all[i] = int64(i)
		}
		full := func(op string, v entry) entry {
			return c.op(op, ir.Attrs{"axes": ir.IntsAttr(all...), "keepdims": ir.BoolAttr(false)}, v)
		}
		hi := c.op("max", nil, full("reduce_max", x), num(x, 0))
		lo := c.op("neg", nil, c.op("max", nil, full("reduce_max", c.op("neg", nil, x)), num(x, 0)))
		scale := c.op("div", nil, c.op("sub", nil, hi, lo), num(x, 255))
		zpf := c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(255)}, c.op("round", nil, c.op("sub", nil, num(x, 0), c.op("div", nil, lo, scale))))
		y := c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(255)}, c.op("add", nil, c.op("round", nil, c.op("div", nil, x, scale)), zpf))
		return c.done(c.cast(y, ir.U8), scale, c.cast(zpf, ir.U8))
	}
	converters["MatMulInteger"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		a, b := im.centred(c, in, 0, 2, -2), im.centred(c, in, 1, 3, -1)
		return c.done(c.cast(c.op("matmul", nil, a, b), ir.I32))
	}
	converters["ConvInteger"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		x, w := im.centred(c, in, 0, 2, 1), im.centred(c, in, 1, 3, 0)
		if c.err != nil {
			return nil, c.err
		}
		y, err := converters["Conv"](im, n, []entry{x, w})
		if err != nil {
			return nil, err
		}
		return c.done(c.cast(y[0], ir.I32))
	}
	// QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
	// the integer product, rescaled by a_scale·b_scale/y_scale and
	// requantized to y_zp's type.
	converters["QLinearMatMul"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		a := im.centred(c, []entry{in[0], in[3], in[2], in[5]}, 0, 2, -2)
		b := im.centred(c, []entry{in[0], in[3], in[2], in[5]}, 1, 3, -1)
		// a_scale per row (axis -2 of the product), b_scale per column
		// (axis -1).
		return im.requantize(c, c.op("matmul", nil, a, b), in[1], -2, in[4], -1, in[6], in[7])
	}
	converters["QLinearConv"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		c := &chain{im: im}
		x := im.centred(c, []entry{in[0], in[3], in[2], in[5]}, 0, 2, 1)
		w := im.centred(c, []entry{in[0], in[3], in[2], in[5]}, 1, 3, 0)
		if c.err != nil {
			return nil, c.err
		}
		conv := []entry{x, w}
		if b, ok := optional(in, 8); ok {
			conv = append(conv, c.cast(b, ir.F64)) // int32, in units of x_scale·w_scale
		}
		y, err := converters["Conv"](im, n, conv)
		if err != nil {
			return nil, err
		}
		// x_scale per tensor, w_scale per output channel (axis 1).
		return im.requantize(c, y[0], in[1], 1, in[4], 1, in[6], in[7])
	}
}

// optional is input i when the node gives it.
func optional(in []entry, i int) (entry, bool) {
	if i < len(in) && !in[i].missing() {
		return in[i], true
	}
	return entry{}, false
}

// workType is the float type quantization computes in: f64 if either
// operand is, else f32.
func workType(a, b entry) ir.DType {
	if a.typ().DType == ir.F64 || b.typ().DType == ir.F64 {
		return ir.F64
	}
	return ir.F32
}

// intRange is the range of an integer type that quantization saturates to.
func intRange(d ir.DType) (lo, hi float64, ok bool) {
	switch d {
	case ir.U8, ir.U16, ir.U32:
		return 0, math.Ldexp(1, int(8*d.Size())) - 1, true
	case ir.I8, ir.I16, ir.I32:
		return -math.Ldexp(1, int(8*d.Size())-1), math.Ldexp(1, int(8*d.Size())-1) - 1, true
	}
	return 0, 0, false
}

// perAxis shapes a scale or zero point for x: a scalar (or one element)
// as it is, a 1-D one along the node's axis (default 1).
func (im *importer) perAxis(n *node, s, x entry) (entry, error) {
	st := s.typ()
	if st.Rank() == 0 || st.NumElements() == 1 && st.Rank() == 1 {
		return im.reshapeTo(s, ir.Shape{})
	}
	ax, err := ir.NormalizeAxis(attrInt(n, "axis", 1), x.typ().Rank())
	if err != nil {
		return entry{}, im.errorf("axis: %v", err)
	}
	if st.Rank() != 1 || st.Shape[0] != x.typ().Shape[ax] {
		return entry{}, im.errorf("a scale or zero point of %s does not fit axis %d of %s (blocked quantization is not supported)", st, ax, x.typ())
	}
	return im.reshapeTo(s, onesBut(x.typ().Rank(), ax, st.Shape[0]))
}

// centred is in[i] - in[zp] (the zero point absent: 0) in f64, exact for
// the integer types; a 1-D zero point lies along axis (negative: from
// the end) of in[i], as MatMulInteger's per-row and per-column ones do.
func (im *importer) centred(c *chain, in []entry, i, zp, axis int) entry {
	v := c.cast(in[i], ir.F64)
	z, ok := optional(in, zp)
	if !ok || c.err != nil {
		return v
	}
	zt := z.typ()
	r := in[i].typ().Rank()
	if zt.Rank() == 1 && zt.NumElements() > 1 {
		ax := axis
		if ax < 0 {
			ax += r
		}
		if ax < 0 || ax >= r || in[i].typ().Shape[ax] != zt.Shape[0] {
			c.err = im.errorf("a zero point of %s does not fit %s", zt, in[i].typ())
			return entry{}
		}
		var err error
		if z, err = im.reshapeTo(z, onesBut(r, ax, zt.Shape[0])); err != nil {
			c.err = err
			return entry{}
		}
	}
	return c.op("sub", nil, v, c.cast(z, ir.F64))
}

// requantize is acc (an exact integer sum in f64) times a_scale·b_scale
// / y_scale, rounded half to even, plus y_zp, saturated to y_zp's type; a
// 1-D a_scale or b_scale lies along axis aAx or bAx of acc (negative:
// from the end).
func (im *importer) requantize(c *chain, acc, as entry, aAx int, bs entry, bAx int, ys, yzp entry) ([]entry, error) {
	out := yzp.typ().DType
	lo, hi, ok := intRange(out)
	if !ok {
		return nil, im.errorf("requantizing to %s is not supported", out)
	}
	if c.err != nil {
		return nil, c.err
	}
	r := acc.typ().Rank()
	along := func(s entry, ax int) entry {
		st := s.typ()
		if st.Rank() == 0 || st.NumElements() == 1 || c.err != nil {
			return c.cast(s, ir.F32)
		}
		if ax < 0 {
			ax += r
		}
		if st.Rank() != 1 || ax < 0 || ax >= r || acc.typ().Shape[ax] != st.Shape[0] {
			c.err = im.errorf("a scale of %s does not fit axis %d of the product %s", st, ax, acc.typ())
			return entry{}
		}
		v, err := im.reshapeTo(c.cast(s, ir.F32), onesBut(r, ax, st.Shape[0]))
		c.err = err
		return v
	}
	scale := c.op("div", nil, c.op("mul", nil, along(as, aAx), along(bs, bAx)), c.cast(ys, ir.F32))
	y := c.op("round", nil, c.op("mul", nil, c.cast(acc, ir.F32), scale))
	y = c.op("add", nil, y, c.cast(yzp, ir.F32))
	y = c.op("clip", ir.Attrs{"lo": ir.FloatAttr(lo), "hi": ir.FloatAttr(hi)}, y)
	return c.done(c.cast(y, out))
}
