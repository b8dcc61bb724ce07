package alloc

import (
	"sort"

	"github.com/kiln-compiler/kiln/interval"
)

// TimeOrdered allocates as a runtime allocator would, in O(n log n): in
// schedule order, buffers that end are freed (their blocks coalesce with
// free neighbours) before those that start are placed, largest first,
// each in the smallest free block that fits (lowest offset among equals),
// or at the top of the arena. It packs worse than the size-ordered greedy
// heuristics on most problems, but its time does not grow with the number
// of buffers live together: it is what large problems fall back to.
func TimeOrdered(p *Problem) *Solution {
	n := len(p.Buffers)
	offs := make([]int64, n)
	type event struct {
		t     int64
		start bool
		i     int
	}
	var evs []event
	for i, b := range p.Buffers {
		if b.Upper > b.Lower && b.Size > 0 {
			evs = append(evs, event{b.Lower, true, i}, event{b.Upper, false, i})
		}
	}
	sort.Slice(evs, func(x, y int) bool {
		a, b := evs[x], evs[y]
		switch {
		case a.t != b.t:
			return a.t < b.t
		case a.start != b.start:
			return !a.start // frees first
		case a.start:
			sa, sb := p.alignedSize(a.i), p.alignedSize(b.i)
			if sa != sb {
				return sa > sb
			}
		}
		return a.i < b.i
	})
	byOffset := interval.NewSet()
	bySize := interval.NewTree(func(a, b interval.Span) bool {
		if sa, sb := a.Hi-a.Lo, b.Hi-b.Lo; sa != sb {
			return sa < sb
		}
		return a.Lo < b.Lo
	})
	addFree := func(s interval.Span) {
		if s.Hi > s.Lo {
			byOffset.Insert(s)
			bySize.Insert(s)
		}
	}
	removeFree := func(s interval.Span) {
		byOffset.Delete(s.Lo)
		bySize.Delete(s)
	}
	top := int64(0)
	for _, e := range evs {
		size := p.alignedSize(e.i)
		if !e.start {
			s := interval.Span{Lo: offs[e.i], Hi: offs[e.i] + size}
			if prev, ok := byOffset.Below(s.Lo); ok && prev.Hi == s.Lo {
				removeFree(prev)
				s.Lo = prev.Lo
			}
			if next, ok := byOffset.From(s.Hi); ok && next.Lo == s.Hi {
				removeFree(next)
				s.Hi = next.Hi
			}
			addFree(s)
			continue
		}
		if blk, ok := bySize.Ceil(interval.Span{Lo: -1 << 62, Hi: -1<<62 + size}); ok {
			removeFree(blk)
			offs[e.i] = blk.Lo
			addFree(interval.Span{Lo: blk.Lo + size, Hi: blk.Hi})
			continue
		}
		// Nothing fits: take the free block at the top, if any, and grow.
		at := top
		if last, ok := byOffset.Below(top); ok && last.Hi == top {
			removeFree(last)
			at = last.Lo
		}
		offs[e.i] = at
		top = at + size
	}
	return finish(p, offs, "time-order")
}
