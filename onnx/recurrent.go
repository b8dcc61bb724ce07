package onnx

import (
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// LSTM and GRU are unrolled over their static sequence length into
// matrix products and elementwise ops. Kiln plans static shapes, and
// unrolled steps are what its passes work on: autodiff differentiates
// each step, remat chooses which steps' states to keep, fuse merges each
// step's gate arithmetic into one kernel, and the memory report sees the
// states one by one. A recurrence op would hide all of that. The input
// projections of all steps are one matrix product before the loop.

func init() {
	arity["LSTM"] = [2]int{3, 8}
	arity["GRU"] = [2]int{3, 6}
	arity["RNN"] = [2]int{3, 6}
	converters["RNN"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.recurrent(n, in, 1)
	}
	converters["LSTM"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.recurrent(n, in, 4)
	}
	converters["GRU"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		return im.recurrent(n, in, 3)
	}
}

// rnnActivations are the activations an RNN node may name (nn.RNN's
// nonlinearity is tanh or relu), as Kiln ops.
var rnnActivations = map[string]string{"Tanh": "tanh", "Relu": "relu", "Sigmoid": "sigmoid"}

// recurrent unrolls an LSTM (gates = 4), GRU (gates = 3) or RNN (gates
// = 1) node.
func (im *importer) recurrent(n *node, in []entry, gates int64) ([]entry, error) {
	// act is each direction's activation of an RNN (default Tanh).
	act := []string{"tanh", "tanh"}
	if a := attr(n, "activations"); a != nil && gates == 1 {
		for i, s := range a.Strings {
			k, ok := rnnActivations[string(s)]
			if !ok || i > 1 {
				return nil, im.errorf("activation %q is not supported (Tanh, Relu or Sigmoid, one per direction)", s)
			}
			act[i] = k
		}
		if len(a.Strings) == 1 {
			act[1] = act[0]
		}
	} else if a != nil {
		return nil, im.errorf("activations other than the defaults are not supported")
	}
	if attr(n, "clip") != nil || attrInt(n, "input_forget", 0) != 0 {
		return nil, im.errorf("clip and input_forget other than the defaults are not supported")
	}
	switch attrInt(n, "layout", 0) {
	case 0:
	case 1:
		// Batch first: X [batch, seq, input] and the states [batch,
		// dirs, hidden], read as layout 0 and transposed back.
		swap := func(e entry) (entry, error) {
			if e.typ().Rank() != 3 && e.typ().Rank() != 4 {
				return entry{}, im.errorf("batch-first %s: X and the states are 3-D", e.typ())
			}
			perm := []int64{1, 0, 2, 3}[:e.typ().Rank()]
			return im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(perm...)}, e)
		}
		in = append([]entry(nil), in...)
		for _, i := range []int{0, 5, 6} {
			if i < len(in) && !in[i].missing() {
				var err error
				if in[i], err = swap(in[i]); err != nil {
					return nil, err
				}
			}
		}
		n0 := *n
		n0.Attrs = nil
		for _, a := range n.Attrs {
			if a.Name != "layout" {
				n0.Attrs = append(n0.Attrs, a)
			}
		}
		out, err := im.recurrent(&n0, in, gates)
		if err != nil {
			return nil, err
		}
		// Y [seq, dirs, batch, hidden] becomes [batch, seq, dirs, hidden].
		if out[0], err = im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(2, 0, 1, 3)}, out[0]); err != nil {
			return nil, err
		}
		for i := 1; i < len(out); i++ {
			if out[i], err = swap(out[i]); err != nil {
				return nil, err
			}
		}
		return out, nil
	default:
		return nil, im.errorf("layout=%d is not one ONNX defines (0 or 1)", attrInt(n, "layout", 0))
	}
	x, w, rw := in[0], in[1], in[2]
	xs := x.typ().Shape
	if len(xs) != 3 || w.typ().Rank() != 3 || rw.typ().Rank() != 3 {
		return nil, im.errorf("X, W and R must have rank 3, got %s, %s and %s", x.typ(), w.typ(), rw.typ())
	}
	seq, batch := xs[0], xs[1]
	dirs := w.typ().Shape[0]
	hidden := rw.typ().Shape[2]
	dt := x.typ().DType
	direction := attrString(n, "direction", "forward")
	if want := map[string]int64{"forward": 1, "reverse": 1, "bidirectional": 2}[direction]; want == 0 || want != dirs {
		return nil, im.errorf("direction %q does not match %d weight directions", direction, dirs)
	}
	if w.typ().Shape[1] != gates*hidden || rw.typ().Shape[1] != gates*hidden {
		return nil, im.errorf("W %s and R %s do not hold %d gates of %d", w.typ(), rw.typ(), gates, hidden)
	}
	zeros := func(shape ...int64) entry { return entry{k: interp.New(ir.Type{DType: dt, Shape: shape})} }
	// dirSlice is t[d] reshaped to shape.
	dirSlice := func(t entry, d int64, shape ...int64) (entry, error) {
		s, err := im.sliceAxis(t, 0, d, d+1, 1)
		if err != nil {
			return entry{}, err
		}
		return im.reshapeTo(s, shape)
	}
	linearBeforeReset := attrInt(n, "linear_before_reset", 0) == 1
	// With sequence_lens, a batch element's steps from its length on
	// keep its state and output zeros: keep[t] is [batch, 1], t < len.
	var keep []entry
	if len(in) > 4 && !in[4].missing() {
		lens := in[4]
		if !lens.typ().Shape.Equal(ir.Shape{batch}) || lens.typ().DType.IsFloat() {
			return nil, im.errorf("sequence_lens %s must be integers of shape [%d]", lens.typ(), batch)
		}
		ch := &chain{im: im}
		lens64 := ch.cast(lens, ir.I64)
		if ch.err != nil {
			return nil, ch.err
		}
		col, err := im.reshapeTo(lens64, ir.Shape{batch, 1})
		if err != nil {
			return nil, err
		}
		for t := int64(0); t < seq; t++ {
			k, err := im.one("lt", nil, scalarConst(ir.I64, float64(t)), col)
			if err != nil {
				return nil, err
			}
			keep = append(keep, k)
		}
	}
	hasPeepholes := len(in) > 7 && !in[7].missing()
	if hasPeepholes && (gates != 4 || !in[7].typ().Shape.Equal(ir.Shape{dirs, 3 * hidden})) {
		return nil, im.errorf("peepholes P %s must be an LSTM's [%d, %d]", in[7].typ(), dirs, 3*hidden)
	}
	var ys, hs, cs []entry
	for d := int64(0); d < dirs; d++ {
		wd, err := dirSlice(w, d, gates*hidden, xs[2])
		if err != nil {
			return nil, err
		}
		rd, err := dirSlice(rw, d, gates*hidden, hidden)
		if err != nil {
			return nil, err
		}
		wt, err := im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(1, 0)}, wd)
		if err != nil {
			return nil, err
		}
		rt, err := im.one("transpose", ir.Attrs{"perm": ir.IntsAttr(1, 0)}, rd)
		if err != nil {
			return nil, err
		}
		// wb, rb: the input and recurrent biases (zero when absent).
		wb, rb := zeros(gates*hidden), zeros(gates*hidden)
		if len(in) > 3 && !in[3].missing() {
			b, err := dirSlice(in[3], d, 2*gates*hidden)
			if err != nil {
				return nil, err
			}
			if wb, err = im.sliceAxis(b, 0, 0, gates*hidden, 1); err != nil {
				return nil, err
			}
			if rb, err = im.sliceAxis(b, 0, gates*hidden, 2*gates*hidden, 1); err != nil {
				return nil, err
			}
		}
		// The input projection of every step: X W^T + Wb, [seq, batch, G].
		xw, err := im.one("matmul", nil, x, wt)
		if err != nil {
			return nil, err
		}
		if xw, err = im.one("add", nil, xw, wb); err != nil {
			return nil, err
		}
		h, c := zeros(batch, hidden), zeros(batch, hidden)
		for i, st := range []*entry{&h, &c} {
			idx := 5 + i
			if gates == 3 && i == 1 {
				break
			}
			if idx < len(in) && !in[idx].missing() {
				if *st, err = dirSlice(in[idx], d, batch, hidden); err != nil {
					return nil, err
				}
			}
		}
		// peep: the input, output and forget peepholes of this direction.
		var peep []entry
		if hasPeepholes {
			p, err := dirSlice(in[7], d, 3*hidden)
			if err != nil {
				return nil, err
			}
			for g := int64(0); g < 3; g++ {
				pg, err := im.sliceAxis(p, 0, g*hidden, (g+1)*hidden, 1)
				if err != nil {
					return nil, err
				}
				peep = append(peep, pg)
			}
		}
		steps := make([]entry, seq)
		for k := int64(0); k < seq; k++ {
			t := k
			if direction == "reverse" || d == 1 {
				t = seq - 1 - k
			}
			xt, err := dirSlice(xw, t, batch, gates*hidden)
			if err != nil {
				return nil, err
			}
			hPrev, cPrev := h, c
			switch gates {
			case 4:
				h, c, err = im.lstmStep(xt, h, c, rt, rb, hidden, peep)
			case 3:
				h, err = im.gruStep(xt, h, rt, rb, hidden, linearBeforeReset)
			default:
				h, err = im.rnnStep(xt, h, rt, rb, act[d])
			}
			if err != nil {
				return nil, err
			}
			yt := h
			if keep != nil {
				ch := &chain{im: im}
				yt = ch.op("where", nil, keep[t], h, scalarConst(dt, 0))
				h = ch.op("where", nil, keep[t], h, hPrev)
				if gates == 4 {
					c = ch.op("where", nil, keep[t], c, cPrev)
				}
				if ch.err != nil {
					return nil, ch.err
				}
			}
			if steps[t], err = im.reshapeTo(yt, ir.Shape{1, 1, batch, hidden}); err != nil {
				return nil, err
			}
		}
		y, err := im.one("concat", ir.Attrs{"axis": ir.IntAttr(0)}, steps...)
		if err != nil {
			return nil, err
		}
		ys = append(ys, y)
		hs = append(hs, h)
		cs = append(cs, c)
	}
	stack := func(parts []entry, axis int64, shape ir.Shape) (entry, error) {
		if len(parts) == 1 {
			return im.reshapeTo(parts[0], shape)
		}
		for i := range parts {
			s := shape.Clone()
			s[axis] = 1
			var err error
			if parts[i], err = im.reshapeTo(parts[i], s); err != nil {
				return entry{}, err
			}
		}
		return im.one("concat", ir.Attrs{"axis": ir.IntAttr(axis)}, parts...)
	}
	y, err := stack(ys, 1, ir.Shape{seq, dirs, batch, hidden})
	if err != nil {
		return nil, err
	}
	yh, err := stack(hs, 0, ir.Shape{dirs, batch, hidden})
	if err != nil {
		return nil, err
	}
	out := []entry{y, yh}
	if gates == 4 {
		yc, err := stack(cs, 0, ir.Shape{dirs, batch, hidden})
		if err != nil {
			return nil, err
		}
		out = append(out, yc)
	}
	return out, nil
}

// gateSplit splits a [batch, k*hidden] value into its k gates.
func (im *importer) gateSplit(g entry, k, hidden int64) ([]entry, error) {
	sizes := make([]int64, k)
	for i := range sizes {
		sizes[i] = hidden
	}
	return im.emit("split", []entry{g}, ir.Attrs{"axis": ir.IntAttr(1), "sizes": ir.IntsAttr(sizes...)})
}

// lstmStep is one LSTM step (gates in ONNX's order i, o, f, c):
// c' = f*c + i*tanh(g_c), h' = o*tanh(c'). With peepholes (peep: P_i,
// P_o, P_f), the input and forget gates add P ⊙ c and the output gate
// P_o ⊙ c'.
func (im *importer) lstmStep(xt, h, c, rt, rb entry, hidden int64, peep []entry) (entry, entry, error) {
	hr, err := im.one("matmul", nil, h, rt)
	if err != nil {
		return entry{}, entry{}, err
	}
	if hr, err = im.one("add", nil, hr, rb); err != nil {
		return entry{}, entry{}, err
	}
	g, err := im.one("add", nil, xt, hr)
	if err != nil {
		return entry{}, entry{}, err
	}
	parts, err := im.gateSplit(g, 4, hidden)
	if err != nil {
		return entry{}, entry{}, err
	}
	if peep != nil {
		// The input (0) and forget (2) gates see c.
		for _, i := range []int{0, 2} {
			pc, err := im.one("mul", nil, peep[i], c)
			if err != nil {
				return entry{}, entry{}, err
			}
			if parts[i], err = im.one("add", nil, parts[i], pc); err != nil {
				return entry{}, entry{}, err
			}
		}
	}
	act := make([]entry, 4)
	for i, kind := range []string{"sigmoid", "", "sigmoid", "tanh"} {
		if kind == "" {
			continue // the output gate, after c'
		}
		if act[i], err = im.one(kind, nil, parts[i]); err != nil {
			return entry{}, entry{}, err
		}
	}
	iGate, fGate, cand := act[0], act[2], act[3]
	fc, err := im.one("mul", nil, fGate, c)
	if err != nil {
		return entry{}, entry{}, err
	}
	ic, err := im.one("mul", nil, iGate, cand)
	if err != nil {
		return entry{}, entry{}, err
	}
	c2, err := im.one("add", nil, fc, ic)
	if err != nil {
		return entry{}, entry{}, err
	}
	tc, err := im.one("tanh", nil, c2)
	if err != nil {
		return entry{}, entry{}, err
	}
	oPre := parts[1]
	if peep != nil {
		pc, err := im.one("mul", nil, peep[1], c2)
		if err != nil {
			return entry{}, entry{}, err
		}
		if oPre, err = im.one("add", nil, oPre, pc); err != nil {
			return entry{}, entry{}, err
		}
	}
	oGate, err := im.one("sigmoid", nil, oPre)
	if err != nil {
		return entry{}, entry{}, err
	}
	h2, err := im.one("mul", nil, oGate, tc)
	return h2, c2, err
}

// gruStep is one GRU step (gates z, r, h):
// h' = (1 - z) * n + z * h, n = tanh(x_n + r * (h R_n + Rb_n)) with
// linear_before_reset, tanh(x_n + (r * h) R_n + Rb_n) without.
func (im *importer) gruStep(xt, h, rt, rb entry, hidden int64, linearBeforeReset bool) (entry, error) {
	xp, err := im.gateSplit(xt, 3, hidden)
	if err != nil {
		return entry{}, err
	}
	rts, err := im.emit("split", []entry{rt}, ir.Attrs{"axis": ir.IntAttr(1), "sizes": ir.IntsAttr(hidden, hidden, hidden)})
	if err != nil {
		return entry{}, err
	}
	rbs, err := im.emit("split", []entry{rb}, ir.Attrs{"axis": ir.IntAttr(0), "sizes": ir.IntsAttr(hidden, hidden, hidden)})
	if err != nil {
		return entry{}, err
	}
	// recur is v R_i + Rb_i.
	recur := func(v entry, i int) (entry, error) {
		p, err := im.one("matmul", nil, v, rts[i])
		if err != nil {
			return entry{}, err
		}
		return im.one("add", nil, p, rbs[i])
	}
	gate := func(i int) (entry, error) {
		p, err := recur(h, i)
		if err != nil {
			return entry{}, err
		}
		s, err := im.one("add", nil, xp[i], p)
		if err != nil {
			return entry{}, err
		}
		return im.one("sigmoid", nil, s)
	}
	z, err := gate(0)
	if err != nil {
		return entry{}, err
	}
	r, err := gate(1)
	if err != nil {
		return entry{}, err
	}
	var rec entry
	if linearBeforeReset {
		p, err := recur(h, 2)
		if err != nil {
			return entry{}, err
		}
		rec, err = im.one("mul", nil, r, p)
		if err != nil {
			return entry{}, err
		}
	} else {
		rh, err := im.one("mul", nil, r, h)
		if err != nil {
			return entry{}, err
		}
		if rec, err = recur(rh, 2); err != nil {
			return entry{}, err
		}
	}
	s, err := im.one("add", nil, xp[2], rec)
	if err != nil {
		return entry{}, err
	}
	cand, err := im.one("tanh", nil, s)
	if err != nil {
		return entry{}, err
	}
	// h' = n + z * (h - n)
	diff, err := im.one("sub", nil, h, cand)
	if err != nil {
		return entry{}, err
	}
	zd, err := im.one("mul", nil, z, diff)
	if err != nil {
		return entry{}, err
	}
	return im.one("add", nil, cand, zd)
}

// rnnStep is one step of a simple RNN: h' = act(x W^T + Wb + h R^T + Rb).
func (im *importer) rnnStep(xt, h, rt, rb entry, act string) (entry, error) {
	c := &chain{im: im}
	pre := c.op("add", nil, xt, c.op("add", nil, c.op("matmul", nil, h, rt), rb))
	out, err := c.done(c.op(act, nil, pre))
	if err != nil {
		return entry{}, err
	}
	return out[0], nil
}
