package onnx

import (
	"github.com/kiln-compiler/kiln/ir"
)

// GridSample (opsets 16 and 20) on 4-D inputs: the grid's normalised
// (x, y) become pixel coordinates, and each output is a nearest, bilinear
// or bicubic (Keys, a = -0.75) combination of input pixels fetched with
// zeros, border or reflection padding, as the operator specifies. Pixels
// are gathered (gather_elements over the flattened image) at indices
// computed from the grid, so the result is differentiable in X and, through
// the interpolation weights, in the grid.

func init() {
	arity["GridSample"] = [2]int{2, 2}
	introduced["GridSample"] = 16
	converters["GridSample"] = gridSample
}

func gridSample(im *importer, n *node, in []entry) ([]entry, error) {
	x, grid := in[0], in[1]
	xs, gs := x.typ().Shape, grid.typ().Shape
	if len(xs) != 4 || len(gs) != 4 || gs[3] != 2 || gs[0] != xs[0] || !x.typ().DType.IsFloat() {
		return nil, im.errorf("GridSample of %s on grid %s: Kiln reads 4-D inputs with an [N, H, W, 2] grid", x.typ(), grid.typ())
	}
	mode := attrString(n, "mode", "linear")
	if im.opset < 20 {
		mode = attrString(n, "mode", "bilinear")
	}
	switch mode {
	case "bilinear":
		mode = "linear"
	case "bicubic":
		mode = "cubic"
	}
	if mode != "linear" && mode != "nearest" && mode != "cubic" {
		return nil, im.errorf("mode %q is not one GridSample defines", mode)
	}
	padding := attrString(n, "padding_mode", "zeros")
	if padding != "zeros" && padding != "border" && padding != "reflection" {
		return nil, im.errorf("padding_mode %q is not one GridSample defines", padding)
	}
	align := attrInt(n, "align_corners", 0) != 0
	N, C, H, W := xs[0], xs[1], xs[2], xs[3]
	ho, wo := gs[1], gs[2]
	c := &chain{im: im}
	f64 := func(v float64) entry { return scalarConst(ir.F64, v) }
	// Pixel coordinates in f64 (the grid is at most f64; the coordinate
	// arithmetic stays exact for any image size).
	coord := func(axis int64, size int64) entry {
		g := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(3), "starts": ir.IntsAttr(axis), "ends": ir.IntsAttr(axis + 1), "steps": ir.IntsAttr(1)}, grid)
		if c.err != nil {
			return entry{}
		}
		g, c.err = im.reshapeTo(c.cast(g, ir.F64), ir.Shape{N, ho, wo})
		if align {
			return c.op("mul", nil, c.op("add", nil, g, f64(1)), f64(float64(size-1)/2))
		}
		return c.op("div", nil, c.op("sub", nil, c.op("mul", nil, c.op("add", nil, g, f64(1)), f64(float64(size))), f64(1)), f64(2))
	}
	px, py := coord(0, W), coord(1, H)
	lo, hiX, hiY := -0.5, float64(W)-0.5, float64(H)-0.5
	if align {
		lo, hiX, hiY = 0, float64(W-1), float64(H-1)
	}
	// reflect folds v into [lo, hi] by reflections at its ends.
	reflect := func(v entry, lo, hi float64) entry {
		span := hi - lo
		if span <= 0 {
			return c.op("mul", nil, v, f64(0)) // one pixel: always it
		}
		fold := func(d entry, near, far float64) entry { // d >= 0 past the end at near
			k := c.op("floor", nil, c.op("div", nil, d, f64(span)))
			r := c.op("sub", nil, d, c.op("mul", nil, k, f64(span)))
			even := c.op("eq", nil, c.op("mod", nil, k, f64(2)), f64(0))
			towards := 1.0
			if far < near {
				towards = -1
			}
			return c.op("where", nil, even, c.op("add", nil, f64(near), c.op("mul", nil, r, f64(towards))), c.op("sub", nil, f64(far), c.op("mul", nil, r, f64(towards))))
		}
		below := c.op("lt", nil, v, f64(lo))
		above := c.op("gt", nil, v, f64(hi))
		v = c.op("where", nil, below, fold(c.op("sub", nil, f64(lo), v), lo, hi), v)
		return c.op("where", nil, above, fold(c.op("sub", nil, v, f64(hi)), hi, lo), v)
	}
	if mode == "nearest" {
		px, py = c.op("round", nil, px), c.op("round", nil, py)
	}
	// Nearest and linear sampling pad the coordinate, then take its taps;
	// cubic sampling takes its 4x4 taps around the coordinate as given and
	// pads each tap (pixel below), as PyTorch's grid_sampler and ONNX's
	// reference do: clipping first would move the taps of a coordinate in
	// (-0.5, 0) onto the border pixel.
	switch {
	case mode == "cubic":
	case padding == "border":
		px = c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(float64(W - 1))}, px)
		py = c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(float64(H - 1))}, py)
	case padding == "reflection":
		px, py = reflect(px, lo, hiX), reflect(py, lo, hiY)
	}
	flat, err := im.reshapeTo(x, ir.Shape{N, C, H * W})
	if err != nil {
		return nil, err
	}
	// pixel is X at integer coordinates (yi, xi), [N, Ho, Wo], with the
	// padding mode's value outside the image, as [N, C, Ho, Wo].
	pixel := func(yi, xi entry) entry {
		var valid entry
		switch padding {
		case "zeros":
			in := func(v entry, size int64) entry {
				return c.op("and", nil, c.op("ge", nil, v, f64(0)), c.op("le", nil, v, f64(float64(size-1))))
			}
			valid = c.op("and", nil, in(xi, W), in(yi, H))
		case "reflection":
			// An integer tap is reflected at the same borders, then
			// truncated toward zero: it is at least -0.5 there, so that
			// is the floor of it clipped at 0.
			xi = c.op("floor", nil, c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(float64(W - 1))}, reflect(xi, lo, hiX)))
			yi = c.op("floor", nil, c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(float64(H - 1))}, reflect(yi, lo, hiY)))
		}
		xc := c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(float64(W - 1))}, xi)
		yc := c.op("clip", ir.Attrs{"lo": ir.FloatAttr(0), "hi": ir.FloatAttr(float64(H - 1))}, yi)
		idx := c.cast(c.op("add", nil, c.op("mul", nil, yc, f64(float64(W))), xc), ir.I64)
		if c.err != nil {
			return entry{}
		}
		idx, c.err = im.reshapeTo(idx, ir.Shape{N, 1, ho * wo})
		idx = c.op("expand", ir.Attrs{"shape": ir.IntsAttr(N, C, ho*wo)}, idx)
		v := c.op("gather_elements", ir.Attrs{"axis": ir.IntAttr(2)}, flat, idx)
		if c.err != nil {
			return entry{}
		}
		v, c.err = im.reshapeTo(v, ir.Shape{N, C, ho, wo})
		if padding == "zeros" && c.err == nil {
			var m entry
			m, c.err = im.reshapeTo(valid, ir.Shape{N, 1, ho, wo})
			v = c.op("where", nil, m, v, num(x, 0))
		}
		return v
	}
	weight := func(w entry) entry { // [N, Ho, Wo] in f64 as [N, 1, Ho, Wo] of X's type
		if c.err != nil {
			return entry{}
		}
		r, err := im.reshapeTo(c.cast(w, x.typ().DType), ir.Shape{N, 1, ho, wo})
		c.err = err
		return r
	}
	var y entry
	switch mode {
	case "nearest":
		y = pixel(py, px)
	case "linear":
		x1, y1 := c.op("floor", nil, px), c.op("floor", nil, py)
		x2, y2 := c.op("add", nil, x1, f64(1)), c.op("add", nil, y1, f64(1))
		dx1, dx2 := weight(c.op("sub", nil, px, x1)), weight(c.op("sub", nil, x2, px))
		dy1, dy2 := weight(c.op("sub", nil, py, y1)), weight(c.op("sub", nil, y2, py))
		row := func(yi entry) entry {
			return c.op("add", nil, c.op("mul", nil, dx2, pixel(yi, x1)), c.op("mul", nil, dx1, pixel(yi, x2)))
		}
		y = c.op("add", nil, c.op("mul", nil, dy2, row(y1)), c.op("mul", nil, dy1, row(y2)))
	case "cubic":
		x0, y0 := c.op("sub", nil, c.op("floor", nil, px), f64(1)), c.op("sub", nil, c.op("floor", nil, py), f64(1))
		tx := c.op("sub", nil, c.op("sub", nil, px, x0), f64(1))
		ty := c.op("sub", nil, c.op("sub", nil, py, y0), f64(1))
		wx, wy := im.keys(c, tx), im.keys(c, ty)
		for i := range 4 {
			yi := c.op("add", nil, y0, f64(float64(i)))
			var rowSum entry
			for j := range 4 {
				term := c.op("mul", nil, weight(wx[j]), pixel(yi, c.op("add", nil, x0, f64(float64(j)))))
				if j == 0 {
					rowSum = term
				} else {
					rowSum = c.op("add", nil, rowSum, term)
				}
			}
			term := c.op("mul", nil, weight(wy[i]), rowSum)
			if i == 0 {
				y = term
			} else {
				y = c.op("add", nil, y, term)
			}
		}
	}
	return c.done(y)
}

// keys are the four cubic convolution weights (Keys, a = -0.75) of taps
// at -1, 0, 1, 2 for a fraction t in [0, 1).
func (im *importer) keys(c *chain, t entry) [4]entry {
	const a = -0.75
	f64 := func(v float64) entry { return scalarConst(ir.F64, v) }
	// outer(s) for |s| in [1, 2): ((a·s - 5a)·s + 8a)·s - 4a.
	outer := func(s entry) entry {
		return c.op("sub", nil, c.op("mul", nil, c.op("add", nil, c.op("mul", nil, c.op("sub", nil, c.op("mul", nil, s, f64(a)), f64(5*a)), s), f64(8*a)), s), f64(4*a))
	}
	// inner(s) for |s| < 1: ((a + 2)·s - (a + 3))·s² + 1.
	inner := func(s entry) entry {
		return c.op("add", nil, c.op("mul", nil, c.op("sub", nil, c.op("mul", nil, s, f64(a+2)), f64(a+3)), c.op("mul", nil, s, s)), f64(1))
	}
	one := c.op("sub", nil, f64(1), t)
	return [4]entry{outer(c.op("add", nil, t, f64(1))), inner(t), inner(one), outer(c.op("sub", nil, f64(2), t))}
}
