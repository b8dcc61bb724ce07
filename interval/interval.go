// Package interval holds ordered sets for sweeps over intervals: Tree, a
// balanced search tree (a treap) of items under a strict order, and Set,
// a set of disjoint half-open intervals that finds the one a new interval
// would overlap in O(log n). The allocators and the checkers of buffer
// offsets use them to stay O(n log n) on steps of 100,000 buffers.
package interval

// Tree is an ordered set of items under less (no two equal items). The
// zero Tree is not ready: use NewTree.
type Tree[T any] struct {
	root *node[T]
	less func(a, b T) bool
	seed uint64
	n    int
}

type node[T any] struct {
	item        T
	pri         uint64
	left, right *node[T]
}

// NewTree returns an empty tree ordered by less.
func NewTree[T any](less func(a, b T) bool) *Tree[T] {
	return &Tree[T]{less: less, seed: 0x9E3779B97F4A7C15}
}

// Len is the number of items.
func (t *Tree[T]) Len() int { return t.n }

// priority draws node priorities from a fixed sequence, so that the
// tree's shape, and every result, is deterministic.
func (t *Tree[T]) priority() uint64 {
	t.seed += 0x9E3779B97F4A7C15
	z := t.seed
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// split returns the items less than x and the rest.
func (t *Tree[T]) split(n *node[T], x T) (l, r *node[T]) {
	if n == nil {
		return nil, nil
	}
	if t.less(n.item, x) {
		a, b := t.split(n.right, x)
		n.right = a
		return n, b
	}
	a, b := t.split(n.left, x)
	n.left = b
	return a, n
}

func merge[T any](l, r *node[T]) *node[T] {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.pri > r.pri:
		l.right = merge(l.right, r)
		return l
	}
	r.left = merge(l, r.left)
	return r
}

// Insert adds x (an item equal to one present is added again).
func (t *Tree[T]) Insert(x T) {
	l, r := t.split(t.root, x)
	t.root = merge(merge(l, &node[T]{item: x, pri: t.priority()}), r)
	t.n++
}

// Delete removes the item equal to x and reports whether there was one.
func (t *Tree[T]) Delete(x T) bool {
	var del func(n *node[T]) (*node[T], bool)
	del = func(n *node[T]) (*node[T], bool) {
		switch {
		case n == nil:
			return nil, false
		case t.less(x, n.item):
			var ok bool
			n.left, ok = del(n.left)
			return n, ok
		case t.less(n.item, x):
			var ok bool
			n.right, ok = del(n.right)
			return n, ok
		}
		return merge(n.left, n.right), true
	}
	var ok bool
	t.root, ok = del(t.root)
	if ok {
		t.n--
	}
	return ok
}

// Ceil returns the smallest item not less than x.
func (t *Tree[T]) Ceil(x T) (T, bool) {
	var best T
	found := false
	for n := t.root; n != nil; {
		if t.less(n.item, x) {
			n = n.right
		} else {
			best, found = n.item, true
			n = n.left
		}
	}
	return best, found
}

// Below returns the largest item less than x.
func (t *Tree[T]) Below(x T) (T, bool) {
	var best T
	found := false
	for n := t.root; n != nil; {
		if t.less(n.item, x) {
			best, found = n.item, true
			n = n.right
		} else {
			n = n.left
		}
	}
	return best, found
}

// Span is a half-open interval [Lo, Hi) with an identifier.
type Span struct {
	Lo, Hi int64
	ID     int
}

// Set is a set of disjoint spans ordered by start.
type Set struct{ t *Tree[Span] }

// NewSet returns an empty set.
func NewSet() *Set {
	return &Set{t: NewTree(func(a, b Span) bool { return a.Lo < b.Lo })}
}

// Len is the number of spans.
func (s *Set) Len() int { return s.t.Len() }

// Overlap returns a span of the set that shares a point with [lo, hi),
// if one does. Because the spans are disjoint, only the last one starting
// before hi can.
func (s *Set) Overlap(lo, hi int64) (Span, bool) {
	if hi <= lo {
		return Span{}, false
	}
	c, ok := s.t.Below(Span{Lo: hi})
	if ok && c.Hi > lo {
		return c, true
	}
	return Span{}, false
}

// Insert adds a span; it must not overlap one in the set.
func (s *Set) Insert(sp Span) { s.t.Insert(sp) }

// Delete removes the span starting at lo.
func (s *Set) Delete(lo int64) bool { return s.t.Delete(Span{Lo: lo}) }

// Below returns the span starting last before x.
func (s *Set) Below(x int64) (Span, bool) { return s.t.Below(Span{Lo: x}) }

// From returns the span starting first at or after x.
func (s *Set) From(x int64) (Span, bool) { return s.t.Ceil(Span{Lo: x}) }
