// Package swap is the `swap` pass: it keeps a function's device arena
// under a budget by copying tensors to host memory after their early uses
// (swap_out) and back before their late uses (swap_in), on the copy
// stream, so that the transfers overlap with compute. The costmodel
// package times kernels and copies; among the tensors live at the peak the
// pass takes, again and again, the change that adds the least simulated
// time per byte it frees. With recompute=true (the default) recomputing a
// tensor (the remat pass's rewriter) competes with swapping it, so each
// tensor gets the cheaper of the two, in the spirit of Capuchin.
package swap

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/alloc"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/assign"
	"github.com/kiln-compiler/kiln/passes/remat"
)

func init() {
	passes.MustRegister(passes.Define(passes.Pass{
		Name:        "swap",
		Summary:     "copy tensors to host memory and back so that the device arena fits a budget",
		Invalidates: []passes.Property{passes.Assigned},
	}, func(ctx *passes.Context, m *ir.Module, o *options) error {
		dev := ctx.Device()
		for _, f := range m.Funcs {
			device, err := DeviceBytes(f, ctx.Workspace)
			if err != nil {
				return err
			}
			budget := o.DeviceBudget.Of(device)
			res, err := Swap(f, budget, Options{Device: dev, Workspace: ctx.Workspace, Recompute: o.Recompute, Params: o.Params, Inputs: o.Inputs, Peak: o.Peak})
			if err != nil {
				return err
			}
			ctx.AddStat("arena-before", device)
			ctx.AddStat("arena-after", res.Arena)
			ctx.AddStat("workspace", res.Workspace)
			ctx.AddStat("budget", budget)
			ctx.AddStat("swapped-tensors", int64(res.Swapped))
			ctx.AddStat("swapped-bytes", res.SwappedBytes)
			ctx.AddStat("recomputed-tensors", int64(res.Recomputed))
			ctx.AddStat("offloaded-params", int64(res.Offloaded))
			ctx.AddStat("offloaded-inputs", int64(res.OffloadedInputs))
			ctx.AddStat("offloaded-bytes", res.OffloadedBytes)
			ctx.Stat("seconds-before", fmt.Sprintf("%.6f", res.Before.Seconds))
			ctx.Stat("seconds-after", fmt.Sprintf("%.6f", res.After.Seconds))
		}
		return nil
	}))
}

type options struct {
	DeviceBudget passes.Size `opt:"device-budget" default:"1.0" range:"(0,1]" doc:"bytes (512MiB, 2GB) or a fraction, of the device memory when the pass starts (0.5): the arguments on the device, the arena and the kernels' workspace after it"`
	Recompute    bool        `opt:"recompute" default:"true" doc:"also consider recomputing each tensor, and take whichever costs less time"`
	Peak         bool        `opt:"peak" default:"false" doc:"bound the peak of the bytes live on the device, as remat{budget} does (no workspace, no packing losses), instead of the device memory (--budget uses it after remat)"`
	Params       bool        `opt:"params" default:"true" doc:"also consider holding parameters and their optimizer state in host memory, the updates running on the host (ZeRO-Offload); false leaves the arguments and their copies as they are"`
	Inputs       bool        `opt:"inputs" default:"false" doc:"with params, when nothing else lowers the peak, also leave data inputs in host memory, each reader fetching a copy (launch plans cannot take them yet)"`
}

// Options configure Swap.
type Options struct {
	Device    costmodel.Device
	Workspace func(*ir.Func) (int64, error) // the backend's kernels' workspace (DeviceBytes)
	Recompute bool                          // let recomputation compete with swapping
	Params    bool                          // let offloading parameters and their state compete too
	Inputs    bool                          // with Params, move data inputs to host memory when nothing else lowers the peak
	// Peak bounds the live bytes on the device (liveness) instead of the
	// device memory (DeviceBytes).
	Peak bool
}

// Result is what Swap reached.
type Result struct {
	Arena        int64 // device memory afterwards: the arguments on the device, the default assignment's arena, rounded up, and the workspace
	Workspace    int64 // of it, the kernels' workspace
	Swapped      int   // tensors swapped out and in
	SwappedBytes int64
	Recomputed   int // tensors recomputed instead
	// Offloaded parameters, data inputs left in host memory (only when
	// nothing else lowers the peak: launch plans cannot take them yet),
	// and the bytes of the arguments in host memory.
	Offloaded       int
	OffloadedInputs int
	OffloadedBytes  int64
	Before, After   costmodel.Timeline
}

// ArenaBytes is f's arena: the assigned one when assign ran, else the
// default assignment's.
func ArenaBytes(f *ir.Func) int64 {
	if a, ok := f.Attrs["arena"]; ok {
		return a.Int
	}
	p, _ := assign.Problem(liveness.Analyze(f), alloc.DefaultAlignment)
	return alloc.BestDeterministic(p).Size
}

// DeviceBytes is the device memory of f's launch plan: the arguments it
// keeps on the device (not those offloaded to host memory), its arena
// (the assigned one, else the default assignment's), rounded up as the
// plan lays it out, and the kernels' workspace after it, as the backend
// sizes it (workspace).
func DeviceBytes(f *ir.Func, workspace func(*ir.Func) (int64, error)) (int64, error) {
	ws, err := workspace(f)
	if err != nil {
		return 0, err
	}
	return deviceArgs(liveness.Analyze(f)) + roundUp(ArenaBytes(f)) + ws, nil
}

// deviceArgs is the bytes of the arguments on the device.
func deviceArgs(info *liveness.Info) int64 {
	return info.ParamBytes + info.StateBytes + info.InputBytes
}

func roundUp(n int64) int64 {
	return (n + alloc.WorkspaceAlignment - 1) / alloc.WorkspaceAlignment * alloc.WorkspaceAlignment
}

// Swap rewrites f so that its device arena (DeviceBytes) is at most
// budget bytes, or returns an
// error naming what is live at the lowest peak it reached.
func Swap(f *ir.Func, budget int64, opt Options) (Result, error) {
	if opt.Inputs {
		// Inputs are the last resort: both strategies without them first.
		without := opt
		without.Inputs = false
		if res, err := Swap(f, budget, without); err == nil {
			return res, nil
		}
	}
	res, err := fit(f, budget, opt)
	if _, tired := err.(workLimitError); err != nil && opt.Recompute && !tired {
		// Greedy choices can corner the search: swaps alone may still fit.
		opt.Recompute = false
		if r2, err2 := fit(f, budget, opt); err2 == nil {
			return r2, nil
		}
	}
	return res, err
}

// fit is Swap with one strategy; on failure f is left as it was.
func fit(f *ir.Func, budget int64, opt Options) (Result, error) {
	body := append([]*ir.Op(nil), f.Body...)
	operands := make([][]*ir.Value, len(body))
	for i, op := range body {
		operands[i] = append([]*ir.Value(nil), op.Operands...)
	}
	results := append([]ir.Result(nil), f.Results...)
	wasHost := map[*ir.Value]bool{}
	for _, a := range f.Args {
		wasHost[a] = ir.HostArg(a)
	}
	restore := func() {
		f.Body = body
		for i, op := range body {
			op.Operands = operands[i]
		}
		copy(f.Results, results)
		for _, a := range f.Args {
			if !wasHost[a] && a.Arg.Attrs != nil {
				delete(a.Arg.Attrs, "host")
			}
		}
	}
	s := &swapper{f: f, dev: opt.Device, recompute: opt.Recompute, params: opt.Params, allowInputs: opt.Params && opt.Inputs, rc: remat.NewRecomputer(f)}
	res := Result{Before: opt.Device.Simulate(f)}
	// Live bytes are a lower bound of the arena: aim lower when
	// fragmentation or the workspace leaves the device arena above the
	// budget.
	ws, err := opt.Workspace(f)
	if err != nil {
		return res, err
	}
	target := budget - ws
	if opt.Peak {
		target = budget
	}
	for round := 0; round < 8; round++ {
		if target <= 0 {
			restore()
			return res, fmt.Errorf("@%s: the device budget of %s (%d bytes) leaves no room for tensors: the kernels' workspace takes %d bytes of it and packing the arena %d more",
				f.Name, diag.Bytes(budget), budget, ws, max(0, budget-ws-target))
		}
		if err := s.lower(target); err != nil {
			restore()
			return res, err
		}
		ws, err := opt.Workspace(f)
		if err != nil {
			restore()
			return res, err
		}
		res.Arena, res.Workspace = deviceArgs(liveness.Analyze(f))+roundUp(ArenaBytes(f))+ws, ws
		if res.Arena <= budget || opt.Peak {
			break
		}
		target -= res.Arena - budget
	}
	if res.Arena > budget && !opt.Peak {
		restore()
		return res, fmt.Errorf("@%s: the device memory is %s (%d bytes, %d of them kernel workspace) after swapping, above the device budget of %s (%d bytes)",
			f.Name, diag.Bytes(res.Arena), res.Arena, res.Workspace, diag.Bytes(budget), budget)
	}
	info := liveness.Analyze(f)
	res.Swapped, res.SwappedBytes, res.Recomputed = len(info.HostBuffers), info.SwappedBytes, s.recomputed
	res.Offloaded, res.OffloadedInputs, res.OffloadedBytes = s.offloaded, s.inputs, info.HostArgBytes
	res.After = opt.Device.Simulate(f)
	return res, nil
}

type swapper struct {
	f         *ir.Func
	dev       costmodel.Device
	recompute bool
	params    bool
	// allowInputs lets data inputs move when nothing else lowers the peak.
	allowInputs bool
	rc          *remat.Recomputer
	recomputed  int
	offloaded   int
	inputs      int   // data inputs moved to host memory
	work        int64 // op visits of analyses, simulations and rewrites (see swapWork)
	// argCopies are the host copies of arguments that host-run updates
	// read besides what they update (the learning rate, the step count):
	// one each, made at the top of the step (again if an undo drops it).
	argCopies map[*ir.Value]*ir.Value
	// undo log of a swap attempt
	body     []*ir.Op
	replaced []replacement
	results  []ir.Result
	hosted   []*ir.Value // arguments moved to host memory
}

type replacement struct {
	op  *ir.Op
	idx int
	old *ir.Value
}

// deviceLive is the live bytes on the device at every op (the arguments
// on the device and the arena's buffers), and the first op where they
// peak.
func deviceLive(info *liveness.Info) ([]int64, int) {
	return info.Live, info.PeakAt
}

// lower changes f until its arena live bytes are at most target. Each
// round ranks the ways of freeing the tensors live at the peak by the time
// they add per byte, estimated locally (the transfer time that the compute
// next to a copy does not hide; the kernel time of a recomputation),
// applies the best and keeps it when the peak op's live bytes drop
// without the peak rising.
func (s *swapper) lower(target int64) error {
	failed := map[candidateKey]bool{}
	// A parameter's offload frees bytes at every op but where its copies
	// are read: one that did not lower one peak may lower the next.
	paramFailedAt := map[*ir.Value]*ir.Op{}
	for {
		info := s.analyze()
		live, p := deviceLive(info)
		if p < 0 || live[p] <= target {
			return nil
		}
		if s.work > swapWork {
			return workLimitError(fmt.Sprintf("@%s: swapping stopped at its work limit (%d op visits, seconds) with %s (%d bytes) live at op %d (%s), above the device budget of %s (%d bytes)",
				s.f.Name, int64(swapWork), diag.Bytes(live[p]), live[p], p, s.f.Body[p].Kind, diag.Bytes(target), target))
		}
		peakOp, oldPeak := s.f.Body[p], live[p]
		uses := usePositions(s.f)
		s.work += 2 * int64(len(s.f.Body))
		prefix := make([]float64, len(s.f.Body)+1)
		for i, op := range s.f.Body {
			prefix[i+1] = prefix[i] + s.dev.OpSeconds(op)
		}
		var cands []candidate
		var sch remat.Schedule
		if s.recompute {
			sch = s.rc.Schedule()
		}
		for _, b := range info.LiveAt(p) {
			// The buffer may hold a chain of values (views, results written
			// in place): it can go when one of them is used after the peak
			// and none at it.
			if g := s.offloadable(b, uses, p, peakOp); g != nil && !failed[candidateKey{g, true}] {
				early := max(lastBefore(uses[g], p), indexOf(s.f.Body, g.Def))
				out, _ := s.placement(g, early, len(s.f.Body), p)
				copySecs := s.dev.CopySeconds(b.Size)
				cost := max(0, copySecs-(prefix[out]-prefix[early+1]))
				cands = append(cands, candidate{v: g, swap: true, offload: true, seconds: cost, freed: b.Size, early: early, peak: p})
				continue
			}
			var v *ir.Value
			early, late, ok := -1, -1, true
			for _, m := range b.Values {
				if s.f.IsResult(m) || containsPos(uses[m], p) || m.Def == peakOp {
					ok = false
					break
				}
				early = max(early, lastBefore(uses[m], p))
				if l := firstAfter(uses[m], p); l >= 0 {
					if v != nil {
						ok = false
						break
					}
					v, late = m, l
				}
			}
			if !ok || v == nil || v.Def == nil {
				continue
			}
			early = max(early, indexOf(s.f.Body, v.Def))
			if !failed[candidateKey{v, true}] {
				out, in := s.placement(v, early, late, p)
				copySecs := s.dev.CopySeconds(b.Size)
				cost := max(0, copySecs-(prefix[out]-prefix[early+1])) + max(0, copySecs-(prefix[late]-prefix[in]))
				cands = append(cands, candidate{v: v, swap: true, seconds: cost, freed: b.Size, early: early, late: late, peak: p})
			}
			if s.recompute && !failed[candidateKey{v, false}] {
				if secs, ok := s.recomputeSeconds(sch, v, late); ok {
					cands = append(cands, candidate{v: v, seconds: secs, freed: b.Size, late: late})
				}
			}
		}
		// Parameters (with their optimizer state) can leave the device
		// for the whole step.
		for _, po := range offloadableParams(s.f) {
			if !s.params || paramFailedAt[po.p] == peakOp {
				continue
			}
			for _, each := range []bool{false, true} {
				q := po
				q.each = each
				cands = append(cands, candidate{v: q.p, swap: true, param: &q, seconds: s.dev.CopySeconds(q.p.Type.SizeBytes()), freed: q.bytes, peak: p})
			}
		}
		for _, a := range s.f.Args {
			if s.params && ir.HostArg(a) && paramFailedAt[a] != peakOp {
				cands = append(cands, candidate{v: a, swap: true, respread: true, seconds: s.dev.CopySeconds(a.Type.SizeBytes()), freed: a.Type.SizeBytes(), peak: p})
			}
		}
		byRatio := func(cs []candidate) {
			sort.SliceStable(cs, func(i, j int) bool {
				a, b := cs[i], cs[j]
				ra, rb := a.seconds/float64(a.freed), b.seconds/float64(b.freed)
				if ra != rb {
					return ra < rb
				}
				return a.freed > b.freed
			})
		}
		// The local estimates do not see copies queueing on the copy
		// stream: the best few of each kind are timed on the whole
		// schedule.
		byRatio(cands)
		now := s.simulate()
		timed := map[int]int{}
		for i := range cands {
			c := &cands[i]
			if timed[c.kind()] >= timedCandidates {
				c.seconds = math.Inf(1)
				continue
			}
			timed[c.kind()]++
			s.begin()
			if s.apply(*c) {
				c.seconds = max(0, s.simulate()-now)
			}
			s.undo()
		}
		byRatio(cands)
		// lowers applies c and keeps it if the peak, then the number of
		// ops at the peak, strictly drops: rounds cannot cycle.
		lowers := func(c candidate) bool {
			s.begin()
			if s.apply(c) {
				live2, p2 := deviceLive(s.analyze())
				if live2[p2] < oldPeak || live2[p2] == oldPeak && atPeak(live2, oldPeak) < atPeak(live, oldPeak) {
					return true
				}
			}
			s.undo()
			return false
		}
		progress := false
		for _, c := range cands {
			if lowers(c) {
				if !c.swap {
					s.recomputed++
				}
				if c.param != nil {
					s.offloaded++
				}
				progress = true
				break
			}
			if c.param != nil || c.respread {
				paramFailedAt[c.v] = peakOp
				continue
			}
			failed[candidateKey{c.v, c.swap}] = true
		}
		if !progress && s.allowInputs {
			// Last, the data inputs: the caller then hands them in host
			// memory, and launch plans cannot take that yet.
			for _, po := range offloadableInputs(s.f) {
				for _, each := range []bool{false, true} {
					q := po
					q.each = each
					if !progress && lowers(candidate{v: q.p, swap: true, param: &q, peak: p}) {
						s.inputs++
						progress = true
					}
				}
			}
		}
		if !progress {
			return s.budgetError(info, target)
		}
	}
}

// timedCandidates is how many candidates of each kind (swap, recompute)
// each round times on the whole schedule.
const timedCandidates = 6

// atPeak counts the ops whose live bytes reach peak.
func atPeak(live []int64, peak int64) int {
	n := 0
	for _, l := range live {
		if l >= peak {
			n++
		}
	}
	return n
}

// kind tells recomputations (0), swaps (1) and parameter offloads (2)
// apart, each timed on its own quota.
func (c candidate) kind() int {
	switch {
	case c.param != nil || c.respread:
		return 2
	case c.swap:
		return 1
	}
	return 0
}

type candidateKey struct {
	v    *ir.Value
	swap bool
}

// candidate is one way of freeing a tensor across the peak.
type candidate struct {
	v                 *ir.Value
	swap              bool
	offload           bool          // a finished gradient: swapped out, returned from host memory
	param             *paramOffload // a parameter and its optimizer state, moved to host memory
	respread          bool          // v is a host argument whose readers get a copy each
	seconds           float64       // estimated time added
	freed             int64
	early, late, peak int
}

// swapWork bounds the op visits of one lower: each round analyses,
// simulates and rewrites the whole schedule about twenty times, so rounds
// cost in proportion to the ops and a 100k-op step could take hours. At
// the limit lower stops with an error (deterministic, unlike a deadline).
const swapWork = 20_000_000

// workLimitError is lower stopping at swapWork.
type workLimitError string

func (e workLimitError) Error() string { return string(e) }

// analyze is liveness.Analyze of the function, counted as work.
func (s *swapper) analyze() *liveness.Info {
	s.work += int64(len(s.f.Body))
	return liveness.Analyze(s.f)
}

// simulate is the simulated seconds of the function, counted as work.
func (s *swapper) simulate() float64 {
	s.work += int64(len(s.f.Body))
	return s.dev.Simulate(s.f).Seconds
}

func (s *swapper) apply(c candidate) bool {
	s.work += int64(len(s.f.Body))
	if c.offload {
		return s.offload(c.v, c.early, c.peak)
	}
	if c.param != nil {
		return s.offloadParam(*c.param, c.peak)
	}
	if c.respread {
		return s.respread(c.v)
	}
	if c.swap {
		return s.swap(c.v, c.early, c.late, c.peak)
	}
	_, ok := s.rc.Recompute(c.v, c.late)
	return ok
}

// recomputeSeconds is the kernel time of recomputing v before position
// late, planned on sch.
func (s *swapper) recomputeSeconds(sch remat.Schedule, v *ir.Value, late int) (float64, bool) {
	ops, ok := s.rc.Plan(sch, v, late)
	if !ok {
		return 0, false
	}
	secs := 0.0
	for _, op := range ops {
		secs += s.dev.OpSeconds(op)
	}
	return secs, true
}

// placement is where a swap of v puts its swap_out (before position out:
// late enough after early that compute hides the copy, but before the
// peak p) and its swap_in (before position in: as late as still hides the
// copy before the use at late, but after p).
func (s *swapper) placement(v *ir.Value, early, late, p int) (out, in int) {
	secs := s.dev.CopySeconds(v.Type.SizeBytes())
	body := s.f.Body
	out = early + 1
	for acc := 0.0; out < p && acc < secs; out++ {
		acc += s.dev.OpSeconds(body[out])
	}
	in = late
	for acc := 0.0; in > p+1 && acc < secs; {
		in--
		acc += s.dev.OpSeconds(body[in])
	}
	return out, in
}

// begin starts a change that undo takes back (both rewriters).
func (s *swapper) begin() {
	s.body = append(s.body[:0], s.f.Body...)
	s.results = append(s.results[:0], s.f.Results...)
	s.replaced = s.replaced[:0]
	s.hosted = s.hosted[:0]
	s.rc.Begin()
}

func (s *swapper) undo() {
	s.rc.Undo()
	for _, a := range s.hosted {
		delete(a.Arg.Attrs, "host")
	}
	for i := len(s.replaced) - 1; i >= 0; i-- {
		r := s.replaced[i]
		r.op.Operands[r.idx] = r.old
	}
	s.f.Body = append(s.f.Body[:0], s.body...)
	copy(s.f.Results, s.results)
}

// swap copies v out after its use at early (late enough that compute
// hides the copy, before the peak p) and back in before its use at late
// (early enough to hide the copy, after p); uses from late on read the
// copy that came back.
func (s *swapper) swap(v *ir.Value, early, late, p int) bool {
	out, in := s.placement(v, early, late, p)
	body := s.f.Body
	loc := v.Def.Loc
	var so *ir.Op
	host := v
	if ir.CopiesFromHost(v.Def) {
		// Already back from the host: bring it back again, later.
		host = v.Def.Operands[0]
	} else {
		var err error
		so, err = s.f.NewOp("swap_out", []*ir.Value{v}, ir.Attrs{"stream": ir.IntAttr(1)}, loc, v.Name+".host")
		if err != nil {
			return false
		}
		host = so.Results[0]
	}
	si, err := s.f.NewOp("swap_in", []*ir.Value{host}, ir.Attrs{"stream": ir.IntAttr(1)}, loc, strings.TrimSuffix(host.Name, ".host")+".back")
	if err != nil {
		return false
	}
	for i := late; i < len(body); i++ {
		for j, x := range body[i].Operands {
			if x == v {
				s.replaced = append(s.replaced, replacement{body[i], j, x})
				body[i].Operands[j] = si.Results[0]
			}
		}
	}
	nb := make([]*ir.Op, 0, len(body)+2)
	for i, op := range body {
		if i == out && so != nil {
			nb = append(nb, so)
		}
		if i == in {
			nb = append(nb, si)
		}
		if op == v.Def && so == nil && len(usePositionsOf(body, v)) == 0 {
			continue // the earlier swap_in lost its last user
		}
		nb = append(nb, op)
	}
	s.f.Body = nb
	return true
}

// offloadable is the gradient that buffer b holds when it is a finished
// one: a result with the gradient role (the last value of the buffer) (or the value an earlier offload
// copies out after p), made before the peak p and read by nothing else
// from p on. Such a gradient can move to host memory for good, as
// ZeRO-Offload does, and be returned from there.
func (s *swapper) offloadable(b *liveness.Buffer, uses map[*ir.Value][]int, p int, peakOp *ir.Op) *ir.Value {
	// The buffer's last value is the gradient; the others (a running sum
	// that microbatches accumulate in place) must be done with too.
	g := b.Values[len(b.Values)-1]
	if g.Def == nil || g.Def == peakOp || ir.CopiesFromHost(g.Def) || slices.Index(s.f.Body, g.Def) > p {
		return nil
	}
	out := s.offloadOf(g)
	for _, m := range b.Values {
		for _, u := range uses[m] {
			if u >= p && s.f.Body[u] != out {
				return nil
			}
		}
	}
	for _, r := range s.f.Results {
		if (r.Value == g || out != nil && r.Value == out.Results[0]) && r.Role() == ir.RoleGrad {
			return g
		}
	}
	return nil
}

// offloadOf is the swap_out of g that an earlier offload made, or nil.
func (s *swapper) offloadOf(g *ir.Value) *ir.Op {
	for _, r := range s.f.Results {
		if d := r.Value.Def; d != nil && ir.CopiesToHost(d) && d.Operands[0] == g {
			return d
		}
	}
	return nil
}

// offload copies the finished gradient g out after its last use before
// the peak p (late enough that compute hides the copy) and returns the
// host copy in its place; an earlier offload of g moves there.
func (s *swapper) offload(g *ir.Value, early, p int) bool {
	so := s.offloadOf(g)
	body := s.f.Body
	if so != nil {
		at := indexOf(body, so)
		body = append(append([]*ir.Op(nil), body[:at]...), body[at+1:]...)
		s.f.Body = body
	} else {
		var err error
		so, err = s.f.NewOp("swap_out", []*ir.Value{g}, ir.Attrs{"stream": ir.IntAttr(1)}, g.Def.Loc, g.Name+".host")
		if err != nil {
			return false
		}
	}
	out, _ := s.placement(g, early, len(body), p)
	nb := make([]*ir.Op, 0, len(body)+1)
	nb = append(nb, body[:out]...)
	nb = append(nb, so)
	s.f.Body = append(nb, body[out:]...)
	for i := range s.f.Results {
		if s.f.Results[i].Value == g {
			s.f.Results[i].Value = so.Results[0]
		}
	}
	return true
}

func (s *swapper) budgetError(info *liveness.Info, target int64) error {
	live, p := deviceLive(info)
	msg := fmt.Sprintf("@%s: can't keep the device memory under %s (%d bytes) by swapping; %s (%d bytes) are live at op %d (%s), and none of them can be swapped or recomputed across it. Largest:",
		s.f.Name, diag.Bytes(target), target, diag.Bytes(live[p]), live[p], p, s.f.Body[p].Kind)
	for _, t := range liveness.Analyze(s.f).Holders(5) {
		msg += fmt.Sprintf("\n  %s %s (%s)", diag.Bytes(t.Bytes), t.Value, t.Op)
	}
	return fmt.Errorf("%s", msg)
}

// usePositionsOf lists the positions of the ops in body that read v.
func usePositionsOf(body []*ir.Op, v *ir.Value) []int {
	var out []int
	for i, op := range body {
		for _, x := range op.Operands {
			if x == v {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// usePositions lists the schedule positions of each value's users.
func usePositions(f *ir.Func) map[*ir.Value][]int {
	out := map[*ir.Value][]int{}
	for i, op := range f.Body {
		for _, x := range op.Operands {
			if u := out[x]; len(u) == 0 || u[len(u)-1] != i {
				out[x] = append(out[x], i)
			}
		}
	}
	return out
}

func containsPos(us []int, p int) bool {
	i := sort.SearchInts(us, p)
	return i < len(us) && us[i] == p
}

func firstAfter(us []int, p int) int {
	i := sort.SearchInts(us, p+1)
	if i < len(us) {
		return us[i]
	}
	return -1
}

func lastBefore(us []int, p int) int {
	i := sort.SearchInts(us, p)
	if i > 0 {
		return us[i-1]
	}
	return -1
}

func indexOf(body []*ir.Op, op *ir.Op) int {
	for i, o := range body {
		if o == op {
			return i
		}
	}
	return -1
}
