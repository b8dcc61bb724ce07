package onnx

import (
	"fmt"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// TfIdfVectorizer counts the n-grams of a pool in each row of integers
// X ([C] or [B, C]): for each gram length n in [min_gram_length,
// max_gram_length] and each skip distance d (1 for unigrams, 1 to
// max_skip_count+1 for longer grams), a start position i matches a pool
// gram when X[i + j·d] equals its j-th item for every j. Per (n, d) that
// is an and of n comparisons of shifted slices of X with the pool's
// items ([B, L, grams]), summed over the positions; a scatter-add takes
// each gram's count to its output column (ngram_indexes).
// Mode TF gives the counts, IDF the weight (or 1) where a count is
// positive, TFIDF the counts times the weights. Pool grams are numbered
// in pool order, grams of lengths outside the range included; a gram
// given twice counts at its last number's column.
func init() {
	arity["TfIdfVectorizer"] = [2]int{1, 1}
	converters["TfIdfVectorizer"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		x := in[0]
		if a := attr(n, "pool_strings"); a != nil {
			return nil, im.errorf("it works on strings (pool_strings); Kiln plans static shapes and tensors of numbers")
		}
		if d := x.typ().DType; d != ir.I64 && d != ir.I32 {
			return nil, im.errorf("X is %s; TfIdfVectorizer reads int32 or int64 (or strings, which Kiln does not)", x.typ())
		}
		rank := x.typ().Rank()
		if rank > 2 {
			return nil, im.errorf("X is %s; TfIdfVectorizer reads [C] or [B, C]", x.typ())
		}
		minN, maxN, skips := attrInt(n, "min_gram_length", 0), attrInt(n, "max_gram_length", 0), attrInt(n, "max_skip_count", 0)
		counts, indexes, pool := attrInts(n, "ngram_counts"), attrInts(n, "ngram_indexes"), attrInts(n, "pool_int64s")
		var weights []float32
		if a := attr(n, "weights"); a != nil {
			weights = a.Floats
		}
		mode := attrString(n, "mode", "")
		switch {
		case mode != "TF" && mode != "IDF" && mode != "TFIDF":
			return nil, im.errorf("mode %q is not TF, IDF or TFIDF", mode)
		case minN < 1 || maxN < minN || skips < 0:
			return nil, im.errorf("min_gram_length %d, max_gram_length %d and max_skip_count %d must satisfy 1 <= min <= max and skips >= 0", minN, maxN, skips)
		case len(indexes) == 0:
			return nil, im.errorf("ngram_indexes is empty")
		}
		width := int64(0)
		for _, o := range indexes {
			if o < 0 || o >= foldLimit {
				return nil, im.errorf("ngram_indexes holds %d (output columns run from 0 to %d)", o, foldLimit-1)
			}
			width = max(width, o+1)
		}
		if weights != nil && int64(len(weights)) != width {
			return nil, im.errorf("%d weights for %d output columns", len(weights), width)
		}
		// The grams of each length in range, as (items, output column).
		type gram struct {
			items  []int64
			column int64
		}
		byLength := map[int64][]gram{}
		at := map[string]int{} // a gram's place in byLength[its length]
		id := 0
		for l := range counts {
			start, end := counts[l], int64(len(pool))
			if l+1 < len(counts) {
				end = counts[l+1]
			}
			size := int64(l + 1)
			if start < 0 || end < start || end > int64(len(pool)) || (end-start)%size != 0 {
				return nil, im.errorf("ngram_counts %v does not split a pool of %d items into grams", counts, len(pool))
			}
			for p := start; p < end; p += size {
				if id >= len(indexes) {
					return nil, im.errorf("ngram_indexes has %d entries for more grams", len(indexes))
				}
				if size >= minN && size <= maxN {
					g := gram{items: pool[p : p+size], column: indexes[id]}
					key := fmt.Sprint(g.items)
					if i, ok := at[key]; ok {
						byLength[size][i] = g
					} else {
						at[key] = len(byLength[size])
						byLength[size] = append(byLength[size], g)
					}
				}
				id++
			}
		}
		c := &chain{im: im}
		rows := x
		switch rank {
		case 0:
			rows = c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(1, 1)}, x)
		case 1:
			rows = c.op("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(0)}, x)
		}
		if c.err != nil {
			return nil, c.err
		}
		b, cols := rows.typ().Shape[0], rows.typ().Shape[1]
		if b > foldLimit/width {
			return nil, im.errorf("a [%d, %d] output is beyond the limit of %d elements", b, width, foldLimit)
		}
		out := entry{k: interp.New(ir.TensorOf(ir.F32, b, width))}
		for size := int64(1); size <= int64(len(counts)); size++ { // the lengths the pool holds
			gs := byLength[size]
			if len(gs) == 0 {
				continue
			}
			columns := make([]int64, len(gs))
			for i, g := range gs {
				columns[i] = g.column
			}
			distances := skips + 1
			if size == 1 {
				distances = 1 // a unigram is the same at every distance
			}
			var total entry
			for d := int64(1); d <= distances; d++ {
				l := cols - (size-1)*d
				if l <= 0 {
					break
				}
				var match entry
				for j := int64(0); j < size; j++ {
					items := interp.New(ir.TensorOf(rows.typ().DType, int64(len(gs))))
					for i, g := range gs {
						items.I[i] = rows.typ().DType.WrapInt(g.items[j])
					}
					s, err := im.sliceAxis(rows, 1, j*d, j*d+l, 1)
					if err != nil {
						return nil, err
					}
					eq := c.op("eq", nil, c.op("unsqueeze", ir.Attrs{"axes": ir.IntsAttr(2)}, s), entry{k: items})
					if j == 0 {
						match = eq
					} else {
						match = c.op("and", nil, match, eq)
					}
				}
				cnt := c.op("reduce_sum", ir.Attrs{"axes": ir.IntsAttr(1), "keepdims": ir.BoolAttr(false)}, c.cast(match, ir.F32))
				if total.missing() {
					total = cnt
				} else {
					total = c.op("add", nil, total, cnt)
				}
			}
			if !total.missing() {
				// Each gram's count to its column: a scatter-add.
				spread := c.op("gather_grad", ir.Attrs{"axis": ir.IntAttr(1), "data_shape": ir.IntsAttr(b, width)},
					total, entry{k: interp.FromInts(ir.TensorOf(ir.I64, int64(len(gs))), columns)})
				out = c.op("add", nil, out, spread)
			}
		}
		if mode != "TF" {
			w := scalarConst(ir.F32, 1)
			if weights != nil {
				wt := interp.New(ir.TensorOf(ir.F32, width))
				for i, v := range weights {
					wt.F[i] = float64(v)
				}
				w = entry{k: wt}
			}
			if mode == "IDF" {
				out = c.op("where", nil, c.op("gt", nil, out, scalarConst(ir.F32, 0)), w, scalarConst(ir.F32, 0))
			} else {
				out = c.op("mul", nil, out, w)
			}
		}
		if rank < 2 {
			out = c.op("reshape", ir.Attrs{"shape": ir.IntsAttr(width)}, out)
		}
		return c.done(out)
	}
}
