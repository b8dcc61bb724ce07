package passes

import (
	"math"

	"github.com/kiln-compiler/kiln/ir"
)

// Composite recognition: exporters write some ops as chains (PyTorch 1.13
// writes GELU as Div, Erf, Add, Mul, Mul). Autodiff would save several of
// the chain's tensors where the one op saves its input. A chain becomes
// the op when it matches exactly: the same arithmetic up to the order of
// commutative operands, constants within f32 rounding of the op's, the
// same result type, and no intermediate value used outside the chain.

// RecognizeComposites rewrites each recognised chain of f into its op
// (and a Linear layer's matmul of a transposed weight into a gemm) and
// returns how many it rewrote; the chains' ops are left dead.
func RecognizeComposites(f *ir.Func) int {
	r := &recognizer{users: f.Users(), result: map[*ir.Value]bool{}}
	for _, res := range f.Results {
		r.result[res.Value] = true
	}
	repl := map[*ir.Value]*ir.Value{}
	var body []*ir.Op
	count := 0
	for _, op := range f.Body {
		for i, v := range op.Operands {
			if w, ok := repl[v]; ok {
				op.Operands[i] = w
			}
		}
		body = append(body, op)
		if op.Region != nil || len(op.Results) != 1 || op.Attrs["remat"].Kind != 0 {
			continue
		}
		if ops := linearWeight(f, op); ops != nil {
			name := op.Results[0].Name
			op.Results[0].Name = f.UniqueName(name + ".chain")
			ops[len(ops)-1].Results[0].Name = name
			body = append(body, ops...)
			repl[op.Results[0]] = ops[len(ops)-1].Results[0]
			count++
			continue
		}
		for _, p := range composites {
			r.inner = map[*ir.Op]bool{}
			kind, attrs, operands := p(r, op)
			if kind == "" || !r.private(op) {
				continue
			}
			name := op.Results[0].Name
			op.Results[0].Name = f.UniqueName(name + ".chain")
			n, err := f.NewOp(kind, operands, attrs, op.Loc, name)
			if err != nil || !n.Results[0].Type.Equal(op.Results[0].Type) {
				op.Results[0].Name = name
				continue
			}
			n.Results[0].Name = name
			body = append(body, n)
			repl[op.Results[0]] = n.Results[0]
			count++
			break
		}
	}
	f.Body = body
	for i, res := range f.Results {
		if w, ok := repl[res.Value]; ok {
			f.Results[i].Value = w
		}
	}
	return count
}

type recognizer struct {
	users  map[*ir.Value][]*ir.Op
	result map[*ir.Value]bool
	inner  map[*ir.Op]bool // the chain's ops below its root
}

// private reports whether every value the chain computes below root is
// used only inside the chain.
func (r *recognizer) private(root *ir.Op) bool {
	for op := range r.inner {
		for _, v := range op.Results {
			if r.result[v] {
				return false
			}
			for _, u := range r.users[v] {
				if u != root && !r.inner[u] {
					return false
				}
			}
		}
	}
	return true
}

// def returns v's defining op when it is of kind (and adds it to the
// chain), or nil.
func (r *recognizer) def(v *ir.Value, kind string) *ir.Op {
	if v == nil || v.Def == nil || v.Def.Kind != kind || v.Def.Region != nil || v.Def.Attrs["remat"].Kind != 0 {
		return nil
	}
	r.inner[v.Def] = true
	return v.Def
}

// isConst reports whether v is a constant whose every element is within
// f32 rounding of c.
func isConst(v *ir.Value, c float64) bool {
	d := constOf(v)
	if d == nil || d.Len() == 0 || !d.Type.DType.IsFloat() {
		return false
	}
	for i := 0; i < d.Len(); i++ {
		if math.Abs(d.Float(int64(i))-c) > 1e-6*math.Abs(c)+1e-12 {
			return false
		}
	}
	return true
}

// factors flattens a tree of mul ops rooted at v (v's own mul included
// when root is set) into its factors.
func (r *recognizer) factors(v *ir.Value, root bool) []*ir.Value {
	var op *ir.Op
	if root {
		op = v.Def
		if op == nil || op.Kind != "mul" {
			return []*ir.Value{v}
		}
	} else if op = r.def(v, "mul"); op == nil {
		return []*ir.Value{v}
	}
	return append(r.factors(op.Operands[0], false), r.factors(op.Operands[1], false)...)
}

// split separates factors into constants equal to c (one is expected)
// and the rest.
func splitConst(fs []*ir.Value, c float64) (found bool, rest []*ir.Value) {
	for _, f := range fs {
		if !found && isConst(f, c) {
			found = true
			continue
		}
		rest = append(rest, f)
	}
	return found, rest
}

// plusOne matches add(v, 1) in either order and returns v.
func (r *recognizer) plusOne(v *ir.Value) *ir.Value {
	op := r.def(v, "add")
	if op == nil {
		return nil
	}
	for i := 0; i < 2; i++ {
		if isConst(op.Operands[1-i], 1) {
			return op.Operands[i]
		}
	}
	return nil
}

// composite matches a chain rooted at op and returns the op to replace
// it with ("" when it does not match).
type composite func(r *recognizer, root *ir.Op) (kind string, attrs ir.Attrs, operands []*ir.Value)

var composites = []composite{geluChain, hardSigmoidChain, siluChain, hardSwishChain, mishChain, softmaxChain, layerNormChain, rmsNormChain}

// geluChain: x * 0.5 * (1 + erf(x / sqrt 2)) (or x * (1/sqrt 2)), and
// x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
func geluChain(r *recognizer, root *ir.Op) (string, ir.Attrs, []*ir.Value) {
	if root.Kind != "mul" {
		return "", nil, nil
	}
	half, rest := splitConst(r.factors(root.Results[0], true), 0.5)
	if !half || len(rest) != 2 {
		return "", nil, nil
	}
	for i := 0; i < 2; i++ {
		x, t := rest[i], r.plusOne(rest[1-i])
		if t == nil {
			continue
		}
		if e := r.def(t, "erf"); e != nil {
			a := e.Operands[0]
			if d := r.def(a, "div"); d != nil && d.Operands[0] == x && isConst(d.Operands[1], math.Sqrt2) {
				return "gelu", nil, []*ir.Value{x}
			}
			if ok, fs := splitConst(r.factors(a, false), 1/math.Sqrt2); ok && len(fs) == 1 && fs[0] == x {
				return "gelu", nil, []*ir.Value{x}
			}
		}
		if th := r.def(t, "tanh"); th != nil {
			ok, fs := splitConst(r.factors(th.Operands[0], false), math.Sqrt(2/math.Pi))
			if !ok || len(fs) != 1 {
				continue
			}
			sum := r.def(fs[0], "add")
			if sum == nil {
				continue
			}
			for j := 0; j < 2; j++ {
				if sum.Operands[j] == x && r.isCubicTerm(sum.Operands[1-j], x) {
					return "gelu", ir.Attrs{"approximate": ir.StringAttr("tanh")}, []*ir.Value{x}
				}
			}
		}
	}
	return "", nil, nil
}

// isCubicTerm matches 0.044715 * x^3, the cube as pow(x, 3) or x*x*x.
func (r *recognizer) isCubicTerm(v, x *ir.Value) bool {
	ok, fs := splitConst(r.factors(v, false), 0.044715)
	if !ok {
		return false
	}
	if len(fs) == 1 {
		if p := r.def(fs[0], "pow"); p != nil && p.Operands[0] == x && isConst(p.Operands[1], 3) {
			return true
		}
		fs = r.factors(fs[0], false)
	}
	return len(fs) == 3 && fs[0] == x && fs[1] == x && fs[2] == x
}

// gated matches root = x * g where gate(g, x) holds, in either order,
// and returns x.
func (r *recognizer) gated(root *ir.Op, gate func(g, x *ir.Value) bool) *ir.Value {
	if root.Kind != "mul" {
		return nil
	}
	for i := 0; i < 2; i++ {
		if x := root.Operands[i]; gate(root.Operands[1-i], x) {
			return x
		}
	}
	return nil
}

// gatedChain is a composite x * g(x) that becomes kind(x).
func gatedChain(kind string, gate func(r *recognizer, g, x *ir.Value) bool) composite {
	return func(r *recognizer, root *ir.Op) (string, ir.Attrs, []*ir.Value) {
		if x := r.gated(root, func(g, x *ir.Value) bool { return gate(r, g, x) }); x != nil {
			return kind, nil, []*ir.Value{x}
		}
		return "", nil, nil
	}
}

// hardSigmoidChain: clip(x + 3, 0, 6) / 6 (or * 1/6), ReLU6(x + 3) / 6
// as MobileNetV3 code writes it.
func hardSigmoidChain(r *recognizer, root *ir.Op) (string, ir.Attrs, []*ir.Value) {
	var inner *ir.Value
	switch {
	case root.Kind == "div" && isConst(root.Operands[1], 6):
		inner = root.Operands[0]
	case root.Kind == "mul":
		for i := 0; i < 2; i++ {
			if isConst(root.Operands[1-i], 1.0/6) {
				inner = root.Operands[i]
			}
		}
	}
	c := r.def(inner, "clip")
	if c == nil || c.Attr().Float("lo") != 0 || c.Attr().Float("hi") != 6 {
		return "", nil, nil
	}
	add := r.def(c.Operands[0], "add")
	if add == nil {
		return "", nil, nil
	}
	for i := 0; i < 2; i++ {
		if isConst(add.Operands[1-i], 3) {
			return "hard_sigmoid", ir.Attrs{"alpha": ir.FloatAttr(1.0 / 6), "beta": ir.FloatAttr(0.5)}, []*ir.Value{add.Operands[i]}
		}
	}
	return "", nil, nil
}

// siluChain: x * sigmoid(x).
var siluChain = gatedChain("silu", func(r *recognizer, g, x *ir.Value) bool {
	s := r.def(g, "sigmoid")
	return s != nil && s.Operands[0] == x
})

// hardSwishChain: x * hard_sigmoid(x) with alpha 1/6 and beta 1/2 (how
// PyTorch exports HardSwish below opset 14).
var hardSwishChain = gatedChain("hard_swish", func(r *recognizer, g, x *ir.Value) bool {
	h := r.def(g, "hard_sigmoid")
	return h != nil && h.Operands[0] == x &&
		math.Abs(h.Attr().Float("alpha")-1.0/6) < 1e-6 && math.Abs(h.Attr().Float("beta")-0.5) < 1e-6
})

// mishChain: x * tanh(softplus(x)).
var mishChain = gatedChain("mish", func(r *recognizer, g, x *ir.Value) bool {
	if t := r.def(g, "tanh"); t != nil {
		s := r.def(t.Operands[0], "softplus")
		return s != nil && s.Operands[0] == x
	}
	return false
})

// softmaxChain: e / sum(e) over one axis, keeping it, where e is exp(x)
// or exp(x - max(x)) over the same axis.
func softmaxChain(r *recognizer, root *ir.Op) (string, ir.Attrs, []*ir.Value) {
	if root.Kind != "div" {
		return "", nil, nil
	}
	e := r.def(root.Operands[0], "exp")
	s := r.def(root.Operands[1], "reduce_sum")
	if e == nil || s == nil || s.Operands[0] != root.Operands[0] {
		return "", nil, nil
	}
	axis, ok := oneKeptAxis(s)
	if !ok {
		return "", nil, nil
	}
	x := e.Operands[0]
	if sub := r.def(x, "sub"); sub != nil {
		if m := r.def(sub.Operands[1], "reduce_max"); m != nil && m.Operands[0] == sub.Operands[0] {
			if a, ok := oneKeptAxis(m); ok && a == axis {
				x = sub.Operands[0]
			}
		}
	}
	if !x.Type.Equal(root.Results[0].Type) {
		return "", nil, nil
	}
	return "softmax", ir.Attrs{"axis": ir.IntAttr(axis)}, []*ir.Value{x}
}

// oneKeptAxis returns the one axis a keepdims reduction reduces,
// normalised.
func oneKeptAxis(op *ir.Op) (int64, bool) {
	axes := op.Attr().Ints("axes")
	if !op.Attr().Bool("keepdims") || len(axes) != 1 {
		return 0, false
	}
	a, err := ir.NormalizeAxis(axes[0], op.Operands[0].Type.Rank())
	return int64(a), err == nil
}

// layerNormChain: (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps),
// times gamma plus beta (both optional), over the trailing axes from some
// axis on; the square as pow(d, 2) or d*d.
func layerNormChain(r *recognizer, root *ir.Op) (string, ir.Attrs, []*ir.Value) {
	v := root.Results[0]
	var gamma, beta *ir.Value
	cur := root
	if cur.Kind == "add" {
		for i := 0; i < 2; i++ {
			if m := cur.Operands[i].Def; m != nil && (m.Kind == "mul" || m.Kind == "div") {
				beta = cur.Operands[1-i]
				v = cur.Operands[i]
				break
			}
		}
		if beta == nil {
			return "", nil, nil
		}
		if cur = r.def(v, v.Def.Kind); cur == nil {
			return "", nil, nil
		}
	}
	if cur.Kind == "mul" {
		if beta == nil {
			// A bias added next makes the larger chain, matched at the add.
			if us := r.users[root.Results[0]]; len(us) == 1 && us[0].Kind == "add" && !r.result[root.Results[0]] {
				return "", nil, nil
			}
		}
		for i := 0; i < 2; i++ {
			if dv := cur.Operands[i].Def; dv != nil && dv.Kind == "div" {
				gamma = cur.Operands[1-i]
				v = cur.Operands[i]
				break
			}
		}
		if gamma == nil {
			return "", nil, nil
		}
		if cur = r.def(v, "div"); cur == nil {
			return "", nil, nil
		}
	}
	if cur.Kind != "div" {
		return "", nil, nil
	}
	d := r.def(cur.Operands[0], "sub")
	if d == nil {
		return "", nil, nil
	}
	x := d.Operands[0]
	mean := r.def(d.Operands[1], "reduce_mean")
	if mean == nil || mean.Operands[0] != x {
		return "", nil, nil
	}
	axis, ok := trailingKeptAxes(mean)
	if !ok {
		return "", nil, nil
	}
	a, eps, ok := r.rootMeanSquare(cur.Operands[1], d.Results[0])
	if !ok || a != axis {
		return "", nil, nil
	}
	norm := x.Type.Shape[axis:]
	for _, p := range []*ir.Value{gamma, beta} {
		if p != nil && (!p.Type.Shape.Equal(norm) || p.Type.DType != x.Type.DType) {
			return "", nil, nil
		}
	}
	if gamma == nil {
		return "", nil, nil // layer_norm needs a scale: leave the chain
	}
	ops := []*ir.Value{x, gamma}
	if beta != nil {
		ops = append(ops, beta)
	}
	return "layer_norm", ir.Attrs{"axis": ir.IntAttr(int64(axis)), "epsilon": ir.FloatAttr(eps)}, ops
}

// trailingKeptAxes returns the first axis of a keepdims reduction over
// the trailing axes of its operand.
func trailingKeptAxes(op *ir.Op) (int, bool) {
	axes := op.Attr().Ints("axes")
	rank := op.Operands[0].Type.Rank()
	if !op.Attr().Bool("keepdims") || len(axes) == 0 {
		return 0, false
	}
	seen := map[int]bool{}
	for _, a := range axes {
		n, err := ir.NormalizeAxis(a, rank)
		if err != nil {
			return 0, false
		}
		seen[n] = true
	}
	first := rank - len(seen)
	for a := first; a < rank; a++ {
		if !seen[a] {
			return 0, false
		}
	}
	return first, true
}

// isSquareOf matches pow(d, 2) or d * d.
func (r *recognizer) isSquareOf(v, d *ir.Value) bool {
	if p := r.def(v, "pow"); p != nil {
		return p.Operands[0] == d && isConst(p.Operands[1], 2)
	}
	if m := r.def(v, "mul"); m != nil {
		return m.Operands[0] == d && m.Operands[1] == d
	}
	return false
}

// linearWeight rewrites matmul(a, transpose(w)) with a weight matrix w
// (how exporters write a Linear layer) as a gemm that reads w transposed,
// with a's batch folded into rows: the transposed copy of w, which the
// backward pass would keep alive, is not made. It returns the new ops
// (the last computes the matmul's result), or nil.
func linearWeight(f *ir.Func, op *ir.Op) []*ir.Op {
	if op.Kind != "matmul" {
		return nil
	}
	a, t := op.Operands[0], op.Operands[1]
	if t.Def == nil || t.Def.Kind != "transpose" || t.Type.Rank() != 2 || a.Type.Rank() < 2 || !a.Type.DType.IsFloat() {
		return nil
	}
	if p := t.Def.Attr().Ints("perm"); len(p) != 2 || p[0] != 1 || p[1] != 0 {
		return nil
	}
	w := t.Def.Operands[0]
	k, n := t.Type.Shape[0], t.Type.Shape[1]
	if k == 0 || n == 0 {
		return nil
	}
	rows := a.Type.NumElements() / k
	var ops []*ir.Op
	in := a
	name := op.Results[0].Name
	if a.Type.Rank() != 2 {
		r, err := f.NewOp("reshape", []*ir.Value{a}, ir.Attrs{"shape": ir.IntsAttr(rows, k)}, op.Loc, name+".rows")
		if err != nil {
			return nil
		}
		ops, in = append(ops, r), r.Results[0]
	}
	g, err := f.NewOp("gemm", []*ir.Value{in, w}, ir.Attrs{"trans_b": ir.BoolAttr(true)}, op.Loc, name+".gemm")
	if err != nil {
		return nil
	}
	ops = append(ops, g)
	if a.Type.Rank() != 2 {
		shape := append(a.Type.Shape[:a.Type.Rank()-1:a.Type.Rank()-1], n)
		r, err := f.NewOp("reshape", []*ir.Value{g.Results[0]}, ir.Attrs{"shape": ir.IntsAttr(shape...)}, op.Loc, name+".out")
		if err != nil {
			return nil
		}
		ops = append(ops, r)
	}
	if !ops[len(ops)-1].Results[0].Type.Equal(op.Results[0].Type) {
		return nil
	}
	return ops
}

// rmsNormChain: x * rsqrt(mean(x^2) + eps) * w (rsqrt as reciprocal of
// sqrt or 1 / sqrt), or x / sqrt(mean(x^2) + eps) * w, over trailing
// axes: layer_norm with center = false.
func rmsNormChain(r *recognizer, root *ir.Op) (string, ir.Attrs, []*ir.Value) {
	if root.Kind != "mul" {
		return "", nil, nil
	}
	fs := r.factors(root.Results[0], true)
	var x, w, s *ir.Value
	switch len(fs) {
	case 2:
		for i := 0; i < 2; i++ {
			if d := r.def(fs[i], "div"); d != nil {
				x, s, w = d.Operands[0], d.Operands[1], fs[1-i]
				break
			}
		}
	case 3:
		for i := 0; i < 3; i++ {
			if inv := r.reciprocal(fs[i]); inv != nil {
				s = inv
				rest := append(append([]*ir.Value{}, fs[:i]...), fs[i+1:]...)
				x, w = rest[0], rest[1]
				if !r.isMeanSquare(s, x) {
					x, w = w, x
				}
				break
			}
		}
	}
	if s == nil || x == nil {
		return "", nil, nil
	}
	if d := x.Def; d != nil && d.Kind == "sub" && d.Operands[1].Def != nil && d.Operands[1].Def.Kind == "reduce_mean" && d.Operands[1].Def.Operands[0] == d.Operands[0] {
		return "", nil, nil // x - mean(x): a LayerNorm, matched at its end
	}
	axis, eps, ok := r.rootMeanSquare(s, x)
	if !ok || !w.Type.Shape.Equal(x.Type.Shape[axis:]) || w.Type.DType != x.Type.DType {
		return "", nil, nil
	}
	return "layer_norm", ir.Attrs{"axis": ir.IntAttr(int64(axis)), "epsilon": ir.FloatAttr(eps), "center": ir.BoolAttr(false)}, []*ir.Value{x, w}
}

// rootMeanSquare matches s = sqrt(mean(d^2) + eps), the mean over
// trailing axes from axis on and kept, and returns axis and eps.
func (r *recognizer) rootMeanSquare(s, d *ir.Value) (int, float64, bool) {
	sq := r.def(s, "sqrt")
	if sq == nil {
		return 0, 0, false
	}
	plus := r.def(sq.Operands[0], "add")
	if plus == nil {
		return 0, 0, false
	}
	for i := 0; i < 2; i++ {
		eps := constOf(plus.Operands[1-i])
		m := r.def(plus.Operands[i], "reduce_mean")
		if eps == nil || eps.Len() != 1 || m == nil || !r.isSquareOf(m.Operands[0], d) {
			continue
		}
		if axis, ok := trailingKeptAxes(m); ok {
			return axis, eps.Float(0), true
		}
	}
	return 0, 0, false
}

// reciprocal matches reciprocal(v) or 1 / v and returns v.
func (r *recognizer) reciprocal(v *ir.Value) *ir.Value {
	if op := r.def(v, "reciprocal"); op != nil {
		return op.Operands[0]
	}
	if op := r.def(v, "div"); op != nil && isConst(op.Operands[0], 1) {
		return op.Operands[1]
	}
	return nil
}

// isMeanSquare reports whether s is sqrt(mean(x^2) + eps), without
// adding to the chain (a probe for which factor is x).
func (r *recognizer) isMeanSquare(s, x *ir.Value) bool {
	sq := s.Def
	if sq == nil || sq.Kind != "sqrt" || sq.Operands[0].Def == nil || sq.Operands[0].Def.Kind != "add" {
		return false
	}
	for _, v := range sq.Operands[0].Def.Operands {
		if m := v.Def; m != nil && m.Kind == "reduce_mean" {
			in := m.Operands[0].Def
			if in != nil && (in.Kind == "pow" || in.Kind == "mul") && in.Operands[0] == x {
				return true
			}
		}
	}
	return false
}
