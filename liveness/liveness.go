// Package liveness computes the memory a schedule needs: live intervals of
// every value of a function's top-level block, buffers (a value, the views
// that alias it, and results written in place over it), live bytes at
// every program point, the peak and the values live there. Counting
// follows the design notes' Contracts: at an op its operands and results
// are live together, unless a result is a view of an operand or written in
// place over an operand that dies there (they share one buffer);
// arguments count for the whole function; results live to the end. Values
// inside kernel regions are internal to their kernel and take no memory.
package liveness

import (
	"sort"

	"github.com/kiln-compiler/kiln/ir"
)

// Buffer is memory shared by one or more values. Start and End are the
// indices of the first and last ops at which it is live (inclusive).
type Buffer struct {
	ID     int
	Values []*ir.Value // the root first, then views and in-place results in order
	Size   int64
	Start  int
	End    int
	// Arg is set for buffers rooted at a function argument (not in the
	// arena; live for the whole function).
	Arg bool
	// Host is set for buffers in host memory: swap_out results, which are
	// in HostBuffers, not Buffers, and count towards HostPeak only; and
	// host arguments (ir.HostArg), which count towards HostArgBytes only.
	Host bool

	pinned bool // holds a function result
}

// Root is the value that owns the buffer.
func (b *Buffer) Root() *ir.Value { return b.Values[0] }

// Info is the memory analysis of a function under its current schedule.
type Info struct {
	Func     *ir.Func
	Buffers  []*Buffer // arena buffers first in definition order, then argument buffers
	BufferOf map[*ir.Value]*Buffer
	// Bytes of device arguments by kind, and of results.
	ParamBytes, StateBytes, InputBytes, OutputBytes int64
	// HostArgBytes are the arguments held in host memory (offloaded).
	HostArgBytes int64
	// Live[i] is the live bytes while op i runs, arguments included.
	Live   []int64
	Peak   int64
	PeakAt int // index of the first op where the peak is reached (-1: no ops)
	// HostBuffers are the swap_out results; HostPeak the most host bytes
	// live at once, SwappedBytes the bytes copied out to the host.
	HostBuffers  []*Buffer
	HostPeak     int64
	SwappedBytes int64
}

// Options tune the analysis.
type Options struct {
	// NoInPlace disables in-place reuse (results always get new buffers).
	NoInPlace bool
}

// Analyze computes the memory of f's schedule.
func Analyze(f *ir.Func) *Info { return AnalyzeWith(f, Options{}) }

// AnalyzeWith is Analyze with options.
func AnalyzeWith(f *ir.Func, opt Options) *Info {
	n := len(f.Body)
	// Sized maps: passes analyse thousands of trial schedules.
	info := &Info{Func: f, BufferOf: make(map[*ir.Value]*Buffer, n+len(f.Args)), PeakAt: -1}
	last := make(map[*ir.Value]int, n+len(f.Args))
	for i, op := range f.Body {
		for _, v := range op.Operands {
			last[v] = i
		}
	}
	holdSentTensors(f, last)
	isResult := map[*ir.Value]bool{}
	for _, r := range f.Results {
		isResult[r.Value] = true
	}
	var argBufs []*Buffer
	for _, a := range f.Args {
		b := &Buffer{Values: []*ir.Value{a}, Size: a.Type.SizeBytes(), Start: 0, End: n - 1, Arg: true, Host: ir.HostArg(a)}
		info.BufferOf[a] = b
		argBufs = append(argBufs, b)
		switch {
		case b.Host:
			info.HostArgBytes += b.Size
		case a.Arg.Kind == ir.ArgParam:
			info.ParamBytes += b.Size
		case a.Arg.Kind == ir.ArgState:
			info.StateBytes += b.Size
		default:
			info.InputBytes += b.Size
		}
	}
	// lastOf is the last op index at which any member of b is used so far.
	lastOf := func(v *ir.Value) int {
		if isResult[v] {
			return n - 1
		}
		if l, ok := last[v]; ok {
			return l
		}
		if v.Def != nil {
			return -2 // unused: filled with its definition below
		}
		return n - 1
	}
	var bufs []*Buffer
	for i, op := range f.Body {
		d := op.Def()
		for j, r := range op.Results {
			var into *Buffer
			if d != nil && j == 0 && len(op.Operands) > 0 {
				switch {
				case d.View:
					into = info.BufferOf[op.Operands[0]]
				case d.InPlace && !opt.NoInPlace:
					into = inPlaceTarget(info, op, r, i, lastOf, isResult)
				}
			}
			end := lastOf(r)
			if end == -2 {
				end = i
			}
			if ir.HostResult(r) {
				b := &Buffer{Values: []*ir.Value{r}, Size: r.Type.SizeBytes(), Start: i, End: end, Host: true}
				info.HostBuffers = append(info.HostBuffers, b)
				info.BufferOf[r] = b
				info.SwappedBytes += b.Size
				continue
			}
			if into != nil {
				into.Values = append(into.Values, r)
				if !into.Arg {
					into.End = max(into.End, end)
				}
				into.pinned = into.pinned || isResult[r]
				info.BufferOf[r] = into
				continue
			}
			b := &Buffer{Values: []*ir.Value{r}, Size: r.Type.SizeBytes(), Start: i, End: end, pinned: isResult[r]}
			bufs = append(bufs, b)
			info.BufferOf[r] = b
		}
	}
	for _, r := range f.Results {
		info.OutputBytes += r.Value.Type.SizeBytes()
	}
	for i, b := range bufs {
		b.ID = i
	}
	for i, b := range argBufs {
		b.ID = len(bufs) + i
	}
	info.Buffers = append(bufs, argBufs...)

	// Live bytes by a difference array over the schedule.
	args := info.ParamBytes + info.StateBytes + info.InputBytes
	diff := make([]int64, n+1)
	for _, b := range bufs {
		diff[b.Start] += b.Size
		diff[b.End+1] -= b.Size
	}
	hostDiff := make([]int64, n+1)
	for j, b := range info.HostBuffers {
		b.ID = len(info.Buffers) + j
		hostDiff[b.Start] += b.Size
		hostDiff[b.End+1] -= b.Size
	}
	for i, cur := 0, int64(0); i < n; i++ {
		cur += hostDiff[i]
		info.HostPeak = max(info.HostPeak, cur)
	}
	info.Live = make([]int64, n)
	cur := int64(0)
	info.Peak = args
	for i := 0; i < n; i++ {
		cur += diff[i]
		info.Live[i] = cur + args
		if info.Live[i] > info.Peak || info.PeakAt < 0 {
			info.Peak, info.PeakAt = info.Live[i], i
		}
	}
	return info
}

// holdSentTensors keeps the tensor of each send with held_until live until
// the recv that attribute names (the recv from the same peer with that
// tag), or to the end of f for -1: until then the send may be pending,
// and nothing may write over its tensor.
func holdSentTensors(f *ir.Func, last map[*ir.Value]int) {
	recvAt := map[[2]int64]int{}
	for i, op := range f.Body {
		if op.Kind == "recv" {
			recvAt[[2]int64{op.Attr().Int("offset"), op.Attr().Int("tag")}] = i
		}
	}
	for _, op := range f.Body {
		if op.Kind != "send" || !op.Attr().Has("held_until") {
			continue
		}
		until := len(f.Body) - 1
		if tag := op.Attr().Int("held_until"); tag >= 0 {
			if j, ok := recvAt[[2]int64{op.Attr().Int("offset"), tag}]; ok {
				until = j
			} // no such recv: held to the end, the safe side
		}
		v := op.Operands[0]
		last[v] = max(last[v], until)
	}
}

// sharedWithOther reports whether an operand of op other than operand k
// lies in buffer b.
func sharedWithOther(info *Info, op *ir.Op, k int, b *Buffer) bool {
	for j, y := range op.Operands {
		if j != k && info.BufferOf[y] == b {
			return true
		}
	}
	return false
}

// inPlaceTarget returns the buffer of an operand that op's result r may
// overwrite: same byte size, not an argument or a function result, and
// dead after op i. An op that may overwrite only some operands (gemm's C)
// reads the others at other indices, so the buffer must be no other
// operand's.
func inPlaceTarget(info *Info, op *ir.Op, r *ir.Value, i int, lastOf func(*ir.Value) int, isResult map[*ir.Value]bool) *Buffer {
	d := op.Def()
	for k, x := range op.Operands {
		b := info.BufferOf[x]
		if b == nil || !d.MayOverwrite(k) || b.Arg || b.Size != r.Type.SizeBytes() || x.Type.DType != r.Type.DType || !x.Type.Shape.Equal(r.Type.Shape) {
			continue
		}
		if d.InPlaceOperands != nil && sharedWithOther(info, op, k, b) {
			continue
		}
		if b.End <= i && !b.pinned {
			return b
		}
	}
	return nil
}

// LiveAt returns the arena buffers live while op i runs.
func (info *Info) LiveAt(i int) []*Buffer {
	var out []*Buffer
	for _, b := range info.Buffers {
		if !b.Arg && b.Start <= i && i <= b.End {
			out = append(out, b)
		}
	}
	return out
}

// Largest returns the k largest arena buffers live at the peak, largest
// first (ties by definition order).
func (info *Info) Largest(k int) []*Buffer {
	if info.PeakAt < 0 {
		return nil
	}
	live := info.LiveAt(info.PeakAt)
	sort.SliceStable(live, func(a, b int) bool { return live[a].Size > live[b].Size })
	if len(live) > k {
		live = live[:k]
	}
	return live
}

// Holder is a value live at the peak, as messages and reports name it.
type Holder struct {
	Value string `json:"value"`
	Bytes int64  `json:"bytes"`
	Op    string `json:"op"`
	Loc   string `json:"loc"`
}

// Holders describes the k largest buffers live at the peak (Largest).
func (info *Info) Holders(k int) []Holder {
	out := []Holder{}
	for _, b := range info.Largest(k) {
		v := b.Root()
		h := Holder{Value: v.Ref(), Bytes: b.Size}
		if v.Def != nil {
			h.Op = v.Def.Kind
			if !v.Def.Loc.IsUnknown() {
				h.Loc = v.Def.Loc.String()
			}
		}
		out = append(out, h)
	}
	return out
}

// ArenaBuffers returns the buffers that need arena memory.
func (info *Info) ArenaBuffers() []*Buffer {
	var out []*Buffer
	for _, b := range info.Buffers {
		if !b.Arg {
			out = append(out, b)
		}
	}
	return out
}
