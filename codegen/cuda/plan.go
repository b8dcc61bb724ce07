// Package cuda lowers a function whose tensors have arena offsets (the
// assign pass) to a CUDA launch plan: plan.json lists the device arena,
// the host staging arena of swapped tensors, every buffer, the streams
// and the ordered nodes (kernel launches, host-device copies, event
// records and waits) with explicit dependencies, so that it maps one to
// one onto a CUDA graph; kernels.cu holds a CUDA C kernel per launch
// kind. Each stage of the loop program (codegen/loops, lowered with
// implicit-GEMM convolutions) is a device function with one thread per
// point of its domain (a tiled product: a block per 64 × 64 outputs; a
// block fold: a block per point), and the stages of a kernel op that run
// back to back are one launch (merge.go: merged, or cooperative with
// grid-wide barriers); products of plain loads are cuBLAS calls and
// collectives NCCL calls. Copies (swap_out,
// swap_in) run on the stream their op names; kernels on stream 0. Events
// are inserted wherever a node on one stream touches memory that a node
// on another stream touched before (read after write, write after read
// or write), and nowhere else. plan.schema.json (beside this file) is the format.
package cuda

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// Format and Version identify plan.json.
const (
	Format  = "kiln.launch-plan"
	Version = 1
)

// Plan is plan.json.
type Plan struct {
	Format    string           `json:"format"`
	Version   int              `json:"version"`
	Function  string           `json:"function"`
	Target    Target           `json:"target"`
	Arena     Arena            `json:"arena"`
	Workspace Region           `json:"workspace"`
	Host      Arena            `json:"host"`
	Params    []Binding        `json:"params"`
	Inputs    []Binding        `json:"inputs"`
	Results   []Binding        `json:"results"`
	Buffers   []Buffer         `json:"buffers"`
	Streams   []Stream         `json:"streams"`
	Events    int              `json:"events"`
	Nodes     []Node           `json:"nodes"`
	CostModel costmodel.Device `json:"cost_model"`
	// Ranks is how many ranks run the plan (an SPMD step of the parallel
	// pass; absent for one): each runs this plan on its own part, with
	// its rank from the runtime, and its collective nodes call NCCL on
	// the communication stream.
	Ranks int `json:"ranks,omitempty"`
	// Stage and Stages place a pipeline stage's plan (stage s of Stages,
	// on ranks s·Ranks to s·Ranks+Ranks−1); absent for a step.
	Stage  int `json:"stage,omitempty"`
	Stages int `json:"stages,omitempty"`
}

// Target names the GPU architecture kernels.cu is written for.
type Target struct {
	Arch string `json:"arch"`
}

// Arena is a memory region the runtime allocates once.
type Arena struct {
	SizeBytes int64 `json:"size_bytes"`
	Alignment int64 `json:"alignment"`
}

// Region is a byte range of the device arena.
type Region struct {
	Offset    int64 `json:"offset"`
	SizeBytes int64 `json:"size_bytes"`
}

// Binding ties a function argument or result to a buffer.
type Binding struct {
	Name   string `json:"name"`
	Buffer int    `json:"buffer"`
}

// Buffer is memory of one or more values (views and in-place results
// share their operand's): space "device" (offset in the arena), "host"
// (offset in the host arena), "param" or "input" (slot, offset in it).
// FirstOp and LastOp are schedule positions of the module's function.
type Buffer struct {
	ID        int      `json:"id"`
	Values    []string `json:"values"`
	Space     string   `json:"space"`
	Slot      int      `json:"slot"`
	Offset    int64    `json:"offset"`
	SizeBytes int64    `json:"size_bytes"`
	DType     string   `json:"dtype"`
	Shape     []int64  `json:"shape"`
	FirstOp   int      `json:"first_op"`
	LastOp    int      `json:"last_op"`
	Loc       string   `json:"loc,omitempty"`
}

// Stream is a CUDA stream.
type Stream struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// Node is one entry of the plan, in issue order. Kind is "kernel",
// "library" (a cuBLAS call: Library), "copy", "collective", "host" (a C
// function of kernels.cu called on the host, with pointers into host
// memory), "event_record" or "event_wait". Deps are the
// nodes it waits for: the previous node on its stream, and for an event
// wait the record.
type Node struct {
	ID     int    `json:"id"`
	Kind   string `json:"kind"`
	Stream int    `json:"stream"`
	Deps   []int  `json:"deps"`
	Op     int    `json:"op"` // schedule position of the op it runs; -1 for events
	// kernel launches
	Kernel      string  `json:"kernel,omitempty"`
	Grid        *[3]int `json:"grid,omitempty"`
	Block       *[3]int `json:"block,omitempty"`
	SharedBytes int     `json:"shared_bytes"`
	Args        []KArg  `json:"args,omitempty"`
	Last        bool    `json:"last_of_op,omitempty"` // the op's last launch
	// Cooperative: the kernel loops over its work with grid-wide
	// barriers, so it runs with cudaLaunchCooperativeKernel on a grid
	// of at most Grid[0] blocks that the GPU holds at once.
	Cooperative bool    `json:"cooperative,omitempty"`
	Seconds     float64 `json:"seconds"`
	// copies
	Direction string  `json:"direction,omitempty"` // device_to_host or host_to_device
	Src       *Access `json:"src,omitempty"`
	Dst       *Access `json:"dst,omitempty"`
	// collectives: an NCCL call from Src to Dst
	Collective *Collective `json:"collective,omitempty"`
	// library calls (kind "library"): a cuBLAS call on Args
	Library *Library `json:"library,omitempty"`
	// events
	Event *int `json:"event,omitempty"`

	stage *stageKernel // the stage a kernel launch runs (nil: a library call, a copy, a host function, a merged launch)
}

// Collective is the NCCL call of a collective node: Call
// (ncclAllReduce, ncclReduceScatter, ncclAllGather or ncclBroadcast) of
// Count elements of DType (the send count: ncclAllGather's sendcount,
// ncclReduceScatter's recvcount times Size) with Reduce (ncclSum, ncclMax,
// ncclMin; "" for gathers and broadcasts) over the group of Size ranks,
// Stride apart, that holds this rank (ranks r0 + k·Stride; one
// communicator per group, which the runtime makes with ncclCommSplit);
// Root is the broadcast's root within the group.
//
// A pipeline stage's ncclSend (Src only) and ncclRecv (Dst only) move
// Count elements to or from rank r+Peer, matched in issue order by Tag;
// each runs on the stream of its direction (P2PStream), so that the
// sends one way never wait behind the receives the other way.
type Collective struct {
	Call   string `json:"call"`
	Reduce string `json:"reduce,omitempty"`
	DType  string `json:"dtype"`
	Count  int64  `json:"count"`
	Size   int64  `json:"size,omitempty"`
	Stride int64  `json:"stride,omitempty"`
	Root   int64  `json:"root"`
	Peer   int64  `json:"peer,omitempty"`
	Tag    int64  `json:"tag,omitempty"`
}

// NCCL names of the collectives and reductions.
var (
	ncclCalls   = map[string]string{"all_reduce": "ncclAllReduce", "reduce_scatter": "ncclReduceScatter", "all_gather": "ncclAllGather", "broadcast": "ncclBroadcast"}
	ncclReduces = map[string]string{"sum": "ncclSum", "max": "ncclMax", "min": "ncclMin"}
)

// CommStream is the stream collectives run on; HostStream the one that
// runs the host functions of updates to offloaded parameters.
const (
	CommStream = 2
	HostStream = 3
)

// P2PStream is the stream of a pipeline stage's sends or receives
// (recv) to or from a later stage (peer > 0) or an earlier one: 4 to 7.
func P2PStream(recv bool, peer int64) int {
	id := 4
	if peer < 0 {
		id = 6
	}
	if recv {
		id++
	}
	return id
}

// streamNames names the streams by ID; a plan's streams are numbered
// from 0 without gaps.
var streamNames = []string{"compute", "copy", "comm", "host", "send_next", "recv_next", "send_prev", "recv_prev"}

// stream makes sure the plan has stream id (and those below it).
func (b *planner) stream(id int) {
	for len(b.plan.Streams) <= id {
		n := len(b.plan.Streams)
		b.plan.Streams = append(b.plan.Streams, Stream{n, streamNames[n]})
	}
}

// KArg is a kernel argument: a pointer into a buffer or an i64 scalar.
type KArg struct {
	Kind    string  `json:"kind"` // "pointer" or "scalar"
	Pointer *Access `json:"pointer,omitempty"`
	Value   int64   `json:"value"`
}

// Access is a byte range a node reads ("read"), writes ("write") or both.
type Access struct {
	Buffer    int    `json:"buffer"`
	Space     string `json:"space"`
	Slot      int    `json:"slot"`
	Offset    int64  `json:"offset"`
	SizeBytes int64  `json:"size_bytes"`
	Mode      string `json:"mode"`
}

// Output is what Lower produces.
type Output struct {
	Plan    *Plan
	Kernels string // kernels.cu

	prog     *loops.Program
	argTypes map[string][]string // per kernel or host function: the C types of its pointer parameters
	results  []*Access           // where each result lives
}

// Arch is the architecture kernels.cu targets (atomicAdd on doubles
// needs sm_60; sm_80 is the A100 and later).
const Arch = "sm_80"

// LoopOptions is how the CUDA backend lowers a function to loop programs
// (implicit GEMMs), which plan-check lowers again to check library calls.
var LoopOptions = loops.Options{ImplicitGemm: true}

// Lower builds the launch plan of f, which must carry offsets.
func Lower(f *ir.Func, dev costmodel.Device) (*Output, error) {
	if _, ok := f.Attrs["arena"]; !ok {
		return nil, fmt.Errorf("@%s has no arena offsets (run the assign pass first)", f.Name)
	}
	for _, a := range f.Args {
		if a.Arg.Kind == ir.ArgData && ir.HostArg(a) {
			return nil, fmt.Errorf("data input %s is in host memory (swap left it there to reach the budget), and launch plans take inputs in device memory only", a.Ref())
		}
	}
	prog, err := loops.LowerWith(f, LoopOptions)
	if err != nil {
		return nil, err
	}
	align := f.Attrs.Int("alignment", 64)
	b := &planner{f: f, dev: dev, prog: prog, info: liveness.Analyze(f), consts: &constTable{names: map[*ir.Dense]string{}},
		byName: map[string]int{}, kernelSrc: map[string]bool{}, argTypes: map[string][]string{}, alias: map[*loops.Stage]string{}, override: map[*loops.Stage]map[loops.Expr]loops.Expr{},
		mergedName: map[string]string{}, bodySrc: map[string]bool{}}
	arena := alignUp(f.Attrs.Int("arena", 0), loops.TempAlignment)
	// Empty lists are [] in plan.json, never null (the schema wants arrays).
	b.plan = &Plan{Format: Format, Version: Version, Function: f.Name, Target: Target{Arch: Arch},
		Params: []Binding{}, Inputs: []Binding{}, Results: []Binding{}, Buffers: []Buffer{}, Nodes: []Node{},
		Host:    Arena{SizeBytes: f.Attrs.Int("host_arena", 0), Alignment: align},
		Streams: []Stream{{0, "compute"}, {1, "copy"}}, CostModel: dev}
	if r := f.Attrs.Int("ranks", 1); r > 1 {
		b.plan.Ranks = int(r)
	}
	if s := f.Attrs.Int("stages", 0); s > 1 {
		b.plan.Stage, b.plan.Stages = int(f.Attrs.Int("stage", 0)), int(s)
	}
	b.buffers()
	ws, err := b.nodes(arena)
	if err != nil {
		return nil, err
	}
	b.plan.Workspace = Region{Offset: arena, SizeBytes: ws}
	b.plan.Arena = Arena{SizeBytes: arena + ws, Alignment: align}
	b.events()
	out := &Output{Plan: b.plan, Kernels: b.source(), prog: prog, argTypes: b.argTypes}
	for _, r := range f.Results {
		a, err := b.valueAccess(r.Value, r.Value.Type.SizeBytes(), "read")
		if err != nil {
			return nil, err
		}
		out.results = append(out.results, a)
	}
	return out, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

type planner struct {
	f         *ir.Func
	dev       costmodel.Device
	prog      *loops.Program
	info      *liveness.Info
	plan      *Plan
	consts    *constTable
	byName    map[string]int // value name -> buffer id
	kernels   []string       // kernel sources in order
	kernelSrc map[string]bool
	raw       []Node // nodes before events
	argTypes  map[string][]string
	alias     map[*loops.Stage]string // names of stages made here (GEMM epilogues, split reductions)
	plainGemm *gemmPlan               // the GEMM the last library call made, when it has no epilogue and no batch loop
	// mergedName names the kernel of each merge of independent stage
	// launches (merge.go) by its stages and grids; bodySrc says which
	// stages' device functions kernels.cu has.
	mergedName map[string]string
	bodySrc    map[string]bool
	override   map[*loops.Stage]map[loops.Expr]loops.Expr
	// splitTop is where the kernel being planned may put the partials of
	// a split reduction (after its temporaries and earlier partials), up to
	// splitLimit, the end of the workspace the plan has anyway.
	splitTop, splitLimit int64
	host                 bool // the op being planned runs on the host (ir.OnHost)
}

// buffers lists the liveness buffers: arguments, arena and host.
func (b *planner) buffers() {
	f, n := b.f, len(b.f.Body)
	params, inputs := 0, 0
	add := func(lb *liveness.Buffer, space string, slot int, offset int64) int {
		root := lb.Root()
		buf := Buffer{ID: len(b.plan.Buffers), Space: space, Slot: slot, Offset: offset, SizeBytes: lb.Size,
			DType: root.Type.DType.String(), Shape: append([]int64{}, root.Type.Shape...), FirstOp: lb.Start, LastOp: lb.End}
		if root.Def != nil && !root.Def.Loc.IsUnknown() {
			buf.Loc = root.Def.Loc.String()
		}
		for _, v := range lb.Values {
			buf.Values = append(buf.Values, v.Name)
			b.byName[v.Name] = buf.ID
		}
		b.plan.Buffers = append(b.plan.Buffers, buf)
		return buf.ID
	}
	for _, a := range f.Args {
		lb := b.info.BufferOf[a]
		if a.Arg.Kind == ir.ArgParam || a.Arg.Kind == ir.ArgState {
			space := "param"
			if ir.HostArg(a) {
				space = "host_param" // pinned host memory (offloaded)
			}
			id := add(lb, space, params, 0)
			b.plan.Params = append(b.plan.Params, Binding{Name: a.Name, Buffer: id})
			params++
		} else {
			id := add(lb, "input", inputs, 0)
			b.plan.Inputs = append(b.plan.Inputs, Binding{Name: a.Name, Buffer: id})
			inputs++
		}
		b.plan.Buffers[len(b.plan.Buffers)-1].FirstOp, b.plan.Buffers[len(b.plan.Buffers)-1].LastOp = 0, max(n-1, 0)
	}
	for _, lb := range b.info.ArenaBuffers() {
		add(lb, "device", 0, lb.Root().Offset)
	}
	for _, lb := range b.info.HostBuffers {
		add(lb, "host", 0, lb.Root().Offset)
	}
	for _, r := range f.Results {
		b.plan.Results = append(b.plan.Results, Binding{Name: r.Value.Name, Buffer: b.byName[r.Value.Name]})
	}
}

// access describes a loop buffer as a byte range of a plan buffer.
func (b *planner) access(lb *loops.Buffer, size int64, mode string) (*Access, error) {
	id, ok := b.byName[lb.Name]
	if !ok {
		return nil, fmt.Errorf("no buffer holds %s", lb)
	}
	pb := b.plan.Buffers[id]
	return &Access{Buffer: id, Space: pb.Space, Slot: pb.Slot, Offset: pb.Offset, SizeBytes: size, Mode: mode}, nil
}

// nodes lists the launches and copies in schedule order and returns the
// workspace bytes kernels need beyond the arena.
func (b *planner) nodes(arena int64) (int64, error) {
	kernelOf := map[*ir.Op]*loops.Kernel{}
	for _, k := range b.prog.Kernels {
		kernelOf[k.Op] = k
	}
	ws := int64(0)
	for _, k := range b.prog.Kernels {
		_, span := k.TempOffsets()
		b.splitLimit = max(b.splitLimit, arena+span)
	}
	for i, op := range b.f.Body {
		if costmodel.IsCopy(op) {
			if err := b.copyNode(i, op); err != nil {
				return 0, err
			}
			continue
		}
		k := kernelOf[op]
		if k == nil {
			continue // a view: no memory, no launch
		}
		b.host = ir.OnHost(op)
		// The kernel's workspace sits after the arena, one temp after
		// another; kernels run one at a time on the compute stream.
		temps := map[string]int64{}
		offs, span := k.TempOffsets()
		for j, t := range k.Temps {
			off := offs[j]
			temps[t.Name] = arena + off
			id := len(b.plan.Buffers)
			b.plan.Buffers = append(b.plan.Buffers, Buffer{ID: id, Values: []string{k.Name + "." + t.Name}, Space: "device",
				Offset: arena + off, SizeBytes: t.Type.SizeBytes(), DType: t.Type.DType.String(), Shape: append([]int64{}, t.Type.Shape...), FirstOp: i, LastOp: i})
			b.byName[k.Name+"."+t.Name] = id
		}
		ws = max(ws, span)
		b.splitTop = arena + alignUp(span, loops.TempAlignment)
		first := len(b.raw)
		c := ir.OpCost(op)
		if err := b.launches(i, k, k.Steps, nil, nil, nil, temps); err != nil {
			return 0, fmt.Errorf("op %s at position %d: %v", op.Kind, i, err)
		}
		ws = max(ws, b.splitTop-arena)
		merged, err := b.combine(b.raw[first:])
		if err != nil {
			return 0, fmt.Errorf("op %s at position %d: %v", op.Kind, i, err)
		}
		b.raw = append(b.raw[:first], merged...)
		launched := b.raw[first:]
		for _, n := range launched {
			if n.stage != nil { // launched alone: its kernel (a merged stage has its device function)
				if err := b.emitStage(n.stage); err != nil {
					return 0, fmt.Errorf("op %s at position %d: %v", op.Kind, i, err)
				}
			}
		}
		if len(launched) == 0 {
			continue
		}
		launched[len(launched)-1].Last = true
		per := 0.0
		for _, n := range launched {
			if n.Kind == "kernel" || n.Kind == "host" || n.Kind == "library" {
				per++
			}
		}
		for j := range launched {
			switch launched[j].Kind { // a collective has its own time
			case "kernel", "library":
				launched[j].Seconds = b.dev.KernelSeconds(int64(float64(c.FLOPs)/per), int64(float64(c.BytesRead+c.BytesWritten)/per))
			case "host":
				launched[j].Seconds = b.dev.OpSeconds(op) / per
			}
		}
	}
	return ws, nil
}

func (b *planner) copyNode(i int, op *ir.Op) error {
	x, r := op.Operands[0], op.Results[0]
	size := x.Type.SizeBytes()
	src, err := b.valueAccess(x, size, "read")
	if err != nil {
		return err
	}
	dst, err := b.valueAccess(r, size, "write")
	if err != nil {
		return err
	}
	dir := "device_to_host"
	if ir.CopiesFromHost(op) {
		dir = "host_to_device"
	}
	b.raw = append(b.raw, Node{Kind: "copy", Stream: int(op.Attr().Int("stream")), Op: i, Direction: dir, Src: src, Dst: dst,
		Seconds: b.dev.CopySeconds(size), Last: true})
	return nil
}

func (b *planner) valueAccess(v *ir.Value, size int64, mode string) (*Access, error) {
	id, ok := b.byName[v.Name]
	if !ok {
		return nil, fmt.Errorf("no buffer holds %s", v.Ref())
	}
	pb := b.plan.Buffers[id]
	off := pb.Offset
	if pb.Space == "device" || pb.Space == "host" {
		off = v.Offset
	}
	return &Access{Buffer: id, Space: pb.Space, Slot: pb.Slot, Offset: off, SizeBytes: size, Mode: mode}, nil
}

// launches adds one node per stage and iteration of the loops around it.
func (b *planner) launches(op int, k *loops.Kernel, steps []loops.Step, outer []*loops.Var, extents, iter []int64, temps map[string]int64) error {
	for si := 0; si < len(steps); si++ {
		st := steps[si]
		switch st := st.(type) {
		case *loops.Loop:
			if len(st.Body) == 1 && !b.host {
				if body, ok := st.Body[0].(*loops.Stage); ok && body.Matmul != nil {
					// One strided-batched GEMM for the whole loop.
					done, err := b.library(op, k, body, st.Var, st.Extent, outer, extents, iter, temps)
					if err != nil {
						return err
					}
					if done {
						fused, err := b.fuseNext(k, steps[si+1:], temps)
						if err != nil {
							return err
						}
						if fused {
							si++
						}
						continue
					}
				}
			}
			for it := int64(0); it < st.Extent; it++ {
				if err := b.launches(op, k, st.Body, append(outer[:len(outer):len(outer)], st.Var), append(extents[:len(extents):len(extents)], st.Extent),
					append(iter[:len(iter):len(iter)], it), temps); err != nil {
					return err
				}
			}
		case *loops.Collective:
			if err := b.collective(op, k, st, temps); err != nil {
				return err
			}
		case *loops.Stage:
			if st.Matmul != nil && !b.host {
				done, err := b.library(op, k, st, nil, 1, outer, extents, iter, temps)
				if err != nil {
					return err
				}
				if done {
					fused, err := b.fuseNext(k, steps[si+1:], temps)
					if err != nil {
						return err
					}
					if fused {
						si++
					}
					continue
				}
			}
			if _, made := b.alias[st]; !made && !b.host {
				done, err := b.split(op, k, st, outer, extents, iter, temps)
				if err != nil {
					return err
				}
				if done {
					continue
				}
			}
			name := fmt.Sprintf("%s_s%d", k.Name, b.stageIndex(k, st))
			if alias, ok := b.alias[st]; ok {
				name = alias
			}
			threads := int64(1)
			for _, e := range st.Extents {
				threads *= e
			}
			sk := &stageKernel{name: name, stage: st, outer: outer, extents: extents, ptrs: pointers(st, b.override[st]), threads: threads, host: b.host, override: b.override[st]}
			if st.Matmul != nil && !b.host && threads > 0 {
				sk.tile = tile(st)
				if sk.tile.parts > 1 {
					// The parts add into the result, zeroed first.
					zero := &loops.Stage{Vars: st.Vars, Extents: st.Extents, Out: st.Out, Index: st.Index,
						Value: loops.Float{V: 0, K: loops.ComputeKind(st.Out.Type.DType)}}
					b.alias[zero] = name + "_zero"
					if err := b.launches(op, k, []loops.Step{zero}, outer, extents, iter, temps); err != nil {
						return err
					}
					for _, p := range sk.ptrs {
						if p.key == keyOf(st.Out) {
							p.read = true // atomicAdd reads what it adds to
						}
					}
				}
				threads = sk.tile.blocks() * BlockSize
				sk.threads = threads
			} else if !b.host && threads > 0 {
				if sk.fold = blockFolds(st, b.override[st]); sk.fold != nil {
					threads *= BlockSize // a block per point
				}
			}
			if b.host {
				if err := b.emitStage(sk); err != nil {
					return err
				}
			}
			if threads == 0 {
				continue
			}
			n := Node{Kind: "kernel", Stream: 0, Op: op, Kernel: name, Grid: &[3]int{int((threads + BlockSize - 1) / BlockSize), 1, 1}, Block: &[3]int{BlockSize, 1, 1}, stage: sk}
			if b.host {
				// A C function the runtime calls on the host stream, in
				// order with the copies and kernels its events name.
				b.stream(HostStream)
				n = Node{Kind: "host", Stream: HostStream, Op: op, Kernel: name}
			}
			for _, p := range sk.ptrs {
				mode := p.mode()
				if p.buf.Storage == loops.Temp && b.host {
					return fmt.Errorf("%s runs on the host, but its stage %s needs a temporary, and temporaries live in the device workspace", k.Name, name)
				}
				a, err := b.pointerAccess(k, p.buf, p.size, mode, temps)
				if err != nil {
					return err
				}
				n.Args = append(n.Args, KArg{Kind: "pointer", Pointer: a})
			}
			for _, v := range iter {
				n.Args = append(n.Args, KArg{Kind: "scalar", Value: v})
			}
			b.raw = append(b.raw, n)
		}
	}
	return nil
}

// emitStage adds sk's kernel (or host function) to kernels.cu, once.
func (b *planner) emitStage(sk *stageKernel) error {
	if b.kernelSrc[sk.name] {
		return nil
	}
	src, err := kernelSource(sk, b.consts)
	if err != nil {
		return err
	}
	b.kernelSrc[sk.name] = true
	b.kernels = append(b.kernels, src)
	b.argTypes[sk.name], err = sk.pointerTypes()
	return err
}

// pointerAccess is the byte range of the loop buffer lb (a view of a
// plan buffer, or one of kernel k's temporaries) that a node touches from
// its start: size bytes, in mode.
func (b *planner) pointerAccess(k *loops.Kernel, lb *loops.Buffer, size int64, mode string, temps map[string]int64) (*Access, error) {
	if lb.Storage == loops.Temp {
		id := b.byName[k.Name+"."+lb.Name]
		return &Access{Buffer: id, Space: "device", Offset: temps[lb.Name], SizeBytes: size, Mode: mode}, nil
	}
	a, err := b.access(lb, size, mode)
	if err != nil {
		return nil, err
	}
	a.Offset = b.plan.Buffers[a.Buffer].Offset + lb.Offset - b.baseOffset(lb)
	return a, nil
}

// collective adds the NCCL call of st, on the communication stream (a
// send or recv on the stream of its direction).
func (b *planner) collective(op int, k *loops.Kernel, st *loops.Collective, temps map[string]int64) error {
	if st.Outer != 1 && (st.Kind == "reduce_scatter" || st.Kind == "all_gather") {
		return fmt.Errorf("%s along a dimension after %d leading elements: NCCL exchanges contiguous parts, and launch plans do not transpose around it yet", st.Kind, st.Outer)
	}
	access := func(lb *loops.Buffer, mode string) (*Access, error) {
		return b.pointerAccess(k, lb, lb.Type.SizeBytes(), mode, temps)
	}
	if st.Kind == "send" || st.Kind == "recv" {
		buf, mode := st.In, "read"
		if st.Kind == "recv" {
			buf, mode = st.Out, "write"
		}
		a, err := access(buf, mode)
		if err != nil {
			return err
		}
		if d := buf.Type.DType; d != ir.F32 && d != ir.F64 && d != ir.I64 {
			return fmt.Errorf("%s of %s: launch plans send f32, f64 and i64 tensors", st.Kind, buf.Type)
		}
		id := P2PStream(st.Kind == "recv", st.Peer)
		b.stream(id)
		n := Node{Kind: "collective", Stream: id, Op: op, Seconds: b.dev.CollectiveSeconds("send", a.SizeBytes, 2),
			Collective: &Collective{Call: "ncclSend", DType: buf.Type.DType.String(), Count: buf.Type.NumElements(), Peer: st.Peer, Tag: st.Tag}}
		if st.Kind == "recv" {
			n.Collective.Call, n.Dst = "ncclRecv", a
		} else {
			n.Src = a
		}
		b.raw = append(b.raw, n)
		return nil
	}
	src, err := access(st.In, "read")
	if err != nil {
		return err
	}
	dst, err := access(st.Out, "write")
	if err != nil {
		return err
	}
	b.stream(CommStream)
	c := &Collective{Call: ncclCalls[st.Kind], Reduce: ncclReduces[st.Reduce], DType: st.In.Type.DType.String(), Count: st.In.Type.NumElements(),
		Size: st.Size, Stride: st.Stride, Root: st.Root}
	if st.Kind == "all_reduce" || st.Kind == "reduce_scatter" {
		if c.Reduce == "" {
			return fmt.Errorf("%s with reduction %q: NCCL has no such reduction", st.Kind, st.Reduce)
		}
	} else {
		c.Reduce = ""
	}
	b.raw = append(b.raw, Node{Kind: "collective", Stream: CommStream, Op: op, Src: src, Dst: dst, Collective: c,
		Seconds: b.dev.CollectiveSeconds(st.Kind, src.SizeBytes, st.Size)})
	return nil
}

// baseOffset is the offset a loop buffer's storage counts from: the arena
// offset for arena and host-arena buffers (already absolute), 0 for
// params and inputs.
func (b *planner) baseOffset(lb *loops.Buffer) int64 {
	if lb.Storage == loops.Arena || lb.Storage == loops.Host {
		return b.plan.Buffers[b.byName[lb.Name]].Offset
	}
	return 0
}

// stageIndex numbers the stages of a kernel in program order.
func (b *planner) stageIndex(k *loops.Kernel, s *loops.Stage) int {
	n := 0
	found := -1
	var walk func(steps []loops.Step)
	walk = func(steps []loops.Step) {
		for _, st := range steps {
			switch st := st.(type) {
			case *loops.Loop:
				walk(st.Body)
			case *loops.Stage:
				if st == s && found < 0 {
					found = n
				}
				n++
			}
		}
	}
	walk(k.Steps)
	return found
}

// source is kernels.cu.
func (b *planner) source() string {
	var out strings.Builder
	out.WriteString("// Generated by Kiln: the kernels of plan.json (@" + loops.CComment(b.f.Name) + ").\n#include \"kiln_cuda.h\"\n\n")
	out.WriteString("#define KILN_F8_FN __host__ __device__ static inline" + loops.FP8C + "\n")
	for _, d := range b.consts.defs {
		out.WriteString(d + "\n")
	}
	if len(b.consts.defs) > 0 {
		out.WriteString("\n")
	}
	for _, k := range b.kernels {
		out.WriteString(k + "\n")
	}
	return out.String()
}

// events orders nodes on different streams that touch the same bytes
// (one of them writing): the earlier node records an event right after
// it, the later one waits for it just before it. Orderings already
// implied by stream order and earlier events are not repeated.
func (b *planner) events() {
	raw := b.raw
	type acc struct {
		node   int
		space  string
		slot   int
		lo, hi int64
		write  bool
	}
	accesses := func(n Node) []acc {
		var out []acc
		add := func(a *Access) {
			if a != nil {
				out = append(out, acc{space: a.Space, slot: a.Slot, lo: a.Offset, hi: a.Offset + a.SizeBytes, write: a.Mode != "read"})
			}
		}
		for _, a := range n.Args {
			add(a.Pointer)
		}
		add(n.Src)
		add(n.Dst)
		return out
	}
	streams := len(b.plan.Streams)
	seq := make([]int, len(raw))     // position of a node on its stream
	clock := make([][]int, len(raw)) // vector clocks: nodes seen per stream
	last := make([]int, streams)     // last node per stream, -1: none
	count := make([]int, streams)
	for i := range last {
		last[i] = -1
	}
	history := make([][]acc, streams)
	waits := map[int][]int{} // node -> sources it waits for
	sources := map[int]bool{}
	for i, n := range raw {
		s := n.Stream
		vc := make([]int, streams)
		if last[s] >= 0 {
			copy(vc, clock[last[s]])
		}
		seq[i] = count[s]
		count[s]++
		vc[s] = count[s]
		mine := accesses(n)
		for t := 0; t < streams; t++ {
			if t == s {
				continue
			}
			// Latest first: one wait for the latest conflicting node
			// orders the earlier ones on its stream too.
			for j := len(history[t]) - 1; j >= 0; j-- {
				h := history[t][j]
				if vc[t] > seq[h.node] {
					break // this and everything before it is ordered
				}
				for _, a := range mine {
					if a.space == h.space && a.slot == h.slot && a.lo < h.hi && h.lo < a.hi && (a.write || h.write) {
						waits[i] = append(waits[i], h.node)
						sources[h.node] = true
						for k := range vc {
							vc[k] = max(vc[k], clock[h.node][k])
						}
						break
					}
				}
			}
		}
		clock[i] = vc
		last[s] = i
		for _, a := range mine {
			a.node = i
			history[s] = append(history[s], a)
		}
	}
	// Emit with events.
	eventOf := map[int]int{}
	recordID := map[int]int{}
	var out []Node
	prev := make([]int, streams)
	for i := range prev {
		prev[i] = -1
	}
	emit := func(n Node) int {
		n.ID = len(out)
		n.Deps = []int{}
		if prev[n.Stream] >= 0 {
			n.Deps = append(n.Deps, prev[n.Stream])
		}
		if n.Kind == "event_wait" {
			n.Deps = append(n.Deps, recordID[*n.Event])
		}
		prev[n.Stream] = n.ID
		out = append(out, n)
		return n.ID
	}
	for i, n := range raw {
		src := waits[i]
		sort.Ints(src)
		for _, w := range src {
			ev := eventOf[w]
			emit(Node{Kind: "event_wait", Stream: n.Stream, Op: -1, Event: &ev})
		}
		if n.Args == nil {
			n.Args = nil
		}
		emit(n)
		if sources[i] {
			ev := len(eventOf)
			eventOf[i] = ev
			recordID[ev] = emit(Node{Kind: "event_record", Stream: n.Stream, Op: -1, Event: &ev})
		}
	}
	b.plan.Nodes = out
	b.plan.Events = len(eventOf)
}
