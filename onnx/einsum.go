package onnx

import (
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Einsum with one or two operands (and "..." for leading axes) becomes
// sums over the indices only one operand has, then, for two operands, a
// batched matmul: each operand transposed to [batch, free, contracted]
// and reshaped to three axes. An index repeated within an operand takes
// its diagonal first (diagonals).

func init() {
	arity["Einsum"] = [2]int{1, many}
	converters["Einsum"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		eq := strings.ReplaceAll(attrString(n, "equation", ""), " ", "")
		lhs, out, explicit := strings.Cut(eq, "->")
		terms := strings.Split(lhs, ",")
		if len(terms) != len(in) || len(in) > 2 {
			return nil, im.errorf("equation %q: Kiln reads Einsum of one or two operands matching the equation", eq)
		}
		for _, c := range strings.NewReplacer("->", "", "...", "", ",", "").Replace(eq) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
				return nil, im.errorf("equation %q: indices are letters", eq)
			}
		}
		// Expand "..." into letters for the leading axes.
		ell := 0
		for i, t := range terms {
			if strings.Contains(t, "...") {
				k := in[i].typ().Rank() - (len(t) - 3)
				ell = max(ell, k)
			}
		}
		// The ellipsis axes get letters the equation does not use.
		ellLetters := ""
		for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" {
			if len(ellLetters) < ell && !strings.ContainsRune(eq, c) {
				ellLetters += string(c)
			}
		}
		if len(ellLetters) < ell {
			return nil, im.errorf("equation %q: too many axes under ...", eq)
		}
		expand := func(t string, rank int) (string, bool) {
			if !strings.Contains(t, "...") {
				return t, len(t) == rank
			}
			k := rank - (len(t) - 3)
			if k < 0 || k > ell {
				return "", false
			}
			return strings.Replace(t, "...", ellLetters[ell-k:ell], 1), true
		}
		for i := range terms {
			var ok bool
			if terms[i], ok = expand(terms[i], in[i].typ().Rank()); !ok {
				return nil, im.errorf("equation %q does not match operand %d of shape %s", eq, i, in[i].typ())
			}
		}
		if !explicit {
			// Implicit output: the ellipsis axes, then the indices that
			// appear once, in alphabetical order.
			count := map[rune]int{}
			for _, t := range terms {
				for _, c := range t {
					count[c]++
				}
			}
			var once []string
			for c, k := range count {
				if k == 1 && !strings.ContainsRune(ellLetters, c) {
					once = append(once, string(c))
				}
			}
			sort.Strings(once)
			out = ellLetters[:ell] + strings.Join(once, "")
		} else if strings.Contains(out, "...") {
			out = strings.Replace(out, "...", ellLetters[:ell], 1)
		}
		ops := append([]entry{}, in...)
		for i := range terms {
			var err error
			if ops[i], terms[i], err = im.diagonals(ops[i], terms[i]); err != nil {
				return nil, err
			}
		}
		dims := map[rune]int64{}
		for i, t := range terms {
			for j, c := range t {
				d := ops[i].typ().Shape[j]
				if old, ok := dims[c]; ok && old != d {
					return nil, im.errorf("index %c is %d in one place and %d in another", c, old, d)
				}
				dims[c] = d
			}
		}
		for _, c := range out {
			if _, ok := dims[c]; !ok {
				return nil, im.errorf("output index %c appears in no operand", c)
			}
		}
		// Sum out the indices that only one operand has and the output
		// lacks.
		for i := range terms {
			var axes []int64
			keep := ""
			for j, c := range terms[i] {
				other := len(terms) == 2 && strings.ContainsRune(terms[1-i], c)
				if !other && !strings.ContainsRune(out, c) {
					axes = append(axes, int64(j))
				} else {
					keep += string(c)
				}
			}
			if len(axes) > 0 {
				var err error
				if ops[i], err = im.one("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(axes...), "keepdims": ir.BoolAttr(false)}, ops[i]); err != nil {
					return nil, err
				}
				terms[i] = keep
			}
		}
		if len(terms) == 1 {
			y, err := im.permuteTo(ops[0], terms[0], out)
			return []entry{y}, err
		}
		a, b := terms[0], terms[1]
		var batch, left, right, con string
		for _, c := range a {
			switch {
			case strings.ContainsRune(b, c) && strings.ContainsRune(out, c):
				batch += string(c)
			case strings.ContainsRune(b, c):
				con += string(c)
			default:
				left += string(c)
			}
		}
		for _, c := range b {
			if !strings.ContainsRune(a, c) {
				right += string(c)
			}
		}
		size := func(s string) int64 {
			p := int64(1)
			for _, c := range s {
				p *= dims[c]
			}
			return p
		}
		shapeOf := func(s string) ir.Shape {
			out := ir.Shape{}
			for _, c := range s {
				out = append(out, dims[c])
			}
			return out
		}
		x, err := im.permuteTo(ops[0], a, batch+left+con)
		if err != nil {
			return nil, err
		}
		if x, err = im.reshapeTo(x, ir.Shape{size(batch), size(left), size(con)}); err != nil {
			return nil, err
		}
		y, err := im.permuteTo(ops[1], b, batch+con+right)
		if err != nil {
			return nil, err
		}
		if y, err = im.reshapeTo(y, ir.Shape{size(batch), size(con), size(right)}); err != nil {
			return nil, err
		}
		z, err := im.one("matmul", nil, x, y)
		if err != nil {
			return nil, err
		}
		if z, err = im.reshapeTo(z, shapeOf(batch+left+right)); err != nil {
			return nil, err
		}
		z, err = im.permuteTo(z, batch+left+right, out)
		return []entry{z}, err
	}
}

// permuteTo transposes x, whose axes are named by from, to the order of
// to (the same letters).
func (im *importer) permuteTo(x entry, from, to string) (entry, error) {
	if from == to {
		return x, nil
	}
	if len(from) != len(to) {
		return entry{}, im.errorf("cannot arrange axes %q as %q", from, to)
	}
	perm := make([]int64, len(to))
	for i, c := range to {
		j := strings.IndexRune(from, c)
		if j < 0 {
			return entry{}, im.errorf("cannot arrange axes %q as %q", from, to)
		}
		perm[i] = int64(j)
	}
	return im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(perm...)}, x)
}

// diagonals takes, for each index that term repeats, the diagonal of x
// along its axes: the two axes moved last and merged, then a gather of
// the elements 0, n+1, 2(n+1), ..., which leaves the index once, last.
// It returns x and its term without repeats.
func (im *importer) diagonals(x entry, term string) (entry, string, error) {
	for {
		p, q := -1, -1
		for j := 0; j < len(term) && q < 0; j++ {
			if k := strings.IndexByte(term[j+1:], term[j]); k >= 0 {
				p, q = j, j+1+k
			}
		}
		if q < 0 {
			return x, term, nil
		}
		s := x.typ().Shape
		n := s[p]
		if s[q] != n {
			return entry{}, "", im.errorf("index %c is %d in one place and %d in another", term[p], n, s[q])
		}
		var perm []int64
		rest, shape := "", ir.Shape{}
		for j := range term {
			if j != p && j != q {
				perm = append(perm, int64(j))
				rest += term[j : j+1]
				shape = append(shape, s[j])
			}
		}
		perm = append(perm, int64(p), int64(q))
		c := &chain{im: im}
		y := c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(perm...)}, x)
		if c.err != nil {
			return entry{}, "", c.err
		}
		y, err := im.reshapeTo(y, append(shape.Clone(), n*n))
		if err != nil {
			return entry{}, "", err
		}
		at := make([]int64, n)
		for k := range at {
			at[k] = int64(k) * (n + 1)
		}
		idx := entry{k: interp.FromInts(ir.TensorOf(ir.I64, n), at)}
		x = c.op("gather", ir.Attrs{"axis": ir.IntAttr(int64(len(shape)))}, y, idx)
		if c.err != nil {
			return entry{}, "", c.err
		}
		term = rest + term[p:p+1]
	}
}
