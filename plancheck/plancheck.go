// Package plancheck replays a CUDA launch plan (codegen/cuda) on the CPU
// with the interpreter's kernels and checks it independently of how it
// was made: the plan's structure; that no two buffers live at the same
// time share a byte; that every pair of nodes on different streams that
// touch the same bytes (one writing) is ordered by stream order and
// events (so a missing event wait is a race, whatever the timing); that
// every read finds the bytes its buffer last wrote (not unwritten memory,
// not another tensor's, not a tensor already swapped out); and that the
// results equal the interpreter's on the plan's module. It also simulates
// the timeline with the plan's cost model.
package plancheck

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/progress"
)

// Report is what a successful replay measured.
type Report struct {
	Nodes, Kernels, Copies, Events int
	LibraryCalls                   int // cuBLAS calls
	GEMMsChecked                   int // library calls the replay recomputed and compared with the interpreter
	Collectives                    int // NCCL calls
	Ranks                          int // ranks the plan runs on (replayed together)
	Timeline                       []Span
	Seconds                        float64 // end of the last node
	ComputeSeconds                 float64 // busy time of stream 0
	CopySeconds                    float64 // busy time of the other streams' copies
	CommSeconds                    float64 // busy time of the collectives
	HostCalls                      int     // host functions (updates of offloaded parameters)
	HostSeconds                    float64 // their busy time
	StallSeconds                   float64 // time stream 0 waited for events
	Replayed                       bool    // the numbers were replayed against the interpreter
}

// Span is one node on the simulated timeline.
type Span struct {
	Node          int
	Name          string
	Stream        int
	Start, Finish float64
}

// Plan is a loaded plan directory: the plan, the function it runs and
// the kernels kernels.cu defines.
type Plan struct {
	*cuda.Plan
	Func     *ir.Func
	Kernels  map[string]Signature
	Progress *progress.Reporter // shows the replay's progress (nil: nothing)
	// MemoryLimit bounds the bytes the replay allocates for the plan's
	// arenas, which plan.json declares (0: DefaultReplayMemory).
	MemoryLimit int64
}

// DefaultReplayMemory is the replay's memory limit when a Plan sets none.
const DefaultReplayMemory = 2 << 30

// Load reads a plan directory: plan.json, which must match the schema
// (cuda.Schema), module.kir and kernels.cu.
func Load(dir string) (*cuda.Plan, *ir.Func, error) {
	lp, err := LoadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	return lp.Plan, lp.Func, nil
}

// LoadDir is Load keeping the kernels' signatures, which Check compares
// every launch with.
func LoadDir(dir string) (*Plan, error) {
	path := filepath.Join(dir, "plan.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := validateSchema(raw); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	var p cuda.Plan
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	src, err := os.ReadFile(filepath.Join(dir, "kernels.cu"))
	if err != nil {
		return nil, err
	}
	kernels, err := signatures(string(src))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", filepath.Join(dir, "kernels.cu"), err)
	}
	f, err := loadModule(dir, p.Function)
	if err != nil {
		return nil, err
	}
	return &Plan{Plan: &p, Func: f, Kernels: kernels}, nil
}

func loadModule(dir, function string) (*ir.Func, error) {
	path := filepath.Join(dir, "module.kir")
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m, err := parser.Parse(path, string(src))
	if err != nil {
		return nil, err
	}
	if err := ir.Verify(m); err != nil {
		return nil, err
	}
	f := m.Func(function)
	if f == nil {
		return nil, fmt.Errorf("plan.json: function @%s is not in module.kir", function)
	}
	return f, nil
}

// Check replays p against f on random arguments drawn from seed. Without
// the kernels' signatures (a plan built in memory) launches are checked
// against the plan alone.
func Check(p *cuda.Plan, f *ir.Func, seed uint64) (*Report, error) {
	return CheckPlan(&Plan{Plan: p, Func: f}, seed)
}

// CheckPlan replays a loaded plan: the structure against the schema's
// rules, the module and kernels.cu, then memory, races and the numbers.
func CheckPlan(lp *Plan, seed uint64) (*Report, error) {
	r, err := CheckStructure(lp)
	if err != nil {
		return nil, err
	}
	defer lp.Progress.Done()
	limit := lp.MemoryLimit
	if limit <= 0 {
		limit = DefaultReplayMemory
	}
	if need := lp.Arena.SizeBytes + lp.Host.SizeBytes; need > limit {
		return nil, fmt.Errorf("replaying the plan needs its device and host arenas in memory, %d bytes, above the %d this replay may use (--fast checks the plan without replaying it)", need, limit)
	}
	gemms, err := replay(lp.Plan, lp.Func, seed, lp.Progress)
	if err != nil {
		return nil, err
	}
	r.Replayed, r.GEMMsChecked = true, gemms
	return r, nil
}

// CheckStages checks the plans of a pipeline's stages (in stage order):
// each one's structure, then, with replay, the numbers of all of them
// together (their sends meeting their recvs). It returns each stage's
// report.
func CheckStages(lps []*Plan, seed uint64, replay bool) ([]*Report, error) {
	var reports []*Report
	var need int64
	for s, lp := range lps {
		if lp.Stage != s || lp.Stages != len(lps) {
			return nil, fmt.Errorf("stage %d's plan says it is stage %d of %d", s, lp.Stage, lp.Stages)
		}
		r, err := CheckStructure(lp)
		if err != nil {
			return nil, fmt.Errorf("stage %d: %v", s, err)
		}
		reports = append(reports, r)
		need += (lp.Arena.SizeBytes + lp.Host.SizeBytes) * int64(max(1, lp.Ranks))
	}
	plans := make([]*cuda.Plan, len(lps))
	for s, lp := range lps {
		plans[s] = lp.Plan
	}
	if err := Rendezvous(plans); err != nil {
		return nil, err
	}
	if !replay {
		return reports, nil
	}
	defer lps[0].Progress.Done()
	limit := lps[0].MemoryLimit
	if limit <= 0 {
		limit = DefaultReplayMemory
	}
	if need > limit {
		return nil, fmt.Errorf("replaying the stages needs their ranks' device and host arenas in memory, %d bytes, above the %d this replay may use (--fast checks the plans without replaying them)", need, limit)
	}
	if _, err := replayStages(lps, seed, lps[0].Progress); err != nil {
		return nil, err
	}
	for _, r := range reports {
		r.Replayed = true
	}
	return reports, nil
}

// Rendezvous checks that the plans of a pipeline's stages cannot
// deadlock when NCCL pairs each rank pair's sends and recvs in issue
// order and a send completes only with its recv: the k-th send from
// stage s to stage o must carry the tag of o's k-th recv from s (else
// they would take each other's tensors), and simulating the nodes, each
// done when its deps are and a send together with its recv, must finish
// every node. Events from memory reuse can join the streams of opposite
// directions into a cycle; the error names the nodes that wait.
func Rendezvous(plans []*cuda.Plan) error {
	per := int64(max(1, plans[0].Ranks))
	type node struct{ s, i int }
	sends, recvs := map[[2]int][]node{}, map[[2]int][]node{}
	for s, p := range plans {
		for i, n := range p.Nodes {
			c := n.Collective
			if c == nil || (c.Call != "ncclSend" && c.Call != "ncclRecv") {
				continue
			}
			o := s + int(c.Peer/per)
			if c.Call == "ncclSend" {
				sends[[2]int{s, o}] = append(sends[[2]int{s, o}], node{s, i})
			} else {
				recvs[[2]int{o, s}] = append(recvs[[2]int{o, s}], node{s, i})
			}
		}
	}
	partner := map[node]node{}
	for pair, ss := range sends {
		rs := recvs[pair]
		if len(rs) != len(ss) {
			return fmt.Errorf("stage %d sends %d tensors to stage %d, which receives %d", pair[0], len(ss), pair[1], len(rs))
		}
		for k, x := range ss {
			y := rs[k]
			if a, b := plans[x.s].Nodes[x.i].Collective.Tag, plans[y.s].Nodes[y.i].Collective.Tag; a != b {
				return fmt.Errorf("stage %d's send %d to stage %d (node %d) has tag %d, but stage %d's recv %d from it (node %d) has tag %d: NCCL pairs sends and recvs in issue order, so they would take each other's tensors", x.s, k, pair[1], x.i, a, y.s, k, y.i, b)
			}
			partner[x], partner[y] = y, x
		}
	}
	done := map[node]bool{}
	ready := func(x node) bool {
		for _, d := range plans[x.s].Nodes[x.i].Deps {
			if !done[node{x.s, d}] {
				return false
			}
		}
		return true
	}
	for moved := true; moved; {
		moved = false
		for s, p := range plans {
			for i := range p.Nodes {
				x := node{s, i}
				if done[x] || !ready(x) {
					continue
				}
				if y, ok := partner[x]; ok {
					if !ready(y) {
						continue
					}
					done[y] = true
				}
				done[x] = true
				moved = true
			}
		}
	}
	var stuck []string
	for s, p := range plans {
		for i, n := range p.Nodes {
			if !done[node{s, i}] {
				stuck = append(stuck, fmt.Sprintf("stage %d at node %d (%s, stream %d)", s, i, describe(p, n), n.Stream))
				break
			}
		}
	}
	if len(stuck) > 0 {
		return fmt.Errorf("the stages deadlock when a send waits for its recv: %s", strings.Join(stuck, "; "))
	}
	return nil
}

// CheckStructure is CheckPlan without the numeric replay: the structure
// against the schema's rules, the module and kernels.cu, buffers that
// overlap while live, races between streams, and the simulated timeline.
// It takes about a second on a full-size ResNet-50 step, whose replay
// in the interpreter takes many minutes.
func CheckStructure(lp *Plan) (*Report, error) {
	p, f := lp.Plan, lp.Func
	if err := structure(p, f); err != nil {
		return nil, err
	}
	if lp.Kernels != nil {
		if err := launches(p, f, lp.Kernels); err != nil {
			return nil, err
		}
	}
	if err := disjoint(p); err != nil {
		return nil, err
	}
	if err := races(p); err != nil {
		return nil, err
	}
	return timeline(p), nil
}

// ReplayFLOPs is the size of step, in FLOPs of the cost model, above which
// kiln plan-check skips the numeric replay unless asked for it: the
// reference interpreter runs about a GFLOP/s here, so replays stay under
// about half a minute.
const ReplayFLOPs = 20e9

// StepFLOPs is the FLOPs of f by the cost model.
func StepFLOPs(f *ir.Func) float64 {
	total := 0.0
	for _, op := range f.Body {
		total += float64(ir.OpCost(op).FLOPs)
	}
	return total
}

func structure(p *cuda.Plan, f *ir.Func) error {
	values := map[string]*ir.Value{}
	for _, a := range f.Args {
		values[a.Name] = a
	}
	for _, op := range f.Body {
		for _, r := range op.Results {
			values[r.Name] = r
		}
	}
	if p.Format != cuda.Format || p.Version != cuda.Version {
		return fmt.Errorf("plan.json: format %q version %d, want %q version %d", p.Format, p.Version, cuda.Format, cuda.Version)
	}
	if p.CostModel.Validate() != nil {
		return fmt.Errorf("plan.json: %v", p.CostModel.Validate())
	}
	if err := layout(p, values); err != nil {
		return err
	}
	for i, b := range p.Buffers {
		if b.ID != i {
			return fmt.Errorf("plan.json: buffer %d has id %d", i, b.ID)
		}
		if len(b.Values) == 0 || b.SizeBytes < 0 {
			return fmt.Errorf("plan.json: buffer %d names no value or has a negative size", i)
		}
		if err := bufferType(b, values); err != nil {
			return fmt.Errorf("plan.json: buffer %d (%s): %v", i, b.Values[0], err)
		}
		switch b.Space {
		case "device":
			if !within(b.Offset, b.SizeBytes, p.Arena.SizeBytes) {
				return fmt.Errorf("plan.json: buffer %d (%s) at %d (%d bytes) is outside the device arena of %d bytes", i, b.Values[0], b.Offset, b.SizeBytes, p.Arena.SizeBytes)
			}
		case "host":
			if !within(b.Offset, b.SizeBytes, p.Host.SizeBytes) {
				return fmt.Errorf("plan.json: buffer %d (%s) at %d (%d bytes) is outside the host arena of %d bytes", i, b.Values[0], b.Offset, b.SizeBytes, p.Host.SizeBytes)
			}
		case "param", "host_param", "input":
		default:
			return fmt.Errorf("plan.json: buffer %d has unknown space %q", i, b.Space)
		}
	}
	for _, bs := range []struct {
		what     string
		list     []cuda.Binding
		space    string
		expected int
	}{{"param", p.Params, "param", -1}, {"input", p.Inputs, "input", -1}, {"result", p.Results, "", len(f.Results)}} {
		if bs.expected >= 0 && len(bs.list) != bs.expected {
			return fmt.Errorf("plan.json: %d %ss, but @%s has %d", len(bs.list), bs.what, f.Name, bs.expected)
		}
		for slot, bd := range bs.list {
			if bd.Buffer < 0 || bd.Buffer >= len(p.Buffers) {
				return fmt.Errorf("plan.json: %s %q names unknown buffer %d", bs.what, bd.Name, bd.Buffer)
			}
			b := p.Buffers[bd.Buffer]
			if !contains(b.Values, bd.Name) {
				return fmt.Errorf("plan.json: %s %q is bound to buffer %d, which holds %v", bs.what, bd.Name, bd.Buffer, b.Values)
			}
			if bs.space != "" && (b.Space != bs.space && !(bs.space == "param" && b.Space == "host_param") || b.Slot != slot) {
				return fmt.Errorf("plan.json: %s %q is in %s slot %d, want %s slot %d", bs.what, bd.Name, b.Space, b.Slot, bs.space, slot)
			}
		}
	}
	for i, r := range p.Results {
		if r.Name != f.Results[i].Value.Name {
			return fmt.Errorf("plan.json: result %d is %q, but @%s returns %s", i, r.Name, f.Name, f.Results[i].Value.Ref())
		}
	}
	prev := map[int]int{}
	recorded := map[int]int{}
	var prods map[int][]product
	for i, n := range p.Nodes {
		if n.Kind == "library" && prods == nil {
			var err error
			if prods, err = products(f); err != nil {
				return err
			}
		}
		if n.ID != i {
			return fmt.Errorf("plan.json: node %d has id %d", i, n.ID)
		}
		if n.Stream < 0 || n.Stream >= len(p.Streams) {
			return fmt.Errorf("node %d: unknown stream %d", i, n.Stream)
		}
		want := []int{}
		if q, ok := prev[n.Stream]; ok {
			want = append(want, q)
		}
		switch n.Kind {
		case "kernel", "copy", "host", "library":
			if n.Op < 0 || n.Op >= len(f.Body) {
				return fmt.Errorf("node %d: op %d is not in @%s", i, n.Op, f.Name)
			}
			if n.Kind == "library" {
				if err := libraryNode(i, n); err != nil {
					return err
				}
				if err := productOf(i, n, f.Body[n.Op], prods[n.Op]); err != nil {
					return err
				}
			}
			if n.Kind == "copy" && (n.Src == nil || n.Dst == nil) {
				return fmt.Errorf("node %d: a copy needs src and dst", i)
			}
			if n.Kind == "copy" {
				break
			}
			// A host function dereferences host pointers only, a kernel
			// device pointers only.
			for _, a := range accesses(n) {
				if a.Buffer < 0 || a.Buffer >= len(p.Buffers) {
					continue // reported with the accesses
				}
				if b := p.Buffers[a.Buffer]; (b.Space == "host" || b.Space == "host_param") != (n.Kind == "host") {
					return fmt.Errorf("node %d: %s gets a pointer to %s, in %s memory", i, describe(p, n), b.Values[0], b.Space)
				}
			}
		case "collective":
			if err := collectiveNode(p, f, i, n); err != nil {
				return err
			}
		case "event_record":
			if n.Event == nil {
				return fmt.Errorf("node %d: event_record without an event", i)
			}
			recorded[*n.Event] = i
		case "event_wait":
			if n.Event == nil {
				return fmt.Errorf("node %d: event_wait without an event", i)
			}
			r, ok := recorded[*n.Event]
			if !ok {
				return fmt.Errorf("node %d waits for event %d, which no earlier node records (the wait would not wait)", i, *n.Event)
			}
			want = append(want, r)
		default:
			return fmt.Errorf("node %d: unknown kind %q", i, n.Kind)
		}
		if fmt.Sprint(n.Deps) != fmt.Sprint(want) {
			return fmt.Errorf("node %d: deps %v, but its stream and events make them %v", i, n.Deps, want)
		}
		for _, a := range accesses(n) {
			if a.Buffer < 0 || a.Buffer >= len(p.Buffers) {
				return fmt.Errorf("node %d: unknown buffer %d", i, a.Buffer)
			}
			if a.Mode != "read" && a.Mode != "write" && a.Mode != "readwrite" || a.SizeBytes < 0 {
				return fmt.Errorf("node %d: access of buffer %d has mode %q and size %d", i, a.Buffer, a.Mode, a.SizeBytes)
			}
		}
		prev[n.Stream] = i
	}
	// Each op's results are complete at its last node, which alone is
	// marked last_of_op: the replay checks them there.
	lastOf := map[int]int{}
	for i, n := range p.Nodes {
		if n.Kind == "event_record" || n.Kind == "event_wait" {
			continue
		}
		if j, ok := lastOf[n.Op]; ok && p.Nodes[j].Last {
			return fmt.Errorf("node %d: %s follows node %d, which is marked as the last of op %d", i, describe(p, n), j, n.Op)
		}
		lastOf[n.Op] = i
	}
	for i, n := range p.Nodes {
		if lastOf[n.Op] == i && !n.Last && n.Kind != "event_record" && n.Kind != "event_wait" {
			return fmt.Errorf("node %d: the last node of op %d is not marked last_of_op", i, n.Op)
		}
	}
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// bufferType checks a buffer's dtype, shape and size against each other
// and against the value of the module it holds first (kernel workspace
// buffers hold no value of the module).
// maxAlignment bounds an arena's alignment (a page of 1 MiB).
const maxAlignment = 1 << 20

// layout checks the arenas and the workspace: each arena's alignment is a
// power of two from 8 (the widest element) to 1 MiB; the workspace is a
// range of the device arena that starts at a multiple of
// loops.TempAlignment, and the device buffers inside it are kernel
// temporaries (no value of the module) that lie wholly in it.
func layout(p *cuda.Plan, values map[string]*ir.Value) error {
	for _, a := range []struct {
		what  string
		arena cuda.Arena
	}{{"device", p.Arena}, {"host", p.Host}} {
		if al := a.arena.Alignment; al < 8 || al > maxAlignment || al&(al-1) != 0 {
			return fmt.Errorf("plan.json: the %s arena's alignment %d is not a power of two from 8 to %d", a.what, al, maxAlignment)
		}
	}
	w := p.Workspace
	if !within(w.Offset, w.SizeBytes, p.Arena.SizeBytes) {
		return fmt.Errorf("plan.json: the workspace at %d (%d bytes) is outside the device arena of %d bytes", w.Offset, w.SizeBytes, p.Arena.SizeBytes)
	}
	if w.Offset%loops.TempAlignment != 0 {
		return fmt.Errorf("plan.json: the workspace starts at %d, not a multiple of %d", w.Offset, loops.TempAlignment)
	}
	for i, b := range p.Buffers {
		if b.Space != "device" || len(b.Values) == 0 || b.SizeBytes <= 0 {
			continue
		}
		inside := b.Offset >= w.Offset && b.Offset <= w.Offset+w.SizeBytes-b.SizeBytes
		overlaps := b.Offset < w.Offset+w.SizeBytes && w.Offset < b.Offset+b.SizeBytes
		switch {
		case overlaps && !inside:
			return fmt.Errorf("plan.json: buffer %d (%s) at %d (%d bytes) straddles the workspace [%d, %d)", i, b.Values[0], b.Offset, b.SizeBytes, w.Offset, w.Offset+w.SizeBytes)
		case inside && values[b.Values[0]] != nil:
			return fmt.Errorf("plan.json: buffer %d holds %s inside the workspace [%d, %d), which only kernel temporaries use", i, b.Values[0], w.Offset, w.Offset+w.SizeBytes)
		}
	}
	return nil
}

func bufferType(b cuda.Buffer, values map[string]*ir.Value) error {
	d, ok := ir.ParseDType(b.DType)
	if !ok {
		return fmt.Errorf("unknown dtype %q", b.DType)
	}
	t := ir.Type{DType: d, Shape: ir.Shape(b.Shape)}
	n, ok := t.Bytes()
	if !ok || n != b.SizeBytes {
		return fmt.Errorf("%s is not %d bytes", t, b.SizeBytes)
	}
	if v := values[b.Values[0]]; v != nil && !v.Type.Equal(t) {
		return fmt.Errorf("holds %s, but the module's %s is %s", t, v.Ref(), v.Type)
	}
	return nil
}

// accesses lists the byte ranges a node touches.
func accesses(n cuda.Node) []*cuda.Access {
	var out []*cuda.Access
	for _, a := range n.Args {
		if a.Pointer != nil {
			out = append(out, a.Pointer)
		}
	}
	if n.Src != nil {
		out = append(out, n.Src)
	}
	if n.Dst != nil {
		out = append(out, n.Dst)
	}
	return out
}

func overlap(a, b *cuda.Access) bool {
	return a.Space == b.Space && a.Slot == b.Slot && a.Offset < b.Offset+b.SizeBytes && b.Offset < a.Offset+a.SizeBytes
}

// disjoint: buffers of one space whose lifetimes overlap do not share a
// byte.
func disjoint(p *cuda.Plan) error {
	for _, space := range []string{"device", "host"} {
		var bs []cuda.Buffer
		for _, b := range p.Buffers {
			if b.Space == space && b.SizeBytes > 0 {
				bs = append(bs, b)
			}
		}
		sort.SliceStable(bs, func(i, j int) bool { return bs[i].FirstOp < bs[j].FirstOp })
		for i, a := range bs {
			for _, b := range bs[i+1:] {
				if b.FirstOp > a.LastOp {
					break
				}
				if a.Offset < b.Offset+b.SizeBytes && b.Offset < a.Offset+a.SizeBytes && b.FirstOp <= a.LastOp && a.FirstOp <= b.LastOp {
					return fmt.Errorf("buffers %s [%d, %d) (ops %d-%d) and %s [%d, %d) (ops %d-%d) are live together and overlap in %s memory",
						a.Values[0], a.Offset, a.Offset+a.SizeBytes, a.FirstOp, a.LastOp, b.Values[0], b.Offset, b.Offset+b.SizeBytes, b.FirstOp, b.LastOp, space)
				}
			}
		}
	}
	return nil
}

// races checks with vector clocks that conflicting accesses from
// different streams are ordered by stream order and events.
func races(p *cuda.Plan) error {
	streams := len(p.Streams)
	clock := make([][]int, len(p.Nodes))
	seq := make([]int, len(p.Nodes))
	last := make([]int, streams)
	count := make([]int, streams)
	for i := range last {
		last[i] = -1
	}
	eventClock := map[int][]int{}
	type hist struct {
		node int
		a    *cuda.Access
	}
	history := make([][]hist, streams)
	for i, n := range p.Nodes {
		s := n.Stream
		vc := make([]int, streams)
		if last[s] >= 0 {
			copy(vc, clock[last[s]])
		}
		seq[i] = count[s]
		count[s]++
		vc[s] = count[s]
		if n.Kind == "event_wait" {
			for k, c := range eventClock[*n.Event] {
				vc[k] = max(vc[k], c)
			}
		}
		clock[i], last[s] = vc, i
		if n.Kind == "event_record" {
			eventClock[*n.Event] = append([]int(nil), vc...)
		}
		mine := accesses(n)
		for t := 0; t < streams; t++ {
			if t == s {
				continue
			}
			for j := len(history[t]) - 1; j >= 0; j-- {
				h := history[t][j]
				if vc[t] > seq[h.node] {
					break // ordered, with everything before it on that stream
				}
				for _, a := range mine {
					if overlap(a, h.a) && (a.Mode != "read" || h.a.Mode != "read") {
						return fmt.Errorf("race: node %d (%s) and node %d (%s) on streams %d and %d both touch %s [%d, %d) (one writes), and no event orders them",
							h.node, describe(p, p.Nodes[h.node]), i, describe(p, n), t, s, p.Buffers[a.Buffer].Values[0], a.Offset, a.Offset+a.SizeBytes)
					}
				}
			}
		}
		for _, a := range mine {
			history[s] = append(history[s], hist{i, a})
		}
	}
	return nil
}

// collectiveNode checks a collective node: the op it runs is that
// collective, its group tiles the plan's ranks, and it sends and receives
// the bytes NCCL's call moves.
func collectiveNode(p *cuda.Plan, f *ir.Func, i int, n cuda.Node) error {
	if n.Op < 0 || n.Op >= len(f.Body) {
		return fmt.Errorf("node %d: op %d is not in @%s", i, n.Op, f.Name)
	}
	c := n.Collective
	if c != nil && (c.Call == "ncclSend" || c.Call == "ncclRecv") {
		return p2pNode(p, f, i, n)
	}
	if c == nil || n.Src == nil || n.Dst == nil {
		return fmt.Errorf("node %d: a collective needs collective, src and dst", i)
	}
	op := f.Body[n.Op]
	size, stride := ir.CollectiveGroup(op)
	calls := map[string]string{"all_reduce": "ncclAllReduce", "reduce_scatter": "ncclReduceScatter", "all_gather": "ncclAllGather", "broadcast": "ncclBroadcast"}
	if calls[op.Kind] != c.Call || size != c.Size || stride != c.Stride {
		return fmt.Errorf("node %d calls %s over %d ranks %d apart, but op %d is %s over %d ranks %d apart", i, c.Call, c.Size, c.Stride, n.Op, op.Kind, size, stride)
	}
	if op.Kind == "all_reduce" || op.Kind == "reduce_scatter" {
		want := map[string]string{"sum": "ncclSum", "max": "ncclMax", "min": "ncclMin"}[op.Attr().String("op")]
		if c.Reduce != want {
			return fmt.Errorf("node %d reduces by %q, but op %d is %s by %s (%s)", i, c.Reduce, n.Op, op.Kind, op.Attr().String("op"), want)
		}
	}
	ranks := int64(max(1, p.Ranks))
	if c.Size < 2 || c.Stride < 1 || c.Size*c.Stride > ranks || ranks%(c.Size*c.Stride) != 0 {
		return fmt.Errorf("node %d: groups of %d ranks, %d apart, do not tile the plan's %d ranks", i, c.Size, c.Stride, ranks)
	}
	dt, ok := ir.ParseDType(c.DType)
	if !ok {
		return fmt.Errorf("node %d: unknown dtype %q", i, c.DType)
	}
	elem := ir.Type{DType: dt}.SizeBytes()
	recv := c.Count
	switch c.Call {
	case "ncclReduceScatter":
		if c.Count%c.Size != 0 {
			return fmt.Errorf("node %d: %d elements do not split among %d ranks", i, c.Count, c.Size)
		}
		recv = c.Count / c.Size
	case "ncclAllGather":
		recv = c.Count * c.Size
	}
	if n.Src.SizeBytes != c.Count*elem || n.Dst.SizeBytes != recv*elem {
		return fmt.Errorf("node %d: %s of %d %s elements sends %d bytes and receives %d, but its src has %d and its dst %d", i, c.Call, c.Count, c.DType, c.Count*elem, recv*elem, n.Src.SizeBytes, n.Dst.SizeBytes)
	}
	if n.Src.Mode != "read" || n.Dst.Mode != "write" {
		return fmt.Errorf("node %d: a collective reads its src and writes its dst", i)
	}
	return nil
}

// p2pNode checks a pipeline stage's ncclSend or ncclRecv: the op it runs
// is that send or recv, to the same peer and tag, moving its bytes, on
// the stream of its direction, to a rank of another stage.
func p2pNode(p *cuda.Plan, f *ir.Func, i int, n cuda.Node) error {
	c, op := n.Collective, f.Body[n.Op]
	recv := c.Call == "ncclRecv"
	want, buf, mode := "send", n.Src, "read"
	if recv {
		want, buf, mode = "recv", n.Dst, "write"
	}
	if op.Kind != want || buf == nil || (recv && n.Src != nil) || (!recv && n.Dst != nil) {
		return fmt.Errorf("node %d calls %s (from src to its peer, or from its peer to dst), but op %d is %s", i, c.Call, n.Op, op.Kind)
	}
	if a := op.Attr(); a.Int("offset") != c.Peer || a.Int("tag") != c.Tag {
		return fmt.Errorf("node %d: %s to rank r%+d, tag %d, but op %d sends to r%+d, tag %d", i, c.Call, c.Peer, c.Tag, n.Op, a.Int("offset"), a.Int("tag"))
	}
	ranks := int64(max(1, p.Ranks))
	if to := int64(p.Stage) + c.Peer/ranks; p.Stages < 2 || c.Peer%ranks != 0 || c.Peer == 0 || to < 0 || to >= int64(p.Stages) {
		return fmt.Errorf("node %d: %s to rank r%+d is not the same rank of another of the pipeline's %d stages of %d ranks", i, c.Call, c.Peer, p.Stages, ranks)
	}
	if n.Stream != cuda.P2PStream(recv, c.Peer) {
		return fmt.Errorf("node %d: %s to rank r%+d runs on stream %d, not on its direction's, %d (a send waiting behind a receive the other way can deadlock the pipeline)", i, c.Call, c.Peer, n.Stream, cuda.P2PStream(recv, c.Peer))
	}
	dt, ok := ir.ParseDType(c.DType)
	if !ok {
		return fmt.Errorf("node %d: unknown dtype %q", i, c.DType)
	}
	if size := c.Count * (ir.Type{DType: dt}).SizeBytes(); buf.SizeBytes != size || buf.Mode != mode {
		return fmt.Errorf("node %d: %s of %d %s elements moves %d bytes, but its buffer has %d (mode %s)", i, c.Call, c.Count, c.DType, size, buf.SizeBytes, buf.Mode)
	}
	return nil
}

func describe(p *cuda.Plan, n cuda.Node) string {
	switch n.Kind {
	case "collective":
		buf := n.Src
		if buf == nil { // a recv
			buf = n.Dst
		}
		return n.Collective.Call + " of " + p.Buffers[buf.Buffer].Values[0]
	case "kernel":
		return "kernel " + n.Kernel
	case "library":
		if n.Library != nil {
			return "library " + n.Library.Call
		}
	case "host":
		return "host function " + n.Kernel
	case "copy":
		return "copy " + n.Direction + " of " + p.Buffers[n.Src.Buffer].Values[0]
	}
	return n.Kind
}

// timeline simulates the plan: a node starts when its deps have finished
// and takes its cost-model seconds.
// collectiveKinds are the IR ops of the NCCL calls, for the cost model.
var collectiveKinds = map[string]string{"ncclAllReduce": "all_reduce", "ncclReduceScatter": "reduce_scatter", "ncclAllGather": "all_gather", "ncclBroadcast": "broadcast", "ncclSend": "send", "ncclRecv": "recv"}

func timeline(p *cuda.Plan) *Report {
	r := &Report{Nodes: len(p.Nodes), Events: p.Events, Ranks: max(1, p.Ranks)}
	finish := make([]float64, len(p.Nodes))
	streamEnd := map[int]float64{}
	for i, n := range p.Nodes {
		start := 0.0
		for _, d := range n.Deps {
			start = max(start, finish[d])
		}
		secs := 0.0
		switch n.Kind {
		case "kernel":
			r.Kernels++
			secs = n.Seconds
		case "library":
			r.LibraryCalls++
			secs = n.Seconds
		case "copy":
			r.Copies++
			secs = p.CostModel.CopySeconds(n.Src.SizeBytes)
		case "host":
			r.HostCalls++
			secs = n.Seconds
		case "collective":
			r.Collectives++
			if c := n.Collective; c.Call == "ncclSend" || c.Call == "ncclRecv" {
				secs = n.Seconds
			} else {
				secs = p.CostModel.CollectiveSeconds(collectiveKinds[c.Call], n.Src.SizeBytes, c.Size)
			}
		}
		if n.Stream == 0 && secs > 0 {
			r.StallSeconds += max(0, start-streamEnd[0])
		}
		finish[i] = start + secs
		switch {
		case n.Stream == 0:
			r.ComputeSeconds += secs
		case n.Kind == "collective":
			r.CommSeconds += secs
		case n.Kind == "host":
			r.HostSeconds += secs
		default:
			r.CopySeconds += secs
		}
		streamEnd[n.Stream] = max(streamEnd[n.Stream], finish[i])
		r.Seconds = max(r.Seconds, finish[i])
		if secs > 0 {
			r.Timeline = append(r.Timeline, Span{Node: i, Name: describe(p, n), Stream: n.Stream, Start: start, Finish: finish[i]})
		}
	}
	return r
}

// memory is the replay's bytes and, per byte range, the buffer that last
// wrote it.
type memory struct {
	bytes map[string][]byte
	owner map[string]*owners
}

func spaceKey(space string, slot int) string { return fmt.Sprintf("%s/%d", space, slot) }

// owners maps byte ranges to the buffer that wrote them (-1: never).
type owners struct{ starts, ids []int64 }

func newOwners(size int64, id int64) *owners {
	return &owners{starts: []int64{0, size}, ids: []int64{id, -1}}
}

// set marks [lo, hi) as written by id.
func (o *owners) set(lo, hi, id int64) {
	var s, ids []int64
	before := int64(-1)
	for i, st := range o.starts {
		if st < lo {
			s, ids = append(s, st), append(ids, o.ids[i])
			before = o.ids[i]
		}
	}
	s, ids = append(s, lo), append(ids, id)
	after := before
	for i, st := range o.starts {
		if st <= hi {
			after = o.ids[i]
		}
	}
	if hi < math.MaxInt64 {
		s, ids = append(s, hi), append(ids, after)
	}
	for i, st := range o.starts {
		if st > hi {
			s, ids = append(s, st), append(ids, o.ids[i])
		}
	}
	o.starts, o.ids = s, ids
}

// who lists the writers of [lo, hi).
func (o *owners) who(lo, hi int64) []int64 {
	var out []int64
	for i, st := range o.starts {
		end := int64(math.MaxInt64)
		if i+1 < len(o.starts) {
			end = o.starts[i+1]
		}
		if st < hi && lo < end && st < end {
			out = append(out, o.ids[i])
		}
	}
	return out
}

// replay runs the nodes in issue order (which stream order and events
// allow, and, with no races, gives every execution's result): kernels of
// an op read their operands from the plan's buffers and the op runs in
// the interpreter at its last launch, writing its results back. Every
// operand read must equal the value the interpreter computed for it, as
// must the results and updated arguments at the end. The replay streams:
// it holds the plan's arenas and one op's tensors, and only fingerprints
// of the interpreter's values.
func replay(p *cuda.Plan, f *ir.Func, seed uint64, prog *progress.Reporter) (int, error) {
	if p.Stages > 1 {
		return 0, fmt.Errorf("@%s is stage %d of a pipeline of %d: its sends and recvs replay with the other stages' plans (plan-check the directory that holds stage0, stage1, …)", f.Name, p.Stage, p.Stages)
	}
	return replayStages([]*Plan{{Plan: p, Func: f}}, seed, prog)
}

// mailKey names the tensors rank from sends rank to (tag 0: NCCL pairs
// them in issue order, whatever their tags).
type mailKey struct{ from, to, tag int64 }

// replayStages replays the plans of a pipeline's stages together (one
// plan: a step), each on its ranks (stage s on ranks s·R to s·R+R−1):
// the ranks of a stage run its nodes in issue order, meeting at its
// collectives; a send leaves its tensor for the rank it names, and a
// recv waits until the tensor is there. A replay in which every stage
// waits is a deadlock, and an error naming the recvs that wait.
func replayStages(stages []*Plan, seed uint64, prog *progress.Reporter) (gemms int, err error) {
	per := max(1, stages[0].Ranks)
	for s, st := range stages {
		if max(1, st.Ranks) != per {
			return 0, fmt.Errorf("stage %d runs on %d ranks, stage 0 on %d", s, max(1, st.Ranks), per)
		}
	}
	n := len(stages) * per
	fs, args := make([]*ir.Func, n), make([][]*interp.Tensor, n)
	for g := range n {
		fs[g] = stages[g/per].Func
		args[g] = interp.RandomArgs(fs[g], seed+uint64(g)) // each rank its own data
	}
	refs, err := reference(fs, args, prog)
	if err != nil {
		return 0, err
	}
	ranks := make([]*rankReplay, n)
	for s, st := range stages {
		byName := map[string]int{}
		for _, b := range st.Buffers {
			for _, v := range b.Values {
				byName[v] = b.ID
			}
		}
		for g := s * per; g < (s+1)*per; g++ {
			if ranks[g], err = newRankReplay(st.Plan, st.Func, args[g], refs[g], byName); err != nil {
				return 0, err
			}
			if n > 1 {
				ranks[g].name = fmt.Sprintf("rank %d: ", g)
			}
		}
	}
	args = nil                                                          // the slots hold the arguments' bytes now
	mail, tags := map[mailKey][]*interp.Tensor{}, map[mailKey][]int64{} // per pair of ranks, in issue order
	next := make([]int, len(stages))
	for {
		moved, done := false, true
		for s, st := range stages {
			group := ranks[s*per : (s+1)*per]
			for next[s] < len(st.Nodes) && !waits(st, next[s], s*per, mail) {
				prog.Step("plan-check: replaying node %d of %d", next[s]+1, len(st.Nodes))
				if err := replayNode(st, next[s], group, int64(s*per), mail, tags); err != nil {
					return 0, err
				}
				next[s]++
				moved = true
			}
			done = done && next[s] == len(st.Nodes)
		}
		if done {
			break
		}
		if !moved {
			var waiting []string
			for s, st := range stages {
				if i := next[s]; i < len(st.Nodes) {
					waiting = append(waiting, fmt.Sprintf("stage %d at node %d (%s)", s, i, describe(st.Plan, st.Nodes[i])))
				}
			}
			return 0, fmt.Errorf("the stages deadlock: every one waits in a recv: %s", strings.Join(waiting, "; "))
		}
	}
	for _, rr := range ranks {
		if err := rr.final(); err != nil {
			return 0, err
		}
	}
	for k, ts := range mail {
		if len(ts) > 0 {
			return 0, fmt.Errorf("rank %d sent %d tensors (tag %d first) to rank %d that no recv took", k.from, len(ts), tags[k][0], k.to)
		}
	}
	for _, rr := range ranks {
		gemms += rr.gemmsChecked
	}
	return gemms, nil
}

// waits reports whether node i of stage st (on ranks from base) is a
// recv whose tensor some rank of the stage has not been sent yet.
func waits(st *Plan, i, base int, mail map[mailKey][]*interp.Tensor) bool {
	nd := st.Nodes[i]
	if nd.Kind != "collective" || !nd.Last || nd.Collective == nil || nd.Collective.Call != "ncclRecv" {
		return false
	}
	for r := range max(1, st.Ranks) {
		g := int64(base + r)
		if len(mail[mailKey{g + nd.Collective.Peer, g, 0}]) == 0 {
			return true
		}
	}
	return false
}

// replayNode runs node i of stage st on the stage's ranks (global ranks
// from base): its accesses, and at an op's last node the op, whose
// operands must equal the interpreter's.
func replayNode(st *Plan, i int, ranks []*rankReplay, base int64, mail map[mailKey][]*interp.Tensor, tags map[mailKey][]int64) error {
	p, f, nd := st.Plan, st.Func, st.Nodes[i]
	for _, rr := range ranks {
		if err := rr.access(i, nd); err != nil {
			return err
		}
	}
	if !nd.Last || (nd.Kind != "kernel" && nd.Kind != "copy" && nd.Kind != "collective" && nd.Kind != "host" && nd.Kind != "library") {
		return nil
	}
	op := f.Body[nd.Op]
	n := len(ranks)
	ins := make([][]*interp.Tensor, n)
	var err error
	for r, rr := range ranks {
		if ins[r], err = rr.operands(i, nd, op); err != nil {
			return err
		}
	}
	outs := make([][]*interp.Tensor, n)
	switch {
	case op.Kind == "send" || op.Kind == "recv":
		c := nd.Collective
		for r := range ranks {
			g := base + int64(r)
			if op.Kind == "send" {
				k := mailKey{g, g + c.Peer, 0}
				mail[k] = append(mail[k], ins[r][0].Clone())
				tags[k] = append(tags[k], c.Tag)
				continue
			}
			k := mailKey{g + c.Peer, g, 0}
			if tags[k][0] != c.Tag {
				return fmt.Errorf("%snode %d (%s) receives tag %d, but the first tensor rank %d sent it has tag %d (NCCL pairs them in issue order)", ranks[r].name, i, describe(p, nd), c.Tag, g+c.Peer, tags[k][0])
			}
			outs[r] = []*interp.Tensor{mail[k][0]}
			mail[k], tags[k] = mail[k][1:], tags[k][1:]
		}
	case ir.IsCollective(op.Kind) && op.Attr().Int("size") > 1:
		// The ranks meet: each brings its operand, takes its part.
		col := make([]*interp.Tensor, n)
		for r := range ranks {
			col[r] = ins[r][0]
		}
		res, err := interp.Collective(op, col)
		if err != nil {
			return fmt.Errorf("node %d (%s): %v", i, describe(p, nd), err)
		}
		for r := range ranks {
			outs[r] = []*interp.Tensor{res[r]}
		}
	default:
		for r, rr := range ranks {
			if outs[r], err = interp.EvalOp(op, ins[r]); err != nil {
				return fmt.Errorf("%snode %d: %v", rr.name, i, err)
			}
			if nd.Kind == "library" {
				if err := rr.checkGemm(i, nd, op, outs[r]); err != nil {
					return err
				}
			}
		}
	}
	for r, rr := range ranks {
		if err := rr.results(i, op, ins[r], outs[r]); err != nil {
			return err
		}
	}
	return nil
}

// rankReplay is one rank's memory in a replay and the interpreter's
// fingerprints of its values.
type rankReplay struct {
	p      *cuda.Plan
	f      *ir.Func
	name   string // "rank r: " in a replay of several ranks
	mem    *memory
	ref    *fingerprints
	byName map[string]int
	// gemmsChecked counts the library calls checkGemm recomputed.
	gemmsChecked int
}

func newRankReplay(p *cuda.Plan, f *ir.Func, args []*interp.Tensor, ref *fingerprints, byName map[string]int) (*rankReplay, error) {
	mem := &memory{bytes: map[string][]byte{}, owner: map[string]*owners{}}
	mem.bytes["device/0"] = make([]byte, p.Arena.SizeBytes)
	mem.owner["device/0"] = newOwners(p.Arena.SizeBytes, -1)
	mem.bytes["host/0"] = make([]byte, p.Host.SizeBytes)
	mem.owner["host/0"] = newOwners(p.Host.SizeBytes, -1)
	argIndex := map[string]int{}
	for i, a := range f.Args {
		argIndex[a.Name] = i
	}
	bind := func(bs []cuda.Binding, space string) error {
		for slot, bd := range bs {
			i, ok := argIndex[bd.Name]
			if !ok {
				return fmt.Errorf("plan.json: argument %q is not in @%s", bd.Name, f.Name)
			}
			raw := args[i].ToDense().RawBytes()
			if bd.Buffer >= 0 && bd.Buffer < len(p.Buffers) && p.Buffers[bd.Buffer].Space == "host_param" {
				space := "host_param" // an offloaded parameter, in host memory
				key := spaceKey(space, slot)
				mem.bytes[key] = append([]byte(nil), raw...)
				mem.owner[key] = newOwners(int64(len(raw)), int64(bd.Buffer))
				continue
			}
			key := spaceKey(space, slot)
			mem.bytes[key] = append([]byte(nil), raw...)
			mem.owner[key] = newOwners(int64(len(raw)), int64(bd.Buffer))
		}
		return nil
	}
	if err := bind(p.Params, "param"); err != nil {
		return nil, err
	}
	if err := bind(p.Inputs, "input"); err != nil {
		return nil, err
	}
	return &rankReplay{p: p, f: f, mem: mem, ref: ref, byName: byName}, nil
}

func (rr *rankReplay) valueAt(v *ir.Value) (*cuda.Buffer, int64, error) {
	id, ok := rr.byName[v.Name]
	if !ok {
		return nil, 0, fmt.Errorf("no buffer of the plan holds %s", v.Ref())
	}
	b := &rr.p.Buffers[id]
	off := b.Offset
	if (b.Space == "device" || b.Space == "host") && v.Offset >= 0 {
		off = v.Offset
	}
	if !within(off, v.Type.SizeBytes(), int64(len(rr.mem.bytes[spaceKey(b.Space, b.Slot)]))) {
		return nil, 0, fmt.Errorf("%s at offset %d does not fit %s memory", v.Ref(), off, b.Space)
	}
	return b, off, nil
}

func (rr *rankReplay) read(v *ir.Value) (*interp.Tensor, error) {
	b, off, err := rr.valueAt(v)
	if err != nil {
		return nil, err
	}
	raw := rr.mem.bytes[spaceKey(b.Space, b.Slot)][off : off+v.Type.SizeBytes()]
	d, err := ir.DenseFromRaw(v.Type, raw)
	if err != nil {
		return nil, err
	}
	return interp.FromDense(d), nil
}

func (rr *rankReplay) write(v *ir.Value, t *interp.Tensor) error {
	b, off, err := rr.valueAt(v)
	if err != nil {
		return err
	}
	copy(rr.mem.bytes[spaceKey(b.Space, b.Slot)][off:], t.ToDense().RawBytes())
	return nil
}

// access checks that node i's reads find what their buffers wrote, in
// their lifetimes, and records its writes. A cooperative kernel's
// accesses are in the order its phases first touch them: each read
// finds what the node's earlier accesses wrote.
func (rr *rankReplay) access(i int, n cuda.Node) error {
	p, mem := rr.p, rr.mem
	// A library call writes the elements of C its m, n, ld, batch and
	// stride reach, which need not be all of C's argument: those bytes
	// alone become its buffer's (a call one column short leaves the
	// column to whatever wrote it before, and a reader of it is caught).
	var written map[*cuda.Access][][2]int64
	if n.Library != nil {
		if ms, err := matrices(n); err == nil {
			written = map[*cuda.Access][][2]int64{ms[2].access: ms[2].spans(n.Library.Batch)}
		}
	}
	record := func(a *cuda.Access) {
		if a.Mode == "read" {
			return
		}
		o := mem.owner[spaceKey(a.Space, a.Slot)]
		spans, exact := written[a]
		if !exact {
			spans = [][2]int64{{a.Offset, a.Offset + a.SizeBytes}}
		}
		for _, s := range spans {
			o.set(s[0], s[1], int64(a.Buffer))
		}
	}
	for _, a := range accesses(n) {
		key := spaceKey(a.Space, a.Slot)
		o := mem.owner[key]
		if o == nil || !within(a.Offset, a.SizeBytes, int64(len(mem.bytes[key]))) {
			return fmt.Errorf("%snode %d (%s): %s [%d, %d) is outside %s memory", rr.name, i, describe(p, n), p.Buffers[a.Buffer].Values[0], a.Offset, a.Offset+a.SizeBytes, a.Space)
		}
		buf := p.Buffers[a.Buffer]
		if n.Op >= 0 && (n.Op < buf.FirstOp || n.Op > buf.LastOp) {
			return fmt.Errorf("%snode %d (%s) at op %d uses %s outside its lifetime (ops %d-%d)%s", rr.name, i, describe(p, n), n.Op, buf.Values[0], buf.FirstOp, buf.LastOp, swappedHint(p, a.Buffer, i))
		}
		if a.Mode != "write" {
			for _, w := range o.who(a.Offset, a.Offset+a.SizeBytes) {
				if w == int64(a.Buffer) {
					continue
				}
				if w < 0 {
					return fmt.Errorf("%snode %d (%s) reads %s [%d, %d), which nothing has written", rr.name, i, describe(p, n), buf.Values[0], a.Offset, a.Offset+a.SizeBytes)
				}
				return fmt.Errorf("%snode %d (%s) reads %s [%d, %d), but %s wrote those bytes last%s", rr.name, i, describe(p, n), buf.Values[0], a.Offset, a.Offset+a.SizeBytes, p.Buffers[w].Values[0], swappedHint(p, a.Buffer, i))
			}
		}
		if n.Cooperative {
			record(a)
		}
	}
	if !n.Cooperative {
		for _, a := range accesses(n) {
			record(a)
		}
	}
	return nil
}

// operands reads op's operands at node i, each checked against the
// interpreter's value.
func (rr *rankReplay) operands(i int, n cuda.Node, op *ir.Op) ([]*interp.Tensor, error) {
	in := make([]*interp.Tensor, len(op.Operands))
	for j, x := range op.Operands {
		t, err := rr.read(x)
		if err != nil {
			return nil, fmt.Errorf("%snode %d: %v", rr.name, i, err)
		}
		if fingerprint(t) != rr.ref.values[x] {
			return nil, fmt.Errorf("%snode %d (%s) reads %s, which differs from the interpreter's value%s", rr.name, i, describe(rr.p, n), x.Ref(), swappedHint(rr.p, rr.byName[x.Name], i))
		}
		in[j] = t
	}
	return in, nil
}

// results writes op's results and the operands it updates in place.
func (rr *rankReplay) results(i int, op *ir.Op, in, out []*interp.Tensor) error {
	for j, r := range op.Results {
		if err := rr.write(r, out[j]); err != nil {
			return fmt.Errorf("%snode %d: %v", rr.name, i, err)
		}
	}
	if d := op.Def(); d != nil {
		for _, k := range d.Writes {
			if err := rr.write(op.Operands[k], in[k]); err != nil {
				return fmt.Errorf("%snode %d: %v", rr.name, i, err)
			}
		}
	}
	return nil
}

// final compares the results and updated arguments with the
// interpreter's, after checking that the plan wrote every byte of each
// (the replay stores the interpreter's values, so a byte no node wrote
// would otherwise compare equal).
func (rr *rankReplay) final() error {
	f := rr.f
	for i, r := range f.Results {
		if err := rr.writtenWhole(r.Value); err != nil {
			return err
		}
		got, err := rr.read(r.Value)
		if err != nil {
			return err
		}
		if fingerprint(got) != rr.ref.results[i] {
			return fmt.Errorf("%sresult %s differs from the interpreter", rr.name, f.ResultName(i))
		}
	}
	for i, a := range f.Args {
		if !a.Arg.InOut {
			continue
		}
		got, err := rr.read(a)
		if err != nil {
			return err
		}
		if fingerprint(got) != rr.ref.args[i] {
			return fmt.Errorf("%supdated argument %s differs from the interpreter", rr.name, a.Ref())
		}
	}
	return nil
}

// writtenWhole checks that the last writer of every byte of v is v's
// buffer.
func (rr *rankReplay) writtenWhole(v *ir.Value) error {
	b, off, err := rr.valueAt(v)
	if err != nil {
		return err
	}
	id := int64(rr.byName[v.Name])
	for _, w := range rr.mem.owner[spaceKey(b.Space, b.Slot)].who(off, off+v.Type.SizeBytes()) {
		if w == id {
			continue
		}
		if w < 0 {
			return fmt.Errorf("%s%s: some of its bytes no node writes", rr.name, v.Ref())
		}
		return fmt.Errorf("%s%s: some of its bytes were written last by %s", rr.name, v.Ref(), rr.p.Buffers[w].Values[0])
	}
	return nil
}

// the interpreter computed, of the results and of the final arguments.
type fingerprints struct {
	values        map[*ir.Value]uint64
	results, args []uint64
}

// reference runs f in the interpreter on each rank's arguments (all
// ranks at once when there are several) and keeps only a fingerprint of
// each value, so that it holds no more than the interpreter's live set,
// and nothing once it returns.
func reference(fs []*ir.Func, args [][]*interp.Tensor, prog *progress.Reporter) ([]*fingerprints, error) {
	f := fs[0]
	refs := make([]*fingerprints, len(args))
	for r := range refs {
		refs[r] = &fingerprints{values: map[*ir.Value]uint64{}}
		for i, a := range fs[r].Args {
			refs[r].values[a] = fingerprint(args[r][i])
		}
	}
	var mu sync.Mutex
	observe := func(rank, i int, op *ir.Op, res []*interp.Tensor) {
		fps := make([]uint64, len(res))
		for j := range res {
			fps[j] = fingerprint(res[j])
		}
		mu.Lock()
		defer mu.Unlock()
		if rank == 0 {
			prog.Step("plan-check: interpreting op %d of %d", i+1, len(f.Body))
		}
		for j, r := range op.Results {
			refs[rank].values[r] = fps[j]
		}
	}
	var want, final [][]*interp.Tensor
	var err error
	if len(args) == 1 {
		var w, fi []*interp.Tensor
		w, fi, err = interp.RunWithUpdates(f, args[0], interp.Options{Observe: func(i int, op *ir.Op, res []*interp.Tensor) { observe(0, i, op, res) }})
		want, final = [][]*interp.Tensor{w}, [][]*interp.Tensor{fi}
	} else {
		want, final, err = interp.RunPrograms(fs, args, interp.Options{ObserveRank: observe})
	}
	if err != nil {
		return nil, fmt.Errorf("interpreter: %v", err)
	}
	for r := range refs {
		for _, t := range want[r] {
			refs[r].results = append(refs[r].results, fingerprint(t))
		}
		for _, t := range final[r] {
			refs[r].args = append(refs[r].args, fingerprint(t))
		}
	}
	return refs, nil
}

// fingerprint hashes the numbers of t, counting every NaN as one value
// and -0 as 0 (the replay compares numbers, not bit patterns).
func fingerprint(t *interp.Tensor) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, x := range t.F {
		switch {
		case math.IsNaN(x):
			x = math.NaN()
		case x == 0:
			x = 0
		}
		binary.LittleEndian.PutUint64(b[:], math.Float64bits(x))
		h.Write(b[:])
	}
	for _, x := range t.I {
		binary.LittleEndian.PutUint64(b[:], uint64(x))
		h.Write(b[:])
	}
	return h.Sum64()
}

// swappedHint explains a stale read of a tensor that was copied out.
func swappedHint(p *cuda.Plan, buffer, before int) string {
	for i := before - 1; i >= 0; i-- {
		n := p.Nodes[i]
		if n.Kind == "copy" && n.Direction == "device_to_host" && n.Src.Buffer == buffer {
			return fmt.Sprintf(" (it was swapped out to the host by node %d)", i)
		}
	}
	return ""
}
