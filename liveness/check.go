package liveness

import (
	"fmt"
	"math"
	"sort"

	"github.com/kiln-compiler/kiln/interval"
	"github.com/kiln-compiler/kiln/ir"
)

// CheckOffsets verifies the arena offsets of a function at the memory
// level, independently of how they were chosen: every value that needs
// arena memory has an aligned offset, views sit at their operand's
// offset, no two values live at the same time share a byte unless one is a
// view of the other or was written in place over it as it died, and the
// arena attribute covers every value. A function whose values carry no
// offset is not at the memory level and passes; one with offsets but no
// "arena" attribute (a plugin's output, say) is checked against the
// arena its offsets span.
func CheckOffsets(f *ir.Func) error {
	arena := int64(math.MaxInt64)
	if a, ok := f.Attrs["arena"]; ok {
		arena = a.Int
	} else if !hasOffsets(f) {
		return nil
	}
	align := f.Attrs.Int("alignment", 1)
	if align < 1 {
		align = 1
	}
	n := len(f.Body)
	last := map[*ir.Value]int{}
	for i, op := range f.Body {
		for _, v := range op.Operands {
			last[v] = i
		}
	}
	isResult := map[*ir.Value]bool{}
	for _, r := range f.Results {
		last[r.Value] = n - 1
		isResult[r.Value] = true
	}
	// Groups: a value joins its operand's group when it is a view, or when
	// it was placed in place over an operand that dies at its op.
	parent := map[*ir.Value]*ir.Value{}
	var find func(v *ir.Value) *ir.Value
	find = func(v *ir.Value) *ir.Value {
		for parent[v] != nil && parent[v] != v {
			v = parent[v]
		}
		return v
	}
	onArg := map[*ir.Value]bool{}
	for _, a := range f.Args {
		onArg[a] = true
		if a.Offset != ir.NoOffset {
			return fmt.Errorf("@%s: argument %s has an arena offset", f.Name, a.Ref())
		}
	}
	// groupEnd is the last use of any member of a group so far.
	groupEnd := map[*ir.Value]int{}
	join := func(r, root *ir.Value, i int) {
		parent[r] = root
		end := i
		if l, ok := last[r]; ok {
			end = l
		}
		groupEnd[root] = max(groupEnd[root], end)
		if isResult[r] {
			groupEnd[root] = n // a result's storage is never taken over
		}
	}
	hostArena := f.Attrs.Int("host_arena", 0)
	var hostSpans []*span
	for i, op := range f.Body {
		d := op.Def()
		for j, r := range op.Results {
			if ir.HostResult(r) {
				if r.Offset == ir.NoOffset || r.Offset%align != 0 || r.Offset+r.Type.SizeBytes() > hostArena {
					return fmt.Errorf("@%s: host tensor %s at offset %d does not fit the host arena of %d bytes with alignment %d", f.Name, r.Ref(), r.Offset, hostArena, align)
				}
				end := i
				if l, ok := last[r]; ok {
					end = l
				}
				hostSpans = append(hostSpans, &span{root: r, start: i, end: end, lo: r.Offset, hi: r.Offset + r.Type.SizeBytes()})
				continue
			}
			if d != nil && d.View && j == 0 {
				x := op.Operands[0]
				if onArg[find(x)] {
					onArg[r] = true
					parent[r] = find(x)
					if r.Offset != ir.NoOffset {
						return fmt.Errorf("@%s: %s views an argument but has an arena offset", f.Name, r.Ref())
					}
					continue
				}
				if r.Offset != x.Offset {
					return fmt.Errorf("@%s: view %s at offset %d does not sit at its operand %s (offset %d)", f.Name, r.Ref(), r.Offset, x.Ref(), x.Offset)
				}
				join(r, find(x), i)
				continue
			}
			if r.Offset == ir.NoOffset {
				return fmt.Errorf("@%s: %s has no arena offset", f.Name, r.Ref())
			}
			if r.Offset%align != 0 {
				return fmt.Errorf("@%s: offset %d of %s is not a multiple of the alignment %d", f.Name, r.Offset, r.Ref(), align)
			}
			if r.Offset+r.Type.SizeBytes() > arena {
				return fmt.Errorf("@%s: %s [%d, %d) does not fit the arena of %d bytes", f.Name, r.Ref(), r.Offset, r.Offset+r.Type.SizeBytes(), arena)
			}
			root := r
			if d != nil && d.InPlace && j == 0 {
				for k, x := range op.Operands {
					g := find(x)
					if d.MayOverwrite(k) && x.Offset == r.Offset && !onArg[g] && x.Type.SizeBytes() == r.Type.SizeBytes() && groupEnd[g] <= i {
						root = g
						break
					}
				}
			}
			join(r, root, i)
		}
	}
	groups := map[*ir.Value]*span{}
	var order []*ir.Value
	for i, op := range f.Body {
		for _, r := range op.Results {
			g := find(r)
			if onArg[g] || ir.HostResult(r) {
				continue
			}
			end := i
			if l, ok := last[r]; ok {
				end = l
			}
			s := groups[g]
			if s == nil {
				s = &span{root: g, start: i, end: end, lo: g.Offset, hi: g.Offset + g.Type.SizeBytes()}
				groups[g] = s
				order = append(order, g)
			}
			s.end = max(s.end, end)
			s.hi = max(s.hi, r.Offset+r.Type.SizeBytes())
		}
	}
	spans := make([]*span, len(order))
	for i, g := range order {
		spans[i] = groups[g]
	}
	if err := disjoint(f, spans); err != nil {
		return err
	}
	return disjoint(f, hostSpans)
}

// hasOffsets reports whether any value of f carries an arena offset.
func hasOffsets(f *ir.Func) bool {
	for _, a := range f.Args {
		if a.Offset != ir.NoOffset {
			return true
		}
	}
	found := false
	f.Walk(func(op *ir.Op) {
		for _, r := range op.Results {
			found = found || r.Offset != ir.NoOffset
		}
	})
	return found
}

// span is a group of values sharing memory: live on ops start..end, at
// bytes [lo, hi).
type span struct {
	root       *ir.Value
	start, end int
	lo, hi     int64
}

// disjoint reports two spans live together whose bytes overlap, sweeping
// over the schedule: the spans live at one op are disjoint so far, so a
// new one overlaps one of them exactly when it overlaps its neighbour.
func disjoint(f *ir.Func, spans []*span) error {
	type event struct {
		t     int
		start bool
		s     *span
	}
	var evs []event
	for _, s := range spans {
		if s.lo != s.hi {
			evs = append(evs, event{s.start, true, s}, event{s.end + 1, false, s})
		}
	}
	sort.SliceStable(evs, func(a, b int) bool {
		if evs[a].t != evs[b].t {
			return evs[a].t < evs[b].t
		}
		return !evs[a].start && evs[b].start
	})
	live := interval.NewSet()
	byIndex := make([]*span, 0, len(spans))
	for _, e := range evs {
		if !e.start {
			live.Delete(e.s.lo)
			continue
		}
		if c, ok := live.Overlap(e.s.lo, e.s.hi); ok {
			a, s := byIndex[c.ID], e.s
			return fmt.Errorf("@%s: %s [%d, %d) and %s [%d, %d) are live together (ops %d-%d and %d-%d) and overlap",
				f.Name, a.root.Ref(), a.lo, a.hi, s.root.Ref(), s.lo, s.hi, a.start, a.end, s.start, s.end)
		}
		live.Insert(interval.Span{Lo: e.s.lo, Hi: e.s.hi, ID: len(byIndex)})
		byIndex = append(byIndex, e.s)
	}
	return nil
}
