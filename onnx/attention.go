package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// Attention (opsets 23 and 24) and RotaryEmbedding (opset 23), written as
// the matrix products, softmax and elementwise ops of their function
// bodies: exact, differentiable through their parts, and visible to the
// planner (the score matrix is a value remat and fusion can see).

func init() {
	arity["Attention"] = [2]int{3, 7}
	arity["RotaryEmbedding"] = [2]int{3, 4}
	introduced["Attention"] = 23
	introduced["RotaryEmbedding"] = 23
	converters["Attention"] = attention
	converters["RotaryEmbedding"] = rotaryEmbedding
}

// heads4 views a 3-D [B, S, H·D] value as [B, H, S, D] (a 4-D one stays).
func (c *chain) heads4(x entry, heads int64, what string) entry {
	if c.err != nil || x.typ().Rank() == 4 {
		return x
	}
	s := x.typ().Shape
	if x.typ().Rank() != 3 || heads <= 0 || s[2]%heads != 0 {
		c.err = c.im.errorf("%s %s: a 3-D input needs its head count (q_num_heads, kv_num_heads) dividing its last dimension", what, x.typ())
		return entry{}
	}
	var err error
	x, err = c.im.reshapeTo(x, ir.Shape{s[0], s[1], heads, s[2] / heads})
	if err != nil {
		c.err = err
		return entry{}
	}
	return c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3)}, x)
}

func attention(im *importer, n *node, in []entry) ([]entry, error) {
	c := &chain{im: im}
	get := func(i int) (entry, bool) {
		if i < len(in) && !in[i].missing() {
			return in[i], true
		}
		return entry{}, false
	}
	q3 := in[0].typ().Rank() == 3
	q := c.heads4(in[0], attrInt(n, "q_num_heads", 0), "Q")
	k := c.heads4(in[1], attrInt(n, "kv_num_heads", 0), "K")
	v := c.heads4(in[2], attrInt(n, "kv_num_heads", 0), "V")
	if c.err != nil {
		return nil, c.err
	}
	pastK, hasPK := get(4)
	pastV, hasPV := get(5)
	if hasPK != hasPV {
		return nil, im.errorf("past_key and past_value are given together or not at all")
	}
	past := int64(0)
	if hasPK {
		if pastK.typ().Rank() != 4 || pastV.typ().Rank() != 4 {
			return nil, im.errorf("past_key %s and past_value %s must be [batch, heads, past, head size]", pastK.typ(), pastV.typ())
		}
		past = pastK.typ().Shape[2]
		k = c.op("concat", ir.Attrs{"axis": ir.IntAttr(2)}, pastK, k)
		v = c.op("concat", ir.Attrs{"axis": ir.IntAttr(2)}, pastV, v)
	}
	if c.err != nil {
		return nil, c.err
	}
	presentK, presentV := k, v
	qs, ks := q.typ().Shape, k.typ().Shape
	b, hq, sq, d := qs[0], qs[1], qs[2], qs[3]
	hkv, total := ks[1], ks[2]
	if hkv == 0 || hq%hkv != 0 {
		return nil, im.errorf("%d query heads are not a multiple of %d key/value heads", hq, hkv)
	}
	if g := hq / hkv; g > 1 {
		// Grouped-query attention: query head h reads key/value head
		// h / g (repeat-interleave).
		rep := func(x entry) entry {
			s := x.typ().Shape
			five, err := im.reshapeTo(x, ir.Shape{s[0], s[1], 1, s[2], s[3]})
			if err != nil {
				c.err = err
				return entry{}
			}
			wide := c.op("expand", ir.Attrs{"shape": ir.IntsAttr(s[0], s[1], g, s[2], s[3])}, five)
			if c.err != nil {
				return entry{}
			}
			out, err := im.reshapeTo(wide, ir.Shape{s[0], s[1] * g, s[2], s[3]})
			c.err = err
			return out
		}
		k, v = rep(k), rep(v)
	}
	dt := q.typ().DType
	scale := 1 / math.Sqrt(float64(d))
	if a := attr(n, "scale"); a != nil {
		scale = float64(a.F)
	}
	root := num(q, math.Sqrt(scale))
	kt := c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 1, 3, 2)}, c.op("mul", nil, k, root))
	qk := c.op("matmul", nil, c.op("mul", nil, q, root), kt)
	scores := qk
	if cap := float64(attrFloat(n, "softcap", 0)); cap > 0 {
		scores = c.op("mul", nil, c.op("tanh", nil, c.op("div", nil, scores, num(q, cap))), num(q, cap))
	}
	capped := scores
	// The bias: the mask (bool: where to attend; numbers: added), the
	// keys past each batch row's nonpad_kv_seqlen, and the causal band.
	masked := false
	if m, ok := get(3); ok {
		masked = true
		if m.typ().Rank() > 0 && m.typ().Shape[m.typ().Rank()-1] != total {
			return nil, im.errorf("attn_mask %s: its last dimension must be the %d keys (Kiln does not pad a shorter mask)", m.typ(), total)
		}
		if m.typ().DType == ir.Bool {
			scores = c.op("where", nil, m, scores, num(q, math.Inf(-1)))
		} else {
			scores = c.op("add", nil, scores, c.cast(m, dt))
		}
	}
	if lens, ok := get(6); ok {
		if hasPK {
			return nil, im.errorf("nonpad_kv_seqlen cannot be combined with past_key and past_value")
		}
		masked = true
		pos := interp.New(ir.Type{DType: ir.I64, Shape: ir.Shape{1, 1, 1, total}})
		for j := range pos.I {
			pos.I[j] = int64(j)
		}
		l, err := im.reshapeTo(lens, ir.Shape{b, 1, 1, 1})
		if err != nil {
			return nil, err
		}
		scores = c.op("where", nil, c.op("lt", nil, entry{k: pos}, l), scores, num(q, math.Inf(-1)))
	}
	if attrInt(n, "is_causal", 0) != 0 {
		if _, ok := get(6); ok {
			return nil, im.errorf("is_causal with nonpad_kv_seqlen (a causal band that depends on the data) is not supported")
		}
		// Query i attends key j <= i + past: compared at run time from
		// the two position vectors (a folded [sq, total] band would grow
		// with the square of the context).
		if sq > foldLimit || total > foldLimit {
			return nil, im.errorf("%d queries over %d keys are too many positions to index", sq, total)
		}
		qi := interp.New(ir.Type{DType: ir.I64, Shape: ir.Shape{sq, 1}})
		for i := range qi.I {
			qi.I[i] = int64(i) + past
		}
		kj := interp.New(ir.Type{DType: ir.I64, Shape: ir.Shape{1, total}})
		for j := range kj.I {
			kj.I[j] = int64(j)
		}
		band := c.op("le", nil, entry{k: kj}, entry{k: qi})
		scores = c.op("where", nil, band, scores, num(q, math.Inf(-1)))
	}
	withMask := scores
	work := dt
	if a := attr(n, "softmax_precision"); a != nil {
		var ok bool
		if work, ok = dtypeOf(a.I); !ok || !work.IsFloat() {
			return nil, im.errorf("softmax_precision %s is not a floating-point type", onnxTypeName(a.I))
		}
	}
	probs := c.cast(c.op("softmax", ir.Attrs{"axis": ir.IntAttr(-1)}, c.cast(scores, work)), dt)
	if masked {
		// A row with every key masked gives 0, not NaN (the 1.23 errata).
		top := c.reduceOver("reduce_max", scores, []int64{3})
		probs = c.op("where", nil, c.op("eq", nil, top, num(q, math.Inf(-1))), num(q, 0), probs)
	}
	y := c.op("matmul", nil, probs, v)
	if c.err != nil {
		return nil, c.err
	}
	if q3 {
		dv := y.typ().Shape[3]
		y = c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3)}, y)
		if c.err != nil {
			return nil, c.err
		}
		var err error
		if y, err = im.reshapeTo(y, ir.Shape{b, sq, hq * dv}); err != nil {
			return nil, err
		}
	}
	out := []entry{y, presentK, presentV}
	if len(n.Outputs) > 3 && n.Outputs[3] != "" {
		switch mode := attrInt(n, "qk_matmul_output_mode", 0); mode {
		case 0:
			out = append(out, qk)
		case 1:
			out = append(out, capped)
		case 2:
			out = append(out, withMask)
		case 3:
			out = append(out, probs)
		default:
			return nil, im.errorf("qk_matmul_output_mode %d is not 0 to 3", mode)
		}
	}
	return c.done(out...)
}

func rotaryEmbedding(im *importer, n *node, in []entry) ([]entry, error) {
	c := &chain{im: im}
	x, cosC, sinC := in[0], in[1], in[2]
	xs := x.typ().Shape
	// Work in [B, S, H, D].
	var work entry
	switch x.typ().Rank() {
	case 4:
		work = c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3)}, x)
	case 3:
		h := attrInt(n, "num_heads", 0)
		if h <= 0 || xs[2]%h != 0 {
			return nil, im.errorf("a 3-D input %s needs num_heads dividing its last dimension", x.typ())
		}
		var err error
		if work, err = im.reshapeTo(x, ir.Shape{xs[0], xs[1], h, xs[2] / h}); err != nil {
			return nil, err
		}
	default:
		return nil, im.errorf("the input must be 3-D or 4-D, not %s", x.typ())
	}
	if c.err != nil {
		return nil, c.err
	}
	ws := work.typ().Shape
	b, s, h, d := ws[0], ws[1], ws[2], ws[3]
	rd := attrInt(n, "rotary_embedding_dim", 0)
	if rd == 0 {
		rd = d
	}
	if rd < 0 || rd > d || rd%2 != 0 {
		return nil, im.errorf("rotary_embedding_dim %d must be even and at most the head size %d", rd, d)
	}
	if len(in) > 3 && !in[3].missing() {
		ids := in[3]
		cosC = c.op("gather", ir.Attrs{"axis": ir.IntAttr(0)}, cosC, ids)
		sinC = c.op("gather", ir.Attrs{"axis": ir.IntAttr(0)}, sinC, ids)
	}
	if c.err != nil {
		return nil, c.err
	}
	if !cosC.typ().Shape.Equal(ir.Shape{b, s, rd / 2}) || !sinC.typ().Shape.Equal(cosC.typ().Shape) {
		return nil, im.errorf("the cos and sin caches give %s and %s, want [%d,%d,%d]", cosC.typ(), sinC.typ(), b, s, rd/2)
	}
	var err error
	if cosC, err = im.reshapeTo(cosC, ir.Shape{b, s, 1, rd / 2}); err != nil {
		return nil, err
	}
	if sinC, err = im.reshapeTo(sinC, ir.Shape{b, s, 1, rd / 2}); err != nil {
		return nil, err
	}
	rot := work
	if rd < d {
		rot = c.op("slice", ir.Attrs{"axes": ir.IntsAttr(3), "starts": ir.IntsAttr(0), "ends": ir.IntsAttr(rd), "steps": ir.IntsAttr(1)}, work)
	}
	var x1, x2 entry
	interleaved := attrInt(n, "interleaved", 0) != 0
	if interleaved {
		// Pairs (x[2i], x[2i+1]).
		pairs, err := im.reshapeTo(rot, ir.Shape{b, s, h, rd / 2, 2})
		if err != nil {
			return nil, err
		}
		half := func(i int64) entry {
			p := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(4), "starts": ir.IntsAttr(i), "ends": ir.IntsAttr(i + 1), "steps": ir.IntsAttr(1)}, pairs)
			if c.err != nil {
				return entry{}
			}
			r, err := im.reshapeTo(p, ir.Shape{b, s, h, rd / 2})
			c.err = err
			return r
		}
		x1, x2 = half(0), half(1)
	} else {
		halves := func(i int64) entry {
			return c.op("slice", ir.Attrs{"axes": ir.IntsAttr(3), "starts": ir.IntsAttr(i * rd / 2), "ends": ir.IntsAttr((i + 1) * rd / 2), "steps": ir.IntsAttr(1)}, rot)
		}
		x1, x2 = halves(0), halves(1)
	}
	real := c.op("sub", nil, c.op("mul", nil, cosC, x1), c.op("mul", nil, sinC, x2))
	imag := c.op("add", nil, c.op("mul", nil, sinC, x1), c.op("mul", nil, cosC, x2))
	if c.err != nil {
		return nil, c.err
	}
	var out entry
	if interleaved {
		r5, err := im.reshapeTo(real, ir.Shape{b, s, h, rd / 2, 1})
		if err != nil {
			return nil, err
		}
		i5, err := im.reshapeTo(imag, ir.Shape{b, s, h, rd / 2, 1})
		if err != nil {
			return nil, err
		}
		both := c.op("concat", ir.Attrs{"axis": ir.IntAttr(4)}, r5, i5)
		if c.err != nil {
			return nil, c.err
		}
		if out, err = im.reshapeTo(both, ir.Shape{b, s, h, rd}); err != nil {
			return nil, err
		}
	} else {
		out = c.op("concat", ir.Attrs{"axis": ir.IntAttr(3)}, real, imag)
	}
	if rd < d {
		pass := c.op("slice", ir.Attrs{"axes": ir.IntsAttr(3), "starts": ir.IntsAttr(rd), "ends": ir.IntsAttr(d), "steps": ir.IntsAttr(1)}, work)
		out = c.op("concat", ir.Attrs{"axis": ir.IntAttr(3)}, out, pass)
	}
	if c.err != nil {
		return nil, c.err
	}
	if x.typ().Rank() == 4 {
		return c.done(c.op("transpose", ir.Attrs{"perm": ir.IntsAttr(0, 2, 1, 3)}, out))
	}
	y, err := im.reshapeTo(out, xs)
	if err != nil {
		return nil, err
	}
	return []entry{y}, nil
}
