package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Operators built from comparisons, masks and scans: ArgMax and ArgMin
// (not differentiable: their results are indices), CumSum, Trilu,
// OneHot, ReduceProd, Mean, GlobalMaxPool and GroupNormalization.

// iota is the int64 constant 0, 1, ..., n-1 laid along axis of a rank-r
// shape (every other dimension 1).
func iota(n int64, axis, r int) entry {
	shape := make(ir.Shape, r)
	for i := range shape {
		shape[i] = 1
	}
	shape[axis] = n
	vals := make([]int64, n)
	for i := range vals {
		vals[i] = int64(i)
	}
	return entry{k: interp.FromInts(ir.Type{DType: ir.I64, Shape: shape}, vals)}
}

func init() {
	for name, op := range map[string]string{"ArgMax": "", "ArgMin": "neg"} {
		arity[name] = [2]int{1, 1}
		converters[name] = func(im *importer, n *node, in []entry) ([]entry, error) {
			x := in[0]
			if !x.typ().DType.IsFloat() {
				return nil, im.errorf("Kiln reads %s of floating-point tensors, not %s", n.OpType, x.typ())
			}
			r := x.typ().Rank()
			ax, err := ir.NormalizeAxis(attrInt(n, "axis", 0), r)
			if err != nil {
				return nil, im.errorf("%v", err)
			}
			if op != "" {
				if x, err = im.one(op, nil, x); err != nil {
					return nil, err
				}
			}
			y, _, err := im.argmax(x, ax, attrInt(n, "select_last_index", 0) == 1, attrInt(n, "keepdims", 1) == 1, nil)
			return []entry{y}, err
		}
	}
	arity["CumSum"] = [2]int{2, 2}
	// CumSum is a Hillis-Steele scan: log2(n) rounds of adding a copy
	// shifted by 1, 2, 4, ... along the axis.
	converters["CumSum"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.scan(n, in, "add", 0)
	}
	arity["CumProd"] = [2]int{2, 2}
	introduced["CumProd"] = 26
	converters["CumProd"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.scan(n, in, "mul", 1)
	}
	arity["Trilu"] = [2]int{1, 2}
	converters["Trilu"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		k := int64(0)
		if ks, err := im.constInts(in, 1, "k"); err != nil {
			return nil, err
		} else if len(ks) == 1 {
			k = ks[0]
		}
		s := in[0].typ().Shape
		if len(s) < 2 {
			return nil, im.errorf("Trilu needs rank >= 2, got %s", in[0].typ())
		}
		rows, cols := s[len(s)-2], s[len(s)-1]
		upper := attrInt(n, "upper", 1) == 1
		mask := interp.New(ir.Type{DType: ir.Bool, Shape: ir.Shape{rows, cols}})
		for i := int64(0); i < rows; i++ {
			for j := int64(0); j < cols; j++ {
				if upper && j-i >= k || !upper && j-i <= k {
					mask.I[i*cols+j] = 1
				}
			}
		}
		y, err := im.one("where", nil, entry{k: mask}, in[0], scalarConst(in[0].typ().DType, 0))
		return []entry{y}, err
	}
	arity["OneHot"] = [2]int{3, 3}
	converters["OneHot"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		depths, err := im.constInts(in, 1, "the depth")
		if err != nil {
			return nil, err
		}
		if len(depths) != 1 || depths[0] < 1 || depths[0] > foldLimit {
			return nil, im.errorf("the depth must be one integer from 1 to %d", foldLimit)
		}
		if in[2].k == nil {
			return nil, im.needConstant(in[2], "the values [off, on]")
		}
		if in[2].k.Len() != 2 {
			return nil, im.errorf("the values must be [off, on]")
		}
		depth := depths[0]
		idx := in[0]
		// Non-integer indices are cast to int64 (the specification).
		if idx.typ().DType != ir.I64 {
			if idx, err = im.one("cast", ir.Attrs{"to": ir.TypeAttr(ir.I64)}, idx); err != nil {
				return nil, err
			}
		}
		r := idx.typ().Rank() + 1
		ax, err := ir.NormalizeAxis(attrInt(n, "axis", -1), r)
		if err != nil {
			return nil, im.errorf("%v", err)
		}
		// Negative indices count from the end: i + depth.
		neg, err := im.one("lt", nil, idx, scalarConst(ir.I64, 0))
		if err != nil {
			return nil, err
		}
		wrapped, err := im.one("add", nil, idx, scalarConst(ir.I64, float64(depth)))
		if err != nil {
			return nil, err
		}
		if idx, err = im.one("where", nil, neg, wrapped, idx); err != nil {
			return nil, err
		}
		if idx, err = im.one("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(int64(ax))}, idx); err != nil {
			return nil, err
		}
		hit, err := im.one("eq", nil, idx, iota(depth, ax, r))
		if err != nil {
			return nil, err
		}
		vals := in[2].k
		off, on := entry{k: interp.New(ir.TensorOf(vals.Type.DType))}, entry{k: interp.New(ir.TensorOf(vals.Type.DType))}
		if vals.F != nil {
			off.k.F[0], on.k.F[0] = vals.F[0], vals.F[1]
		} else {
			off.k.I[0], on.k.I[0] = vals.I[0], vals.I[1]
		}
		y, err := im.one("where", nil, hit, on, off)
		return []entry{y}, err
	}
	arity["ReduceProd"] = [2]int{1, 2}
	// ReduceProd multiplies halves pairwise, log2(n) rounds per axis (an
	// odd length is padded with a 1).
	converters["ReduceProd"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		im.accumulating = true
		defer func() { im.accumulating = false }()
		x := in[0]
		r := x.typ().Rank()
		axes := attrInts(n, "axes")
		if len(in) > 1 {
			var err error
			if axes, err = im.constInts(in, 1, "the axes"); err != nil {
				return nil, err
			}
		}
		if len(axes) == 0 {
			if attrInt(n, "noop_with_empty_axes", 0) == 1 {
				return in[:1], nil
			}
			for a := 0; a < r; a++ {
				axes = append(axes, int64(a))
			}
		}
		keep := x.typ().Shape.Clone()
		for _, a := range axes {
			ax, err := ir.NormalizeAxis(a, r)
			if err != nil {
				return nil, im.errorf("%v", err)
			}
			for d := x.typ().Shape[ax]; d > 1; d = x.typ().Shape[ax] {
				if d%2 == 1 {
					pads := make([]int64, 2*r)
					pads[ax+r] = 1
					if x, err = im.one("pad", ir.Attrs{"pads": ir.IntsAttr(pads...), "value": ir.FloatAttr(1)}, x); err != nil {
						return nil, err
					}
					d++
				}
				lo, err := im.sliceAxis(x, ax, 0, d/2, 1)
				if err != nil {
					return nil, err
				}
				hi, err := im.sliceAxis(x, ax, d/2, d, 1)
				if err != nil {
					return nil, err
				}
				if x, err = im.one("mul", nil, lo, hi); err != nil {
					return nil, err
				}
			}
			keep[ax] = 1
		}
		if attrInt(n, "keepdims", 1) == 0 {
			var s ir.Shape
			for i, d := range keep {
				if !contains(axes, i, r) {
					s = append(s, d)
				}
			}
			keep = s
		}
		y, err := im.reshapeTo(x, keep)
		return []entry{y}, err
	}
	arity["Mean"] = [2]int{1, many}
	converters["Mean"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		acc := in[0]
		var err error
		for _, e := range in[1:] {
			if acc, err = im.one("add", nil, acc, e); err != nil {
				return nil, err
			}
		}
		y, err := im.one("div", nil, acc, scalarConst(acc.typ().DType, float64(len(in))))
		return []entry{y}, err
	}
	arity["GlobalMaxPool"] = [2]int{1, 1}
	converters["GlobalMaxPool"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		if in[0].typ().Rank() < 3 {
			return nil, im.errorf("needs [N, C, spatial...], got %s", in[0].typ())
		}
		var axes []int64
		for a := 2; a < in[0].typ().Rank(); a++ {
			axes = append(axes, int64(a))
		}
		return im.emit("reduce_max", in, ir.Attrs{"axes": ir.IntsAttr(axes...), "keepdims": ir.BoolAttr(true)})
	}
	arity["GroupNormalization"] = [2]int{3, 3}
	// GroupNormalization normalises [N, G, C/G * spatial] over its last
	// axis; scale and bias are per group at opset 18 and per channel from
	// opset 21.
	converters["GroupNormalization"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x, scale, bias := in[0], in[1], in[2]
		s := x.typ().Shape
		g := attrInt(n, "num_groups", 0)
		if len(s) < 3 || g < 1 || s[1]%g != 0 || x.typ().NumElements() == 0 {
			return nil, im.errorf("num_groups=%d does not divide the channels of %s", g, x.typ())
		}
		per := x.typ().NumElements() / (s[0] * g)
		xg, err := im.reshapeTo(x, ir.Shape{s[0], g, per})
		if err != nil {
			return nil, err
		}
		ones := interp.New(ir.Type{DType: x.typ().DType, Shape: ir.Shape{per}})
		for i := range ones.F {
			ones.F[i] = 1
		}
		y, err := im.one("layer_norm", ir.Attrs{"axis": ir.IntAttr(2), "epsilon": ir.FloatAttr(f32(attrFloat(n, "epsilon", 1e-5)))}, xg, entry{k: ones})
		if err != nil {
			return nil, err
		}
		c := s[1]
		if im.opset < 21 {
			// Per-group parameters: repeat each over its channels.
			c = g
		}
		if y, err = im.reshapeTo(y, ir.Shape{s[0], c, x.typ().NumElements() / (s[0] * c)}); err != nil {
			return nil, err
		}
		if y, err = im.scaleShift(y, scale, bias, ir.Shape{c, 1}); err != nil {
			return nil, err
		}
		y, err = im.reshapeTo(y, s)
		return []entry{y}, err
	}
}

// contains reports whether axes (possibly negative, for rank r) holds i.
func contains(axes []int64, i, r int) bool {
	for _, a := range axes {
		if ax, err := ir.NormalizeAxis(a, r); err == nil && ax == i {
			return true
		}
	}
	return false
}

func init() {
	arity["GatherElements"] = [2]int{2, 2}
	converters["GatherElements"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.emit("gather_elements", in, ir.Attrs{"axis": ir.IntAttr(attrInt(n, "axis", 0))})
	}
	// ScatterElements: with reduction "add", data plus the scatter-add of
	// the updates (gather_elements' gradient); otherwise (scatterReduce)
	// indices known at import.
	scatter := func(im *importer, n *node, in []entry) ([]entry, error) {
		data, idx, upd := in[0], in[1], in[2]
		axis := attrInt(n, "axis", 0)
		if !upd.typ().Shape.Equal(idx.typ().Shape) {
			return nil, im.errorf("updates %s must have the indices' shape %s", upd.typ(), idx.typ())
		}
		a := ir.Attrs{"axis": ir.IntAttr(axis), "data_shape": ir.IntsAttr(data.typ().Shape...)}
		spread := func(u entry) (entry, error) { return im.one("gather_elements_grad", a, u, idx) }
		reduction := attrString(n, "reduction", "none")
		if reduction == "add" {
			s, err := spread(upd)
			if err != nil {
				return nil, err
			}
			y, err := im.one("add", nil, data, s)
			return []entry{y}, err
		}
		if idx.k == nil {
			return nil, im.needConstant(idx, "with reduction "+reduction+", the indices (to order the updates of one element)")
		}
		ax, err := ir.NormalizeAxis(axis, data.typ().Rank())
		if err != nil {
			return nil, im.errorf("%v", err)
		}
		is := idx.typ().Shape
		for d := range is {
			if len(is) != data.typ().Rank() || d != ax && is[d] > data.typ().Shape[d] {
				return nil, im.errorf("indices %s do not fit data %s outside axis %d", idx.typ(), data.typ(), ax)
			}
		}
		targets := make([]int64, len(idx.k.I))
		ds := data.typ().Shape.Strides()
		for i := range idx.k.I {
			pos, rest := int64(0), int64(i)
			for d := len(is) - 1; d >= 0; d-- {
				c := rest % is[d]
				rest /= is[d]
				if d == ax {
					c = idx.k.I[i]
					if c < 0 {
						c += data.typ().Shape[ax]
					}
					if c < 0 || c >= data.typ().Shape[ax] {
						return nil, im.errorf("index %d is out of range for dimension %d of size %d", idx.k.I[i], ax, data.typ().Shape[ax])
					}
				}
				pos += c * ds[d]
			}
			targets[i] = pos
		}
		y, err := im.scatterReduce(reduction, data, upd, targets, spread)
		return []entry{y}, err
	}
	arity["ScatterElements"] = [2]int{3, 3}
	converters["ScatterElements"] = scatter
	arity["Scatter"] = [2]int{3, 3}
	converters["Scatter"] = scatter
}

// argmax returns the index of x's maximum along ax (int64) and the
// maximum itself (kept axis): the smallest (with last, the largest)
// index where x equals its maximum or is NaN (the maximum is NaN then,
// and NumPy returns the first NaN).
// Positions where exclude (when not nil) is true are never chosen.
func (im *importer) argmax(x entry, ax int, last, keepdims bool, exclude *entry) (entry, entry, error) {
	r := x.typ().Rank()
	d := x.typ().Shape[ax]
	m, err := im.one("reduce_max", ir.Attrs{"axes": ir.IntsAttr(int64(ax)), "keepdims": ir.BoolAttr(true)}, x)
	if err != nil {
		return entry{}, entry{}, err
	}
	hit, err := im.one("eq", nil, x, m)
	if err != nil {
		return entry{}, entry{}, err
	}
	nan, err := im.one("ne", nil, x, x)
	if err != nil {
		return entry{}, entry{}, err
	}
	if hit, err = im.one("or", nil, hit, nan); err != nil {
		return entry{}, entry{}, err
	}
	if exclude != nil {
		free, err := im.one("not", nil, *exclude)
		if err != nil {
			return entry{}, entry{}, err
		}
		if hit, err = im.one("and", nil, hit, free); err != nil {
			return entry{}, entry{}, err
		}
	}
	idx := iota(d, ax, r)
	if !last {
		// min(i) = -max(-i)
		if idx, err = im.one("neg", nil, idx); err != nil {
			return entry{}, entry{}, err
		}
	}
	cand, err := im.one("where", nil, hit, idx, scalarConst(ir.I64, -float64(d)))
	if err != nil {
		return entry{}, entry{}, err
	}
	y, err := im.one("reduce_max", ir.Attrs{"axes": ir.IntsAttr(int64(ax)), "keepdims": ir.BoolAttr(keepdims)}, cand)
	if err != nil || last {
		return y, m, err
	}
	y, err = im.one("neg", nil, y)
	return y, m, err
}

// maxTopK bounds TopK's k: each of the k rounds is a pass over the axis.
const maxTopK = 256

func init() {
	arity["TopK"] = [2]int{1, 2}
	// TopK takes k rounds of (maximum, its first index, mask it out with
	// -inf); the values come from reduce_max, so their gradient reaches
	// the chosen elements.
	converters["TopK"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		if !x.typ().DType.IsFloat() {
			return nil, im.errorf("Kiln reads TopK of floating-point tensors, not %s", x.typ())
		}
		k := attrInt(n, "k", -1)
		if im.opset >= 10 {
			ks, err := im.constInts(in, 1, "k")
			if err != nil {
				return nil, err
			}
			if len(ks) != 1 {
				return nil, im.errorf("k must be one integer")
			}
			k = ks[0]
		}
		r := x.typ().Rank()
		ax, err := ir.NormalizeAxis(attrInt(n, "axis", -1), r)
		if err != nil {
			return nil, im.errorf("%v", err)
		}
		d := x.typ().Shape[ax]
		if k < 1 || k > d || k > maxTopK {
			return nil, im.errorf("k=%d must be from 1 to the axis length %d (and at most %d)", k, d, maxTopK)
		}
		largest := attrInt(n, "largest", 1) == 1
		cur := x
		if !largest {
			if cur, err = im.one("neg", nil, cur); err != nil {
				return nil, err
			}
		}
		var vals, idxs []entry
		var taken *entry // the positions chosen so far
		for i := int64(0); i < k; i++ {
			j, m, err := im.argmax(cur, ax, false, true, taken)
			if err != nil {
				return nil, err
			}
			vals, idxs = append(vals, m), append(idxs, j)
			if i == k-1 {
				break
			}
			now, err := im.one("eq", nil, iota(d, ax, r), j)
			if err != nil {
				return nil, err
			}
			if taken != nil {
				if now, err = im.one("or", nil, now, *taken); err != nil {
					return nil, err
				}
			}
			taken = &now
			if cur, err = im.one("where", nil, now, scalarConst(x.typ().DType, math.Inf(-1)), cur); err != nil {
				return nil, err
			}
		}
		cat := func(parts []entry) (entry, error) {
			if len(parts) == 1 {
				return parts[0], nil
			}
			return im.one("concat", ir.Attrs{"axis": ir.IntAttr(int64(ax))}, parts...)
		}
		v, err := cat(vals)
		if err != nil {
			return nil, err
		}
		if !largest {
			if v, err = im.one("neg", nil, v); err != nil {
				return nil, err
			}
		}
		ix, err := cat(idxs)
		return []entry{v, ix}, err
	}
}

// ndIndex turns GatherND/ScatterND indices [..., m] into one int64 index
// per position into data's first m axes flattened: Σ_t i_t · stride_t,
// each i_t taken through a gather of 0..d_t-1, which wraps negative
// indices and rejects out-of-range ones at run time as Gather does.
func (im *importer) ndIndex(data ir.Shape, idx entry) (entry, int, error) {
	is := idx.typ().Shape
	if len(is) < 1 {
		return entry{}, 0, im.errorf("indices need at least one axis")
	}
	m := int(is[len(is)-1])
	if m < 1 || m > len(data) {
		return entry{}, 0, im.errorf("indices address %d axes of data %s", m, data)
	}
	lead := is[:len(is)-1].Clone()
	stride := int64(1)
	var lin entry
	for t := m - 1; t >= 0; t-- {
		comp, err := im.sliceAxis(idx, len(is)-1, int64(t), int64(t)+1, 1)
		if err != nil {
			return entry{}, 0, err
		}
		if comp, err = im.reshapeTo(comp, lead); err != nil {
			return entry{}, 0, err
		}
		if comp.typ().DType != ir.I64 {
			if comp, err = im.one("cast", ir.Attrs{"to": ir.TypeAttr(ir.I64)}, comp); err != nil {
				return entry{}, 0, err
			}
		}
		if comp, err = im.one("gather", ir.Attrs{"axis": ir.IntAttr(0)}, iota(data[t], 0, 1), comp); err != nil {
			return entry{}, 0, err
		}
		if stride != 1 {
			if comp, err = im.one("mul", nil, comp, scalarConst(ir.I64, float64(stride))); err != nil {
				return entry{}, 0, err
			}
		}
		if t == m-1 {
			lin = comp
		} else if lin, err = im.one("add", nil, lin, comp); err != nil {
			return entry{}, 0, err
		}
		stride *= data[t]
	}
	return lin, m, nil
}

func init() {
	arity["GatherND"] = [2]int{2, 2}
	// GatherND (batch_dims 0): a gather along data's first m axes
	// flattened into one.
	converters["GatherND"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		idx := in[1]
		if b := attrInt(n, "batch_dims", 0); b != 0 {
			// The first b axes of data and indices are batch axes: each
			// index tuple is prefixed with its batch coordinates, and the
			// gather has no batch axes.
			var err error
			if idx, err = im.prefixBatch(in[0].typ().Shape, idx, b); err != nil {
				return nil, err
			}
		}
		data := in[0].typ().Shape
		lin, m, err := im.ndIndex(data, idx)
		if err != nil {
			return nil, err
		}
		flat, _ := data[:m].NumElements()
		x, err := im.reshapeTo(in[0], append(ir.Shape{flat}, data[m:]...))
		if err != nil {
			return nil, err
		}
		y, err := im.one("gather", ir.Attrs{"axis": ir.IntAttr(0)}, x, lin)
		return []entry{y}, err
	}
	arity["ScatterND"] = [2]int{3, 3}
	// ScatterND: with reduction "add", data plus the scatter-add of the
	// updates (gather's gradient) into data's first m axes flattened;
	// without, the updates where an index points, which needs indices
	// known at import and free of duplicates.
	converters["ScatterND"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		data, upd := in[0].typ().Shape, in[2]
		lin, m, err := im.ndIndex(data, in[1])
		if err != nil {
			return nil, err
		}
		flat, _ := data[:m].NumElements()
		fs := append(ir.Shape{flat}, data[m:]...)
		want := append(lin.typ().Shape.Clone(), data[m:]...)
		if !upd.typ().Shape.Equal(want) {
			return nil, im.errorf("updates %s must have shape %v", upd.typ(), want)
		}
		spread := func(u entry) (entry, error) {
			s, err := im.one("gather_grad", ir.Attrs{"axis": ir.IntAttr(0), "data_shape": ir.IntsAttr(fs...)}, u, lin)
			if err != nil {
				return entry{}, err
			}
			return im.reshapeTo(s, data)
		}
		reduction := attrString(n, "reduction", "none")
		if reduction == "add" {
			s, err := spread(upd)
			if err != nil {
				return nil, err
			}
			y, err := im.one("add", nil, in[0], s)
			return []entry{y}, err
		}
		if lin.k == nil {
			return nil, im.needConstant(lin, "with reduction "+reduction+", the indices (to order the updates of one element)")
		}
		inner, _ := data[m:].NumElements()
		targets := make([]int64, 0, int64(len(lin.k.I))*inner)
		for _, j := range lin.k.I {
			for e := int64(0); e < inner; e++ {
				targets = append(targets, j*inner+e)
			}
		}
		y, err := im.scatterReduce(reduction, in[0], upd, targets, spread)
		return []entry{y}, err
	}
}

// scatterReduce combines data with updates whose element i goes to
// data's flat position targets[i], known at import: "none" replaces
// (duplicate targets are an error: ONNX leaves their order undefined);
// "mul", "max" and "min" combine each element with its updates in index
// order. spread scatter-adds an updates-shaped value into data's shape.
// Updates are taken in rounds: round r holds each target's r-th update,
// so no round has a duplicate, and each round is one scatter-add of the
// updates it holds (the others zeroed) and one combine where it hits.
func (im *importer) scatterReduce(reduction string, data, upd entry, targets []int64, spread func(entry) (entry, error)) (entry, error) {
	switch reduction {
	case "none", "mul", "max", "min":
	default:
		return entry{}, im.errorf("reduction=%s is not one of none, add, mul, max and min", reduction)
	}
	seen := map[int64]int{}
	round := make([]int, len(targets))
	rounds := 0
	for i, t := range targets {
		round[i] = seen[t]
		seen[t]++
		rounds = max(rounds, seen[t])
	}
	if reduction == "none" && rounds > 1 {
		return entry{}, im.errorf("the indices hit one element twice; without a reduction ONNX leaves the result undefined")
	}
	if size := data.typ().NumElements() + upd.typ().NumElements(); int64(rounds) > max(foldLimit/max(size, 1), 1) {
		return entry{}, im.errorf("the indices hit one element %d times; Kiln combines the updates of an element in one round each, with masks as large as the data, and %d rounds are beyond its limit", rounds, rounds)
	}
	dt := data.typ().DType
	y := data
	c := &chain{im: im}
	for r := 0; r < rounds; r++ {
		mask := interp.New(ir.Type{DType: ir.Bool, Shape: upd.typ().Shape})
		hit := interp.New(ir.Type{DType: ir.Bool, Shape: data.typ().Shape})
		for i, t := range targets {
			if round[i] == r {
				mask.I[i], hit.I[t] = 1, 1
			}
		}
		u := upd
		if rounds > 1 {
			u = c.op("where", nil, entry{k: mask}, upd, scalarConst(dt, 0))
		}
		if c.err != nil {
			return entry{}, c.err
		}
		s, err := spread(u)
		if err != nil {
			return entry{}, err
		}
		h := entry{k: hit}
		switch reduction {
		case "none":
			y = c.op("where", nil, h, s, y)
		case "mul":
			y = c.op("mul", nil, y, c.op("where", nil, h, s, scalarConst(dt, 1)))
		case "max", "min":
			y = c.op("where", nil, h, c.op(reduction, nil, y, s), y)
		}
	}
	if c.err != nil {
		return entry{}, c.err
	}
	return y, nil
}

// scan is CumSum (combine "add", identity 0) or CumProd ("mul", 1) along
// the axis in[1]: log2(d) rounds of combining with the value shifted by
// 1, 2, 4, ... along the axis (padded with the identity); exclusive
// shifts by one first, reverse shifts the other way. Its ops are marked
// as an accumulator's, as ReduceProd's are.
func (im *importer) scan(n *node, in []entry, combine string, identity float64) ([]entry, error) {
	axes, err := im.constInts(in, 1, "the axis")
	if err != nil {
		return nil, err
	}
	x := in[0]
	r := x.typ().Rank()
	if len(axes) != 1 {
		return nil, im.errorf("the axis must be one integer")
	}
	ax, err := ir.NormalizeAxis(axes[0], r)
	if err != nil {
		return nil, im.errorf("%v", err)
	}
	d := x.typ().Shape[ax]
	if d == 0 {
		return in[:1], nil
	}
	reverse := attrInt(n, "reverse", 0) == 1
	im.accumulating = true
	defer func() { im.accumulating = false }()
	shift := func(v entry, s int64) (entry, error) {
		pads := make([]int64, 2*r)
		var part entry
		var err error
		if reverse {
			part, err = im.sliceAxis(v, ax, s, d, 1)
			pads[ax+r] = s
		} else {
			part, err = im.sliceAxis(v, ax, 0, d-s, 1)
			pads[ax] = s
		}
		if err != nil {
			return entry{}, err
		}
		a := ir.Attrs{"pads": ir.IntsAttr(pads...)}
		if identity != 0 {
			a["value"] = ir.FloatAttr(identity)
		}
		return im.one("pad", a, part)
	}
	y := x
	if attrInt(n, "exclusive", 0) == 1 {
		if y, err = shift(x, 1); err != nil || d <= 1 {
			return []entry{y}, err
		}
	}
	for s := int64(1); s < d; s *= 2 {
		sh, err := shift(y, s)
		if err != nil {
			return nil, err
		}
		if y, err = im.one(combine, nil, y, sh); err != nil {
			return nil, err
		}
	}
	return []entry{y}, nil
}

// prefixBatch turns GatherND's indices [B1..Bb, ..., k] with batch_dims
// b into indices [B1..Bb, ..., b + k] of batch_dims 0: each tuple prefixed
// with the batch coordinates of its position.
func (im *importer) prefixBatch(data ir.Shape, idx entry, b int64) (entry, error) {
	is := idx.typ().Shape
	r := int64(len(is))
	if b < 0 || b >= r || b > int64(len(data)) {
		return entry{}, im.errorf("batch_dims %d needs that many leading axes in data %v and indices %v", b, data, is)
	}
	for a := int64(0); a < b; a++ {
		if data[a] != is[a] {
			return entry{}, im.errorf("batch axis %d is %d in data and %d in the indices", a, data[a], is[a])
		}
	}
	c := &chain{im: im}
	pos := is[:r-1]
	n, _ := pos.NumElements()
	if n*b > foldLimit {
		return entry{}, im.errorf("indices %v are too many to prefix with batch coordinates", is)
	}
	coords := interp.New(ir.Type{DType: ir.I64, Shape: append(pos.Clone(), b)})
	strides := pos.Strides()
	for i := int64(0); i < n; i++ {
		for a := int64(0); a < b; a++ {
			coords.I[i*b+a] = i / strides[a] % pos[a]
		}
	}
	return firstEntry(c.done(c.op("concat", ir.Attrs{"axis": ir.IntAttr(r - 1)}, entry{k: coords}, c.cast(idx, ir.I64))))
}

func firstEntry(out []entry, err error) (entry, error) {
	if err != nil {
		return entry{}, err
	}
	return out[0], nil
}

// Compress keeps the slices along axis (or, without one, the elements of
// the flattened input) where the condition holds: its result's shape
// depends on the condition, which must be known at import (a constant,
// or a graph input given with --input); then it is a gather of those
// positions.
func init() {
	arity["Compress"] = [2]int{2, 2}
	introduced["Compress"] = 9
	converters["Compress"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		cond, err := im.constInts(in, 1, "the condition (its result's shape depends on it)")
		if err != nil {
			return nil, err
		}
		c := &chain{im: im}
		axis := int64(0)
		if a := attr(n, "axis"); a != nil {
			ax, err := ir.NormalizeAxis(a.I, x.typ().Rank())
			if err != nil {
				return nil, im.errorf("%v", err)
			}
			axis = int64(ax)
		} else {
			x = c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(x.typ().NumElements())}, x)
			if c.err != nil {
				return nil, c.err
			}
		}
		d := x.typ().Shape[axis]
		if int64(len(cond)) > d {
			return nil, im.errorf("the condition has %d entries for an axis of %d", len(cond), d)
		}
		var keep []int64
		for i, v := range cond {
			if v != 0 {
				keep = append(keep, int64(i))
			}
		}
		idx := entry{k: interp.FromInts(ir.TensorOf(ir.I64, int64(len(keep))), keep)}
		return c.done(c.op("gather", ir.Attrs{"axis": ir.IntAttr(axis)}, x, idx))
	}
}
