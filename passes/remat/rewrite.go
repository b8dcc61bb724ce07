package remat

import (
	"slices"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// rewriter recomputes values of a function and can undo its changes.
type rewriter struct {
	f     *ir.Func
	keep  map[*ir.Value]bool // never recomputed: used as they are (checkpoints)
	flops int64              // FLOPs added by recomputation so far

	// undo log of the current attempt
	body     []*ir.Op
	replaced []replacement
	added    int64
	inserted []*ir.Op // the copies made by the last recompute
	moved    bool     // it moved updates, so earlier positions changed

	flopsOf map[*ir.Op]int64 // FLOPs of ops priced so far

	// work counts the ops visited by analyses and rewrites: the iterative
	// solvers stop improving once it passes solverWork.
	work int64
}

// solverWork bounds the op visits of one iterative solver (an analysis of
// the schedule or one recomputation visits every op): about a second or
// two. Solvers stop where they are when it runs out, so a 100k-op step
// gets a plan in seconds and the quadratic searches still run in full on
// steps of a few thousand ops. Deterministic, unlike a deadline.
const solverWork = 2_000_000

// tired reports whether the solver has spent its work.
func (rw *rewriter) tired() bool { return rw.tiredAt(solverWork) }

// tiredAt reports whether the solver has spent more than work.
func (rw *rewriter) tiredAt(work int64) bool { return rw.work > work }

// live is liveness.Analyze of the function, counted as work.
func (rw *rewriter) live() *liveness.Info {
	rw.work += int64(len(rw.f.Body))
	return liveness.Analyze(rw.f)
}

// sched is analyse of the function, counted as work.
func (rw *rewriter) sched() *schedule {
	rw.work += int64(len(rw.f.Body))
	return analyse(rw.f)
}

type replacement struct {
	op  *ir.Op
	idx int
	old *ir.Value
}

// schedule is the position and use information of the current body.
type schedule struct {
	pos     map[*ir.Op]int
	lastUse map[*ir.Value]int
	uses    map[*ir.Value][]int // positions of the ops using a value, ascending
	written map[*ir.Value]int   // position of the op overwriting an argument (ir.Verify allows one per argument)
	result  map[*ir.Value]bool  // function results
}

func analyse(f *ir.Func) *schedule {
	n := len(f.Body) + len(f.Args)
	s := &schedule{pos: make(map[*ir.Op]int, n), lastUse: make(map[*ir.Value]int, n), uses: make(map[*ir.Value][]int, n), written: map[*ir.Value]int{}, result: make(map[*ir.Value]bool, len(f.Results))}
	for i, op := range f.Body {
		s.pos[op] = i
		if d := op.Def(); d != nil {
			for _, k := range d.Writes {
				s.written[op.Operands[k]] = i
			}
		}
		for j, v := range op.Operands {
			dup := false
			for _, w := range op.Operands[:j] {
				dup = dup || w == v
			}
			if !dup {
				s.uses[v] = append(s.uses[v], i)
			}
			s.lastUse[v] = i
		}
	}
	for _, r := range f.Results {
		s.lastUse[r.Value] = len(f.Body)
		s.result[r.Value] = true
	}
	return s
}

// forget updates s after v's uses from position t on were redirected to
// a copy inserted at t: v is now last used before t. Positions before t
// stay valid, so recomputations at earlier positions can still plan
// with s.
func (s *schedule) forget(v *ir.Value, t int) {
	uses := s.uses[v]
	k := 0
	for k < len(uses) && uses[k] < t {
		k++
	}
	s.uses[v] = uses[:k]
	if k > 0 {
		s.lastUse[v] = uses[k-1]
	} else if v.Def != nil {
		s.lastUse[v] = s.pos[v.Def]
	}
}

// useAt records a use of v at position t, for plans at positions up to
// t: a copy inserted there reads v.
func (s *schedule) useAt(v *ir.Value, t int) {
	uses := s.uses[v]
	k := sort.SearchInts(uses, t)
	if k == len(uses) || uses[k] != t {
		s.uses[v] = slices.Insert(uses, k, t)
	}
	s.lastUse[v] = max(s.lastUse[v], t)
}

// recomputable reports whether op may be cloned: pure, known, not marked
// remat = "never". A clone keeps the original's role.
func recomputable(op *ir.Op) bool {
	if op == nil {
		return false
	}
	if op.Attr().String("remat") == "never" {
		return false
	}
	d := op.Def()
	if d == nil || d.Impure {
		return false
	}
	if op.Region != nil {
		for _, inner := range op.Region.Body {
			if !recomputable(inner) {
				return false
			}
		}
	}
	return true
}

// plan lists the ops to clone (in dependence order) so that v is
// available at position t: operands still alive at t, arguments and kept
// values are used as they are, others are recomputed too. ok is false when
// an impure or pinned op would have to be recomputed.
func (rw *rewriter) plan(s *schedule, v *ir.Value, t int, memo map[*ir.Value]bool, out *[]*ir.Op) bool {
	if w, ok := s.written[v]; ok && w < t && !rw.canDelay(s, rw.f.Body[w], t) {
		return false // an argument already overwritten by an update that must stay
	}
	if v.IsArg() || rw.keep[v] || s.lastUse[v] >= t || memo[v] {
		return true
	}
	op := v.Def
	if !recomputable(op) {
		return false
	}
	for _, u := range op.Operands {
		if !rw.plan(s, u, t, memo, out) {
			return false
		}
	}
	for _, r := range op.Results {
		memo[r] = true
	}
	*out = append(*out, op)
	return true
}

// canDelay reports whether the in-place update op (at a position before
// t) may move to t, after copies that read the old values of what it
// writes: no op between reads or writes those arguments.
func (rw *rewriter) canDelay(s *schedule, op *ir.Op, t int) bool {
	d := op.Def()
	if d == nil {
		return false
	}
	written := map[*ir.Value]bool{}
	for _, k := range d.Writes {
		written[op.Operands[k]] = true
	}
	for _, o := range rw.f.Body[s.pos[op]+1 : t] {
		for _, u := range o.Operands {
			if written[u] {
				return false
			}
		}
	}
	return true
}

// delayed lists the updates before t that write arguments the ops read.
func delayed(s *schedule, body []*ir.Op, ops []*ir.Op, t int) map[*ir.Op]bool {
	out := map[*ir.Op]bool{}
	for _, op := range ops {
		for _, u := range op.Operands {
			if w, ok := s.written[u]; ok && w < t {
				out[body[w]] = true
			}
		}
	}
	return out
}

// cost is the FLOPs of recomputing ops.
func (rw *rewriter) cost(ops []*ir.Op) int64 {
	c := int64(0)
	for _, op := range ops {
		c += rw.opFLOPs(op)
	}
	return c
}

// opFLOPs is ir.OpCost(op).FLOPs, remembered: the solvers price the same
// ops over and over.
func (rw *rewriter) opFLOPs(op *ir.Op) int64 {
	if c, ok := rw.flopsOf[op]; ok {
		return c
	}
	if rw.flopsOf == nil {
		rw.flopsOf = map[*ir.Op]int64{}
	}
	c := ir.OpCost(op).FLOPs
	rw.flopsOf[op] = c
	return c
}

// begin starts an attempt that can be undone.
func (rw *rewriter) begin() {
	rw.body = append(rw.body[:0], rw.f.Body...)
	rw.replaced = rw.replaced[:0]
	rw.added = 0
}

// undo restores the function as it was at begin.
func (rw *rewriter) undo() {
	for i := len(rw.replaced) - 1; i >= 0; i-- {
		r := rw.replaced[i]
		r.op.Operands[r.idx] = r.old
	}
	rw.f.Body = append(rw.f.Body[:0], rw.body...)
	rw.flops -= rw.added
}

// recompute makes v's uses at positions >= t read a recomputed copy
// inserted just before position t, recomputing operands that are not
// alive there as well. It reports false (and changes nothing) when v
// cannot be recomputed.
func (rw *rewriter) recompute(s *schedule, v *ir.Value, t int) bool {
	ops, inserted, ok := rw.clones(s, v, t)
	if !ok {
		return false
	}
	copyOfV := inserted[len(inserted)-1].Results[v.Index]
	rw.work += int64(len(rw.f.Body))
	// Redirect the late uses of v (and of recomputed values, which are
	// not alive at t by construction).
	for i := t; i < len(rw.f.Body); i++ {
		use := rw.f.Body[i]
		for j, u := range use.Operands {
			if u == v {
				rw.replaced = append(rw.replaced, replacement{use, j, u})
				use.Operands[j] = copyOfV
			}
		}
	}
	// Updates of arguments the copies read move after the copies (plan
	// checked that nothing in between touches those arguments).
	moved := delayed(s, rw.f.Body, ops, t)
	body := make([]*ir.Op, 0, len(rw.f.Body)+len(inserted))
	var after []*ir.Op
	for _, o := range rw.f.Body[:t] {
		if moved[o] {
			after = append(after, o)
		} else {
			body = append(body, o)
		}
	}
	body = append(body, inserted...)
	body = append(body, after...)
	body = append(body, rw.f.Body[t:]...)
	rw.f.Body = body
	rw.inserted, rw.moved = inserted, len(after) > 0
	c := rw.cost(inserted)
	rw.flops += c
	rw.added += c
	return true
}

// clones plans v's recomputation at position t and makes the copies:
// ops are the originals cloned (v's own op last) and inserted their
// clones, reading each other and values alive at t. Nothing in the
// function changes. ok is false when v cannot be recomputed.
func (rw *rewriter) clones(s *schedule, v *ir.Value, t int) (ops, inserted []*ir.Op, ok bool) {
	memo := map[*ir.Value]bool{}
	// v itself is recomputed even though it is alive at t.
	op := v.Def
	if op == nil || !recomputable(op) || rw.keep[v] {
		return nil, nil, false
	}
	for _, u := range op.Operands {
		if !rw.plan(s, u, t, memo, &ops) {
			return nil, nil, false
		}
	}
	ops = append(ops, op)
	clone := map[*ir.Value]*ir.Value{}
	for _, orig := range ops {
		operands := make([]*ir.Value, len(orig.Operands))
		for i, u := range orig.Operands {
			if c, ok := clone[u]; ok {
				operands[i] = c
			} else {
				operands[i] = u
			}
		}
		c := cloneOp(rw.f, orig, operands)
		for i, r := range orig.Results {
			clone[r] = c.Results[i]
		}
		inserted = append(inserted, c)
	}
	return ops, inserted, true
}

// cloneOp copies op with new operands, marking it recomputed; regions are
// copied deeply.
func cloneOp(f *ir.Func, op *ir.Op, operands []*ir.Value) *ir.Op {
	attrs := op.Attrs.Clone()
	if attrs == nil {
		attrs = ir.Attrs{}
	}
	attrs["recomputed"] = ir.BoolAttr(true)
	delete(attrs, "remat")
	c := &ir.Op{Kind: op.Kind, Operands: operands, Attrs: attrs, Loc: op.Loc}
	for i, r := range op.Results {
		c.Results = append(c.Results, &ir.Value{Name: f.UniqueName(RecomputedName(r.Name)), Type: r.Type, Def: c, Index: i, Offset: ir.NoOffset})
	}
	if op.Region != nil {
		c.Region = op.Region.CloneRenamed(func(name string) string { return f.UniqueName(RecomputedName(name)) })
	}
	return c
}

// RecomputedName is the base name of a copy of the value named name:
// name.remat, where a copy of a copy keeps one .remat (UniqueName then
// numbers the copies: x.remat, x.remat.1, ...), not x.remat.1.remat.1.
func RecomputedName(name string) string {
	for {
		base := name
		if i := strings.LastIndexByte(base, '.'); i >= 0 && isDigits(base[i+1:]) {
			base = base[:i]
		}
		if !strings.HasSuffix(base, ".remat") {
			return name + ".remat"
		}
		stripped := strings.TrimSuffix(base, ".remat")
		if stripped == "" {
			return name + ".remat"
		}
		name = stripped
	}
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// Recomputer recomputes single values of a function, for passes that
// weigh recomputation against other ways of freeing memory (swap). Every
// change can be undone until the next Begin.
type Recomputer struct{ rw *rewriter }

// NewRecomputer starts recomputing values of f.
func NewRecomputer(f *ir.Func) *Recomputer {
	return &Recomputer{rw: &rewriter{f: f, keep: map[*ir.Value]bool{}}}
}

// Begin starts a change that Undo can take back.
func (r *Recomputer) Begin() { r.rw.begin() }

// Undo restores the function as it was at Begin.
func (r *Recomputer) Undo() { r.rw.undo() }

// Recompute makes the uses of v at schedule positions >= t read a copy
// recomputed just before t (with any operands no longer alive there). It
// returns the ops inserted, or false when v cannot be recomputed.
func (r *Recomputer) Recompute(v *ir.Value, t int) ([]*ir.Op, bool) {
	if !r.rw.recompute(analyse(r.rw.f), v, t) {
		return nil, false
	}
	return r.rw.inserted, true
}

// Schedule is what Plan needs to know of the function as it is now: valid
// until the function changes.
type Schedule struct{ s *schedule }

// Schedule analyses the function as it is now.
func (r *Recomputer) Schedule() Schedule { return Schedule{analyse(r.rw.f)} }

// Plan returns the ops that Recompute(v, t) would clone, without changing
// anything: the chain of operands no longer alive at t, then v's own op;
// false when v cannot be recomputed there.
func (r *Recomputer) Plan(sch Schedule, v *ir.Value, t int) ([]*ir.Op, bool) {
	ops, ok := r.rw.chain(sch.s, v, t)
	if !ok || r.rw.keep[v] {
		return nil, false
	}
	return append(ops, v.Def), true
}
