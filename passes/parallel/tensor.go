package parallel

import (
	"errors"
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
// its part along dim, or a partial sum of the whole. With outer > 1, dim
// is outer equal segments and the rank holds its part of each, in order
// (the heads of each row of a batch-major [B·H] dimension, or of each of
// the query, key and value rows of a fused projection).
type sharding struct {
	dim     int
	outer   int64 // 0 for one segment
	partial bool
}

var replicated = sharding{dim: -1}

// splitAt is the part along dim of each of outer segments.
func splitAt(dim int, outer int64) sharding {
	if outer <= 1 {
		outer = 0
	}
	return sharding{dim: dim, outer: outer}
}

func (s sharding) segments() int64 { return max(s.outer, 1) }

// split is how a weight is split: along dim, in each of outer segments;
// weights split for one block share a group.
type split struct {
	dim   int
	outer int64
	group int
	first bool // the block's first product (split by columns)
}

// tensorParallel rewrites f into the SPMD step of one rank of n
// tensor-parallel ranks (groups of stride stride). It returns how many
// weights it split; on error f is unchanged.
//
// A block whose split weight would be gathered whole, or updated from a
// whole gradient (its heads are fewer than the ranks, or more than they
// divide, so the propagation gathered them), stays whole: the rewrite
// runs again without it.
func tensorParallel(f *ir.Func, n, stride int64) (int, error) {
	return tensorParallelTraced(f, n, stride, nil)
}

// tensorParallelTraced is tensorParallel recording in trace (when not
// nil) the op of f each op of the rewritten step comes from (the ops its
// rewrite emitted); the results' gathers at the end have none.
func tensorParallelTraced(f *ir.Func, n, stride int64, trace map[*ir.Op]*ir.Op) (int, error) {
	banned := map[*ir.Value]bool{} // weights that failed as a block's first
	for {
		splits := megatronSplits(f, n, banned)
		if len(splits) == 0 {
			return 0, fmt.Errorf("no block splits over %d ranks: no pair of matrix products joined by elementwise ops (an MLP block) or by attention heads that %d ranks divide", n, n)
		}
		g := f.Clone()
		own := map[*ir.Value]split{}
		for i, a := range f.Args {
			if sp, ok := splits[a]; ok {
				own[g.Args[i]] = sp
			}
		}
		tp := &tensorRewrite{f: g, n: n, stride: stride, state: map[*ir.Value]sharding{}, local: map[*ir.Value]*ir.Value{},
			whole: map[*ir.Value]*ir.Value{}, origin: map[*ir.Op]*ir.Op{}, scales: map[*ir.Value]*ir.Value{}}
		orig := map[*ir.Op]*ir.Op{} // g's ops (a clone) -> f's
		for i, op := range g.Body {
			orig[op] = f.Body[i]
		}
		err := tp.run(own)
		var whole *needsWhole
		switch {
		case err == nil:
			if trace != nil {
				for op, o := range tp.origin {
					trace[op] = orig[o]
				}
			}
			*f = *g
			return len(splits), nil
		case !errors.As(err, &whole):
			return 0, err
		}
		sp, ok := splits[f.Args[whole.arg]]
		if !ok {
			return 0, err
		}
		for w, s := range splits {
			if s.group == sp.group && s.first {
				banned[w] = true
			}
		}
	}
}

// needsWhole is the error of an op that needs whole the split argument
// arg: it gathers it, or updates it from whole operands.
type needsWhole struct {
	arg  int
	name string
}

func (e *needsWhole) Error() string {
	return fmt.Sprintf("it needs %%%s, which this rank holds in part, whole", e.name)
}

// megatronSplits chooses the weights to split. From each forward
// matrix product by a 2-D parameter W1, it follows the values the result
// reaches in the forward through elementwise ops, reshapes, transposes,
// slices, softmaxes and products of two activations (an attention
// block's heads); where one of them is the left operand of a product by
// another 2-D parameter W2 whose contraction extent e divides W1's output
// width w, W1 splits by output columns in w/e segments (the query, key
// and value of a fused projection), W2 by rows, and each 1-D parameter
// of width w added on the way (a bias, perhaps through expand) with W1.
// Several W1 may share a W2 (the query, key and value projections of one
// attention). The sharding propagation decides what stays local: a
// split that heads do not follow costs gathers, never a wrong result.
func megatronSplits(f *ir.Func, n int64, banned map[*ir.Value]bool) map[*ir.Value]split {
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
		case op.Kind == "gemm" && len(op.Operands) >= 2 && isParam(op.Operands[1], 2) && !op.Attr().Bool("trans_a"):
			if op.Attr().Bool("trans_b") {
				return op.Operands[1], 0, 1, true
			}
			return op.Operands[1], 1, 0, true
		}
		return nil, 0, 0, false
	}
	// follows reports whether the search goes on from v through u: not
	// through a product by another weight, nor an elementwise op that
	// broadcasts v.
	follows := func(v *ir.Value, u *ir.Op) bool {
		d := u.Def()
		if d == nil || d.Impure || isRandom(u) && u.Kind != "dropout" {
			return false
		}
		switch u.Kind {
		case "split":
			return true
		case "reshape", "transpose", "slice", "softmax", "log_softmax":
			return len(u.Results) == 1
		case "matmul":
			_, _, _, byWeight := weight(u)
			return !byWeight
		}
		return elementwiseClass(d) && u.Results[0].Type.Shape.Equal(v.Type.Shape)
	}
	splits := map[*ir.Value]split{}
	for _, op := range f.Body {
		w1, out, _, ok := weight(op)
		if !ok || bwd[op] || w1.Type.Shape[out]%n != 0 || banned[w1] {
			continue
		}
		if _, taken := splits[w1]; taken {
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
				if w, _, in, ok := weight(u); ok && u.Operands[0] == v && width%w.Type.Shape[in] == 0 && w != w1 {
					w2, w2dim = w, in
					break
				}
				if !follows(v, u) {
					continue
				}
				for _, x := range u.Operands {
					// A bias, perhaps broadcast by expand first.
					for x.Def != nil && x.Def.Kind == "expand" {
						x = x.Def.Operands[0]
					}
					if isParam(x, 1) && x.Type.Shape[0] == width && u.Kind == "add" {
						biases = append(biases, x)
					}
				}
				for _, r := range u.Results {
					if !seen[r] {
						seen[r] = true
						queue = append(queue, r)
					}
				}
			}
		}
		if w2 == nil || w2.Type.Shape[w2dim]%n != 0 {
			continue
		}
		outer := width / w2.Type.Shape[w2dim]
		if width%(outer*n) != 0 {
			continue
		}
		group := len(splits)
		if s, taken := splits[w2]; taken {
			if s.dim != w2dim {
				continue
			}
			group = s.group // another projection of the same attention
		}
		splits[w1], splits[w2] = split{dim: out, outer: outer, group: group, first: true}, split{dim: w2dim, group: group}
		for _, b := range biases {
			splits[b] = split{outer: outer, group: group}
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
	readers   map[*ir.Value][]*ir.Op  // old value -> the ops that read it
	origin    map[*ir.Op]*ir.Op       // new op -> the old op whose rewrite emitted it
	scales    map[*ir.Value]*ir.Value // a split dropout's mask (old) -> the rank's part of its scale
	current   *ir.Op                  // the old op being rewritten
}

// sumsOnly reports whether only additions and subtractions read v (an
// old value).
func (tp *tensorRewrite) sumsOnly(v *ir.Value) bool {
	for _, u := range tp.readers[v] {
		if u.Kind != "add" && u.Kind != "sub" {
			return false
		}
	}
	return len(tp.readers[v]) > 0
}

func (tp *tensorRewrite) emit(kind string, operands []*ir.Value, attrs ir.Attrs, loc ir.Location, name string) (*ir.Op, error) {
	op, err := tp.f.NewOp(kind, operands, attrs, loc, name)
	if err != nil {
		return nil, err
	}
	tp.body = append(tp.body, op)
	if tp.current != nil {
		tp.origin[op] = tp.current
	}
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
	if v.Arg != nil {
		return nil, &needsWhole{arg: v.Index, name: v.Name}
	}
	group := ir.Attrs{"size": ir.IntAttr(tp.n), "stride": ir.IntAttr(tp.stride)}
	var op *ir.Op
	var err error
	switch {
	case s.partial:
		op, err = tp.emit("all_reduce", []*ir.Value{v}, group, loc, v.Name+".sum")
	case s.outer > 1:
		// Each segment's parts gathered in place: the rank's dimension as
		// [segments, part], gathered along the part, then merged again.
		shape := v.Type.Shape
		seg := slices.Concat(shape[:s.dim], []int64{s.outer, shape[s.dim] / s.outer}, shape[s.dim+1:])
		var view *ir.Op
		if view, err = tp.emit("reshape", []*ir.Value{v}, ir.Attrs{"shape": ir.IntsAttr(seg...)}, loc, v.Name+".segments"); err != nil {
			return nil, err
		}
		group["axis"] = ir.IntAttr(int64(s.dim + 1))
		var g *ir.Op
		if g, err = tp.emit("all_gather", view.Results, group, loc, v.Name+".whole_segments"); err != nil {
			return nil, err
		}
		whole := slices.Clone(shape)
		whole[s.dim] *= tp.n
		op, err = tp.emit("reshape", g.Results, ir.Attrs{"shape": ir.IntsAttr(whole...)}, loc, v.Name+".whole")
	default:
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

func (tp *tensorRewrite) run(splits map[*ir.Value]split) error {
	f := tp.f
	// Updates write their parameter's state beside it: split alike.
	for _, op := range f.Body {
		d := op.Def()
		if d == nil || len(d.Writes) == 0 {
			continue
		}
		if sp, ok := splits[op.Operands[d.Writes[0]]]; ok {
			for _, k := range d.Writes[1:] {
				splits[op.Operands[k]] = sp
			}
		}
	}
	for _, a := range append([]*ir.Value(nil), f.Args...) {
		if sp, ok := splits[a]; ok {
			part := shardArg(f, a, ir.ShardLevel{Dim: int64(sp.dim), Size: tp.n, Stride: tp.stride, Outer: sp.outer})
			tp.local[a], tp.state[part] = part, splitAt(sp.dim, sp.outer)
		} else {
			tp.local[a], tp.state[a] = a, replicated
		}
	}
	tp.readers = map[*ir.Value][]*ir.Op{}
	for _, op := range f.Body {
		for _, x := range op.Operands {
			tp.readers[x] = append(tp.readers[x], op)
		}
	}
	for _, op := range f.Body {
		tp.current = op
		if err := tp.rewrite(op); err != nil {
			return fmt.Errorf("tensor parallel: %s defining %s: %w", op.Kind, resultRef(op), err)
		}
	}
	tp.current = nil
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
	if op.Kind == "dropout" || op.Kind == "dropout_grad" {
		if done, err := tp.dropout(op, in, st); done || err != nil {
			return err
		}
	}
	if op.Kind == "gemm" && len(in) == 3 && st[2] == replicated {
		if done, err := tp.rowProductWithBias(op, in, st); done || err != nil {
			return err
		}
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
				p := op.Operands[d.Writes[0]] // the parameter
				return &needsWhole{arg: p.Index, name: p.Name}
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
	if (op.Kind == "reshape" || op.Kind == "transpose") && st[0].partial && len(tp.readers[op.Operands[0]]) == 1 && tp.sumsOnly(op.Results[0]) {
		// A partial sum's view is the view's partial sum (the shapes are
		// the whole's). Where the view is added to another partial sum
		// (the input gradients of two column products: an MLP's gate
		// and up projections) one all_reduce then serves both.
		return st[0], op.Attrs, true
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
		return splitAt(slices.Index(perm, int64(st[0].dim)), st[0].outer), op.Attrs, true
	case op.Kind == "reshape":
		return tp.reshape(op, in, st)
	case op.Kind == "slice" || op.Kind == "slice_grad":
		return tp.slice(op, in, st)
	case op.Kind == "split":
		return tp.splitOp(op, in, st)
	case op.Kind == "concat":
		return tp.concat(op, in, st)
	case op.Kind == "softmax" || op.Kind == "log_softmax" || op.Kind == "softmax_grad" || op.Kind == "log_softmax_grad":
		// Along an axis the rank holds whole.
		s := st[0]
		for _, t := range st {
			if t != s {
				return replicated, nil, false
			}
		}
		axis, err := ir.NormalizeAxis(op.Attr().Int("axis"), in[0].Type.Rank())
		if err != nil || s.partial || axis == s.dim {
			return replicated, nil, false
		}
		return s, op.Attrs, true
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
	return splitAt(dim, s.outer), attrs, true
}

// isRandom reports whether op draws random numbers (a mask of its own
// per part would differ from the whole's).
func isRandom(op *ir.Op) bool {
	_, seeded := op.Attrs["seed"]
	return seeded
}

// elementwise keeps an elementwise op local when every operand split is
// split alike along the same dimension of the result and every whole
// operand broadcasts along it; a sum or difference of partial sums is a
// partial sum.
func (tp *tensorRewrite) elementwise(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	rank := op.Results[0].Type.Rank()
	if op.Kind == "add" || op.Kind == "sub" {
		partial := true
		for i, s := range st {
			partial = partial && s.partial && in[i].Type.Shape.Equal(op.Results[0].Type.Shape)
		}
		if partial {
			return sharding{dim: -1, partial: true}, op.Attrs, true
		}
	}
	dim, outer := -1, int64(0)
	for i, s := range st {
		if s.partial {
			return replicated, nil, false
		}
		if s.dim >= 0 {
			d := s.dim + rank - in[i].Type.Rank()
			if dim >= 0 && (d != dim || s.outer != outer) {
				return replicated, nil, false
			}
			dim, outer = d, s.outer
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
	return splitAt(dim, outer), op.Attrs, true
}

// product keeps a matrix product local: by parts of B's columns (or A's
// rows) the result is split alike; by parts of the contraction it is a
// partial sum; with both operands split alike along a batch dimension
// (an attention's heads) the result is split along it too.
func (tp *tensorRewrite) product(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	a, b := in[0], in[1]
	if st[0].partial || st[1].partial || len(in) > 2 {
		return replicated, nil, false
	}
	ta, tb := op.Kind == "gemm" && op.Attr().Bool("trans_a"), op.Kind == "gemm" && op.Attr().Bool("trans_b")
	ar, br := a.Type.Rank(), b.Type.Rank()
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
	ra, rb := role(st[0], ar, ta, true), role(st[1], br, tb, false)
	out := op.Results[0].Type.Rank()
	switch {
	case br > 2 && ra == "batch" && rb == "batch" && ar == br && st[0] == st[1]:
		return st[0], op.Attrs, true
	case br > 2:
		return replicated, nil, false
	case ra == "whole" && rb == "outer": // columns of B
		return splitAt(out-1, st[1].outer), op.Attrs, true
	case (ra == "outer" || ra == "batch") && rb == "whole": // rows (or batches) of A
		dim := st[0].dim
		if ra == "outer" {
			dim = out - 2
		}
		return splitAt(dim, st[0].outer), op.Attrs, true
	case ra == "inner" && rb == "inner" && st[0].outer == st[1].outer:
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
		return splitAt(dim, s.outer), op.Attrs, true
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
	return splitAt(at, s.outer), attrs, true
}

// reshape keeps a reshape local when the rank's digit of the flat index
// (which part of each segment it holds) lies within one dimension of the
// result: merging or splitting the dimensions around it (a batch folded
// into rows and back, or a width cut into heads, whose [B·H] dimension
// then holds the rank's heads of every batch row). The shape attribute
// becomes the rank's part.
func (tp *tensorRewrite) reshape(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	s := st[0]
	if s.partial {
		return replicated, nil, false
	}
	from := op.Operands[0].Type.Shape // the whole shapes
	to := op.Results[0].Type.Shape
	blk := from[s.dim] / (s.segments() * tp.n) // a rank's part of a segment
	after, _ := from[s.dim+1:].NumElements()   // shapes are checked: no overflow
	sigma := blk * after                       // the flat stride of the rank's digit
	for j := len(to) - 1; j >= 0; j-- {
		below, _ := to[j+1:].NumElements()
		if sigma%below != 0 {
			break
		}
		inner := sigma / below
		if to[j]%(inner*tp.n) != 0 {
			continue
		}
		local := slices.Clone([]int64(to))
		local[j] /= tp.n
		attrs := op.Attrs.Clone()
		attrs["shape"] = ir.IntsAttr(local...)
		return splitAt(j, to[j]/(inner*tp.n)), attrs, true
	}
	return replicated, nil, false
}

// slice keeps a slice (or its gradient, slice_grad) local along a
// dimension other than the split one; along the split one when it takes
// whole segments (the query of a fused projection: the rank's heads of
// it), the result's segments being those it took.
func (tp *tensorRewrite) slice(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	s := st[0]
	if s.partial {
		return replicated, nil, false
	}
	grad := op.Kind == "slice_grad"
	whole := op.Operands[0].Type.Shape
	if grad {
		whole = ir.Shape(op.Attr().Ints("input_shape"))
	}
	sl, err := ir.SliceOf(whole, op.Attr())
	if err != nil {
		return replicated, nil, false
	}
	d := s.dim
	attrs := op.Attrs.Clone()
	if grad {
		local := slices.Clone([]int64(whole))
		local[d] /= tp.n
		attrs["input_shape"] = ir.IntsAttr(local...)
	}
	if sl.Start[d] == 0 && sl.Step[d] == 1 && sl.Out[d] == whole[d] {
		return s, attrs, true // the split dimension is taken whole
	}
	// Segments of the sliced tensor (whole) and of the slice.
	var seg int64
	if grad {
		seg = sl.Out[d] / s.segments()
	} else {
		seg = whole[d] / s.segments()
	}
	if sl.Step[d] != 1 || seg%tp.n != 0 || sl.Start[d]%seg != 0 || sl.Out[d]%seg != 0 || whole[d]%seg != 0 {
		return replicated, nil, false
	}
	axes, ok := sliceAxes(op, len(whole))
	j := slices.Index(axes, d)
	if !ok || j < 0 {
		return replicated, nil, false
	}
	starts, ends := slices.Clone(op.Attr().Ints("starts")), slices.Clone(op.Attr().Ints("ends"))
	starts[j] = sl.Start[d] / tp.n
	ends[j] = starts[j] + sl.Out[d]/tp.n
	attrs["starts"], attrs["ends"] = ir.IntsAttr(starts...), ir.IntsAttr(ends...)
	if grad {
		return splitAt(d, whole[d]/seg), attrs, true
	}
	return splitAt(d, sl.Out[d]/seg), attrs, true
}

// sliceAxes is the normalised axes attribute of a slice of a tensor of
// rank rank (all axes in order when it has none).
func sliceAxes(op *ir.Op, rank int) ([]int, bool) {
	n := len(op.Attr().Ints("starts"))
	raw, named := op.Attrs["axes"]
	out := make([]int, n)
	for i := range out {
		a := int64(i)
		if named {
			vals, ok := raw.Ints()
			if !ok || len(vals) != n {
				return nil, false
			}
			a = vals[i]
		}
		ax, err := ir.NormalizeAxis(a, rank)
		if err != nil {
			return nil, false
		}
		out[i] = ax
	}
	return out, true
}

// rowProductWithBias runs gemm(A, B, C) whose product A·B is a partial
// sum on the rank's parts (a row-parallel linear layer with its bias): the
// partial product, its all_reduce, then beta·C added once. It reports
// whether it did.
func (tp *tensorRewrite) rowProductWithBias(op *ir.Op, in []*ir.Value, st []sharding) (bool, error) {
	out, _, ok := tp.product(op, in[:2], st[:2])
	if !ok || !out.partial {
		return false, nil
	}
	attrs := op.Attrs.Clone()
	delete(attrs, "beta")
	r := op.Results[0]
	prod, err := tp.emit("gemm", in[:2], attrs, op.Loc, r.Name+".partial")
	if err != nil {
		return false, err
	}
	tp.state[prod.Results[0]] = sharding{dim: -1, partial: true}
	sum, err := tp.replicate(prod.Results[0], op.Loc)
	if err != nil {
		return false, err
	}
	c := in[2]
	if beta := op.Attr().Float("beta"); beta != 1 {
		t := ir.Type{DType: c.Type.DType, Shape: ir.Shape{}}
		k, err := tp.emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: t, Floats: []float64{ir.RoundTo(t.DType, beta)}})}, op.Loc, r.Name+".beta")
		if err != nil {
			return false, err
		}
		scaled, err := tp.emit("mul", []*ir.Value{c, k.Results[0]}, nil, op.Loc, r.Name+".bias")
		if err != nil {
			return false, err
		}
		c = scaled.Results[0]
	}
	add, err := tp.emit("add", []*ir.Value{sum, c}, nil, op.Loc, r.Name)
	if err != nil {
		return false, err
	}
	add.Results[0].Name = r.Name // r leaves the body
	tp.local[r], tp.state[add.Results[0]] = add.Results[0], replicated
	return true, nil
}

// splitOp keeps a split local along a dimension other than the split
// one, and along it when each piece is the same whole number of segments
// (a fused projection's query, key and value): each piece is the rank's
// part of its segments.
func (tp *tensorRewrite) splitOp(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	s := st[0]
	axis, err := ir.NormalizeAxis(op.Attr().Int("axis"), in[0].Type.Rank())
	if err != nil || s.partial {
		return replicated, nil, false
	}
	if axis != s.dim {
		return s, op.Attrs, true
	}
	seg := op.Operands[0].Type.Shape[s.dim] / s.segments()
	sizes := op.Attr().Ints("sizes")
	local := make([]int64, len(sizes))
	for i, size := range sizes {
		if size%seg != 0 || size != sizes[0] || seg%tp.n != 0 {
			return replicated, nil, false
		}
		local[i] = size / tp.n
	}
	attrs := op.Attrs.Clone()
	attrs["sizes"] = ir.IntsAttr(local...)
	return splitAt(s.dim, sizes[0]/seg), attrs, true
}

// concat keeps a concatenation local when its operands are split alike:
// along another dimension the result is too; along the split one each
// operand's segments become the result's, in order (the gradient of a
// fused projection's split).
func (tp *tensorRewrite) concat(op *ir.Op, in []*ir.Value, st []sharding) (sharding, ir.Attrs, bool) {
	s := st[0]
	var segments int64
	for i, t := range st {
		if t.partial || t.dim != s.dim || t.dim < 0 {
			return replicated, nil, false
		}
		if op.Operands[i].Type.Shape[t.dim]/t.segments() != op.Operands[0].Type.Shape[s.dim]/s.segments() {
			return replicated, nil, false // segments of another size
		}
		segments += t.segments()
	}
	axis, err := ir.NormalizeAxis(op.Attr().Int("axis"), in[0].Type.Rank())
	if err != nil {
		return replicated, nil, false
	}
	if axis != s.dim {
		for _, t := range st {
			if t != s {
				return replicated, nil, false
			}
		}
		return s, op.Attrs, true
	}
	return splitAt(s.dim, segments), op.Attrs, true
}

// dropout runs a dropout (or its gradient) on the rank's part of a split
// operand with the one-device step's mask: every rank draws the whole
// mask (the dropout of ones of the whole shape: its scale, 0 or
// 1/(1−ratio), from the same seed and indices) and keeps its part, taken
// by a reduce_scatter by max over identical tensors (exact; it moves the
// mask, as an all_gather of the activation would). The mask result is the
// whole mask, on every rank; a gradient reading it multiplies by the
// forward's part. It reports whether it did.
func (tp *tensorRewrite) dropout(op *ir.Op, in []*ir.Value, st []sharding) (bool, error) {
	s := st[0]
	if s.dim < 0 || s.partial {
		return false, nil
	}
	r := op.Results[0]
	var scale *ir.Value
	var key *ir.Value // the random key, as this rank holds it
	if ir.RandomKey(op) != nil {
		key = in[len(in)-1]
	}
	if op.Kind == "dropout_grad" && len(in) == 2 && key == nil {
		if scale = tp.scales[op.Operands[1]]; scale == nil || tp.state[scale] != s {
			return false, nil
		}
	} else {
		var mask *ir.Value
		var err error
		if scale, mask, err = tp.dropoutScale(op, key, op.Operands[0].Type, s); err != nil {
			return false, err
		}
		if op.Kind == "dropout" {
			mask.Name = op.Results[1].Name // the old mask leaves the body
			tp.local[op.Results[1]], tp.state[mask] = mask, replicated
			tp.scales[op.Results[1]] = scale
		}
	}
	y, err := tp.emit("mul", []*ir.Value{in[0], scale}, nil, op.Loc, r.Name)
	if err != nil {
		return false, err
	}
	y.Results[0].Name = r.Name
	tp.local[r], tp.state[y.Results[0]] = y.Results[0], s
	return true, nil
}

// dropoutScale is the rank's part (split as s) of the scale of the
// dropout mask op draws for a tensor of type whole, and the whole mask.
func (tp *tensorRewrite) dropoutScale(op *ir.Op, key *ir.Value, whole ir.Type, s sharding) (scale, mask *ir.Value, err error) {
	name := op.Results[0].Name + ".scale"
	one, err := tp.emit("constant", nil, ir.Attrs{"value": ir.DenseAttr(&ir.Dense{Type: ir.Type{DType: whole.DType, Shape: ir.Shape{}}, Floats: []float64{1}})}, op.Loc, name+".one")
	if err != nil {
		return nil, nil, err
	}
	ones, err := tp.emit("expand", one.Results, ir.Attrs{"shape": ir.IntsAttr(whole.Shape...)}, op.Loc, name+".ones")
	if err != nil {
		return nil, nil, err
	}
	attrs := ir.Attrs{"seed": op.Attrs["seed"]}
	for _, k := range []string{"ratio", "offset"} {
		if v, ok := op.Attrs[k]; ok {
			attrs[k] = v
		}
	}
	operands := ones.Results
	if key != nil {
		operands = append([]*ir.Value{ones.Results[0]}, key)
	}
	drawn, err := tp.emit("dropout", operands, attrs, op.Loc, name+".whole")
	if err != nil {
		return nil, nil, err
	}
	v := drawn.Results[0]
	group := ir.Attrs{"size": ir.IntAttr(tp.n), "stride": ir.IntAttr(tp.stride), "op": ir.StringAttr("max"), "axis": ir.IntAttr(int64(s.dim))}
	if s.outer > 1 {
		// Each segment's part: the dimension as [segments, segment].
		shape := whole.Shape
		seg := slices.Concat(shape[:s.dim], []int64{s.outer, shape[s.dim] / s.outer}, shape[s.dim+1:])
		view, err := tp.emit("reshape", []*ir.Value{v}, ir.Attrs{"shape": ir.IntsAttr(seg...)}, op.Loc, name+".segments")
		if err != nil {
			return nil, nil, err
		}
		v, group["axis"] = view.Results[0], ir.IntAttr(int64(s.dim+1))
	}
	part, err := tp.emit("reduce_scatter", []*ir.Value{v}, group, op.Loc, name)
	if err != nil {
		return nil, nil, err
	}
	scale = part.Results[0]
	if s.outer > 1 {
		local := slices.Clone([]int64(whole.Shape))
		local[s.dim] /= tp.n
		back, err := tp.emit("reshape", part.Results, ir.Attrs{"shape": ir.IntsAttr(local...)}, op.Loc, name+".part")
		if err != nil {
			return nil, nil, err
		}
		scale = back.Results[0]
	}
	tp.state[scale] = s
	return scale, drawn.Results[1], nil
}
