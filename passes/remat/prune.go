package remat

import (
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
)

// pruneWork bounds prune's op visits (each trial analyses the whole
// function): the costliest recomputations are tried first, so a large
// step stops after the ones that matter.
const pruneWork = 4_000_000

// prune takes back recomputations that a plan does not need: the solvers
// keep a recomputation whenever the peak does not rise, so a plan can
// recompute values whose keeping costs nothing at the peak (a batch
// norm's per-channel statistics, recomputed by a reduction over the whole
// activation). Each recomputed result of an op that does not fuse away
// (fusesAway), costliest first (the bytes its op
// reads and writes: a recomputation's time is mostly its memory traffic),
// is read from its original again where that leaves the peak at or below
// target; copies left unread are removed. It reports whether it changed f.
//
// A copy is matched to its original by name and checked structurally
// (same kind, attributes and result type, operands that are the
// original's or copies of them), so a plan is only ever rewritten back
// towards the function it came from. Values marked remat = "always" stay
// recomputed, and so do values whose memory is an argument that the step
// overwrites.
func prune(f *ir.Func, target int64) bool {
	origin := originals(f)
	type site struct {
		copy    *ir.Value
		traffic int64
	}
	var sites []site
	for _, op := range f.Body {
		if !op.Attr().Bool("recomputed") || fusesAway(op) {
			continue
		}
		var traffic int64
		for _, u := range op.Operands {
			traffic += u.Type.SizeBytes()
		}
		for _, r := range op.Results {
			traffic += r.Type.SizeBytes()
		}
		for _, r := range op.Results {
			if o := origin[r]; o != nil && o.Def.Attr().String("remat") != "always" && !overwrittenMemory(f, o) {
				sites = append(sites, site{r, traffic})
			}
		}
	}
	if len(sites) == 0 {
		return false
	}
	sort.SliceStable(sites, func(i, j int) bool { return sites[i].traffic > sites[j].traffic })
	rw := &rewriter{f: f, keep: map[*ir.Value]bool{}}
	changed := false
	for _, s := range sites {
		if rw.work > pruneWork {
			break
		}
		if s.copy.Def == nil || !inBody(f, s.copy.Def) {
			continue // removed with a copy it fed
		}
		rw.begin()
		o := origin[s.copy]
		for _, op := range f.Body {
			for j, u := range op.Operands {
				if u == s.copy {
					rw.replaced = append(rw.replaced, replacement{op, j, u})
					op.Operands[j] = o
				}
			}
		}
		removeUnreadCopies(f)
		if rw.live().Peak <= target {
			changed = true
			continue
		}
		rw.undo()
	}
	return changed
}

// fusesAway reports whether a copy of op costs (about) nothing to
// recompute: elementwise, broadcast and injective ops fuse into the
// kernels that read them, which read the copy's operands instead of its
// result. A reduction, a normalisation's statistics or a contraction
// reads its operands whole again.
func fusesAway(op *ir.Op) bool {
	if ir.IsConstant(op) {
		return true
	}
	d := op.Def()
	if d == nil || op.Region != nil {
		return false
	}
	return d.Fusion == ir.Elementwise || d.Fusion == ir.Broadcast || d.Fusion == ir.Injective
}

// recomputeFLOPs is the FLOPs of f's recomputed ops.
func recomputeFLOPs(f *ir.Func) int64 {
	var n int64
	for _, op := range f.Body {
		if op.Attr().Bool("recomputed") {
			n += ir.OpCost(op).FLOPs
		}
	}
	return n
}

// originals maps each result of a recomputed op of f to the value it
// recomputes, where the match is certain (see prune).
func originals(f *ir.Func) map[*ir.Value]*ir.Value {
	byName := map[string]*ir.Value{}
	for _, a := range f.Args {
		byName[a.Name] = a
	}
	for _, op := range f.Body {
		for _, r := range op.Results {
			byName[r.Name] = r
		}
	}
	origin := map[*ir.Value]*ir.Value{}
	of := func(v *ir.Value) *ir.Value {
		if o := origin[v]; o != nil {
			return o
		}
		return v
	}
	for _, op := range f.Body {
		if !op.Attr().Bool("recomputed") || len(op.Results) == 0 {
			continue
		}
		o := byName[originalName(op.Results[0].Name)]
		if o == nil || o.Def == nil || o.Index != 0 || o.Def.Attr().Bool("recomputed") {
			continue
		}
		orig := o.Def
		if orig.Kind != op.Kind || len(orig.Results) != len(op.Results) || len(orig.Operands) != len(op.Operands) ||
			(orig.Region == nil) != (op.Region == nil) {
			continue
		}
		attrs := op.Attrs.Clone()
		delete(attrs, "recomputed")
		want := orig.Attrs.Clone()
		delete(want, "remat")
		if !attrs.Equal(want) {
			continue
		}
		same := true
		for i, r := range op.Results {
			same = same && r.Type.Equal(orig.Results[i].Type) && originalName(r.Name) == orig.Results[i].Name
		}
		for i, u := range op.Operands {
			same = same && of(u) == orig.Operands[i]
		}
		if op.Region != nil {
			same = same && len(op.Region.Body) == len(orig.Region.Body)
			for i := 0; same && i < len(op.Region.Body); i++ {
				a, b := op.Region.Body[i], orig.Region.Body[i]
				same = a.Kind == b.Kind && a.Attrs.Equal(b.Attrs)
			}
		}
		if !same {
			continue
		}
		for i, r := range op.Results {
			origin[r] = orig.Results[i]
		}
	}
	return origin
}

// originalName undoes RecomputedName and the numbering UniqueName adds:
// x.remat and x.remat.3 name copies of x.
func originalName(name string) string {
	base := name
	if i := strings.LastIndexByte(base, '.'); i >= 0 && isDigits(base[i+1:]) {
		base = base[:i]
	}
	if s, ok := strings.CutSuffix(base, ".remat"); ok && s != "" {
		return s
	}
	return name
}

// overwrittenMemory reports whether v's memory is, through views, that of
// an argument some op of f overwrites: keeping v longer would read the
// new contents.
func overwrittenMemory(f *ir.Func, v *ir.Value) bool {
	for v.Def != nil {
		d := v.Def.Def()
		if d == nil || !d.View || v.Index != 0 || len(v.Def.Operands) == 0 {
			return false
		}
		v = v.Def.Operands[0]
	}
	for _, op := range f.Body {
		if d := op.Def(); d != nil {
			for _, k := range d.Writes {
				if op.Operands[k] == v {
					return true
				}
			}
		}
	}
	return false
}

// removeUnreadCopies deletes recomputed ops none of whose results is read
// (by an op or as a result of f), repeatedly.
func removeUnreadCopies(f *ir.Func) {
	removed := 0
	for {
		read := map[*ir.Value]bool{}
		for _, op := range f.Body {
			for _, u := range op.Operands {
				read[u] = true
			}
		}
		for _, r := range f.Results {
			read[r.Value] = true
		}
		body := f.Body[:0:0]
		n := removed
		for _, op := range f.Body {
			unread := op.Attr().Bool("recomputed")
			for _, r := range op.Results {
				unread = unread && !read[r]
			}
			if unread {
				removed++
			} else {
				body = append(body, op)
			}
		}
		if removed == n {
			return
		}
		f.Body = body
	}
}

func inBody(f *ir.Func, op *ir.Op) bool {
	for _, o := range f.Body {
		if o == op {
			return true
		}
	}
	return false
}
