package onnx

import (
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Det (opset 11) of [..., n, n] is Gaussian elimination with partial
// pivoting, unrolled over the n columns: at column k the row (k or
// below) of largest magnitude is swapped into row k (a gather_elements
// of the rows; a swap flips the sign), the pivot joins the product, and
// the rows below subtract their multiple of row k. The determinant is
// the sign times the product of the pivots. A zero column gives a zero
// pivot, which divides as 1 (its multiples are 0) and makes the product
// 0. The pivot choice is piecewise constant; the rest differentiates
// through its parts.
func init() {
	arity["Det"] = [2]int{1, 1}
	introduced["Det"] = 11
	converters["Det"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		a := in[0]
		r := a.typ().Rank()
		if r < 2 || !a.typ().DType.IsFloat() || a.typ().Shape[r-1] != a.typ().Shape[r-2] {
			return nil, im.errorf("Det of %s: Kiln reads square floating-point matrices [..., n, n]", a.typ())
		}
		size := a.typ().Shape[r-1]
		dt := a.typ().DType
		c := &chain{im: im}
		rows := iota(size, r-2, r) // [1.., n, 1]: each row's number
		zeros := interp.New(ir.Type{DType: ir.I64, Shape: onesBut(r, r-1, size)})
		sign, prod := scalarConst(dt, 1), scalarConst(dt, 1)
		for k := int64(0); k < size; k++ {
			col := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(int64(r - 1)), "starts": ir.IntsAttr(k), "ends": ir.IntsAttr(k + 1)}, a)
			before := c.op("lt", nil, rows, scalarConst(ir.I64, float64(k)))
			mag := c.op("where", nil, before, scalarConst(dt, -1), c.op("abs", nil, col))
			if c.err != nil {
				return nil, c.err
			}
			p, _, err := im.argmax(mag, r-2, false, true, nil) // [..., 1, 1]
			if err != nil {
				return nil, err
			}
			kk := scalarConst(ir.I64, float64(k))
			perm := c.op("where", nil, c.op("eq", nil, rows, kk), p, c.op("where", nil, c.op("eq", nil, rows, p), kk, rows))
			perm = c.op("add", nil, perm, entry{k: zeros}) // [..., n, n]
			a = c.op("gather_elements", ir.Attrs{"axis": ir.IntAttr(int64(r - 2))}, a, perm)
			sign = c.op("mul", nil, sign, c.op("where", nil, c.op("eq", nil, p, kk), scalarConst(dt, 1), scalarConst(dt, -1)))
			pivotRow := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(int64(r - 2)), "starts": ir.IntsAttr(k), "ends": ir.IntsAttr(k + 1)}, a)
			pivot := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(int64(r - 1)), "starts": ir.IntsAttr(k), "ends": ir.IntsAttr(k + 1)}, pivotRow)
			prod = c.op("mul", nil, prod, pivot)
			if k == size-1 {
				break
			}
			safe := c.op("where", nil, c.op("eq", nil, pivot, scalarConst(dt, 0)), scalarConst(dt, 1), pivot)
			col = c.op("slice", ir.Attrs{"axes": ir.IntsAttr(int64(r - 1)), "starts": ir.IntsAttr(k), "ends": ir.IntsAttr(k + 1)}, a)
			below := c.op("gt", nil, rows, kk)
			factor := c.op("where", nil, below, c.op("div", nil, col, safe), scalarConst(dt, 0))
			a = c.op("sub", nil, a, c.op("mul", nil, factor, pivotRow))
		}
		det := c.op("mul", nil, sign, prod) // [..., 1, 1]
		if c.err != nil {
			return nil, c.err
		}
		det = c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(a.typ().Shape[:r-2]...)}, det)
		return c.done(det)
	}
}
