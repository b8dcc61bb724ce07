package passes

import "github.com/kiln-compiler/kiln/ir"

// MergeProducts rewrites matrix products that canonicalize finds written in
// pieces, and returns how many ops it rewrote:
//
//   - concat(gemm(A, B1), gemm(A, B2), …) along the columns is
//     gemm(A, concat(B1, B2, …)), and along the rows with one B
//     gemm(concat(A1, A2, …), B), when the joined operands are no larger
//     than the result. The backward of a weight split into gates (an RNN's,
//     a fused q/k/v projection's) is written so: one product per part, then
//     their concat, both live at once.
//   - add(S, gemm(A, B)) with S of the product's type is gemm(A, B, S) with
//     beta 1, which writes over S when S dies there. A gradient summed over
//     the uses of a weight (over an RNN's steps, a tied embedding's two
//     ends) then keeps one running buffer instead of the sum and each new
//     product.
//
// Only products whose result nothing else reads, and whose operands nothing
// overwrites before the concat or add, are rewritten, so no value is
// computed twice or from another value; the results are those of the ops they replace, up to
// the order of floating-point sums.
func MergeProducts(f *ir.Func) int {
	users := f.Users()
	onlyUse := func(v *ir.Value, op *ir.Op) bool {
		u := users[v]
		if len(u) != 1 || u[0] != op || f.IsResult(v) {
			return false
		}
		n := 0
		for _, w := range op.Operands {
			if w == v {
				n++
			}
		}
		return n == 1
	}
	pos := make(map[*ir.Op]int, len(f.Body))
	for i, op := range f.Body {
		pos[op] = i
	}
	// movable reports whether product g may run at op's place instead:
	// nothing between them overwrites one of its operands (an optimizer
	// update writing a weight in place).
	writtenAt := map[*ir.Value][]int{}
	for i, o := range f.Body {
		if d := o.Def(); d != nil {
			for _, w := range d.Writes {
				writtenAt[o.Operands[w]] = append(writtenAt[o.Operands[w]], i)
			}
		}
	}
	movable := func(g, op *ir.Op) bool {
		for _, v := range g.Operands {
			for _, at := range writtenAt[v] {
				if pos[g] < at && at < pos[op] {
					return false
				}
			}
		}
		return true
	}
	usable := func(v *ir.Value, op *ir.Op) bool { return onlyUse(v, op) && movable(v.Def, op) }
	// extension is the bytes of g's operands whose last reader is before
	// op: running g at op keeps them alive until then.
	extension := func(g, op *ir.Op) int64 {
		var n int64
		for _, v := range g.Operands {
			last := -1
			for _, u := range users[v] {
				last = max(last, pos[u])
			}
			if v.Def != nil && !f.IsResult(v) && last < pos[op] {
				n += v.Type.SizeBytes()
			}
		}
		return n
	}
	var out []*ir.Op
	rewritten := 0
	for _, op := range f.Body {
		switch op.Kind {
		case "concat":
			if pre := mergeConcat(f, op, usable); pre != nil {
				out = append(out, pre)
				rewritten++
			}
		case "add":
			if accumulateProduct(op, usable, pos, extension) {
				rewritten++
			}
		}
		out = append(out, op)
	}
	f.Body = out
	return rewritten
}

// plainProduct returns the attributes of v's defining gemm when it has two
// operands and no attributes beyond its own (no marks of other passes),
// and nil otherwise.
func plainProduct(v *ir.Value) ir.Attrs {
	g := v.Def
	if g == nil || g.Kind != "gemm" || len(g.Operands) != 2 || g.Region != nil {
		return nil
	}
	attrs := ir.Attrs{}
	for k, a := range g.Attrs {
		switch k {
		case "alpha", "trans_a", "trans_b":
			attrs[k] = a
		case "beta":
		default:
			return nil
		}
	}
	return attrs
}

// mergeConcat turns op, a concat of products sharing an operand, into one
// product of the joined other operands; it returns the concat of those
// operands (to be placed before op), or nil when op is left as it is.
func mergeConcat(f *ir.Func, op *ir.Op, onlyUse func(*ir.Value, *ir.Op) bool) *ir.Op {
	if len(op.Operands) < 2 || len(op.Attrs) != 1 || op.Results[0].Type.Rank() != 2 {
		return nil
	}
	axis := op.Attr().Int("axis")
	if axis < 0 {
		axis += 2
	}
	if axis != 0 && axis != 1 {
		return nil
	}
	// Along the columns the products share A (operand 0) and B is joined;
	// along the rows they share B and A is joined.
	shared, joined := 0, 1
	if axis == 0 {
		shared, joined = 1, 0
	}
	first := op.Operands[0]
	attrs := plainProduct(first)
	if attrs == nil {
		return nil
	}
	var parts []*ir.Value
	for _, v := range op.Operands {
		a := plainProduct(v)
		if a == nil || !onlyUse(v, op) || v.Def.Operands[shared] != first.Def.Operands[shared] || !sameAttrs(a, attrs) {
			return nil
		}
		parts = append(parts, v.Def.Operands[joined])
	}
	// A part [m_i, k] (or [k, m_i] transposed) joins along the axis that
	// the result's m_i or n_i lies on.
	trans := attrs["trans_b"].Bool
	if joined == 0 {
		trans = attrs["trans_a"].Bool
	}
	joinAxis := int64(joined)
	if trans {
		joinAxis ^= 1
	}
	var joinedBytes int64
	for _, p := range parts {
		n, ok := p.Type.Bytes()
		if !ok {
			return nil
		}
		joinedBytes += n
	}
	if n, ok := op.Results[0].Type.Bytes(); !ok || joinedBytes > n {
		return nil
	}
	cat, err := f.NewOp("concat", parts, ir.Attrs{"axis": ir.IntAttr(joinAxis)}, op.Loc, op.Results[0].Name+".parts")
	if err != nil {
		return nil
	}
	operands := []*ir.Value{first.Def.Operands[0], cat.Results[0]}
	if joined == 0 {
		operands = []*ir.Value{cat.Results[0], first.Def.Operands[1]}
	}
	if !productType(operands, attrs).Equal(op.Results[0].Type) {
		return nil
	}
	op.Kind, op.Operands, op.Attrs, op.Loc = "gemm", operands, attrs, first.Def.Loc
	return cat
}

// accumulateProduct turns op, add(S, P) or add(P, S) with P a product that
// only op reads and S of op's type, into gemm(A, B, S); it reports whether
// it did. Of two such products it folds the one whose operands moving it
// to op keeps alive longer by the fewest bytes (extension), then the later.
func accumulateProduct(op *ir.Op, usable func(*ir.Value, *ir.Op) bool, pos map[*ir.Op]int, extension func(g, op *ir.Op) int64) bool {
	if len(op.Attrs) != 0 || len(op.Operands) != 2 {
		return false
	}
	res := op.Results[0].Type
	pick := -1
	for i, p := range op.Operands {
		s := op.Operands[1-i]
		if plainProduct(p) == nil || !usable(p, op) || !s.Type.Equal(res) || !p.Type.Equal(res) {
			continue
		}
		if pick < 0 {
			pick = i
			continue
		}
		q := op.Operands[pick].Def
		if e, eq := extension(p.Def, op), extension(q, op); e < eq || e == eq && pos[p.Def] > pos[q] {
			pick = i
		}
	}
	if pick < 0 {
		return false
	}
	g := op.Operands[pick].Def
	op.Kind, op.Operands, op.Attrs, op.Loc = "gemm", []*ir.Value{g.Operands[0], g.Operands[1], op.Operands[1-pick]}, plainProduct(g.Results[0]), g.Loc
	return true
}

func sameAttrs(a, b ir.Attrs) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !v.Equal(w) {
			return false
		}
	}
	return true
}

// productType is the type of gemm(operands) under attrs, or the zero type
// when the operands do not multiply.
func productType(operands []*ir.Value, attrs ir.Attrs) ir.Type {
	in := []ir.Type{operands[0].Type, operands[1].Type}
	t, err := ir.Lookup("gemm").InferTypes(in, attrs)
	if err != nil {
		return ir.Type{}
	}
	return t[0]
}
