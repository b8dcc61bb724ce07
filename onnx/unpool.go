package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// maxPoolWithIndices is a 2-D MaxPool of floats that also returns its
// indices output: for each output element, the flat index (over the
// whole input, N·C·H·W; storage_order 1 counts within a plane column by
// column) of the first window element, in window order, equal to the
// maximum. Each window offset (kh, kw) is a strided slice of the input
// padded with -inf; from the last offset to the first, where that slice
// equals the pooled maximum (and the offset is inside the input), its
// position replaces the index, so the first equal one remains.
func (im *importer) maxPoolWithIndices(n *node, x entry) ([]entry, error) {
	xs := x.typ().Shape
	if x.typ().Rank() != 4 || !x.typ().DType.IsFloat() {
		return nil, im.errorf("the indices output of MaxPool: Kiln gives it for 2-D pooling of floating-point values, not %s", x.typ())
	}
	order := attrInt(n, "storage_order", 0)
	if order != 0 && order != 1 {
		return nil, im.errorf("storage_order=%d is not 0 or 1", order)
	}
	w, err := im.readWindow(n, 2, nil, xs[2:])
	if err != nil {
		return nil, err
	}
	a := w.attrs2d(0, 1)
	a["kernel"] = ir.IntsAttr(w.kernel...)
	if attrInt(n, "ceil_mode", 0) == 1 {
		a["ceil_mode"] = ir.BoolAttr(true)
	}
	c := &chain{im: im}
	y := c.op("max_pool2d", a, x)
	if c.err != nil {
		return nil, c.err
	}
	H, W := xs[2], xs[3]
	oh, ow := y.typ().Shape[2], y.typ().Shape[3]
	// The padded input, with room for the last (ceil-mode) windows.
	extent := func(o, stride, k, dil int64) int64 { return (o-1)*stride + (k-1)*dil + 1 }
	padH := max(w.pads[2], extent(oh, w.strides[0], w.kernel[0], w.dilations[0])-H-w.pads[0])
	padW := max(w.pads[3], extent(ow, w.strides[1], w.kernel[1], w.dilations[1])-W-w.pads[1])
	xp := c.op("pad", ir.Attrs{"pads": ir.IntsAttr(0, 0, w.pads[0], w.pads[1], 0, 0, padH, padW), "value": ir.FloatAttr(math.Inf(-1))}, x)
	idx := entry{k: interp.New(ir.TensorOf(ir.I64, 1, 1, oh, ow))}
	for kh := w.kernel[0] - 1; kh >= 0; kh-- {
		for kw := w.kernel[1] - 1; kw >= 0; kw-- {
			h0, w0 := kh*w.dilations[0], kw*w.dilations[1]
			cand := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(2, 3), "starts": ir.IntsAttr(h0, w0),
				"ends":  ir.IntsAttr(h0+(oh-1)*w.strides[0]+1, w0+(ow-1)*w.strides[1]+1),
				"steps": ir.IntsAttr(w.strides[0], w.strides[1])}, xp)
			pos := interp.New(ir.TensorOf(ir.I64, 1, 1, oh, ow))
			inside := interp.New(ir.TensorOf(ir.Bool, 1, 1, oh, ow))
			for i := int64(0); i < oh; i++ {
				for j := int64(0); j < ow; j++ {
					h, v := i*w.strides[0]+h0-w.pads[0], j*w.strides[1]+w0-w.pads[1]
					if h >= 0 && h < H && v >= 0 && v < W {
						inside.I[i*ow+j] = 1
					}
					pos.I[i*ow+j] = h*W + v
					if order == 1 {
						pos.I[i*ow+j] = v*H + h
					}
				}
			}
			hit := c.op("and", nil, c.op("eq", nil, cand, y), entry{k: inside})
			idx = c.op("where", nil, hit, entry{k: pos}, idx)
		}
	}
	base := interp.New(ir.TensorOf(ir.I64, xs[0], xs[1], 1, 1))
	for i := range base.I {
		base.I[i] = int64(i) * H * W
	}
	idx = c.op("add", nil, idx, entry{k: base})
	return c.done(y, idx)
}

// MaxUnpool places each value of X at the flat index I gives it (over
// the whole unpooled shape, N·C·OH·OW with OH = (H - 1)·stride - pads +
// kernel per axis) in zeros, then pads the end of each axis to the
// output_shape input where one is given (known at import), as ONNX's
// reference does. It is a scatter-add of X and, for indices
// that repeat (overlapping MaxPool windows give one element's index
// twice, with its value each time), a division by how many times each
// index occurs: the repeated value itself, exact for two, within one
// rounding for more.
func init() {
	arity["MaxUnpool"] = [2]int{2, 3}
	introduced["MaxUnpool"] = 9
	converters["MaxUnpool"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, ix := in[0], in[1]
		xs := x.typ().Shape
		if x.typ().Rank() < 3 || !x.typ().DType.IsFloat() || !ix.typ().Shape.Equal(xs) || ix.typ().DType != ir.I64 {
			return nil, im.errorf("MaxUnpool of %s with indices %s: Kiln reads floating-point X and int64 indices of its shape", x.typ(), ix.typ())
		}
		spatial := x.typ().Rank() - 2
		w, err := im.readWindow(n, spatial, nil, nil)
		if err != nil {
			return nil, err
		}
		out := ir.Shape{xs[0], xs[1]}
		for i := 0; i < spatial; i++ {
			out = append(out, (xs[2+i]-1)*w.strides[i]-w.pads[i]-w.pads[spatial+i]+w.kernel[i])
		}
		given, err := im.constInts(in, 2, "the output shape")
		if err != nil {
			return nil, err
		}
		var grow []int64 // pads at the end of each axis, to output_shape
		if given != nil {
			if len(given) != len(out) {
				return nil, im.errorf("output_shape %v does not match X %s", given, x.typ())
			}
			grow = make([]int64, 2*len(out))
			for i := range out {
				if given[i] < out[i] || i < 2 && given[i] != out[i] {
					return nil, im.errorf("output_shape %v is smaller than the unpooled shape %v", given, out)
				}
				grow[len(out)+i] = given[i] - out[i]
			}
		}
		total, ok := out.NumElements()
		if !ok || total < 1 {
			return nil, im.errorf("output shape %v is invalid", out)
		}
		c := &chain{im: im}
		m := x.typ().NumElements()
		flatX := c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(m)}, x)
		flatI := c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(m)}, ix)
		// The indices are MaxPool's: positions from 0, none below.
		a := ir.Attrs{"axis": ir.IntAttr(0), "data_shape": ir.IntsAttr(total), ir.AttrNegative: ir.BoolAttr(false)}
		sum := c.op("gather_grad", a, flatX, flatI)
		ones := c.cast(c.op("eq", nil, flatI, flatI), x.typ().DType) // 1 per value of X
		count := c.op("gather_grad", a, ones, flatI)
		y := c.op("div", nil, sum, c.op("max", nil, count, scalarConst(x.typ().DType, 1)))
		y = c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(out...)}, y)
		if grow != nil {
			y = c.op("pad", ir.Attrs{"pads": ir.IntsAttr(grow...)}, y)
		}
		return c.done(y)
	}
}
