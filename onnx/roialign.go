package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// RoiAlign (opsets 10 and 16) pools each region of interest into an
// output_height × output_width grid: each bin averages (mode avg) or
// maximises (mode max: the largest of the four weighted corners, as
// ONNX's reference and onnxruntime do) a grid of bilinear samples of X.
// The sample coordinates come from the rois (data) in f64: each axis's
// coordinates are [R, bins·grid] tensors, from which the floor, the
// clamped neighbours and the weights follow elementwise; the four
// corners are gathers from X laid out as [N·H·W, C] at flat positions
// batch·H·W + y·W + x. X's gradient flows through the gathers; the
// rois get none (their coordinates are piecewise, as in PyTorch's
// roi_align). sampling_ratio 0 sizes each roi's grid by the roi, which
// needs the rois known at import.
func init() {
	arity["RoiAlign"] = [2]int{3, 3}
	introduced["RoiAlign"] = 10
	converters["RoiAlign"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, rois, batchIdx := in[0], in[1], in[2]
		xs := x.typ().Shape
		if x.typ().Rank() != 4 || !x.typ().DType.IsFloat() {
			return nil, im.errorf("X is %s; RoiAlign reads [N, C, H, W] floats", x.typ())
		}
		if rois.typ().Rank() != 2 || rois.typ().Shape[1] != 4 || !rois.typ().DType.IsFloat() || !batchIdx.typ().Shape.Equal(ir.Shape{rois.typ().Shape[0]}) || batchIdx.typ().DType.IsFloat() {
			return nil, im.errorf("rois %s and batch_indices %s must be [R, 4] floats and [R] integers", rois.typ(), batchIdx.typ())
		}
		R := rois.typ().Shape[0]
		mode := attrString(n, "mode", "avg")
		if mode != "avg" && mode != "max" {
			return nil, im.errorf("mode %q is neither avg nor max", mode)
		}
		ctm := "output_half_pixel"
		if im.opset >= 16 {
			ctm = attrString(n, "coordinate_transformation_mode", "half_pixel")
		}
		if ctm != "half_pixel" && ctm != "output_half_pixel" {
			return nil, im.errorf("coordinate_transformation_mode %q is neither half_pixel nor output_half_pixel", ctm)
		}
		halfPixel := ctm == "half_pixel"
		ph, pw := attrInt(n, "output_height", 1), attrInt(n, "output_width", 1)
		ratio, scale := attrInt(n, "sampling_ratio", 0), attrFloat(n, "spatial_scale", 1)
		if ph < 1 || pw < 1 || ratio < 0 {
			return nil, im.errorf("output_height %d, output_width %d and sampling_ratio %d must be positive (the ratio may be 0)", ph, pw, ratio)
		}
		H, W, C := xs[2], xs[3], xs[1]
		offset := 0.0
		if halfPixel {
			offset = 0.5
		}
		// Each roi's sample grid (gh, gw): the ratio, or sized by the roi.
		gh, gw := make([]int64, R), make([]int64, R)
		for r := range gh {
			gh[r], gw[r] = ratio, ratio
		}
		if ratio == 0 {
			if rois.k == nil {
				return nil, im.needConstant(rois, "with sampling_ratio 0, the rois (each roi's sample grid depends on its size)")
			}
			for r := int64(0); r < R; r++ {
				v := func(j int64) float64 { return rois.k.At(int(r*4+j))*scale - offset }
				rw, rh := v(2)-v(0), v(3)-v(1)
				if !halfPixel {
					rw, rh = max(rw, 1), max(rh, 1)
				}
				gh[r], gw[r] = int64(max(math.Ceil(rh/float64(ph)), 0)), int64(max(math.Ceil(rw/float64(pw)), 0))
				if gh[r] > foldLimit || gw[r] > foldLimit {
					return nil, im.errorf("roi %d spans %g × %g: its sample grid is beyond the limit of %d", r, rh, rw, foldLimit)
				}
			}
		}
		Gh, Gw := int64(1), int64(1)
		for r := range gh {
			Gh, Gw = max(Gh, gh[r]), max(Gw, gw[r])
		}
		// Samples of every roi and channel: R·C·ph·Gh·pw·Gw.
		if n, ok := (ir.Shape{R, C, ph, Gh, pw, Gw}).NumElements(); !ok || n > foldLimit {
			return nil, im.errorf("%d rois of %d×%d bins, %d×%d samples each, over %d channels are beyond the limit of %d samples", R, ph, pw, Gh, Gw, C, foldLimit)
		}
		c := &chain{im: im}
		f64 := func(v float64) entry { return scalarConst(ir.F64, v) }
		r64 := c.cast(rois, ir.F64)
		col := func(j int64) entry {
			return c.op("sub", nil, c.op("mul", nil, c.op("slice", ir.Attrs{"axes": ir.IntsAttr(1), "starts": ir.IntsAttr(j), "ends": ir.IntsAttr(j + 1)}, r64), f64(scale)), f64(offset))
		}
		// axis gives the sample coordinates along one axis, [R, bins·G],
		// and, per coordinate, the low and high neighbours (int64), the
		// weights of the low and high ones, and whether it is inside.
		type axisSamples struct{ low, high, wLow, wHigh, inside entry }
		axis := func(startCol, endCol int64, bins, G, size int64, grid []int64) axisSamples {
			start, end := col(startCol), col(endCol)
			extent := c.op("sub", nil, end, start)
			if !halfPixel {
				extent = c.op("max", nil, extent, f64(1))
			}
			bin := c.op("div", nil, extent, f64(float64(bins)))
			// The position of sample i of bin b in bins: b + (i + 0.5)/g.
			at := interp.New(ir.TensorOf(ir.F64, R, bins*G))
			for r := int64(0); r < R; r++ {
				g := max(grid[r], 1)
				for b := int64(0); b < bins; b++ {
					for i := int64(0); i < G; i++ {
						at.F[r*bins*G+b*G+i] = float64(b) + (float64(i)+0.5)/float64(g)
					}
				}
			}
			y := c.op("add", nil, start, c.op("mul", nil, bin, entry{k: at}))
			inside := c.op("and", nil, c.op("ge", nil, y, f64(-1)), c.op("le", nil, y, f64(float64(size))))
			y = c.op("max", nil, y, f64(0))
			low := c.op("floor", nil, y)
			last := c.op("ge", nil, low, f64(float64(size-1)))
			low = c.op("where", nil, last, f64(float64(size-1)), low)
			y = c.op("where", nil, last, low, y)
			high := c.op("where", nil, last, low, c.op("add", nil, low, f64(1)))
			l := c.op("sub", nil, y, low)
			return axisSamples{low: c.cast(low, ir.I64), high: c.cast(high, ir.I64), wLow: c.op("sub", nil, f64(1), l), wHigh: l, inside: inside}
		}
		ya := axis(1, 3, ph, Gh, H, gh)                                                               // [R, A]
		xa := axis(0, 2, pw, Gw, W, gw)                                                               // [R, B]
		col3 := func(e entry) entry { return c.op("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(2)}, e) } // [R, A, 1]
		row3 := func(e entry) entry { return c.op("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(1)}, e) } // [R, 1, B]
		base := c.op("mul", nil, c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(R, 1, 1)}, c.cast(batchIdx, ir.I64)), scalarConst(ir.I64, float64(H*W)))
		inside := c.op("and", nil, col3(ya.inside), row3(xa.inside))
		// X as [N·H·W, C].
		table := c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(xs[0]*H*W, C)}, c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 3, 1)}, x))
		var corners []entry
		for _, yy := range []struct{ at, w entry }{{ya.low, ya.wLow}, {ya.high, ya.wHigh}} {
			for _, xx := range []struct{ at, w entry }{{xa.low, xa.wLow}, {xa.high, xa.wHigh}} {
				pos := c.op("add", nil, base, c.op("add", nil, c.op("mul", nil, col3(yy.at), scalarConst(ir.I64, float64(W))), row3(xx.at)))
				w := c.op("where", nil, inside, c.op("mul", nil, col3(yy.w), row3(xx.w)), f64(0))
				w = c.op("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(3)}, c.cast(w, x.typ().DType)) // [R, A, B, 1]
				// A batch index below 0 (or past N) leaves every position
				// out of range: the run fails rather than pool another image.
				v := c.op("gather", ir.Attrs{"axis": ir.IntAttr(0), ir.AttrNegative: ir.BoolAttr(false)}, table, pos) // [R, A, B, C]
				corners = append(corners, c.op("mul", nil, v, w))
			}
		}
		// Samples beyond a roi's own grid (sampling_ratio 0) are left out.
		used := interp.New(ir.TensorOf(ir.Bool, R, ph, Gh, pw, Gw, 1))
		// A roi whose grid is empty (sampling_ratio 0 on a roi of no
		// extent) takes no sample: its bins are 0, as ONNX's reference
		// gives.
		count := interp.New(ir.TensorOf(x.typ().DType, R, 1, 1, 1))
		empty := interp.New(ir.TensorOf(ir.Bool, R, 1, 1, 1))
		for r := int64(0); r < R; r++ {
			count.F[r] = float64(max(gh[r]*gw[r], 1))
			if gh[r]*gw[r] == 0 {
				empty.I[r] = 1
			}
			for b := int64(0); b < ph; b++ {
				for i := int64(0); i < Gh; i++ {
					for b2 := int64(0); b2 < pw; b2++ {
						for j := int64(0); j < Gw; j++ {
							if i < gh[r] && j < gw[r] {
								used.I[(((r*ph+b)*Gh+i)*pw+b2)*Gw+j] = 1
							}
						}
					}
				}
			}
		}
		shape6 := ir.Attrs{"shape": ir.IntsAttr(R, ph, Gh, pw, Gw, C)}
		var y entry
		if mode == "avg" {
			sum := c.op("add", nil, c.op("add", nil, corners[0], corners[1]), c.op("add", nil, corners[2], corners[3]))
			sum = c.op("where", nil, entry{k: used}, c.op("reshape", shape6, sum), scalarConst(x.typ().DType, 0))
			y = c.op("div", nil, c.op("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(2, 4), "keepdims": ir.BoolAttr(false)}, sum), entry{k: count})
		} else {
			m := c.op("max", nil, c.op("max", nil, corners[0], corners[1]), c.op("max", nil, corners[2], corners[3]))
			m = c.op("where", nil, entry{k: used}, c.op("reshape", shape6, m), scalarConst(x.typ().DType, math.Inf(-1)))
			y = c.op("reduce_max", ir.Attrs{"axes": ir.IntsAttr(2, 4), "keepdims": ir.BoolAttr(false)}, m)
			y = c.op("where", nil, entry{k: empty}, scalarConst(x.typ().DType, 0), y)
		}
		y = c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 3, 1, 2)}, y)
		return c.done(y)
	}
}
