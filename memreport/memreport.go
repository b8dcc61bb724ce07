// Package memreport builds the memory report of `kiln mem`: operation
// count, bytes of parameters, state, inputs and outputs, the peak and the
// largest values live at it, the arena and planned bytes of a buffer
// assignment, fragmentation and FLOPs, as text, JSON, and a Chrome trace
// timeline that Perfetto opens.
package memreport

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kiln-compiler/kiln/alloc"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// Top is one of the largest values live at the peak.
type Top = liveness.Holder

// Pass names a pass of the pipeline that produced the function; Seconds
// is set only when timing was asked for.
type Pass struct {
	Name    string   `json:"name"`
	Seconds *float64 `json:"seconds,omitempty"`
	Notes   []string `json:"notes,omitempty"` // what the pass wants the reader to know (its "note" statistics)
}

// Approximation is one approximation a pass made, by the name that
// allowed it.
type Approximation struct {
	Pass string `json:"pass"`
	Name string `json:"name"`
	What string `json:"what"`
}

// PeakOp locates the peak: the op's index in the schedule, its kind, the
// value it defines (if any) and its source location.
type PeakOp struct {
	Index int    `json:"index"`
	Op    string `json:"op"`
	Value string `json:"value,omitempty"`
	Loc   string `json:"loc"`
}

// Report is the memory report of one function. Field names are a contract
// (design notes): later work adds fields, never renames them.
type Report struct {
	Func           string  `json:"func"`
	Ops            int     `json:"ops"`
	ParamsBytes    int64   `json:"params_bytes"`
	InputsBytes    int64   `json:"inputs_bytes"`
	OutputsBytes   int64   `json:"outputs_bytes"`
	StateBytes     int64   `json:"state_bytes"`
	PeakBytes      int64   `json:"peak_bytes"`
	ArenaBytes     int64   `json:"arena_bytes"`
	PlannedBytes   int64   `json:"planned_bytes"`
	Fragmentation  float64 `json:"fragmentation"`
	FLOPs          int64   `json:"flops"`
	RecomputeFLOPs int64   `json:"recompute_flops"`
	TopAtPeak      []Top   `json:"top_at_peak"`
	// PeakOp is the op at which the peak is reached (absent for a
	// function without ops).
	PeakOp *PeakOp `json:"peak_op,omitempty"`
	Passes []Pass  `json:"passes"`
	// Effects, when set, is the function before the pipeline and after
	// each pass (the HTML report's comparison).
	Effects []Effect `json:"-"`
	// Kernels counts the launches: every top-level op but constants and
	// views (a fused kernel counts once). TrafficBytes is the bytes they
	// read and write; the unfused_ fields count as if every op inside a
	// kernel ran alone, and IntermediateBytesRemoved is the bytes of values
	// that live only inside kernels.
	Kernels                  int   `json:"kernels"`
	TrafficBytes             int64 `json:"traffic_bytes"`
	UnfusedKernels           int   `json:"unfused_kernels"`
	UnfusedTrafficBytes      int64 `json:"unfused_traffic_bytes"`
	IntermediateBytesRemoved int64 `json:"intermediate_bytes_removed"`
	// BytesByDType splits the bytes live at the peak (arguments included)
	// by dtype: they sum to peak_bytes.
	BytesByDType map[string]int64 `json:"bytes_by_dtype"`
	// HostBytes is the host memory that swapped-out tensors need (the host
	// arena when assigned, else the most host bytes live at once);
	// SwappedBytes the bytes copied to the host (and back).
	HostBytes    int64 `json:"host_bytes"`
	SwappedBytes int64 `json:"swapped_bytes"`
	// OffloadedBytes are the arguments the caller holds in host memory
	// (parameters, optimizer state, and data inputs swap left there): not
	// in planned_bytes or inputs_bytes.
	OffloadedBytes int64 `json:"offloaded_bytes,omitempty"`
	// Mechanisms is what each way of saving memory contributed over the
	// pipeline, by name (see MechanismOf); empty when no pass measured.
	Mechanisms map[string]*Mechanism `json:"mechanisms"`
	// Ranks, for a step partitioned over ranks, is each rank's plan; the
	// top-level planned_bytes is then the largest rank's.
	Ranks []RankReport `json:"ranks,omitempty"`

	// Allowed names the approximations the request allowed (empty: none,
	// and the plan computes what the step computes); Approximations are
	// those its passes made.
	Allowed        []string        `json:"allowed"`
	Approximations []Approximation `json:"approximations"`

	info   *liveness.Info
	device costmodel.Device // what the times model
}

// RankReport is one rank's share of a partitioned step: its planned
// bytes, the parameters and optimizer state it holds, and the bytes it
// sends in collectives (ring algorithms).
type RankReport struct {
	Rank         int   `json:"rank"`
	PlannedBytes int64 `json:"planned_bytes"`
	ParamsBytes  int64 `json:"params_bytes"`
	StateBytes   int64 `json:"state_bytes"`
	CommBytes    int64 `json:"comm_bytes"`
	// CommSeconds is the collectives' time in the cost model,
	// ExposedCommSeconds what of it the step waits for (the rest overlaps
	// compute), and HideableCommSeconds the most of it that this schedule
	// could overlap (costmodel.Device.HideableComm).
	CommSeconds         float64 `json:"comm_seconds"`
	ExposedCommSeconds  float64 `json:"exposed_comm_seconds"`
	HideableCommSeconds float64 `json:"hideable_comm_seconds"`
}

// RankOf is the report of rank r of the SPMD step f whose report is rep.
func RankOf(f *ir.Func, rep *Report, r int) RankReport {
	return RankReport{Rank: r, PlannedBytes: rep.PlannedBytes, ParamsBytes: rep.ParamsBytes, StateBytes: rep.StateBytes,
		CommBytes: CommBytes(f), CommSeconds: rep.device.Simulate(f).CommSeconds, ExposedCommSeconds: rep.device.ExposedComm(f),
		HideableCommSeconds: rep.device.HideableComm(f)}
}

// CommBytes is what a rank of f sends in f's collectives and sends.
func CommBytes(f *ir.Func) int64 {
	var n int64
	for _, op := range f.Body {
		if ir.IsCollective(op.Kind) {
			size, _ := ir.CollectiveGroup(op)
			n += costmodel.CollectiveBytes(op.Kind, op.Operands[0].Type.SizeBytes(), size)
		}
		if op.Kind == "send" {
			n += ir.P2PBytes(op)
		}
	}
	return n
}

// Effect is where a function stands after a pass (or before the first):
// its peak, FLOPs, kernel launches and modelled step time.
type Effect struct {
	Pass    string // "" for the input
	Peak    int64
	FLOPs   int64
	Kernels int
	Seconds float64 // the schedule's time on the device measured for
}

// Measure is f's Effect, without the allocator's work of Build.
// info is f's liveness (nil: computed here).
func Measure(pass string, f *ir.Func, info *liveness.Info, dev costmodel.Device) Effect {
	if info == nil {
		info = liveness.Analyze(f)
	}
	e := Effect{Pass: pass, Peak: info.Peak, Seconds: dev.Simulate(f).Seconds}
	for _, op := range f.Body {
		e.FLOPs += ir.OpCost(op).FLOPs
		if isLaunch(op) {
			e.Kernels++
		}
	}
	return e
}

// Build analyses f. When f carries an arena (buffer assignment ran) the
// report uses it; otherwise it runs the default assignment on the side.
func Build(f *ir.Func, passes []Pass, dev costmodel.Device) *Report {
	return BuildFrom(liveness.Analyze(f), passes, dev)
}

// BuildFrom is Build of the function whose liveness is info.
func BuildFrom(info *liveness.Info, passes []Pass, dev costmodel.Device) *Report {
	f := info.Func
	r := &Report{device: dev,
		Func: f.Name, Ops: len(f.Body),
		ParamsBytes: info.ParamBytes, InputsBytes: info.InputBytes, OutputsBytes: info.OutputBytes, StateBytes: info.StateBytes,
		PeakBytes: info.Peak, Passes: passes, TopAtPeak: []Top{}, Mechanisms: map[string]*Mechanism{}, info: info,
	}
	if r.Passes == nil {
		r.Passes = []Pass{}
	}
	r.Allowed, r.Approximations = []string{}, []Approximation{}
	if a, ok := f.Attrs["arena"]; ok {
		r.ArenaBytes = a.Int
	} else {
		p := &alloc.Problem{Alignment: alloc.DefaultAlignment}
		for _, b := range info.ArenaBuffers() {
			p.Buffers = append(p.Buffers, alloc.Buffer{ID: b.ID, Lower: int64(b.Start), Upper: int64(b.End) + 1, Size: b.Size})
		}
		r.ArenaBytes = alloc.BestDeterministic(p).Size
	}
	r.PlannedBytes = r.ParamsBytes + r.StateBytes + r.InputsBytes + r.ArenaBytes
	r.HostBytes, r.SwappedBytes, r.OffloadedBytes = info.HostPeak, info.SwappedBytes, info.HostArgBytes
	if h, ok := f.Attrs["host_arena"]; ok {
		r.HostBytes = h.Int
	}
	r.BytesByDType = map[string]int64{}
	for _, b := range info.Buffers {
		if !b.Host && (b.Arg || info.PeakAt >= 0 && b.Start <= info.PeakAt && info.PeakAt <= b.End) {
			r.BytesByDType[b.Root().Type.DType.String()] += b.Size
		}
	}
	if r.PeakBytes > 0 {
		r.Fragmentation = float64(r.PlannedBytes)/float64(r.PeakBytes) - 1
	}
	if info.PeakAt >= 0 && info.PeakAt < len(f.Body) {
		op := f.Body[info.PeakAt]
		r.PeakOp = &PeakOp{Index: info.PeakAt, Op: op.Kind}
		if !op.Loc.IsUnknown() {
			r.PeakOp.Loc = op.Loc.String()
		}
		if len(op.Results) > 0 {
			r.PeakOp.Value = op.Results[0].Ref()
		}
	}
	for _, op := range f.Body {
		c := ir.OpCost(op)
		r.FLOPs += c.FLOPs
		if op.Attr().Bool("recomputed") {
			r.RecomputeFLOPs += c.FLOPs
		} else if op.Region != nil {
			for _, inner := range op.Region.Body { // a fused kernel's recomputed ops
				if inner.Attr().Bool("recomputed") {
					r.RecomputeFLOPs += ir.OpCost(inner).FLOPs
				}
			}
		}
		if isLaunch(op) {
			r.Kernels++
			r.TrafficBytes += c.BytesRead + c.BytesWritten
		}
		if op.Region == nil {
			if isLaunch(op) {
				r.UnfusedKernels++
				r.UnfusedTrafficBytes += c.BytesRead + c.BytesWritten
			}
			continue
		}
		yielded := map[*ir.Value]bool{}
		for _, y := range op.Region.Yield {
			yielded[y] = true
		}
		for _, inner := range op.Region.Body {
			if isLaunch(inner) {
				ic := ir.OpCost(inner)
				r.UnfusedKernels++
				r.UnfusedTrafficBytes += ic.BytesRead + ic.BytesWritten
			}
			for _, v := range inner.Results {
				if !yielded[v] {
					r.IntermediateBytesRemoved += v.Type.SizeBytes()
				}
			}
		}
	}
	r.TopAtPeak = info.Holders(10)
	return r
}

// isLaunch reports whether op is a kernel launch: not a constant, and not
// a view (views move no data).
func isLaunch(op *ir.Op) bool {
	if ir.IsConstant(op) {
		return false
	}
	d := op.Def()
	return d == nil || !d.View
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "function\t@%s\n", ir.QuoteName(r.Func))
	fmt.Fprintf(tw, "ops\t%d\n", r.Ops)
	row := func(name string, n int64) { fmt.Fprintf(tw, "%s\t%s\t(%d bytes)\n", name, diag.Bytes(n), n) }
	row("parameters", r.ParamsBytes)
	row("state", r.StateBytes)
	row("inputs", r.InputsBytes)
	row("outputs", r.OutputsBytes)
	at := ""
	if r.info != nil && r.info.PeakAt >= 0 {
		op := r.info.Func.Body[r.info.PeakAt]
		at = fmt.Sprintf(" at op %d (%s)", r.info.PeakAt, op.Kind)
		if len(op.Results) > 0 {
			at = fmt.Sprintf(" at op %d (%s defining %s)", r.info.PeakAt, op.Kind, op.Results[0].Ref())
		}
	}
	fmt.Fprintf(tw, "peak\t%s\t(%d bytes)%s\n", diag.Bytes(r.PeakBytes), r.PeakBytes, at)
	if len(r.BytesByDType) > 1 {
		names := make([]string, 0, len(r.BytesByDType))
		for d := range r.BytesByDType {
			names = append(names, d)
		}
		sort.Strings(names)
		for _, d := range names {
			row("  at peak in "+d, r.BytesByDType[d])
		}
	}
	row("arena", r.ArenaBytes)
	row("planned", r.PlannedBytes)
	if r.SwappedBytes > 0 {
		row("host", r.HostBytes)
		row("swapped", r.SwappedBytes)
	}
	if r.OffloadedBytes > 0 {
		row("offloaded", r.OffloadedBytes)
	}
	fmt.Fprintf(tw, "fragmentation\t%.4f\n", r.Fragmentation)
	fmt.Fprintf(tw, "flops\t%d\n", r.FLOPs)
	fmt.Fprintf(tw, "recompute flops\t%d\n", r.RecomputeFLOPs)
	fmt.Fprintf(tw, "kernels\t%d\t(%d unfused)\n", r.Kernels, r.UnfusedKernels)
	fmt.Fprintf(tw, "traffic\t%s\t(%d bytes; %s unfused)\n", diag.Bytes(r.TrafficBytes), r.TrafficBytes, diag.Bytes(r.UnfusedTrafficBytes))
	if r.IntermediateBytesRemoved > 0 {
		row("fused away", r.IntermediateBytesRemoved)
	}
	if len(r.Passes) > 0 {
		names := make([]string, len(r.Passes))
		for i, p := range r.Passes {
			names[i] = p.Name
			if p.Seconds != nil {
				names[i] += fmt.Sprintf(" (%.3fs)", *p.Seconds)
			}
		}
		fmt.Fprintf(tw, "passes\t%s\n", strings.Join(names, ", "))
		for _, p := range r.Passes {
			for _, n := range p.Notes {
				fmt.Fprintf(tw, "note\t%s: %s\n", p.Name, n)
			}
		}
	}
	if len(r.Allowed) > 0 {
		fmt.Fprintf(tw, "allowed\t%s\n", strings.Join(r.Allowed, ", "))
	}
	for _, a := range r.Approximations {
		fmt.Fprintf(tw, "approximation\t%s: %s: %s\n", a.Pass, a.Name, a.What)
	}
	for _, name := range mechanismOrder {
		if m := r.Mechanisms[name]; m != nil && (m.BytesSaved != 0 || m.FLOPsAdded != 0 || m.SecondsAdded != 0) {
			fmt.Fprintf(tw, "mechanism\t%s: %s\n", name, m.describe(r.FLOPs))
		}
	}
	alike := true
	for _, k := range r.Ranks {
		k.Rank = r.Ranks[0].Rank
		alike = alike && k == r.Ranks[0]
	}
	if len(r.Ranks) > 0 && alike {
		// The ranks of an SPMD step plan alike: one line says it for all.
		k := r.Ranks[0]
		fmt.Fprintf(tw, "ranks\t%d, each planning %s: parameters %s, state %s; sends %s in collectives, %.1f µs of which %.1f µs the step waits for (%.1f µs could overlap at most)\n",
			len(r.Ranks), diag.Bytes(k.PlannedBytes), diag.Bytes(k.ParamsBytes), diag.Bytes(k.StateBytes), diag.Bytes(k.CommBytes), k.CommSeconds*1e6, k.ExposedCommSeconds*1e6, k.HideableCommSeconds*1e6)
	} else {
		// Pipeline stages: a line each.
		for _, k := range r.Ranks {
			fmt.Fprintf(tw, "rank %d\tplanning %s: parameters %s, state %s; sends %s, %.1f µs of which %.1f µs the step waits for (%.1f µs could overlap at most)\n",
				k.Rank, diag.Bytes(k.PlannedBytes), diag.Bytes(k.ParamsBytes), diag.Bytes(k.StateBytes), diag.Bytes(k.CommBytes), k.CommSeconds*1e6, k.ExposedCommSeconds*1e6, k.HideableCommSeconds*1e6)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.TopAtPeak) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nlargest values live at the peak:\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  bytes\tvalue\top\tlocation\n")
	for _, t := range r.TopAtPeak {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", diag.Bytes(t.Bytes), t.Value, t.Op, t.Loc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := io.WriteString(w, terms); err != nil || len(r.Ranks) == 0 {
		return err
	}
	_, err := io.WriteString(w, rankTerms)
	return err
}

// terms explains the report's words, one line each.
const terms = `
terms:
  peak           the most bytes live at once in the schedule: arguments, results and intermediates
  arena          the one buffer that holds every intermediate value, at the offsets assign chose
  planned        what the function needs: parameters + state + inputs + arena
  fragmentation  planned / peak - 1: the space the arena's packing wastes
  traffic        bytes the kernels read and write; "unfused" counts every op as its own kernel
  mechanism      what a way of saving memory did: how far its passes lowered the peak, and the
                 FLOPs and step time (on the modelled device, --device) they added
`

// rankTerms explains the ranks line, for steps spread over ranks.
const rankTerms = `  ranks          a step spread over ranks: what each plans, holds and sends (ring algorithms),
                 and how much of its communication the compute does not hide (cost model)
`

// WriteTimeline writes a Chrome trace (JSON; Perfetto opens it) of the
// schedule in simulated time: each op runs for the time the default cost
// model gives it (microseconds) on a track named "ops", a counter track
// shows the live bytes as each op starts, and each arena buffer is a
// slice from its first op's start to its last op's end, on tracks named
// "buffers N" laid out so that slices on one never overlap.
func (r *Report) WriteTimeline(w io.Writer) error {
	type event struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  *float64       `json:"dur,omitempty"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		Args map[string]any `json:"args,omitempty"`
	}
	info := r.info
	body := info.Func.Body
	start := make([]float64, len(body)+1) // µs at which op i starts; start[n] is the end
	for i, op := range body {
		start[i+1] = start[i] + r.device.OpSeconds(op)*1e6
	}
	evs := []event{
		{Name: "process_name", Ph: "M", Pid: 1, Args: map[string]any{"name": "@" + info.Func.Name + " (simulated time, cost model)"}},
		{Name: "thread_name", Ph: "M", Pid: 1, Tid: 0, Args: map[string]any{"name": "ops"}},
	}
	for i, op := range body {
		dur := start[i+1] - start[i]
		name := op.Kind
		if len(op.Results) > 0 {
			name += " " + op.Results[0].Ref()
		}
		evs = append(evs, event{Name: name, Ph: "X", Ts: start[i], Dur: &dur, Pid: 1, Tid: 0, Args: map[string]any{"op": i}})
	}
	for i, live := range info.Live {
		evs = append(evs, event{Name: "live bytes", Ph: "C", Ts: start[i], Pid: 1, Args: map[string]any{"bytes": live}})
	}
	bufs := info.ArenaBuffers()
	sort.SliceStable(bufs, func(a, b int) bool { return bufs[a].Start < bufs[b].Start })
	var laneEnd []int
	for _, b := range bufs {
		lane := -1
		for l, end := range laneEnd {
			if end < b.Start {
				lane = l
				break
			}
		}
		if lane < 0 {
			laneEnd = append(laneEnd, 0)
			lane = len(laneEnd) - 1
			evs = append(evs, event{Name: "thread_name", Ph: "M", Pid: 1, Tid: lane + 1, Args: map[string]any{"name": fmt.Sprintf("buffers %d", lane+1)}})
		}
		laneEnd[lane] = b.End
		dur := start[b.End+1] - start[b.Start]
		args := map[string]any{"bytes": b.Size, "first_op": b.Start, "last_op": b.End}
		if v := b.Root(); v.Def != nil {
			args["op"] = v.Def.Kind
			if v.Offset != ir.NoOffset {
				args["offset"] = v.Offset
			}
		}
		evs = append(evs, event{Name: b.Root().Ref(), Ph: "X", Ts: start[b.Start], Dur: &dur, Pid: 1, Tid: lane + 1, Args: args})
	}
	enc := json.NewEncoder(w)
	return enc.Encode(map[string]any{"traceEvents": evs, "displayTimeUnit": "ms"})
}
