package parallel

import (
	"fmt"
	"slices"

	"github.com/kiln-compiler/kiln/ir"
)

// Tensor parallelism (Megatron-LM): the weights of each pair of matrix
// products joined by elementwise ops (an MLP block: x·W1 + b1, an
// activation, ·W2) are split across the n ranks of a tensor-parallel
// group, W1 by columns (and b1 with them), W2 by rows. Each rank then
// computes its columns of the hidden layer without communicating, and
// its partial product with W2, which one all_reduce sums; in the
// backward, the product with W1's transpose is the partial one. The
// gradients of the split weights come out split, so each rank updates
// its own part of them and of their optimizer state.
//
// The rewrite propagates a sharding through the whole step, forward,
// backward and updates: each value is replicated, split along one
// dimension, or a partial sum. Elementwise ops, transposes, matrix
// products and sums follow rules that keep parts local; any other op
// reads whole values, gathered (all_gather) or summed (all_reduce) first,
// so the step computes what one device does whatever it holds.

// sharding is how a rank holds a value: whole (dim < 0, not partial),
// its part along dim, or a partial sum of the whole.
type sharding struct {
	dim     int
	partial bool
}

var replicated = sharding{dim: -1}

// tensorParallel rewrites f into the SPMD step of one rank of n
// tensor-parallel ranks (groups of stride stride). It returns how many
// weights it split; on error f is unchanged.
func tensorParallel(f *ir.Func, n, stride int64) (int, error) {
	g := f.Clone()
	splits := megatronSplits(g, n)
	if len(splits) == 0 {
		return 0, fmt.Errorf("no pair of matrix products joined by elementwise ops has weights that %d ranks divide (tensor parallelism splits MLP blocks)", n)
	}
	tp := &tensorRewrite{f: g, n: n, stride: stride, state: map[*ir.Value]sharding{}, local: map[*ir.Value]*ir.Value{},
		whole: map[*ir.Value]*ir.Value{}}
	if err := tp.run(splits); err != nil {
		return 0, err
	}
	*f = *g
	return len(splits), nil
}

// megatronSplits chooses the weights to split: for each forward matrix
// product by a 2-D parameter W1 whose output dimension n divides, the
// values its result reaches through elementwise ops (and reshapes that
// keep that dimension last); where one of them is
// multiplied by a 2-D parameter W2 over that dimension, W1 splits by
// columns, W2 by rows, and each 1-D parameter of that length added on the
// way (a bias, perhaps through expand) with W1. It maps each weight to the dimension it splits.
func megatronSplits(f *ir.Func, n int64) map[*ir.Value]int {
	bwd := backwardOps(f)
	users := map[*ir.Value][]*ir.Op{}
	for _, op := range f.Body {
		for _, x := range op.Operands {
			users[x] = append(users[x], op)
		}
	}
	isParam := func(v *ir.Value, rank int) bool {
		return v.Arg != nil && v.Arg.Kind == ir.ArgParam && v.Type.Rank() == rank
	}
	// weight is a product's 2-D parameter operand, the dimension of its
	// output columns and of its contraction; ok false for other ops.
	weight := func(op *ir.Op) (w *ir.Value, out, in int, ok bool) {
		if op.Kind == "matmul" && len(op.Operands) == 2 {
			// nn.Linear as exported: x · transpose(W).
			if t := op.Operands[1].Def; t != nil && t.Kind == "transpose" && isParam(t.Operands[0], 2) && slices.Equal(t.Attr().Ints("perm"), []int64{1, 0}) {
				return t.Operands[0], 0, 1, true
			}
		}
		switch {
		case op.Kind == "matmul" && len(op.Operands) == 2 && isParam(op.Operands[1], 2):
			return op.Operands[1], 1, 0, true
		case op.Kind == "gemm" && len(op.Operands) == 2 && isParam(op.Operands[1], 2) && !op.Attr().Bool("trans_a"):
			if op.Attr().Bool("trans_b") {
				return op.Operands[1], 0, 1, true
			}
			return op.Operands[1], 1, 0, true
		}
		return nil, 0, 0, false
	}
	splits := map[*ir.Value]int{}
	for _, op := range f.Body {
		w1, out, _, ok := weight(op)
		if !ok || bwd[op] || w1.Type.Shape[out]%n != 0 {
			continue
		}
		width := w1.Type.Shape[out]
		var biases []*ir.Value
		var w2 *ir.Value
		w2dim := 0
		seen := map[*ir.Value]bool{op.Results[0]: true}
		queue := []*ir.Value{op.Results[0]}
		for len(queue) > 0 && w2 == nil {
			v := queue[0]
			queue = queue[1:]
			for _, u := range users[v] {
				if bwd[u] {
					continue
				}
				if w, _, in, ok := weight(u); ok && u.Operands[0] == v && w.Type.Shape[in] == width && w != w1 {
					w2, w2dim = w, in
					break
				}
				// Elementwise ops, and reshapes that keep the columns last
				// (a batch folded into rows for a gemm, and back).
				d := u.Def()
				switch {
				case d == nil || len(u.Results) != 1:
					continue
				case u.Kind == "reshape":
					if s := u.Results[0].Type.Shape; len(s) == 0 || s[len(s)-1] != width {
						continue
					}
				case !elementwiseClass(d) || d.Impure || isRandom(u) || !u.Results[0].Type.Shape.Equal(v.Type.Shape):
					continue
				}
				for _, x := range u.Operands {
					// A bias, perhaps broadcast by expand first.
					for x.Def != nil && x.Def.Kind == "expand" {
						x = x.Def.Operands[0]
					}
					if isParam(x, 1) && x.Type.Shape[0] == width {
						biases = append(biases, x)
					}
				}
				if r := u.Results[0]; !seen[r] {
					seen[r] = true
					queue = append(queue, r)
				}
			}
		}
		if w2 == nil || w2.Type.Shape[w2dim]%n != 0 {
			continue
		}
		if _, taken := splits[w1]; taken {
			continue
		}
		if _, taken := splits[w2]; taken {
			continue
		}
		splits[w1], splits[w2] = out, w2dim
		for _, b := range biases {
			splits[b] = 0
		}
	}
	return splits
}

// tensorRewrite carries the rewrite of one function.
type tensorRewrite struct {
	f         *ir.Func
	n, stride int64
	body      []*ir.Op
	state     map[*ir.Value]sharding  // of the new values
	local     map[*ir.Value]*ir.Value // old value -> the rank's value
	whole     map[*ir.Value]*ir.Value // new value -> its replicated form, made once
}

func (tp *tensorRewrite) emit(kind string, operands []*ir.Value, attrs ir.Attrs, loc ir.Location, name string) (*ir.Op, error) {
	op, err := tp.f.NewOp(kind, operands, attrs, loc, name)
	if err != nil {
		return nil, err
	}
	tp.body = append(tp.body, op)
	return op, nil
}

// replicate is v (a new value) whole on every rank: all-gathered along
// its split dimension, or its partial sums all-reduced.
func (tp *tensorRewrite) replicate(v *ir.Value, loc ir.Location) (*ir.Value, error) {
	s := tp.state[v]
	if s.dim < 0 && !s.partial {
		return v, nil
	}
	if w, ok := tp.whole[v]; ok {
		return w, nil
	}
	group := ir.Attrs{"size": ir.IntAttr(tp.n), "stride": ir.IntAttr(tp.stride)}
	var op *ir.Op
	var err error
	if s.partial {
		op, err = tp.emit("all_reduce", []*ir.Value{v}, group, loc, v.Name+".sum")
	} else {
		group["axis"] = ir.IntAttr(int64(s.dim))
		op, err = tp.emit("all_gather", []*ir.Value{v}, group, loc, v.Name+".whole")
	}
	if err != nil {
		return nil, err
	}
	w := op.Results[0]
	tp.state[w] = replicated
	tp.whole[v] = w
	return w, nil
}

func (tp *tensorRewrite) run(splits map[*ir.Value]int) error {
	f := tp.f
	// Updates write their parameter's state beside it: split alike.
	for _, op := range f.Body {
		d := op.Def()
		if d == nil || len(d.Writes) == 0 {
			continue
		}
		if dim, ok := splits[op.Operands[d.Writes[0]]]; ok {
			for _, k := range d.Writes[1:] {
				splits[op.Operands[k]] = dim
			}
		}
	}
	for _, a := range append([]*ir.Value(nil), f.Args...) {
		if dim, ok := splits[a]; ok {
			part := shardArg(f, a, ir.ShardLevel{Dim: int64(dim), Size: tp.n, Stride: tp.stride})
			tp.local[a], tp.state[part] = part, sharding{dim: dim}
		} else {
			tp.local[a], tp.state[a] = a, replicated
		}
	}
	for _, op := range f.Body {
		if err := tp.rewrite(op); err != nil {
			return fmt.Errorf("tensor parallel: %s defining %s: %v", op.Kind, resultRef(op), err)
		}
	}
	for i, r := range f.Results {
		v, err := tp.replicate(tp.local[r.Value], ir.Location{})
		if err != nil {
			return err
		}
		f.Results[i].Value = v
	}
	f.Body = tp.body
	return nil
}

func resultRef(op *ir.Op) string {
	if len(op.Results) == 0 {
		return "nothing"
	}
	return op.Results[0].Ref()
}

// rewrite emits op for one rank: on the rank's parts where a rule keeps
// them local, else on whole operands.
func (tp *tensorRewrite) rewrite(op *ir.Op) error {
	in := make([]*ir.Value, len(op.Operands))
	st := make([]sharding, len(op.Operands))
	for i, x := range op.Operands {
		in[i] = tp.local[x]
		st[i] = tp.state[in[i]]
	}
	out, attrs, ok := tp.rule(op, in, st)
	if !ok {
		// Whole operands: the op computes what one device does.
		for i := range in {
			w, err := tp.replicate(in[i], op.Loc)
			if err != nil {
				return err
			}
			in[i] = w
		}
		out, attrs = replicated, op.Attrs
	}
	if d := op.Def(); d != nil && len(d.Writes) > 0 {
		// An update writes its arguments in place: they must be the rank's
		// own (its part, or whole on every rank).
		for _, k := range d.Writes {
			if in[k] != tp.local[op.Operands[k]] {
				return fmt.Errorf("it updates %s, which this rank holds in part, from whole operands", op.Operands[k].Ref())
			}
		}
	}
	name := ""
	if len(op.Results) > 0 {
		name = op.Results[0].Name
	}
	nop, err := tp.emit(op.Kind, in, attrs, op.Loc, name)
	if err != nil {
		return err
	}
	for j, r := range op.Results {
		nop.Results[j].Name = r.Name // r leaves the body
		tp.local[r] = nop.Results[j]
		tp.state[nop.Results[j]] = out
	}
	return nil
}

// rule is how op runs on the rank's parts: its result's sharding and
// attributes; ok is false when no rule keeps the operands local.
func (tp *tensorRewrite) rule(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	any := false
	for _, s := range st {
		if s.dim >= 0 || s.partial {
			any = true
		}
	}
	if !any {
		return replicated, op.Attrs, true
	}
	d := op.Def()
	if d == nil || d.Impure && len(d.Writes) == 0 {
		return replicated, nil, false
	}
	switch {
	case len(d.Writes) > 0:
		// An optimizer update: every tensor operand split alike.
		s := st[0]
		for i, x := range in {
			if x.Type.Rank() > 0 && st[i] != s {
				return replicated, nil, false
			}
		}
		return s, op.Attrs, s.dim >= 0
	case op.Kind == "matmul" || op.Kind == "gemm":
		return tp.product(op, in, st)
	case op.Kind == "transpose":
		if st[0].partial {
			return replicated, nil, false
		}
		perm := op.Attr().Ints("perm")
		return sharding{dim: slices.Index(perm, int64(st[0].dim))}, op.Attrs, true
	case op.Kind == "reshape":
		return tp.reshape(op, in, st)
	case op.Kind == "reduce_sum" || op.Kind == "sum_to":
		return tp.sum(op, in, st)
	case op.Kind == "expand":
		return tp.expand(op, in, st)
	case elementwiseClass(d) && len(op.Results) == 1 && !isRandom(op):
		return tp.elementwise(op, in, st)
	}
	return replicated, nil, false
}

// elementwiseClass reports whether ops of d compute each result element
// from the operands' elements at its position, broadcasting them aligned
// at the right as numpy does. batch_norm_infer aligns its statistics
// with the channel axis instead, and expand's shape attribute names the
// whole result: neither is one.
func elementwiseClass(d *ir.OpDef) bool {
	return d.Fusion == ir.Elementwise || d.Fusion == ir.Broadcast && d.Name != "batch_norm_infer" && d.Name != "expand"
}

// expand keeps a broadcast local when its operand's split dimension is
// not one it broadcasts: the rank's part broadcasts to its part of the
// result.
func (tp *tensorRewrite) expand(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	s := st[0]
	if s.partial {
		return replicated, nil, false
	}
	out := op.Results[0].Type.Shape
	dim := s.dim + len(out) - in[0].Type.Rank()
	if op.Operands[0].Type.Shape[s.dim] != out[dim] {
		return replicated, nil, false
	}
	shape := op.Attr().Ints("shape")
	at := dim - (len(out) - len(shape))
	attrs := op.Attrs
	if at >= 0 && shape[at] != 1 {
		local := slices.Clone(shape)
		local[at] /= tp.n
		attrs = op.Attrs.Clone()
		attrs["shape"] = ir.IntsAttr(local...)
	}
	return sharding{dim: dim}, attrs, true
}

// isRandom reports whether op draws random numbers (a mask of its own
// per part would differ from the whole's).
func isRandom(op *ir.Op) bool {
	_, seeded := op.Attrs["seed"]
	return seeded
}

// elementwise keeps an elementwise op local when every operand split is
// split along the same dimension of the result and every whole operand
// broadcasts along it.
func (tp *tensorRewrite) elementwise(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	rank := op.Results[0].Type.Rank()
	dim := -1
	for i, s := range st {
		if s.partial {
			return replicated, nil, false
		}
		if s.dim >= 0 {
			d := s.dim + rank - in[i].Type.Rank()
			if dim >= 0 && d != dim {
				return replicated, nil, false
			}
			dim = d
		}
	}
	for i, s := range st {
		if s.dim >= 0 {
			continue
		}
		if at := dim - (rank - in[i].Type.Rank()); at >= 0 && in[i].Type.Shape[at] != 1 {
			return replicated, nil, false // a whole operand along the split: its part is not at hand
		}
	}
	return sharding{dim: dim}, op.Attrs, true
}

// product keeps a matrix product local: by parts of B's columns (or A's
// rows) the result is split alike; by parts of the contraction it is a
// partial sum.
func (tp *tensorRewrite) product(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	a, b := in[0], in[1]
	if st[0].partial || st[1].partial || len(in) > 2 || b.Type.Rank() != 2 {
		return replicated, nil, false
	}
	ta, tb := op.Kind == "gemm" && op.Attr().Bool("trans_a"), op.Kind == "gemm" && op.Attr().Bool("trans_b")
	ar := a.Type.Rank()
	if op.Kind == "gemm" && ar != 2 {
		return replicated, nil, false
	}
	// Which of (rows, contraction) A's split is, and (contraction, columns) B's.
	role := func(s sharding, rank int, trans bool, rowsFirst bool) string {
		switch {
		case s.dim < 0:
			return "whole"
		case s.dim < rank-2:
			return "batch"
		}
		first := s.dim == rank-2
		if trans {
			first = !first
		}
		if first == rowsFirst {
			return "outer"
		}
		return "inner"
	}
	ra, rb := role(st[0], ar, ta, true), role(st[1], 2, tb, false)
	switch {
	case ra == "whole" && rb == "outer": // columns of B
		return sharding{dim: op.Results[0].Type.Rank() - 1}, op.Attrs, true
	case (ra == "outer" || ra == "batch") && rb == "whole": // rows (or batches) of A
		dim := st[0].dim
		if ra == "outer" {
			dim = op.Results[0].Type.Rank() - 2
		}
		return sharding{dim: dim}, op.Attrs, true
	case ra == "inner" && rb == "inner":
		return sharding{dim: -1, partial: true}, op.Attrs, true
	}
	return replicated, nil, false
}

// sum keeps a sum local: over the split dimension it is a partial sum;
// over others the result stays split (its shape attribute, for sum_to,
// the rank's part).
func (tp *tensorRewrite) sum(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	s, x := st[0], in[0]
	if s.partial {
		return replicated, nil, false
	}
	rank := x.Type.Rank()
	if op.Kind == "reduce_sum" {
		axes, err := ir.ReduceAxes(op.Attr(), rank)
		if err != nil {
			return replicated, nil, false
		}
		if slices.Contains(axes, s.dim) {
			return sharding{dim: -1, partial: true}, op.Attrs, true
		}
		if op.Attr().Bool("keepdims") {
			return s, op.Attrs, true
		}
		dim := s.dim
		for _, a := range axes {
			if a < s.dim {
				dim--
			}
		}
		return sharding{dim: dim}, op.Attrs, true
	}
	// sum_to: the target broadcasts to x, aligned at the right.
	target := op.Attr().Ints("shape")
	at := s.dim - (rank - len(target))
	if at < 0 || target[at] == 1 {
		return sharding{dim: -1, partial: true}, op.Attrs, true
	}
	local := slices.Clone(target)
	local[at] /= tp.n
	attrs := op.Attrs.Clone()
	attrs["shape"] = ir.IntsAttr(local...)
	return sharding{dim: at}, attrs, true
}

// reshape keeps a reshape local when it leaves the split dimension and
// every dimension after it as they are (it merges or splits only the
// dimensions before: the batch folded into rows, and back); its shape
// attribute becomes the rank's part.
func (tp *tensorRewrite) reshape(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	s := st[0]
	if s.partial {
		return replicated, nil, false
	}
	from := op.Operands[0].Type.Shape // the whole shapes
	to := op.Results[0].Type.Shape
	tail := len(from) - s.dim
	if tail > len(to) || !slices.Equal(from[s.dim:], to[len(to)-tail:]) {
		return replicated, nil, false
	}
	local := slices.Clone(to)
	at := len(to) - tail
	local[at] /= tp.n
	attrs := op.Attrs.Clone()
	attrs["shape"] = ir.IntsAttr(local...)
	return sharding{dim: at}, attrs, true
}
