package interp

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/kiln-compiler/kiln/ir"
)

// comm joins the ranks of one RunRanks: each collective waits until every
// rank of its group has brought its tensor, then each takes its part.
// A rank that fails wakes the others with an error.
type comm struct {
	ranks  int64
	mu     sync.Mutex
	wake   *sync.Cond
	calls  map[callKey]*call
	next   map[seqKey]int64 // each rank's count of collectives per group
	failed error
	// Sends waiting for their recvs, and the ranks that wait (in a recv
	// or a collective) or have finished: when all of them do, none can
	// go on.
	mail    map[mailKey][]*Tensor
	waiters map[*func() bool]bool
	done    int64
}

// mailKey names the messages from one rank to another with one tag.
type mailKey struct{ from, to, tag int64 }

// errDeadlock is what every rank of a run returns when they all wait.
var errDeadlock = errors.New("deadlock: every rank waits for a recv or collective that no rank can reach")

// wait blocks until ready() holds or the run fails, counting the rank
// as blocked meanwhile; c.mu is held.
func (c *comm) wait(ready func() bool) error {
	c.waiters[&ready] = true
	defer delete(c.waiters, &ready)
	for !ready() && c.failed == nil {
		if c.stuck() {
			c.failed = errDeadlock
			c.wake.Broadcast()
			break
		}
		c.wake.Wait()
	}
	if ready() {
		return nil
	}
	if c.failed == errDeadlock {
		return errDeadlock
	}
	return errOtherRank
}

// stuck reports whether every rank has finished or waits for what has
// not come.
func (c *comm) stuck() bool {
	if int64(len(c.waiters))+c.done != c.ranks {
		return false
	}
	for w := range c.waiters {
		if (*w)() {
			return false
		}
	}
	return true
}

// unread is the first (by sender, receiver, tag) of the messages no recv
// took, and how many there are under its key.
func (c *comm) unread() (mailKey, int) {
	var first mailKey
	n := 0
	for k, m := range c.mail {
		if len(m) > 0 && (n == 0 || k.from < first.from || k.from == first.from && (k.to < first.to || k.to == first.to && k.tag < first.tag)) {
			first, n = k, len(m)
		}
	}
	return first, n
}

// finish marks a rank as done.
func (c *comm) finish() {
	c.mu.Lock()
	c.done++
	c.mu.Unlock()
	c.wake.Broadcast()
}

// pointToPoint runs a send or recv of rank rt.rank.
func pointToPoint(op *ir.Op, in []*Tensor, out []ir.Type, rt *runtime) ([]*Tensor, error) {
	c := rt.comm
	a := op.Attr()
	peer := rt.rank + a.Int("offset")
	if c == nil || peer < 0 || peer >= c.ranks {
		n := int64(1)
		if c != nil {
			n = c.ranks
		}
		return nil, fmt.Errorf("rank %d %ss with rank %d, which is not in this run of %d ranks", rt.rank, op.Kind, peer, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if op.Kind == "send" {
		k := mailKey{rt.rank, peer, a.Int("tag")}
		c.mail[k] = append(c.mail[k], in[0].Clone())
		c.wake.Broadcast()
		return nil, nil
	}
	k := mailKey{peer, rt.rank, a.Int("tag")}
	if err := c.wait(func() bool { return len(c.mail[k]) > 0 }); err != nil {
		return nil, err
	}
	x := c.mail[k][0]
	c.mail[k] = c.mail[k][1:]
	if !x.Type.Equal(out[0]) {
		return nil, fmt.Errorf("rank %d receives %s with tag %d from rank %d, which sent %s", rt.rank, out[0], a.Int("tag"), peer, x.Type)
	}
	return []*Tensor{x}, nil
}

// A group is named by its first rank, size and stride; its n-th
// collective is one call.
type groupKey struct{ base, size, stride int64 }
type callKey struct {
	g   groupKey
	seq int64
}
type seqKey struct {
	rank int64
	g    groupKey
}

type call struct {
	op     []*ir.Op // each member's op
	in     []*Tensor
	came   int
	out    []*Tensor
	err    error
	done   bool
	served int
}

// errOtherRank is what ranks waiting on a failed rank return.
var errOtherRank = errors.New("another rank failed")

func newComm(ranks int64) *comm {
	c := &comm{ranks: ranks, calls: map[callKey]*call{}, next: map[seqKey]int64{}, mail: map[mailKey][]*Tensor{}, waiters: map[*func() bool]bool{}}
	c.wake = sync.NewCond(&c.mu)
	return c
}

func (c *comm) fail(err error) {
	c.mu.Lock()
	if c.failed == nil {
		c.failed = err
	}
	c.mu.Unlock()
	c.wake.Broadcast()
}

// collective runs op on rank's tensor x with the rest of its group.
func collective(op *ir.Op, x *Tensor, out ir.Type, rt *runtime) (*Tensor, error) {
	size, stride := ir.CollectiveGroup(op)
	if size == 1 {
		return x.Clone(), nil
	}
	c := rt.comm
	if c == nil {
		return nil, fmt.Errorf("a group of %d ranks needs a run of as many ranks (this run has one)", size)
	}
	if size > c.ranks || stride > c.ranks || c.ranks%(size*stride) != 0 {
		return nil, fmt.Errorf("groups of %d ranks, %d apart, do not tile a run of %d ranks", size, stride, c.ranks)
	}
	members := ir.GroupOf(rt.rank, size, stride)
	me := 0
	for i, r := range members {
		if r == rt.rank {
			me = i
		}
	}
	g := groupKey{members[0], size, stride}
	c.mu.Lock()
	defer c.mu.Unlock()
	sk := seqKey{rt.rank, g}
	key := callKey{g, c.next[sk]}
	c.next[sk]++
	cl := c.calls[key]
	if cl == nil {
		cl = &call{op: make([]*ir.Op, size), in: make([]*Tensor, size)}
		c.calls[key] = cl
	}
	cl.op[me], cl.in[me] = op, x
	cl.came++
	if cl.came == int(size) {
		cl.out, cl.err = combine(cl.op, cl.in, out)
		cl.done = true
		c.wake.Broadcast()
	}
	if err := c.wait(func() bool { return cl.done }); err != nil {
		return nil, err
	}
	cl.served++
	if cl.served == int(size) {
		delete(c.calls, key)
	}
	if cl.err != nil {
		return nil, cl.err
	}
	return cl.out[me], nil
}

// Collective runs the collective op on every rank of a run of
// len(in) ranks at once, rank r bringing in[r] (every rank runs op): the
// results per rank. It is what RunRanks does at one collective, for
// replays that step the ranks in lockstep.
func Collective(op *ir.Op, in []*Tensor) ([]*Tensor, error) {
	n := int64(len(in))
	size, stride := ir.CollectiveGroup(op)
	if size > n || stride > n || n%(size*stride) != 0 {
		return nil, fmt.Errorf("groups of %d ranks, %d apart, do not tile a run of %d ranks", size, stride, n)
	}
	out := make([]*Tensor, n)
	ops := make([]*ir.Op, size)
	for i := range ops {
		ops[i] = op
	}
	for r := int64(0); r < n; r++ {
		members := ir.GroupOf(r, size, stride)
		if members[0] != r {
			continue // the group's first rank computes it
		}
		gin := make([]*Tensor, size)
		for i, m := range members {
			gin[i] = in[m]
		}
		res, err := combine(ops, gin, op.Results[0].Type)
		if err != nil {
			return nil, err
		}
		for i, m := range members {
			out[m] = res[i]
		}
	}
	return out, nil
}

// combine computes every member's result of one collective call.
func combine(ops []*ir.Op, in []*Tensor, out ir.Type) ([]*Tensor, error) {
	for i := range ops {
		if ops[i].Kind != ops[0].Kind || !in[i].Type.Equal(in[0].Type) || !sameAttrs(ops[i].Attrs, ops[0].Attrs) {
			return nil, fmt.Errorf("the group's ranks disagree: its first rank runs %s on %s, its rank %d %s on %s",
				ops[0].Kind, in[0].Type, i, ops[i].Kind, in[i].Type)
		}
	}
	op, n := ops[0], len(in)
	res := make([]*Tensor, n)
	switch op.Kind {
	case "all_reduce":
		r := reduceAll(in, op.Attr().String("op"))
		for i := range res {
			res[i] = r.Clone()
		}
	case "reduce_scatter":
		r := reduceAll(in, op.Attr().String("op"))
		for i := range res {
			res[i] = part(r, op, out, i)
		}
	case "all_gather":
		r := gatherAll(in, op, out)
		for i := range res {
			res[i] = r.Clone()
		}
	case "broadcast":
		for i := range res {
			res[i] = in[op.Attr().Int("root")].Clone()
		}
	default:
		return nil, fmt.Errorf("%s is not a collective", op.Kind)
	}
	return res, nil
}

func sameAttrs(a, b ir.Attrs) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !v.Equal(w) {
			return false
		}
	}
	return true
}

// reduceAll folds the members' tensors in group order, rounding each step
// to the dtype.
func reduceAll(in []*Tensor, how string) *Tensor {
	r := in[0].Clone()
	for _, x := range in[1:] {
		for j := range r.F {
			switch how {
			case "sum":
				r.F[j] = ir.RoundTo(r.Type.DType, r.F[j]+x.F[j])
			case "max":
				r.F[j] = math.Max(r.F[j], x.F[j])
			case "min":
				r.F[j] = math.Min(r.F[j], x.F[j])
			}
		}
		unsigned := r.Type.DType == ir.U64
		for j := range r.I {
			switch {
			case how == "sum":
				r.I[j] += x.I[j]
			case how == "max" && unsigned:
				r.I[j] = int64(max(uint64(r.I[j]), uint64(x.I[j])))
			case how == "min" && unsigned:
				r.I[j] = int64(min(uint64(r.I[j]), uint64(x.I[j])))
			case how == "max":
				r.I[j] = max(r.I[j], x.I[j])
			case how == "min":
				r.I[j] = min(r.I[j], x.I[j])
			}
		}
	}
	return r
}

// layout is x's shape around axis: outer × d × inner.
func layout(s ir.Shape, op *ir.Op) (outer, d, inner int64) {
	ax, _ := ir.NormalizeAxis(op.Attr().Int("axis"), len(s))
	outer, _ = s[:ax].NumElements()
	inner, _ = s[ax+1:].NumElements()
	return outer, s[ax], inner
}

// part is member i's part of x cut along the op's axis.
func part(x *Tensor, op *ir.Op, out ir.Type, i int) *Tensor {
	outer, d, inner := layout(x.Type.Shape, op)
	y := New(out)
	_, od, _ := layout(out.Shape, op)
	for o := int64(0); o < outer; o++ {
		for j := int64(0); j < od*inner; j++ {
			copyElem(y, o*od*inner+j, x, o*d*inner+int64(i)*od*inner+j)
		}
	}
	return y
}

// gatherAll concatenates the members' tensors along the op's axis.
func gatherAll(in []*Tensor, op *ir.Op, out ir.Type) *Tensor {
	y := New(out)
	outer, d, inner := layout(in[0].Type.Shape, op)
	od := d * int64(len(in))
	for i, x := range in {
		for o := int64(0); o < outer; o++ {
			for j := int64(0); j < d*inner; j++ {
				copyElem(y, o*od*inner+int64(i)*d*inner+j, x, o*d*inner+j)
			}
		}
	}
	return y
}

func init() {
	kernels["send"] = pointToPoint
	kernels["recv"] = pointToPoint
	for _, name := range []string{"all_reduce", "reduce_scatter", "all_gather", "broadcast"} {
		kernels[name] = func(op *ir.Op, in []*Tensor, out []ir.Type, rt *runtime) ([]*Tensor, error) {
			y, err := collective(op, in[0], out[0], rt)
			if err != nil {
				return nil, err
			}
			return []*Tensor{y}, nil
		}
	}
}
