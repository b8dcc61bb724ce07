// Package fuse is the `fuse` pass: it groups ops into kernels, each an op
// of kind "kernel" whose region lists the fused ops, with a fused location
// of every original location. By fusion class: elementwise and broadcast
// chains fuse; injective ops fuse into their consumers; an elementwise
// epilogue fuses into an out-fusable producer (conv, matmul, gemm); a
// reduction absorbs its elementwise inputs; a reduction over an
// out-fusable producer's output may join it as a second output; sibling
// kernels reading the same large input may merge into one kernel with
// several outputs; an elementwise producer may join a matmul or
// convolution as its prologue when redoing it on every load costs fewer
// FLOPs than prologue-flops allows; opaque and impure ops stand alone. No
// fusion creates a cycle, and fusions that would raise the function's peak
// are backed out.
package fuse

import (
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "fuse",
		Summary:     "group ops into kernels by fusion class (no cycles, never a higher peak)",
		Establishes: []passes.Property{passes.Fused},
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *Options) error {
		for _, f := range m.Funcs {
			st := Fuse(f, *o)
			ctx.AddStat("kernels-formed", int64(st.Kernels))
			ctx.AddStat("ops-fused", int64(st.OpsFused))
			ctx.AddStat("intermediate-bytes-removed", st.BytesRemoved)
			ctx.AddStat("fusions-backed-out", int64(st.BackedOut))
		}
		return nil
	}))
}

// Options bound the fusion.
type Options struct {
	MaxOps        int     `opt:"max-ops" default:"64" range:"[1,inf)" doc:"largest number of ops in one kernel"`
	MultiOutput   bool    `opt:"multi-output" default:"true" doc:"merge sibling kernels that read the same large input"`
	PrologueFLOPs float64 `opt:"prologue-flops" default:"0" range:"[0,inf)" doc:"FLOPs a prologue may add by being redone on every load, as a fraction of the kernel's FLOPs (0: no prologue fusion)"`
}

// Stats reports what the pass did.
type Stats struct {
	Kernels, OpsFused, BackedOut int
	BytesRemoved                 int64
}

type group struct {
	id      int
	ops     []int // body positions, ascending
	heavy   int   // position of its out-fusable (else reduction) op, or -1
	heavies int   // how many out-fusable and reduction ops it holds
}

type fuser struct {
	f      *ir.Func
	opt    Options
	n      int
	pos    map[*ir.Op]int
	users  [][]int // positions of the ops using op i's results
	preds  [][]int
	of     []*group // group of each op
	result map[*ir.Value]bool
	// seen marks the ops one path search visited: seen[i] == stamp.
	seen  []int32
	stamp int32
	stack []int
}

func classOf(op *ir.Op) ir.FusionClass {
	d := op.Def()
	if d == nil || d.Impure || op.Region != nil || len(op.Results) == 0 {
		return ir.Opaque
	}
	if ir.IsConstant(op) {
		return ir.Elementwise
	}
	return d.Fusion
}

func light(c ir.FusionClass) bool {
	return c == ir.Elementwise || c == ir.Broadcast || c == ir.Injective
}

// Fuse groups f's ops into kernels.
func Fuse(f *ir.Func, opt Options) Stats {
	if opt.MaxOps <= 0 {
		opt.MaxOps = 64
	}
	fu := &fuser{f: f, opt: opt, n: len(f.Body), pos: map[*ir.Op]int{}, result: map[*ir.Value]bool{}}
	for _, r := range f.Results {
		fu.result[r.Value] = true
	}
	fu.users, fu.preds, fu.of = make([][]int, fu.n), make([][]int, fu.n), make([]*group, fu.n)
	for i, op := range f.Body {
		fu.pos[op] = i
		g := &group{id: i, ops: []int{i}, heavy: -1}
		if c := classOf(op); c == ir.OutFusable || c == ir.Reduction {
			g.heavy, g.heavies = i, 1
		}
		fu.of[i] = g
	}
	for i, op := range f.Body {
		seen := map[int]bool{}
		for _, v := range op.Operands {
			if v.Def != nil {
				if p, ok := fu.pos[v.Def]; ok && !seen[p] {
					seen[p] = true
					fu.preds[i] = append(fu.preds[i], p)
					fu.users[p] = append(fu.users[p], i)
				}
			}
		}
	}
	fu.addWriteOrder()
	before := liveness.Analyze(f).Peak
	// Producer-into-consumer merges, consumers in schedule order.
	for c := 0; c < fu.n; c++ {
		if classOf(f.Body[c]) == ir.Opaque {
			continue
		}
		for _, p := range fu.preds[c] {
			fu.tryMerge(fu.of[p], fu.of[c])
		}
	}
	if opt.MultiOutput {
		fu.mergeSiblings()
	}
	// Materialise, then back out kernels while the peak is higher than
	// before fusing, starting with those live at the peak. Each round
	// that still misses backs out twice as many as the last, so a step
	// whose fusion raises the peak everywhere takes O(log kernels)
	// rounds of O(ops), not one round per kernel; readmit then tries the
	// backed-out kernels again one by one.
	body := append([]*ir.Op(nil), f.Body...)
	all := fu.groups()
	on := make([]bool, len(all))
	for i := range on {
		on[i] = true
	}
	try := func() (Stats, *liveness.Info) {
		var kept []*built
		for i, g := range all {
			if on[i] {
				kept = append(kept, g)
			}
		}
		f.Body = append([]*ir.Op(nil), body...)
		relinkAll(f.Body)
		st := materialise(f, kept)
		return st, liveness.Analyze(f)
	}
	var dropped []int // in the order they were backed out
	batch := 1
	for {
		st, after := try()
		if after.Peak <= before || len(dropped) == len(all) {
			if len(dropped) == 0 {
				return st
			}
			return readmit(f, try, on, dropped, before, len(body))
		}
		// Drop the kernel at the peak, then the nearest ones before it,
		// then those after it.
		peakOp := f.Body[after.PeakAt]
		at := after.PeakAt
		for k, o := range body {
			if o == peakOp {
				at = k
			}
		}
		order := make([]int, 0, len(all))
		for gi, g := range all {
			if on[gi] && g.kernel == peakOp {
				order = append(order, gi)
			}
		}
		for gi := len(all) - 1; gi >= 0; gi-- {
			if on[gi] && all[gi].kernel != peakOp && all[gi].lastPos <= at {
				order = append(order, gi)
			}
		}
		for gi, g := range all {
			if on[gi] && g.kernel != peakOp && g.lastPos > at {
				order = append(order, gi)
			}
		}
		for _, gi := range order[:min(batch, len(order))] {
			on[gi] = false
			dropped = append(dropped, gi)
		}
		batch *= 2
	}
}

// readmitWork bounds the ops that readmit re-analyses in all (each try
// materialises and analyses the whole body).
const readmitWork = 1_000_000

// readmit tries the backed-out kernels again, the last backed out
// (farthest from the peak) first: backing out doubles its batch each
// round, so most of the last batch was not needed. It admits a set at
// once when the peak stays within before, and otherwise halves it, the
// later half first (a kernel alone that raises the peak stays out), so
// that a few kernels that must stay out cost a few tries each, not one
// try per backed-out kernel. It leaves f materialised with the kernels
// kept.
func readmit(f *ir.Func, try func() (Stats, *liveness.Info), on []bool, dropped []int, before int64, ops int) Stats {
	tries := max(8, readmitWork/max(ops, 1))
	var admit func(set []int)
	admit = func(set []int) {
		if len(set) == 0 || tries <= 0 {
			return
		}
		tries--
		for _, g := range set {
			on[g] = true
		}
		if _, after := try(); after.Peak <= before {
			return
		}
		for _, g := range set {
			on[g] = false
		}
		if len(set) > 1 {
			admit(set[len(set)/2:])
			admit(set[:len(set)/2])
		}
	}
	admit(dropped)
	st, _ := try()
	for _, x := range on {
		if !x {
			st.BackedOut++
		}
	}
	return st
}

// tryMerge merges group p into group c when the fusion rules allow it.
func (fu *fuser) tryMerge(p, c *group) bool {
	if p == c || len(p.ops)+len(c.ops) > fu.opt.MaxOps {
		return false
	}
	f := fu.f
	for _, i := range p.ops {
		if classOf(f.Body[i]) == ir.Opaque {
			return false
		}
	}
	pHeavy, cHeavy := p.heavy >= 0, c.heavy >= 0
	if p.heavies+c.heavies > 2 {
		return false
	}
	switch {
	case pHeavy && cHeavy:
		// A reduction over an out-fusable producer's output joins it as a
		// second output (conv + batch-norm statistics).
		if classOf(f.Body[p.heavy]) != ir.OutFusable || classOf(f.Body[c.heavy]) != ir.Reduction || len(c.ops) != 1 {
			return false
		}
	case pHeavy:
		// An elementwise epilogue of a heavy producer.
		for _, i := range c.ops {
			if k := classOf(f.Body[i]); k != ir.Elementwise && k != ir.Broadcast {
				return false
			}
		}
		if classOf(f.Body[p.heavy]) == ir.Reduction && !sameShapes(f, p, c) {
			return false
		}
	case cHeavy:
		// Light producers: a reduction absorbs them; an out-fusable op
		// takes them as a prologue only within the FLOPs allowance.
		if classOf(f.Body[c.heavy]) == ir.OutFusable {
			if fu.opt.PrologueFLOPs <= 0 || !fu.prologueFits(p, c) {
				return false
			}
		}
	}
	if !pHeavy {
		for _, i := range p.ops {
			if !light(classOf(f.Body[i])) {
				return false
			}
		}
	}
	if fu.path(p, c) || !fu.outputsAfter(p, c) || !fu.outputsAfter(c, p) {
		return false
	}
	fu.merge(p, c)
	return true
}

// sameShapes reports whether every op of c produces the shape of p's
// heavy op's first result (an epilogue over a reduction).
func sameShapes(f *ir.Func, p, c *group) bool {
	want := f.Body[p.heavy].Results[0].Type.Shape
	for _, i := range c.ops {
		for _, r := range f.Body[i].Results {
			if !r.Type.Shape.Equal(want) {
				return false
			}
		}
	}
	return true
}

// prologueFits estimates the FLOPs added by redoing p's ops on every load
// of the heavy op's operand (its reuse: kernel FLOPs / 2 / operand size).
func (fu *fuser) prologueFits(p, c *group) bool {
	heavy := fu.f.Body[c.heavy]
	kflops := ir.OpCost(heavy).FLOPs
	pf, elems := int64(0), int64(0)
	for _, i := range p.ops {
		pf += ir.OpCost(fu.f.Body[i]).FLOPs
		for _, r := range fu.f.Body[i].Results {
			elems += r.Type.NumElements()
		}
	}
	if elems == 0 || kflops == 0 {
		return false
	}
	reuse := float64(kflops) / 2 / float64(elems)
	return float64(pf)*max(reuse-1, 0) <= fu.opt.PrologueFLOPs*float64(kflops)
}

// path reports whether some op outside both groups depends on p and is
// depended on by c (merging would then create a cycle).
func (fu *fuser) path(p, c *group) bool {
	limit := c.ops[len(c.ops)-1]
	if len(fu.seen) < fu.n {
		fu.seen = make([]int32, fu.n)
	}
	fu.stamp++
	if fu.stamp == 0 { // wrapped: clear the marks
		clear(fu.seen)
		fu.stamp = 1
	}
	seen, stamp := fu.seen, fu.stamp
	stack := fu.stack[:0]
	defer func() { fu.stack = stack[:0] }()
	for _, i := range p.ops {
		for _, u := range fu.users[i] {
			if fu.of[u] != p && fu.of[u] != c && seen[u] != stamp && u <= limit {
				seen[u] = stamp
				stack = append(stack, u)
			}
		}
	}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, u := range fu.users[i] {
			if fu.of[u] == c {
				return true
			}
			if fu.of[u] != p && seen[u] != stamp && u <= limit {
				seen[u] = stamp
				stack = append(stack, u)
			}
		}
	}
	return false
}

func (fu *fuser) merge(p, c *group) {
	c.ops = append(c.ops, p.ops...)
	sort.Ints(c.ops)
	if p.heavy >= 0 {
		if c.heavy < 0 || classOf(fu.f.Body[p.heavy]) == ir.OutFusable {
			c.heavy = p.heavy
		}
	}
	c.heavies += p.heavies
	for _, i := range p.ops {
		fu.of[i] = c
	}
}

// mergeSiblings merges groups that read the same large input when neither
// depends on the other.
func (fu *fuser) mergeSiblings() {
	f := fu.f
	readers := map[*ir.Value][]*group{}
	var order []*ir.Value
	for i, op := range f.Body {
		for _, v := range op.Operands {
			g := fu.of[i]
			if classOf(op) == ir.Opaque {
				continue
			}
			if _, ok := readers[v]; !ok {
				order = append(order, v)
			}
			dup := false
			for _, h := range readers[v] {
				dup = dup || h == g
			}
			if !dup {
				readers[v] = append(readers[v], g)
			}
		}
	}
	for _, v := range order {
		if v.Type.SizeBytes() < 1<<16 {
			continue
		}
		gs := readers[v]
		for a := 0; a < len(gs); a++ {
			for b := a + 1; b < len(gs); b++ {
				x, y := gs[a], gs[b]
				if x == y || fu.of[x.ops[0]] != x || fu.of[y.ops[0]] != y {
					continue
				}
				if fu.outFusable(x) || fu.outFusable(y) || len(x.ops)+len(y.ops) > fu.opt.MaxOps {
					continue
				}
				first, second := x, y
				if x.ops[len(x.ops)-1] > y.ops[len(y.ops)-1] {
					first, second = y, x
				}
				if fu.path(first, second) || fu.path(second, first) || !fu.outputsAfter(first, second) {
					continue
				}
				fu.merge(first, second)
				gs[a] = second
			}
		}
	}
}

// addWriteOrder adds the order that in-place writes of arguments
// (optimizer updates) impose: every read of an argument before its write
// precedes the write, and every read after it follows it. With these
// edges a kernel never moves a read across the write.
func (fu *fuser) addWriteOrder() {
	edge := func(from, to int) {
		for _, p := range fu.preds[to] {
			if p == from {
				return
			}
		}
		fu.preds[to] = append(fu.preds[to], from)
		fu.users[from] = append(fu.users[from], to)
	}
	var readers map[*ir.Value][]int // built on the first write: most steps have none
	for w, op := range fu.f.Body {
		d := op.Def()
		if d == nil || len(d.Writes) == 0 {
			continue
		}
		if readers == nil {
			readers = map[*ir.Value][]int{}
			for r, other := range fu.f.Body {
				for _, v := range other.Operands {
					readers[v] = append(readers[v], r)
				}
			}
		}
		for _, k := range d.Writes {
			if k >= len(op.Operands) {
				continue
			}
			for _, r := range readers[op.Operands[k]] {
				switch {
				case r < w:
					edge(r, w)
				case r > w:
					edge(w, r)
				}
			}
		}
	}
}

// outFusable reports whether g holds a compute-heavy op (conv, matmul).
func (fu *fuser) outFusable(g *group) bool {
	return g.heavy >= 0 && classOf(fu.f.Body[g.heavy]) == ir.OutFusable
}

// outputsAfter reports whether every user outside both groups of first's
// values runs after the merged kernel, which sits at the later of the two
// groups' last ops.
func (fu *fuser) outputsAfter(first, second *group) bool {
	last := max(second.ops[len(second.ops)-1], first.ops[len(first.ops)-1])
	for _, i := range first.ops {
		for _, u := range fu.users[i] {
			if fu.of[u] != first && fu.of[u] != second && u < last {
				return false
			}
		}
	}
	return true
}

// built is a group ready to become a kernel.
type built struct {
	ops     []int
	lastPos int
	kernel  *ir.Op
}

func (fu *fuser) groups() []*built {
	seen := map[*group]bool{}
	var out []*built
	for i := 0; i < fu.n; i++ {
		g := fu.of[i]
		if seen[g] {
			continue
		}
		seen[g] = true
		nonConst := 0
		for _, j := range g.ops {
			if !ir.IsConstant(fu.f.Body[j]) {
				nonConst++
			}
		}
		if nonConst < 2 {
			continue
		}
		out = append(out, &built{ops: g.ops, lastPos: g.ops[len(g.ops)-1]})
	}
	return out
}

// relinkAll restores Def and Index of every top-level result (undoing a
// previous materialisation).
func relinkAll(body []*ir.Op) {
	for _, op := range body {
		for i, r := range op.Results {
			r.Def, r.Index = op, i
		}
	}
}

// materialise replaces each group by a kernel op at the position of its
// last member. Values used outside the group keep their identity and
// become the kernel's results; values internal to it move into the region.
func materialise(f *ir.Func, groups []*built) Stats {
	st := Stats{}
	isResult := map[*ir.Value]bool{}
	for _, r := range f.Results {
		isResult[r.Value] = true
	}
	inGroup := map[*ir.Op]*built{}
	for _, g := range groups {
		for _, i := range g.ops {
			inGroup[f.Body[i]] = g
		}
	}
	usedOutside := map[*ir.Value]bool{}
	for _, op := range f.Body {
		for _, v := range op.Operands {
			if v.Def != nil && inGroup[v.Def] != nil && inGroup[v.Def] != inGroup[op] {
				usedOutside[v] = true
			}
		}
	}
	var out []*ir.Op
	for i, op := range f.Body {
		g := inGroup[op]
		if g == nil {
			out = append(out, op)
			continue
		}
		if i != g.lastPos {
			continue
		}
		k := buildKernel(f, g, usedOutside, isResult)
		g.kernel = k
		out = append(out, k)
		st.Kernels++
		st.OpsFused += len(g.ops)
		for _, r := range k.Region.Body {
			for _, v := range r.Results {
				yielded := false
				for _, y := range k.Region.Yield {
					yielded = yielded || y == v
				}
				if !yielded {
					st.BytesRemoved += v.Type.SizeBytes()
				}
			}
		}
	}
	f.Body = out
	return st
}

func buildKernel(f *ir.Func, g *built, usedOutside, isResult map[*ir.Value]bool) *ir.Op {
	members := map[*ir.Op]bool{}
	for _, i := range g.ops {
		members[f.Body[i]] = true
	}
	k := &ir.Op{Kind: "kernel"}
	region := &ir.Region{}
	inner := map[*ir.Value]*ir.Value{}
	var locs []ir.Location
	var kinds []string
	arg := func(v *ir.Value) *ir.Value {
		if a, ok := inner[v]; ok {
			return a
		}
		a := &ir.Value{Name: f.UniqueName(v.Name + ".in"), Type: v.Type, Index: len(region.Args), Offset: ir.NoOffset}
		region.Args = append(region.Args, a)
		k.Operands = append(k.Operands, v)
		inner[v] = a
		return a
	}
	for _, i := range g.ops {
		op := f.Body[i]
		ops := make([]*ir.Value, len(op.Operands))
		for j, v := range op.Operands {
			if v.Def != nil && members[v.Def] {
				ops[j] = inner[v]
			} else {
				ops[j] = arg(v)
			}
		}
		c := &ir.Op{Kind: op.Kind, Operands: ops, Attrs: op.Attrs.Clone(), Loc: op.Loc}
		for j, r := range op.Results {
			nr := &ir.Value{Name: f.UniqueName(r.Name + ".k"), Type: r.Type, Def: c, Index: j, Offset: ir.NoOffset}
			c.Results = append(c.Results, nr)
			inner[r] = nr
		}
		region.Body = append(region.Body, c)
		locs = append(locs, op.Loc)
		if !ir.IsConstant(op) {
			kinds = append(kinds, op.Kind)
		}
	}
	for _, i := range g.ops {
		for _, r := range f.Body[i].Results {
			if usedOutside[r] || isResult[r] {
				region.Yield = append(region.Yield, inner[r])
				r.Def, r.Index = k, len(k.Results)
				k.Results = append(k.Results, r)
			}
		}
	}
	k.Region = region
	k.Loc = ir.FuseLocations(locs...)
	name := "fused_" + strings.Join(kinds, "_")
	if len(name) > 60 {
		name = name[:60]
	}
	k.Attrs = ir.Attrs{"name": ir.StringAttr(name)}
	return k
}
