package remat

import (
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
)

// pruneWork bounds prune's op visits (an analysis of the schedule or of
// liveness visits every op; a trial takes one, an accepted one two more):
// about 30 trials on a 1000-op step, 3 on a 10,000-op one. The costliest
// recomputations are tried first, in chunks that double, so a large step
// stops after the ones that matter.
const pruneWork = 100_000

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
// (same kind, attributes and result types, operands that are the
// original's or copies of them; a region's ops by kind and attributes),
// so a plan is only ever rewritten back towards the function it came
// from, and only where the original precedes the copy's readers. Values marked remat = "always" stay
// recomputed, and so do values whose memory is an argument that the step
// overwrites.
func prune(f *ir.Func, target int64) bool {
	origin := originals(f)
	written := writtenArgs(f)
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
			if o := origin[r]; o != nil && o.Def.Attr().String("remat") != "always" && !overwrittenMemory(o, written) {
				sites = append(sites, site{r, traffic})
			}
		}
	}
	if len(sites) == 0 {
		return false
	}
	sort.SliceStable(sites, func(i, j int) bool { return sites[i].traffic > sites[j].traffic })
	rw := &rewriter{f: f, keep: map[*ir.Value]bool{}}
	sched, info := rw.sched(), rw.live()
	eligible := func(c *ir.Value) bool {
		o := origin[c]
		if _, inBody := sched.pos[c.Def]; !inBody || len(sched.uses[c]) == 0 {
			return false // removed with a copy it fed, or unread
		}
		if sched.pos[o.Def] >= sched.uses[c][0] {
			return false // the original comes after a reader (a plan reordered by hand)
		}
		// A value kept across the peak, where neither it nor its copy was
		// live, raises the peak by its size: no need to analyse that.
		return o.Type.SizeBytes() <= target-info.Peak || sched.pos[o.Def] >= info.PeakAt ||
			sched.lastUse[o] >= info.PeakAt || sched.pos[c.Def] <= info.PeakAt
	}
	// Sites go in chunks that double while whole chunks are taken and
	// halve when one raises the peak too far, down to single sites.
	changed := false
	for i, chunk := 0, 1; i < len(sites) && !rw.tiredAt(pruneWork); {
		var batch []*ir.Value
		j := i
		for ; j < len(sites) && len(batch) < chunk; j++ {
			if eligible(sites[j].copy) {
				batch = append(batch, sites[j].copy)
			}
		}
		if len(batch) == 0 {
			break
		}
		rw.begin()
		for _, c := range batch {
			for _, u := range sched.uses[c] {
				op := f.Body[u]
				for k, x := range op.Operands {
					if x == c {
						rw.replaced = append(rw.replaced, replacement{op, k, x})
						op.Operands[k] = origin[c]
					}
				}
			}
		}
		removeUnreadCopies(f)
		if now := rw.live(); now.Peak <= target {
			changed = true
			sched, info = rw.sched(), now
			i, chunk = j, chunk*2
			continue
		}
		rw.undo()
		if len(batch) == 1 {
			i, chunk = j, 1
		} else {
			chunk = len(batch) / 2
		}
	}
	return changed
}

// writtenArgs is the set of f's arguments that its ops overwrite.
func writtenArgs(f *ir.Func) map[*ir.Value]bool {
	w := map[*ir.Value]bool{}
	for _, op := range f.Body {
		if d := op.Def(); d != nil {
			for _, k := range d.Writes {
				w[op.Operands[k]] = true
			}
		}
	}
	return w
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
// an argument the step overwrites (written): keeping v longer would read
// the new contents.
func overwrittenMemory(v *ir.Value, written map[*ir.Value]bool) bool {
	for v.Def != nil {
		d := v.Def.Def()
		if d == nil || !d.View || v.Index != 0 || len(v.Def.Operands) == 0 {
			return false
		}
		v = v.Def.Operands[0]
	}
	return written[v]
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
