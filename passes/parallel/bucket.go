package parallel

import (
	"github.com/kiln-compiler/kiln/ir"
)

// bucket joins consecutive all_reduces of n ranks into buckets of up to
// limit bytes, as DDP does: each bucket flattens and concatenates its
// gradients, all-reduces them at once where its last gradient is ready,
// and splits them back, so that every all_reduce pays its latency once
// per bucket instead of once per gradient. A bucket closes before an
// all_reduce of another dtype or one that would pass limit, and before
// any op reads one of its results (an early optimizer update), so no
// reader waits for a later gradient. It returns the number of buckets of
// more than one gradient.
func bucket(f *ir.Func, n, stride int64, limit int64) (int, error) {
	readers := map[*ir.Value][]int{}
	for i, op := range f.Body {
		for _, x := range op.Operands {
			readers[x] = append(readers[x], i)
		}
	}
	var groups [][]*ir.Op
	var cur []*ir.Op
	var bytes int64
	firstRead := func(g []*ir.Op) int {
		at := len(f.Body)
		for _, op := range g {
			if len(readers[op.Results[0]]) > 0 {
				at = min(at, readers[op.Results[0]][0])
			}
		}
		return at
	}
	for i, op := range f.Body {
		if op.Kind != "all_reduce" || op.Attr().String("op") != "sum" || op.Attr().Int("stride") != stride || op.Attr().Int("size") != n {
			continue
		}
		t := op.Operands[0].Type
		if len(cur) > 0 && (bytes+t.SizeBytes() > limit || t.DType != cur[0].Operands[0].Type.DType || firstRead(cur) < i) {
			groups, cur, bytes = append(groups, cur), nil, 0
		}
		cur = append(cur, op)
		bytes += t.SizeBytes()
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	// Each bucket gathers and all-reduces where its last gradient is
	// ready, and is split back just before its first reader, so compute
	// runs on while the bucket is on the wire.
	gather := map[*ir.Op][]*ir.Op{} // last member -> the bucket's first ops
	scatter := map[int][]*ir.Op{}   // first reader's position -> split ops
	drop := map[*ir.Op]bool{}       // the other members
	joined := 0
	for _, g := range groups {
		if len(g) < 2 {
			continue
		}
		readAt := firstRead(g)
		pre, post, err := join(f, g, n, stride)
		if err != nil {
			return joined, err
		}
		gather[g[len(g)-1]] = pre
		scatter[readAt] = append(scatter[readAt], post...)
		for _, op := range g[:len(g)-1] {
			drop[op] = true
		}
		joined++
	}
	var body []*ir.Op
	for i, op := range f.Body {
		body = append(body, scatter[i]...)
		switch {
		case drop[op]:
		case gather[op] != nil:
			body = append(body, gather[op]...)
		default:
			body = append(body, op)
		}
	}
	f.Body = append(body, scatter[len(f.Body)]...)
	return joined, nil
}

// join builds the ops of one bucket, those that flatten, concatenate
// and all-reduce its gradients and those that split it back, and points
// the readers of each member's result at its part.
func join(f *ir.Func, g []*ir.Op, n, stride int64) (pre, post []*ir.Op, err error) {
	var ops []*ir.Op
	add := func(kind string, in []*ir.Value, attrs ir.Attrs, name string) (*ir.Op, error) {
		op, err := f.NewOp(kind, in, attrs, g[0].Loc, name)
		if err == nil {
			ops = append(ops, op)
		}
		return op, err
	}
	var flat []*ir.Value
	var sizes []int64
	for _, op := range g {
		x := op.Operands[0]
		k := x.Type.NumElements()
		r, err := add("reshape", []*ir.Value{x}, ir.Attrs{"shape": ir.IntsAttr(k)}, x.Name+".flat")
		if err != nil {
			return nil, nil, err
		}
		flat = append(flat, r.Results[0])
		sizes = append(sizes, k)
	}
	name := g[0].Results[0].Name + ".bucket"
	cat, err := add("concat", flat, ir.Attrs{"axis": ir.IntAttr(0)}, name)
	if err != nil {
		return nil, nil, err
	}
	ar, err := add("all_reduce", cat.Results, groupAttrs(n, stride), name)
	if err != nil {
		return nil, nil, err
	}
	pre, ops = ops, nil
	sp, err := add("split", ar.Results, ir.Attrs{"axis": ir.IntAttr(0), "sizes": ir.IntsAttr(sizes...)}, name)
	if err != nil {
		return nil, nil, err
	}
	for i, op := range g {
		r := op.Results[0]
		back, err := add("reshape", []*ir.Value{sp.Results[i]}, ir.Attrs{"shape": ir.IntsAttr(r.Type.Shape...)}, r.Name)
		if err != nil {
			return nil, nil, err
		}
		f.ReplaceUses(r, back.Results[0])
	}
	return pre, ops, nil
}
