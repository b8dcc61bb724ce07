package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Convolution and pooling over 1, 2 or 3 spatial axes. Kiln's ops are
// 2-D; a 1-D node runs as 2-D with a height of 1, and a 3-D node as one
// 2-D op per kernel depth over depth slices folded into the batch,
// combined by a sum (convolution, average) or a maximum. Each form is
// exact and differentiable through its parts.

// window is a node's per-axis geometry over its spatial axes.
type window struct {
	kernel, strides, dilations []int64
	pads                       []int64 // begins, then ends
}

// readWindow reads kernel_shape (or kernel, the weight's spatial dims),
// strides, dilations and pads with ONNX's defaults.
// readWindow reads a convolution's or pooling's window attributes. x is
// the input's spatial shape, from which auto_pad SAME_UPPER and
// SAME_LOWER derive the pads (nil for ConvTranspose, whose auto_pad
// means something else and is refused).
func (im *importer) readWindow(n *node, spatial int, kernel []int64, x ir.Shape) (window, error) {
	w := window{kernel: kernel}
	if k := attrInts(n, "kernel_shape"); k != nil {
		w.kernel = k
	}
	fill := func(name string, v int64, count int) []int64 {
		if a := attrInts(n, name); a != nil {
			return a
		}
		out := make([]int64, count)
		for i := range out {
			out[i] = v
		}
		return out
	}
	w.strides, w.dilations, w.pads = fill("strides", 1, spatial), fill("dilations", 1, spatial), fill("pads", 0, 2*spatial)
	if len(w.kernel) != spatial || len(w.strides) != spatial || len(w.dilations) != spatial || len(w.pads) != 2*spatial {
		return w, im.errorf("kernel_shape, strides, dilations and pads must have %d, %d, %d and %d entries for %d spatial axes", spatial, spatial, spatial, 2*spatial, spatial)
	}
	for i := range spatial {
		if w.strides[i] < 1 || w.dilations[i] < 1 {
			return w, im.errorf("strides %v and dilations %v must be at least 1", w.strides, w.dilations)
		}
		if w.kernel[i] < 1 {
			return w, im.errorf("kernel_shape %v must be positive", w.kernel)
		}
		if w.strides[i] > ir.MaxExtent || w.pads[i] < 0 || w.pads[i] > ir.MaxExtent || w.pads[spatial+i] < 0 || w.pads[spatial+i] > ir.MaxExtent {
			return w, im.errorf("strides %v and pads %v must lie in [1, 2^40] and [0, 2^40]", w.strides, w.pads)
		}
		if _, ok := ir.DilatedExtent(w.kernel[i], w.dilations[i]); !ok {
			return w, im.errorf("kernel_shape %v with dilations %v spans more than 2^40 elements", w.kernel, w.dilations)
		}
	}
	switch ap := attrString(n, "auto_pad", "NOTSET"); {
	case ap == "NOTSET" || ap == "":
	case ap == "VALID" && x != nil:
		w.pads = make([]int64, 2*spatial)
	case (ap == "SAME_UPPER" || ap == "SAME_LOWER") && x != nil:
		// The output is ceil(x / stride); the pads that make it so are
		// split evenly, the odd one at the end (UPPER) or the start.
		for i := 0; i < spatial; i++ {
			out := (x[i] + w.strides[i] - 1) / w.strides[i]
			total := max(0, (out-1)*w.strides[i]+(w.kernel[i]-1)*w.dilations[i]+1-x[i])
			lo := total / 2
			if ap == "SAME_LOWER" {
				lo = total - total/2
			}
			w.pads[i], w.pads[spatial+i] = lo, total-lo
		}
	default:
		return w, im.errorf("auto_pad=%s is not supported; export with explicit pads", ap)
	}
	for i, k := range kernel {
		if w.kernel[i] != k {
			return w, im.errorf("kernel_shape %v does not match the weight's spatial dimensions %v", w.kernel, kernel)
		}
	}
	return w, nil
}

// attrs2d is the 2-D op's attributes for spatial axes i and j (i = -1:
// a height of 1).
func (w window) attrs2d(i, j int) ir.Attrs {
	sp := len(w.strides)
	pick := func(v []int64, k int, def int64) int64 {
		if k < 0 {
			return def
		}
		return v[k]
	}
	return ir.Attrs{
		"strides":   ir.IntsAttr(pick(w.strides, i, 1), w.strides[j]),
		"dilations": ir.IntsAttr(pick(w.dilations, i, 1), w.dilations[j]),
		"pads":      ir.IntsAttr(pick(w.pads, i, 0), w.pads[j], pick(w.pads[sp:], i, 0), w.pads[sp+j]),
	}
}

func init() {
	converters["Conv"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		in = present(in)
		x, wt := in[0], in[1]
		spatial := x.typ().Rank() - 2
		if spatial < 1 || spatial > 3 || wt.typ().Rank() != spatial+2 {
			return nil, im.errorf("convolution of %s with weight %s: Kiln reads 1-, 2- and 3-D convolutions", x.typ(), wt.typ())
		}
		w, err := im.readWindow(n, spatial, []int64(wt.typ().Shape[2:]), x.typ().Shape[2:])
		if err != nil {
			return nil, err
		}
		groups := attrInt(n, "group", 1)
		switch spatial {
		case 1:
			a := w.attrs2d(-1, 0)
			a["groups"] = ir.IntAttr(groups)
			return im.as2d(in, []int{0, 1}, "conv2d", a)
		case 2:
			a := w.attrs2d(0, 1)
			a["groups"] = ir.IntAttr(groups)
			return im.emit("conv2d", in, a)
		}
		return im.over3d(n, in, w, "conv2d", groups)
	}
	for onnxName, kind := range map[string]string{"MaxPool": "max_pool2d", "AveragePool": "avg_pool2d"} {
		converters[onnxName] = func(im *importer, n *node, in []entry) ([]entry, error) {
			x := in[0]
			if len(n.Outputs) > 1 && n.Outputs[1] != "" {
				if kind != "max_pool2d" {
					return nil, im.errorf("%s has one output; the node asks for %d", onnxName, len(n.Outputs))
				}
				return im.maxPoolWithIndices(n, x)
			}
			if d := x.typ().DType; !d.IsFloat() {
				// MaxPool takes 8-bit integers (opset 12): pooled in f64,
				// which holds every integer of up to 32 bits exactly.
				if kind != "max_pool2d" || d == ir.I64 || d == ir.Bool {
					return nil, im.errorf("pooling of %s: Kiln pools floating-point values, and integers of up to 32 bits with MaxPool", x.typ())
				}
				wide, err := im.one("cast", ir.Attrs{"to": ir.TypeAttr(ir.F64)}, x)
				if err != nil {
					return nil, err
				}
				outs, err := converters[onnxName](im, n, []entry{wide})
				if err != nil {
					return nil, err
				}
				y, err := im.one("cast", ir.Attrs{"to": ir.TypeAttr(d)}, outs[0])
				return []entry{y}, err
			}
			spatial := x.typ().Rank() - 2
			if spatial < 1 || spatial > 3 {
				return nil, im.errorf("pooling of %s: Kiln reads 1-, 2- and 3-D pooling", x.typ())
			}
			w, err := im.readWindow(n, spatial, nil, x.typ().Shape[2:])
			if err != nil {
				return nil, err
			}
			ceil := attrInt(n, "ceil_mode", 0) == 1
			include := kind == "avg_pool2d" && attrInt(n, "count_include_pad", 0) == 1
			flags := func(a ir.Attrs, kernel ...int64) ir.Attrs {
				a["kernel"] = ir.IntsAttr(kernel...)
				if ceil {
					a["ceil_mode"] = ir.BoolAttr(true)
				}
				if include {
					a["count_include_pad"] = ir.BoolAttr(true)
				}
				return a
			}
			switch spatial {
			case 1:
				return im.as2d(in[:1], []int{0}, kind, flags(w.attrs2d(-1, 0), 1, w.kernel[0]))
			case 2:
				return im.emit(kind, in[:1], flags(w.attrs2d(0, 1), w.kernel...))
			}
			if ceil {
				return nil, im.errorf("ceil_mode=1 is not supported for 3-D pooling")
			}
			if kind == "avg_pool2d" && !include && (w.pads[0] != 0 || w.pads[3] != 0) {
				return nil, im.errorf("3-D average pooling with depth padding needs count_include_pad=1")
			}
			return im.over3d(n, in[:1], w, kind, 0)
		}
	}
	converters["ConvTranspose"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		in = present(in)
		x, wt := in[0], in[1]
		spatial := x.typ().Rank() - 2
		if spatial < 1 || spatial > 3 || wt.typ().Rank() != spatial+2 {
			return nil, im.errorf("transposed convolution of %s with weight %s: Kiln reads 1-, 2- and 3-D ones", x.typ(), wt.typ())
		}
		// auto_pad SAME_* and output_shape set the pads, from the output
		// size (given, or input × stride): the window is read without them.
		autoPad := attrString(n, "auto_pad", "NOTSET")
		plain := *n
		plain.Attrs = nil
		for _, a := range n.Attrs {
			if a.Name != "auto_pad" && a.Name != "output_shape" {
				plain.Attrs = append(plain.Attrs, a)
			}
		}
		w, err := im.readWindow(&plain, spatial, []int64(wt.typ().Shape[2:]), nil)
		if err != nil {
			return nil, err
		}
		groups := attrInt(n, "group", 1)
		outPad := append([]int64(nil), attrInts(n, "output_padding")...) // a copy: output_shape may add to it
		if len(outPad) == 0 {
			outPad = make([]int64, spatial)
		}
		if len(outPad) != spatial {
			return nil, im.errorf("output_padding needs %d entries", spatial)
		}
		xs := x.typ().Shape
		want := attrInts(n, "output_shape")
		switch {
		case len(want) == spatial+2:
			want = want[2:]
		case want != nil && len(want) != spatial:
			return nil, im.errorf("output_shape needs %d (or %d) entries, not %d", spatial, spatial+2, len(want))
		case want == nil && (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER"):
			for i := 0; i < spatial; i++ {
				want = append(want, xs[2+i]*w.strides[i])
			}
		case want == nil && autoPad != "NOTSET" && autoPad != "VALID" && autoPad != "":
			return nil, im.errorf("auto_pad=%s is not one ONNX defines", autoPad)
		}
		for i := range want {
			total := w.strides[i]*(xs[2+i]-1) + outPad[i] + (w.kernel[i]-1)*w.dilations[i] + 1 - want[i]
			if total < 0 {
				// A larger output than the unpadded one: the spec's split
				// (Python's floor division) puts the extra at the end
				// without SAME_UPPER, which is output_padding.
				if autoPad == "SAME_UPPER" {
					return nil, im.errorf("output_shape %v with auto_pad=SAME_UPPER extends the output at its start, which Kiln does not read", want)
				}
				outPad[i] -= total
				total = 0
			}
			lo := total - total/2
			if autoPad == "SAME_UPPER" {
				lo = total / 2
			}
			w.pads[i], w.pads[spatial+i] = lo, total-lo
		}
		out := ir.Shape{xs[0], wt.typ().Shape[1] * groups}
		for i := 0; i < spatial; i++ {
			d := w.strides[i]*(xs[2+i]-1) + outPad[i] + w.dilations[i]*(w.kernel[i]-1) + 1 - w.pads[i] - w.pads[spatial+i]
			if outPad[i] < 0 || outPad[i] >= max(w.strides[i], w.dilations[i]) || d < 1 {
				return nil, im.errorf("output_padding %v with strides %v gives an invalid output", outPad, w.strides)
			}
			out = append(out, d)
		}
		var a ir.Attrs
		switch spatial {
		case 1:
			a = w.attrs2d(-1, 0)
			out = ir.Shape{out[0], out[1], 1, out[2]}
		case 2:
			a = w.attrs2d(0, 1)
		case 3:
			a = w.attrs2d(1, 2)
		}
		a["groups"] = ir.IntAttr(groups)
		a["input_shape"] = ir.IntsAttr(out...)
		var y []entry
		switch spatial {
		case 1:
			y, err = im.as2d(in[:2], []int{0, 1}, "conv2d_grad_input", a)
		case 2:
			y, err = im.emit("conv2d_grad_input", in[:2], a)
		case 3:
			y, err = im.transposed3d(x, wt, w, outPad[0], out, a)
		}
		if err != nil || len(in) < 3 {
			return y, err
		}
		return im.addChannelBias(y[0], in[2])
	}
}

// addChannelBias adds b[C] along axis 1 of y.
func (im *importer) addChannelBias(y, b entry) ([]entry, error) {
	ys := y.typ().Shape
	if b.typ().NumElements() != ys[1] {
		return nil, im.errorf("bias %s does not match %d channels", b.typ(), ys[1])
	}
	shape := ir.Shape{ys[1]}
	for range ys[2:] {
		shape = append(shape, 1)
	}
	b, err := im.reshapeTo(b, shape)
	if err != nil {
		return nil, err
	}
	out, err := im.one("add", nil, y, b)
	return []entry{out}, err
}

// as2d runs a 2-D op on 1-D operands: the operands listed get a height
// of 1 (axis 2), and the result loses it.
func (im *importer) as2d(in []entry, lift []int, kind string, a ir.Attrs) ([]entry, error) {
	in = append([]entry{}, in...)
	for _, i := range lift {
		var err error
		if in[i], err = im.one("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(2)}, in[i]); err != nil {
			return nil, err
		}
	}
	y, err := im.one(kind, a, in...)
	if err != nil {
		return nil, err
	}
	y, err = im.one("squeeze", ir.Attrs{"axes": ir.IntsAttr(2)}, y)
	return []entry{y}, err
}

// over3d computes a 3-D convolution or pooling as 2-D ops, one per
// kernel depth kd: the depth slice kd*dilation, +stride, ... of the
// (depth-padded) input, with depth folded into the batch, through the
// 2-D op over height and width; the slices' results are summed
// (convolution, then the bias once), maximised, or averaged.
func (im *importer) over3d(n *node, in []entry, w window, kind string, groups int64) ([]entry, error) {
	x := in[0]
	xs := x.typ().Shape
	if w.pads[0] != 0 || w.pads[3] != 0 {
		value := 0.0
		if kind == "max_pool2d" {
			value = math.Inf(-1)
		}
		var err error
		if x, err = im.one("pad", ir.Attrs{"pads": ir.IntsAttr(0, 0, w.pads[0], 0, 0, 0, 0, w.pads[3], 0, 0), "value": ir.FloatAttr(value)}, x); err != nil {
			return nil, err
		}
	}
	depth := x.typ().Shape[2]
	kd, sd, dd := w.kernel[0], w.strides[0], w.dilations[0]
	span := dd*(kd-1) + 1
	if kd < 1 || sd < 1 || dd < 1 || depth < span {
		return nil, im.errorf("the depth window (kernel %d, dilation %d) does not fit a depth of %d", kd, dd, depth)
	}
	outDepth := (depth-span)/sd + 1
	xt, err := im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3, 4)}, x)
	if err != nil {
		return nil, err
	}
	a := w.attrs2d(1, 2)
	combine := "add"
	switch kind {
	case "conv2d":
		a["groups"] = ir.IntAttr(groups)
	case "max_pool2d":
		a["kernel"] = ir.IntsAttr(w.kernel[1:]...)
		combine = "max"
	default:
		a["kernel"] = ir.IntsAttr(w.kernel[1:]...)
		if attrInt(n, "count_include_pad", 0) == 1 {
			a["count_include_pad"] = ir.BoolAttr(true)
		}
	}
	var acc entry
	for k := int64(0); k < kd; k++ {
		s, err := im.sliceAxis(xt, 1, k*dd, k*dd+(outDepth-1)*sd+1, sd)
		if err != nil {
			return nil, err
		}
		if s, err = im.reshapeTo(s, ir.Shape{xs[0] * outDepth, xs[1], xs[3], xs[4]}); err != nil {
			return nil, err
		}
		operands := []entry{s}
		if kind == "conv2d" {
			ws := in[1].typ().Shape
			wk, err := im.sliceAxis(in[1], 2, k, k+1, 1)
			if err != nil {
				return nil, err
			}
			if wk, err = im.reshapeTo(wk, ir.Shape{ws[0], ws[1], ws[3], ws[4]}); err != nil {
				return nil, err
			}
			operands = append(operands, wk)
			if k == 0 && len(in) > 2 {
				operands = append(operands, in[2])
			}
		}
		y, err := im.one(kind, a, operands...)
		if err != nil {
			return nil, err
		}
		if k == 0 {
			acc = y
		} else if acc, err = im.one(combine, nil, acc, y); err != nil {
			return nil, err
		}
	}
	if kind == "avg_pool2d" && kd > 1 {
		if acc, err = im.one("div", nil, acc, scalarConst(acc.typ().DType, float64(kd))); err != nil {
			return nil, err
		}
	}
	ys := acc.typ().Shape
	if acc, err = im.reshapeTo(acc, ir.Shape{xs[0], outDepth, ys[1], ys[2], ys[3]}); err != nil {
		return nil, err
	}
	y, err := im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3, 4)}, acc)
	return []entry{y}, err
}

func init() {
	converters["Resize"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		var scales []float64
		var sizes []int64
		var err error
		scaleInput := 2
		if im.opset < 11 {
			scaleInput = 1 // Resize-10: (X, scales)
		}
		if s, err := im.constFloats(in, scaleInput, "the scales"); err != nil {
			return nil, err
		} else if len(s) > 0 {
			scales = s
		}
		if im.opset >= 11 {
			if sizes, err = im.constInts(in, 3, "the sizes"); err != nil {
				return nil, err
			}
		}
		var roi []float64
		if im.opset >= 11 && attrString(n, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize" {
			if roi, err = im.constFloats(in, 1, "the roi (of tf_crop_and_resize)"); err != nil {
				return nil, err
			}
			if len(roi) != 2*in[0].typ().Rank() {
				return nil, im.errorf("tf_crop_and_resize needs a roi of %d values (starts, then ends), not %d", 2*in[0].typ().Rank(), len(roi))
			}
		}
		return im.resize(n, in[0], scales, sizes, roi)
	}
	converters["Upsample"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		var scales []float64
		if a := attr(n, "scales"); a != nil {
			for _, f := range a.Floats {
				scales = append(scales, float64(f))
			}
		} else {
			var err error
			if scales, err = im.constFloats(in, 1, "the scales"); err != nil {
				return nil, err
			}
		}
		return im.resize(n, in[0], scales, nil, nil)
	}
	arity["Resize"] = [2]int{1, 4}
	arity["Upsample"] = [2]int{1, 2}
}

// constFloats returns input i as float64s; it must be known at import time.
func (im *importer) constFloats(in []entry, i int, what string) ([]float64, error) {
	if i >= len(in) || in[i].missing() {
		return nil, nil
	}
	k := in[i].k
	if k == nil {
		if k = im.initializerConst(in[i]); k == nil {
			return nil, im.needConstant(in[i], what)
		}
	}
	out := make([]float64, k.Len())
	for j := range out {
		out[j] = k.At(j)
	}
	return out, nil
}

// resize resamples x along every axis whose size changes, as gathers of
// source elements (nearest) or a linear interpolation between two of
// them (lerp_gather, whose gradient scatters both parts at once): exact,
// and differentiable.
func (im *importer) resize(n *node, x entry, scales []float64, sizes []int64, roi []float64) ([]entry, error) {
	xs := x.typ().Shape
	r := len(xs)
	mode := attrString(n, "mode", "nearest")
	if mode != "nearest" && mode != "linear" && mode != "cubic" {
		return nil, im.errorf("mode=%s is not one Resize defines (nearest, linear or cubic)", mode)
	}
	ctm := attrString(n, "coordinate_transformation_mode", "half_pixel")
	if im.opset < 11 {
		ctm = "asymmetric" // Resize-10 and Upsample
	}
	nearest := attrString(n, "nearest_mode", "round_prefer_floor")
	if im.opset < 11 {
		nearest = "floor"
	}
	if attr(n, "axes") != nil || attrInt(n, "antialias", 0) != 0 || attrString(n, "keep_aspect_ratio_policy", "stretch") != "stretch" {
		return nil, im.errorf("axes, antialias and keep_aspect_ratio_policy are not supported")
	}
	out := make([]int64, r)
	scale := make([]float64, r)
	switch {
	case len(sizes) == r:
		for i := range out {
			out[i] = sizes[i]
			scale[i] = float64(sizes[i]) / float64(xs[i])
		}
	case len(scales) == r:
		for i := range out {
			scale[i] = scales[i]
			out[i] = int64(math.Floor(float64(xs[i]) * scales[i]))
		}
	default:
		return nil, im.errorf("needs %d scales or sizes for an input of rank %d", r, r)
	}
	y := x
	for a := 0; a < r; a++ {
		crop := ctm == "tf_crop_and_resize"
		if out[a] == xs[a] && scale[a] == 1 && (!crop || roi[a] == 0 && roi[r+a] == 1) {
			continue
		}
		// tf_crop_and_resize: outputs whose source is outside the input
		// take extrapolation_value.
		var outside []int64
		if out[a] < 1 || xs[a] < 1 || out[a] > foldLimit {
			return nil, im.errorf("resizing axis %d from %d to %d elements", a, xs[a], out[a])
		}
		lo := make([]int64, out[a])
		hi := make([]int64, out[a])
		w := make([]float64, out[a])
		var taps [4][]int64 // cubic: the four taps of each output and their weights
		var tapW [4][]float64
		for k := range taps {
			taps[k], tapW[k] = make([]int64, out[a]), make([]float64, out[a])
		}
		for o := range lo {
			var src float64
			fo, in := float64(o), float64(xs[a])
			switch ctm {
			case "half_pixel":
				src = (fo+0.5)/scale[a] - 0.5
			case "pytorch_half_pixel":
				if out[a] > 1 {
					src = (fo+0.5)/scale[a] - 0.5
				}
			case "align_corners":
				// length_resized is the input's length times the scale,
				// not rounded (ONNX's reference; with sizes it is the size).
				if out[a] > 1 {
					src = fo * (in - 1) / (in*scale[a] - 1)
				}
			case "asymmetric":
				src = fo / scale[a]
			case "tf_half_pixel_for_nn":
				src = (fo + 0.5) / scale[a]
			case "tf_crop_and_resize":
				// The resized length is the input's times the scale, not
				// rounded (ONNX's reference; with sizes it is the size).
				start, end := roi[a], roi[r+a]
				if out[a] > 1 {
					src = start*(in-1) + fo*(end-start)*(in-1)/(in*scale[a]-1)
				} else {
					src = 0.5 * (start + end) * (in - 1)
				}
				if src < 0 || src > in-1 {
					outside = append(outside, int64(o))
				}
			default:
				return nil, im.errorf("coordinate_transformation_mode=%s is not supported", ctm)
			}
			clamp := func(i float64) int64 { return int64(max(0, min(i, in-1))) }
			if mode == "cubic" {
				// Keys' cubic convolution (cubic_coeff_a) over the taps
				// floor(src) - 1 .. + 2, edge values past the ends; with
				// exclude_outside those taps weigh 0 and the rest are
				// renormalised.
				ca := float64(f32(attrFloat(n, "cubic_coeff_a", -0.75)))
				base := math.Floor(src)
				t := src - base
				outer := func(s float64) float64 { return ((ca*s-5*ca)*s+8*ca)*s - 4*ca }
				inner := func(s float64) float64 { return ((ca+2)*s-(ca+3))*s*s + 1 }
				ws := [4]float64{outer(t + 1), inner(t), inner(1 - t), outer(2 - t)}
				sum := 0.0
				for k := range 4 {
					p := base - 1 + float64(k)
					if attrInt(n, "exclude_outside", 0) != 0 && (p < 0 || p > in-1) {
						ws[k] = 0
					}
					sum += ws[k]
					taps[k][o] = clamp(p)
				}
				for k := range 4 {
					tapW[k][o] = ws[k] / sum
				}
				continue
			}
			if mode == "nearest" {
				var i float64
				switch nearest {
				case "round_prefer_floor":
					i = math.Ceil(src - 0.5)
				case "round_prefer_ceil":
					i = math.Floor(src + 0.5)
				case "floor":
					i = math.Floor(src)
				case "ceil":
					i = math.Ceil(src)
				default:
					return nil, im.errorf("nearest_mode=%s is not an ONNX mode", nearest)
				}
				lo[o] = clamp(i)
				continue
			}
			src = max(0, min(src, in-1))
			lo[o] = clamp(math.Floor(src))
			hi[o] = min(lo[o]+1, xs[a]-1)
			w[o] = src - math.Floor(src)
		}
		idx := func(v []int64) entry {
			return entry{k: interp.FromInts(ir.TensorOf(ir.I64, int64(len(v))), v)}
		}
		var err error
		switch mode {
		case "nearest":
			if y, err = im.one("gather", ir.Attrs{"axis": ir.IntAttr(int64(a))}, y, idx(lo)); err != nil {
				return nil, err
			}
		case "cubic":
			// y = Σ_k w_k · y[tap_k] along axis a.
			c := &chain{im: im}
			var sum entry
			for k := range 4 {
				wk := entry{k: interp.FromFloats(ir.Type{DType: x.typ().DType, Shape: onesBut(r, a, out[a])}, tapW[k])}
				term := c.op("mul", nil, c.op("gather", ir.Attrs{"axis": ir.IntAttr(int64(a))}, y, idx(taps[k])), wk)
				if k == 0 {
					sum = term
				} else {
					sum = c.op("add", nil, sum, term)
				}
			}
			if c.err != nil {
				return nil, c.err
			}
			y = sum
		default:
			// y = y[lo] + w * (y[hi] - y[lo]) along axis a.
			wk := entry{k: interp.FromFloats(ir.Type{DType: x.typ().DType, Shape: ir.Shape{out[a]}}, w)}
			if y, err = im.one("lerp_gather", ir.Attrs{"axis": ir.IntAttr(int64(a))}, y, idx(lo), idx(hi), wk); err != nil {
				return nil, err
			}
		}
		if len(outside) > 0 {
			mask := interp.New(ir.Type{DType: ir.Bool, Shape: onesBut(r, a, out[a])})
			for _, o := range outside {
				mask.I[o] = 1
			}
			if y, err = im.one("where", nil, entry{k: mask}, scalarConst(x.typ().DType, attrFloat(n, "extrapolation_value", 0)), y); err != nil {
				return nil, err
			}
		}
	}
	return []entry{y}, nil
}

// transposed3d is a 3-D transposed convolution as 2-D ones, one per
// kernel depth kd: the input's depth slices folded into the batch go
// through the 2-D transposed convolution (a, over height and width) with
// the weight's depth slice kd; each result depth d lands at output depth
// d·stride + kd·dilation, so it is spread by the stride (zeros between)
// and shifted by kd·dilation; the shifted results are summed over the
// whole uncropped depth, (D - 1)·stride + (K - 1)·dilation + 1 +
// output_padding, and the depth pads are cropped. out is the output
// shape.
func (im *importer) transposed3d(x, wt entry, w window, outPadDepth int64, out ir.Shape, a ir.Attrs) ([]entry, error) {
	xs, ws := x.typ().Shape, wt.typ().Shape
	n, depth := xs[0], xs[2]
	kd, sd, dd := w.kernel[0], w.strides[0], w.dilations[0]
	full := (depth-1)*sd + (kd-1)*dd + 1 + outPadDepth
	c := &chain{im: im}
	// [N, C, D, H, W] → [N·D, C, H, W]
	xt := c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3, 4)}, x)
	if c.err != nil {
		return nil, c.err
	}
	flat, err := im.reshapeTo(xt, ir.Shape{n * depth, xs[1], xs[3], xs[4]})
	if err != nil {
		return nil, err
	}
	plane := ir.Shape{n * depth, out[1], out[3], out[4]}
	a["input_shape"] = ir.IntsAttr(plane...)
	var acc entry
	for k := int64(0); k < kd; k++ {
		wk, err := im.sliceAxis(wt, 2, k, k+1, 1)
		if err != nil {
			return nil, err
		}
		if wk, err = im.reshapeTo(wk, ir.Shape{ws[0], ws[1], ws[3], ws[4]}); err != nil {
			return nil, err
		}
		z := c.op("conv2d_grad_input", a, flat, wk)
		if c.err != nil {
			return nil, c.err
		}
		// [N·D, Co, OH, OW] → [N, D, 1, Co, OH, OW], spread by the stride.
		if z, err = im.reshapeTo(z, ir.Shape{n, depth, 1, out[1], out[3], out[4]}); err != nil {
			return nil, err
		}
		if sd > 1 {
			z = c.op("pad", ir.Attrs{"pads": ir.IntsAttr(0, 0, 0, 0, 0, 0, 0, 0, sd-1, 0, 0, 0)}, z)
		}
		if c.err != nil {
			return nil, c.err
		}
		if z, err = im.reshapeTo(z, ir.Shape{n, depth * sd, out[1], out[3], out[4]}); err != nil {
			return nil, err
		}
		span := (depth-1)*sd + 1
		if sd > 1 {
			if z, err = im.sliceAxis(z, 1, 0, span, 1); err != nil {
				return nil, err
			}
		}
		z = c.op("pad", ir.Attrs{"pads": ir.IntsAttr(0, k*dd, 0, 0, 0, 0, full-k*dd-span, 0, 0, 0)}, z)
		if k == 0 {
			acc = z
		} else {
			acc = c.op("add", nil, acc, z)
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	y, err := im.sliceAxis(acc, 1, w.pads[0], w.pads[0]+out[2], 1)
	if err != nil {
		return nil, err
	}
	y = c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3, 4)}, y)
	return c.done(y)
}
