package onnx

import (
	"github.com/kiln-compiler/kiln/ir"
)

// The optimizer operators of the ai.onnx.preview.training domain
// (version 1): one node updates several tensors, its inputs being the
// learning rate R and the step count T (scalars, read at run time like
// any input), then one group of tensors per role (X the parameters, G
// their gradients, then the optimizer's state), and its outputs the new
// parameters and state, group by group. Each is elementwise arithmetic in
// the parameters' dtype, as the operators' definitions write it.
func init() {
	for _, o := range []struct {
		name   string
		groups int // X, G and the state tensors
		update func(c *chain, n *node, r, t entry, x, g entry, state []entry) []entry
	}{
		{"Adagrad", 3, adagrad},
		{"Momentum", 3, momentum},
		{"Adam", 4, adam},
	} {
		key := previewTraining + "." + o.name
		arity[key] = [2]int{2 + o.groups, many}
		converters[key] = func(im *importer, n *node, in []entry) ([]entry, error) {
			if (len(in)-2)%o.groups != 0 {
				return nil, im.errorf("%s takes R, T and %d groups of tensors of one length; the node has %d inputs", o.name, o.groups, len(in))
			}
			k := (len(in) - 2) / o.groups
			r, t := in[0], in[1]
			if r.typ().Rank() != 0 || !r.typ().DType.IsFloat() || t.typ().Rank() != 0 || t.typ().DType != ir.I64 {
				return nil, im.errorf("%s needs a float scalar R and an int64 scalar T, got %s and %s", o.name, r.typ(), t.typ())
			}
			outs := make([]entry, len(in)-2)
			c := &chain{im: im}
			for i := 0; i < k; i++ {
				x := in[2+i]
				if !x.typ().DType.IsFloat() {
					return nil, im.errorf("%s updates floating-point tensors, not %s", o.name, x.typ())
				}
				state := make([]entry, o.groups-2)
				for s := range state {
					state[s] = in[2+(2+s)*k+i]
				}
				for j, y := range o.update(c, n, r, t, x, in[2+k+i], state) {
					outs[j*k+i] = y
				}
			}
			return c.done(outs...)
		}
	}
}

// regularized is norm_coefficient · X + G.
func regularized(c *chain, n *node, x, g entry) entry {
	return c.op("add", nil, c.op("mul", nil, num(x, attrFloat(n, "norm_coefficient", 0)), x), g)
}

// adagrad: r = R / (1 + T · decay_factor); G' = norm · X + G;
// H_new = H + G'²; X_new = X - r · G' / (√H_new + epsilon).
func adagrad(c *chain, n *node, r, t, x, g entry, state []entry) []entry {
	dt := x.typ().DType
	tf := c.cast(t, dt)
	rate := c.op("div", nil, c.cast(r, dt), c.op("add", nil, num(x, 1), c.op("mul", nil, tf, num(x, attrFloat(n, "decay_factor", 0)))))
	gr := regularized(c, n, x, g)
	h := c.op("add", nil, state[0], c.op("mul", nil, gr, gr))
	denom := c.op("add", nil, c.op("sqrt", nil, h), num(x, attrFloat(n, "epsilon", 1e-6)))
	xNew := c.op("sub", nil, x, c.op("div", nil, c.op("mul", nil, rate, gr), denom))
	return []entry{xNew, h}
}

// momentum: G' = norm · X + G; V_new = alpha · V + beta' · G' with beta'
// = beta after the first step (T > 0) and 1 at it; X_new = X - R · V_new
// (mode "standard") or X - R · (G' + alpha · V_new) ("nesterov").
func momentum(c *chain, n *node, r, t, x, g entry, state []entry) []entry {
	alpha := num(x, attrFloat(n, "alpha", 0))
	first := c.op("gt", nil, t, scalarConst(ir.I64, 0))
	beta := c.op("where", nil, first, num(x, attrFloat(n, "beta", 0)), num(x, 1))
	gr := regularized(c, n, x, g)
	v := c.op("add", nil, c.op("mul", nil, alpha, state[0]), c.op("mul", nil, beta, gr))
	step := v
	switch mode := attrString(n, "mode", ""); mode {
	case "standard":
	case "nesterov":
		step = c.op("add", nil, gr, c.op("mul", nil, alpha, v))
	default:
		if c.err == nil {
			c.err = c.im.errorf("mode %q is neither standard nor nesterov", mode)
		}
	}
	return []entry{c.op("sub", nil, x, c.op("mul", nil, c.cast(r, x.typ().DType), step)), v}
}

// adam: G' = norm · X + G; V_new = alpha · V + (1 - alpha) · G';
// H_new = beta · H + (1 - beta) · G'²; r = R · √(1 - beta^T) / (1 -
// alpha^T) for T > 0, R at T = 0; X_new = (1 - norm_post) · (X - r ·
// V_new / (√H_new + epsilon)).
func adam(c *chain, n *node, r, t, x, g entry, state []entry) []entry {
	dt := x.typ().DType
	a, b := attrFloat(n, "alpha", 0.9), attrFloat(n, "beta", 0.999)
	gr := regularized(c, n, x, g)
	v := c.op("add", nil, c.op("mul", nil, num(x, a), state[0]), c.op("mul", nil, num(x, 1-a), gr))
	h := c.op("add", nil, c.op("mul", nil, num(x, b), state[1]), c.op("mul", nil, num(x, 1-b), c.op("mul", nil, gr, gr)))
	tf, rate := c.cast(t, dt), c.cast(r, dt)
	correction := func(p float64) entry { return c.op("sub", nil, num(x, 1), c.op("pow", nil, num(x, p), tf)) }
	adjusted := c.op("div", nil, c.op("mul", nil, rate, c.op("sqrt", nil, correction(b))), correction(a))
	rate = c.op("where", nil, c.op("gt", nil, t, scalarConst(ir.I64, 0)), adjusted, rate)
	denom := c.op("add", nil, c.op("sqrt", nil, h), num(x, attrFloat(n, "epsilon", 1e-6)))
	xNew := c.op("sub", nil, x, c.op("mul", nil, rate, c.op("div", nil, v, denom)))
	xNew = c.op("mul", nil, num(x, 1-attrFloat(n, "norm_coefficient_post", 0)), xNew)
	return []entry{xNew, v, h}
}
