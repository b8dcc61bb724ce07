package parallel

import (
	"fmt"
	"maps"
	"math"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/microbatch"
)

// Pipeline parallelism cuts a training step into stages, a function
// each, that pass activations forward and gradients back with send and
// recv; each stage runs on dp ranks (one without data parallelism).
//
// Stages. The forward ops, in schedule order, are cut into pp contiguous
// runs. Every other op goes where the forward values it reads are at
// hand: a backward op to the last stage that reads (in the forward) each
// forward value it reads, so a layer's gradients are made where the
// layer ran; a backward op reading no forward value to the earliest
// stage of its operands (gradients flow back), or, when it is a view of
// one gradient, to its readers' stage; an optimizer update to its
// parameter's stage, the stage of the parameter's first reader. The cuts
// minimise the costliest stage: its modelled time (forward, backward and
// updates) plus the link time of what crosses its edges. Data
// arguments, constants and what is made from them alone are at hand
// everywhere: each stage that reads them makes its own copy. Any other
// value one stage makes and another reads is sent once to it.
//
// Microbatches. With m > 1 the step is first split into m slices (the
// microbatch machinery, traced, with dp's partition when dp > 1), and
// each stage runs its slices' forwards and backwards in the 1F1B order:
// stage s of p runs p−1−s forwards ahead, then alternates one forward
// and one backward, so at most p−s slices' activations are live on it at
// a time, and the backward of the first slice starts before the forward
// of the last has finished. When that order could deadlock (a value sent
// against the flow between slices), the stage keeps the slices in turn.

// Stage attributes of the functions Pipeline makes.
const (
	// StageAttr is the function's stage (its rank), StagesAttr their number.
	StageAttr  = "stage"
	StagesAttr = "stages"
	// ResultsAttr lists, for each result of a stage, the index of the
	// whole step's result it is; ArgsAttr, for each argument, the whole
	// step's argument.
	ResultsAttr = "results"
	ArgsAttr    = "args"
)

// Stages returns the pipeline stages of m in rank order (the functions
// with a stage attribute), or nil when m is not a pipeline.
func Stages(m *ir.Module) []*ir.Func {
	var out []*ir.Func
	for _, f := range m.Funcs {
		if _, ok := f.Attrs[StageAttr]; ok {
			out = append(out, f)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Attrs.Int(StageAttr, 0) < out[j].Attrs.Int(StageAttr, 0) })
	return out
}

// PipelineStats is what Pipeline did.
type PipelineStats struct {
	Micro     microbatch.Stats
	Sends     int   // send ops over all stages
	SentBytes int64 // their bytes
	// Step is the modelled step time (PipelineTime); Busy each stage's
	// time computing in it.
	Step       float64
	Busy       []float64
	Interleave bool // the stages run 1F1B; false: slices in turn
}

// Bubble is the fraction of the stages' time spent waiting.
func (st PipelineStats) Bubble() float64 {
	if st.Step <= 0 || len(st.Busy) == 0 {
		return 0
	}
	busy := 0.0
	for _, b := range st.Busy {
		busy += b
	}
	return 1 - busy/(st.Step*float64(len(st.Busy)))
}

// PipelineTime models the stages running together, a rank each: each
// runs its ops in order, a send's tensor arrives after the link's time
// (α + n/B, the sender going on at once) and a recv waits for it. It
// returns the step's time (the last stage to finish) and each stage's
// busy time.
func PipelineTime(stages []*ir.Func, dev costmodel.Device) (step float64, busy []float64) {
	clock, busy, _ := simulateStages(stages, dev.OpSeconds)
	for _, c := range clock {
		step = max(step, c)
	}
	return step, busy
}

// simulateStages runs the stages together, a rank each: each runs its ops in
// order, taking secs(op) (a send's tensor arrives that long after it
// starts, the sender going on at once); a recv waits for its tensor. It
// returns each stage's clock and busy time at the end, and an error
// naming a waiting recv when every unfinished stage waits.
func simulateStages(stages []*ir.Func, secs func(*ir.Op) float64) (clock, busy []float64, err error) {
	at := make([]int, len(stages))
	clock, busy = make([]float64, len(stages)), make([]float64, len(stages))
	arrive := map[[3]int64][]float64{} // (from, to, tag) -> arrival times
	for {
		moved, done := false, true
		for s, f := range stages {
		ops:
			for at[s] < len(f.Body) {
				op := f.Body[at[s]]
				t := secs(op)
				switch op.Kind {
				case "recv":
					k := [3]int64{int64(s) + op.Attrs["offset"].Int/int64(RanksOf(f)), int64(s), op.Attrs["tag"].Int}
					if len(arrive[k]) == 0 {
						break ops // its tensor has not been sent yet
					}
					clock[s] = max(clock[s], arrive[k][0])
					arrive[k] = arrive[k][1:]
				case "send":
					k := [3]int64{int64(s), int64(s) + op.Attrs["offset"].Int/int64(RanksOf(f)), op.Attrs["tag"].Int}
					arrive[k] = append(arrive[k], clock[s]+t)
				default:
					clock[s] += t
					busy[s] += t
				}
				at[s]++
				moved = true
			}
			done = done && at[s] == len(f.Body)
		}
		switch {
		case done:
			return clock, busy, nil
		case !moved:
			for s, f := range stages {
				if at[s] < len(f.Body) {
					op := f.Body[at[s]]
					return clock, busy, fmt.Errorf("the stages' order deadlocks: stage %d waits in its op %d for %s (tag %d), which no stage can send", s, at[s], op.Results[0].Ref(), op.Attrs["tag"].Int)
				}
			}
		}
	}
}

// Pipeline cuts the training step f into pp stages running m microbatches
// each. f is left as it was.
func Pipeline(f *ir.Func, pp, m int) ([]*ir.Func, PipelineStats, error) {
	return PipelinePlan(f, Plan{DP: 1, PP: pp, Microbatches: m})
}

// PipelinePlan is Pipeline with data parallelism inside each stage: with
// p.DP > 1 the step is first partitioned as Partition does for dp (ZeRO,
// buckets and batch-norm statistics as p says), and each stage is the
// SPMD program of dp ranks: ranks s·dp to s·dp+dp−1 run stage s, and a
// send goes to the same data-parallel rank of the other stage.
func PipelinePlan(f *ir.Func, p Plan) ([]*ir.Func, PipelineStats, error) {
	var st PipelineStats
	pp, m, dp := p.PP, max(1, p.Microbatches), max(1, p.DP)
	if pp < 2 {
		return nil, st, fmt.Errorf("a pipeline needs at least 2 stages, got pp=%d", pp)
	}
	if _, ok := f.Attrs[StageAttr]; ok {
		return nil, st, fmt.Errorf("@%s is already a pipeline stage", f.Name)
	}
	for _, op := range f.Body {
		if ir.IsPointToPoint(op.Kind) || ir.IsCollective(op.Kind) {
			return nil, st, fmt.Errorf("@%s already exchanges tensors between ranks (%s): parallel partitions a one-device step", f.Name, op.Kind)
		}
	}
	g := f.Clone()
	passes.RemoveDeadOps(g) // a dead forward op belongs to no stage
	pl := &pipeliner{g: g, pp: pp, dp: dp * max(1, p.TP), stage: map[*ir.Op]int{}, dev: p.device()}
	if err := pl.cut(); err != nil {
		return nil, st, err
	}
	whole := map[*ir.Op]int{}
	for op, s := range pl.stage {
		whole[op] = s
	}
	pl.whole = map[*ir.Op]bool{}
	for _, op := range g.Body {
		pl.whole[op] = true
	}
	trace, tpTrace := map[*ir.Op]microbatch.Origin{}, map[*ir.Op]*ir.Op{}
	sub := p
	sub.PP, sub.DP, sub.Microbatches = 0, dp, m
	var err error
	if st.Micro, err = partition(g, sub, trace, tpTrace); err != nil {
		return nil, st, err
	}
	// An op's origin in the whole step: through the microbatch split's
	// copy, then through the tensor-parallel rewrite.
	beforeTP := func(op *ir.Op) *ir.Op {
		if o, ok := tpTrace[op]; ok {
			return o
		}
		return op
	}
	pl.origin = func(op *ir.Op) (*ir.Op, int64, bool) {
		if o, ok := trace[op]; ok {
			if o.Op == nil {
				return nil, o.Slice, true
			}
			return beforeTP(o.Op), o.Slice, true
		}
		return beforeTP(op), 0, false
	}
	pl.place(whole)
	// build rewrites the ops' operands: a second try starts from them.
	operands := map[*ir.Op][]*ir.Value{}
	for _, op := range g.Body {
		operands[op] = append([]*ir.Value(nil), op.Operands...)
	}
	stages, err := pl.build(m, true)
	if err == nil {
		st.Interleave = true
	} else {
		for op, xs := range operands {
			op.Operands = xs
		}
		if stages, err = pl.build(m, false); err != nil {
			return nil, st, err
		}
	}
	st.Step, st.Busy = PipelineTime(stages, pl.dev)
	for _, s := range stages {
		for _, op := range s.Body {
			if op.Kind == "send" {
				st.Sends++
				st.SentBytes += ir.P2PBytes(op)
			}
		}
	}
	return stages, st, nil
}

type pipeliner struct {
	g      *ir.Func
	dev    costmodel.Device
	pp     int
	stage  map[*ir.Op]int // of every op that is not free
	free   map[*ir.Value]bool
	home   map[int]int     // stage of each parameter and state argument, by index (partition may replace the values)
	dp     int             // ranks per stage (dp × tp): stage s runs on ranks s·dp to s·dp+dp−1
	fwd    map[*ir.Op]bool // the forward: what the loss and outputs need, not the gradients
	bwd    map[*ir.Op]bool // the backward: what the loss seed reaches
	whole  map[*ir.Op]bool // the ops of the step before the partition
	origin func(op *ir.Op) (whole *ir.Op, slice int64, perSlice bool)
}

// cut places the ops of the whole step g.
func (pl *pipeliner) cut() error {
	g := pl.g
	pl.free = freeValues(g)
	pl.fwd, pl.bwd = forwardOps(g), backwardOps(g)
	var fwd []*ir.Op
	index := map[*ir.Op]int{}
	for _, op := range g.Body {
		if !pl.fwd[op] || allFree(op, pl.free) {
			continue
		}
		index[op] = len(fwd)
		fwd = append(fwd, op)
	}
	if len(fwd) < pl.pp {
		return fmt.Errorf("the forward has %d ops, fewer than pp=%d stages", len(fwd), pl.pp)
	}
	// lo and hi: the forward ops that make a forward value (for an
	// argument, its first reader) and the last that reads it.
	lo, hi := map[*ir.Value]int{}, map[*ir.Value]int{}
	for i, op := range fwd {
		for _, x := range op.Operands {
			if pl.free[x] {
				continue
			}
			if _, ok := lo[x]; !ok {
				lo[x] = i
			}
			hi[x] = max(hi[x], i)
		}
		for _, r := range op.Results {
			lo[r], hi[r] = i, i
		}
	}
	// Each op is attributed to a forward op; its stage is that op's.
	attr := map[*ir.Op]int{}
	noForward := map[*ir.Op]bool{}
	weight := make([]float64, len(fwd))
	for _, op := range g.Body {
		if allFree(op, pl.free) && !isUpdate(op) {
			continue
		}
		a := -1
		switch {
		case pl.fwd[op]:
			a = index[op]
		case isUpdate(op):
			// With its parameter (on the first stage when no forward op
			// reads it: its gradient is zero).
			a = max(0, lo[op.Operands[op.Def().Writes[0]]])
		default:
			// Anything else reading nothing a stage holds (parameters
			// no forward op reads) goes on the first stage.
			a = max(0, attribute(op, pl.free, lo, hi, attr))
			if !readsForward(op, hi) {
				noForward[op] = true
			}
		}
		attr[op] = a
		weight[a] += pl.dev.OpSeconds(op)
	}
	// A cut at i sends the forward values made before i and read from i
	// on, and their gradients back: the link's time counts against the
	// stages on both sides.
	cross := make([]float64, len(fwd)+1)
	for x, l := range lo {
		if h := hi[x]; h > l && x.Type.SizeBytes() > 0 {
			secs := 2 * pl.dev.CollectiveSeconds("send", x.Type.SizeBytes(), 2)
			cross[l+1] += secs
			cross[h+1] -= secs
		}
	}
	for i := 1; i <= len(fwd); i++ {
		cross[i] += cross[i-1]
	}
	bounds := balance(weight, cross, pl.pp)
	stageOf := func(i int) int { return sort.SearchInts(bounds, i+1) }
	pl.home = map[int]int{}
	for _, a := range g.Args {
		if l, ok := lo[a]; ok && !pl.free[a] {
			pl.home[a.Index] = stageOf(l)
		}
	}
	for op, a := range attr {
		pl.stage[op] = stageOf(a)
	}
	pl.follow(noForward)
	for _, op := range g.Body {
		if isUpdate(op) {
			// Moments and other state live with their parameter.
			for _, k := range op.Def().Writes {
				pl.home[op.Operands[k].Index] = pl.stage[op]
			}
		}
	}
	return nil
}

// follow moves each op of a gradient's own (one operand, no forward
// value: a reshape or transpose of a gradient) to the stage that reads
// it, when one stage alone does: the gradient crosses once, not each of
// its views. Ops are visited last first, so chains of views move
// together.
func (pl *pipeliner) follow(candidates map[*ir.Op]bool) {
	users := map[*ir.Value][]*ir.Op{}
	for _, op := range pl.g.Body {
		for _, x := range op.Operands {
			users[x] = append(users[x], op)
		}
	}
	results := map[*ir.Value]bool{}
	for _, r := range pl.g.Results {
		results[r.Value] = true
	}
	for i := len(pl.g.Body) - 1; i >= 0; i-- {
		op := pl.g.Body[i]
		if !candidates[op] || len(op.Results) != 1 || results[op.Results[0]] {
			continue
		}
		inputs := 0
		for _, x := range op.Operands {
			if !pl.free[x] {
				inputs++
			}
		}
		to := -1
		for _, u := range users[op.Results[0]] {
			s, ok := pl.stage[u]
			if !ok || to >= 0 && s != to {
				to = -1
				break
			}
			to = s
		}
		if inputs == 1 && to >= 0 {
			pl.stage[op] = to
		}
	}
}

// readsForward reports whether op reads a forward value.
func readsForward(op *ir.Op, hi map[*ir.Value]int) bool {
	for _, x := range op.Operands {
		if _, ok := hi[x]; ok {
			return true
		}
	}
	return false
}

// attribute is the forward op a backward op goes with: the last forward
// reader common to the forward values it reads (but not before any of
// them is made); without forward operands, the earliest of its
// operands'.
func attribute(op *ir.Op, free map[*ir.Value]bool, lo, hi map[*ir.Value]int, attr map[*ir.Op]int) int {
	minHi, maxLo, minBwd := math.MaxInt, -1, math.MaxInt
	for _, x := range op.Operands {
		if free[x] {
			continue
		}
		if h, ok := hi[x]; ok {
			minHi, maxLo = min(minHi, h), max(maxLo, lo[x])
			continue
		}
		if x.Def != nil {
			if a, ok := attr[x.Def]; ok {
				minBwd = min(minBwd, a)
			}
		}
	}
	switch {
	case maxLo >= 0:
		return max(minHi, maxLo)
	case minBwd < math.MaxInt:
		return minBwd
	}
	return -1
}

// balance cuts w into n contiguous nonempty runs, a run [a, b) costing
// w's sum over it plus cross[a] and cross[b] (the cuts' traffic; cross[0]
// and cross[len(w)] count nothing), so that the costliest run costs
// least: the runs' exclusive ends. A dynamic program over the cuts,
// pruned where a run alone costs more than the best found.
func balance(w, cross []float64, n int) []int {
	m := len(w)
	pre := make([]float64, m+1)
	for i, x := range w {
		pre[i+1] = pre[i] + x
	}
	edge := func(i int) float64 {
		if i == 0 || i == m {
			return 0
		}
		return cross[i]
	}
	cost := func(a, b int) float64 { return pre[b] - pre[a] + edge(a) + edge(b) }
	inf := math.Inf(1)
	best := make([][]float64, n+1) // best[k][i]: the first i ops in k runs
	from := make([][]int, n+1)
	for k := range best {
		best[k] = make([]float64, m+1)
		from[k] = make([]int, m+1)
		for i := range best[k] {
			best[k][i] = inf
		}
	}
	best[0][0] = 0
	for k := 1; k <= n; k++ {
		for i := k; i <= m-(n-k); i++ {
			for j := i - 1; j >= k-1; j-- {
				if pre[i]-pre[j] >= best[k][i] {
					break // longer runs only cost more
				}
				if c := max(best[k-1][j], cost(j, i)); c < best[k][i] {
					best[k][i], from[k][i] = c, j
				}
			}
		}
	}
	ends := make([]int, n)
	for k, i := n, m; k > 0; k-- {
		ends[k-1] = i
		i = from[k][i]
	}
	return ends
}

// freeValues are the values every stage can make for itself: data
// arguments, state that the step only reads (a learning rate: each stage
// holds its copy rather than receive it), counters (state whose one
// writer stores a value made from free values and the counter itself,
// such as the optimizer's step count: each stage holding a copy advances
// it alike, see counters), and results of pure ops that read only free
// values (or nothing: constants).
func freeValues(g *ir.Func) map[*ir.Value]bool {
	free := map[*ir.Value]bool{}
	for _, a := range g.Args {
		if a.Arg.Kind == ir.ArgData || a.Arg.Kind == ir.ArgState && !a.Arg.InOut {
			free[a] = true
		}
	}
	propagate := func(free map[*ir.Value]bool) {
		for _, op := range g.Body {
			if d := op.Def(); d == nil || len(d.Writes) > 0 || d.Impure && d.Random == nil {
				continue
			}
			reads := true
			for _, x := range op.Operands {
				reads = reads && free[x]
			}
			if reads {
				for _, r := range op.Results {
					free[r] = true
				}
			}
		}
	}
	for a, w := range counters(g) {
		try := maps.Clone(free)
		try[a] = true
		propagate(try)
		if try[w.Operands[1]] {
			free[a] = true
		}
	}
	propagate(free)
	return free
}

// counters are the inout state arguments written by exactly one op, an
// overwrite, with that op.
func counters(g *ir.Func) map[*ir.Value]*ir.Op {
	writers := map[*ir.Value][]*ir.Op{}
	for _, op := range g.Body {
		if d := op.Def(); d != nil {
			for _, k := range d.Writes {
				writers[op.Operands[k]] = append(writers[op.Operands[k]], op)
			}
		}
	}
	out := map[*ir.Value]*ir.Op{}
	for a, ws := range writers {
		if a.Arg != nil && a.Arg.Kind == ir.ArgState && len(ws) == 1 && ws[0].Kind == "overwrite" {
			out[a] = ws[0]
		}
	}
	return out
}

func allFree(op *ir.Op, free map[*ir.Value]bool) bool {
	if len(op.Results) == 0 {
		return false
	}
	for _, r := range op.Results {
		if !free[r] {
			return false
		}
	}
	return true
}

// forwardOps are the ops that the step's results other than gradients
// need, the backward's ops aside: the forward proper.
func forwardOps(g *ir.Func) map[*ir.Op]bool {
	bwd := backwardOps(g)
	need := map[*ir.Value]bool{}
	for _, r := range g.Results {
		if r.Role() != ir.RoleGrad {
			need[r.Value] = true
		}
	}
	fwd := map[*ir.Op]bool{}
	for i := len(g.Body) - 1; i >= 0; i-- {
		op := g.Body[i]
		if bwd[op] || isUpdate(op) {
			continue
		}
		for _, r := range op.Results {
			if need[r] {
				fwd[op] = true
			}
		}
		if fwd[op] {
			for _, x := range op.Operands {
				need[x] = true
			}
		}
	}
	return fwd
}

func isUpdate(op *ir.Op) bool {
	d := op.Def()
	return d != nil && len(d.Writes) > 0
}

// homeOf is the stage of argument v (ok false for values that are not
// arguments, or arguments no stage holds); homeAt is it, or 0.
func (pl *pipeliner) homeOf(v *ir.Value) (int, bool) {
	if v.Arg == nil {
		return 0, false
	}
	h, ok := pl.home[v.Index]
	return h, ok
}

func (pl *pipeliner) homeAt(v *ir.Value) int {
	h, _ := pl.homeOf(v)
	return h
}

// place gives every op of the (perhaps split) step its stage: a copy of
// a whole-step op takes its original's; ops the split made without one
// (the results' joins) take their operands' latest.
func (pl *pipeliner) place(whole map[*ir.Op]int) {
	pl.free = freeValues(pl.g)
	pl.stage = map[*ir.Op]int{}
	var unheld []*ir.Op
	for _, op := range pl.g.Body {
		if allFree(op, pl.free) && !isUpdate(op) {
			continue
		}
		orig, _, _ := pl.origin(op)
		if s, ok := whole[orig]; ok {
			pl.stage[op] = s
			continue
		}
		s, held := 0, false
		for _, x := range op.Operands {
			if x.Def != nil {
				if t, ok := pl.stage[x.Def]; ok {
					s, held = max(s, t), true
				}
			} else if h, ok := pl.homeOf(x); ok {
				s, held = max(s, h), true
			}
		}
		pl.stage[op] = s
		if !held {
			unheld = append(unheld, op)
		}
	}
	// An op that reads only what every stage makes (a collective over the
	// gradient of the last bias, made from the loss seed alone) goes with
	// its first reader rather than to stage 0.
	users := map[*ir.Value][]*ir.Op{}
	for _, op := range pl.g.Body {
		for _, x := range op.Operands {
			users[x] = append(users[x], op)
		}
	}
	for i := len(unheld) - 1; i >= 0; i-- {
		op := unheld[i]
		for _, r := range op.Results {
			if us := users[r]; len(us) > 0 {
				if t, ok := pl.stage[us[0]]; ok {
					pl.stage[op] = t
				}
				break
			}
		}
	}
}

// class is where an op runs in a stage's order: in slice k's forward or
// backward, or (edge −1) wherever what it reads is ready.
type class struct {
	edge     int
	slice    int64
	backward bool
}

// build makes the stage functions; interleave asks for the 1F1B order.
func (pl *pipeliner) build(m int, interleave bool) ([]*ir.Func, error) {
	g := pl.g
	// Each op's class: the slice it copies, forward or backward (a
	// whole-step op without slices is slice 0's); ops the partition made
	// for no slice (collectives over the sums, ZeRO's gathers) have none.
	cls := map[*ir.Op]class{}
	sliced := false // an op of a slice has been seen
	for _, op := range g.Body {
		orig, k, per := pl.origin(op)
		sliced = sliced || per
		switch {
		case per && orig == nil: // a batch argument's slice
			cls[op] = class{slice: k}
		case per:
			cls[op] = class{slice: k, backward: !pl.fwd[orig]}
		case pl.whole[orig] && (m == 1 || !sliced):
			// Without slices the whole step; before them, work on
			// parameters alone: the forward's, or the backward's (what
			// autodiff derives from forward values alone, too).
			cls[op] = class{backward: !pl.fwd[orig]}
		case pl.whole[orig]:
			// After the slices (updates, work on the gradients' sums):
			// in the last slice's backward turn.
			cls[op] = class{slice: int64(m - 1), backward: true}
		default:
			cls[op] = class{edge: -1}
		}
	}
	// The slices' order on stage s.
	rank := func(s int, c class) int64 {
		if c.edge < 0 {
			return -1
		}
		// 1F1B: forwards 0 to warm−1, then forward warm+i and
		// backward i for each i (without interleaving, warm = 0: each
		// slice's forward and backward in turn).
		warm := int64(0)
		if interleave {
			warm = min(int64(pl.pp-1-s), int64(m))
		}
		switch {
		case c.backward:
			return warm + 2*c.slice + 1
		case c.slice < warm:
			return c.slice
		}
		return warm + 2*(c.slice-warm)
	}
	// An op runs in the turn of its class, and no earlier than the ops
	// of its stage it reads (an op without a class: as soon as they
	// have run). Keys only grow along the step's order, so sorting by
	// them keeps every value made before it is read.
	per := make([][]*ir.Op, pl.pp)
	key := map[*ir.Op]int64{}
	readers := map[*ir.Value][]*ir.Op{}
	for _, op := range g.Body {
		for _, x := range op.Operands {
			readers[x] = append(readers[x], op)
		}
	}
	// settle gives op the least key its class, its operands and (for an
	// update) the reads of what it overwrites allow.
	settle := func(op *ir.Op, s int, k int64) {
		for _, x := range op.Operands {
			if x.Def != nil && pl.stage[x.Def] == s {
				if kx, ok := key[x.Def]; ok {
					k = max(k, kx)
				}
			}
		}
		if isUpdate(op) {
			// It overwrites its parameter: after every read of it.
			for _, w := range op.Def().Writes {
				for _, u := range readers[op.Operands[w]] {
					if ku, ok := key[u]; ok && u != op && pl.stage[u] == s {
						k = max(k, ku)
					}
				}
			}
		}
		key[op] = k
	}
	for _, op := range g.Body {
		if s, ok := pl.stage[op]; ok {
			settle(op, s, rank(s, cls[op]))
			per[s] = append(per[s], op)
		}
	}
	// An op without a class (ZeRO-3's gather of a parameter) runs in its
	// first reader's turn rather than at the start, where what it makes
	// would stay live for the whole step; then the keys settle again.
	for i := len(g.Body) - 1; i >= 0; i-- {
		op := g.Body[i]
		s, ok := pl.stage[op]
		if !ok || cls[op].edge >= 0 {
			continue
		}
		first := int64(math.MaxInt64)
		for _, r := range op.Results {
			for _, u := range readers[r] {
				if ku, ok := key[u]; ok && pl.stage[u] == s {
					first = min(first, ku)
				}
			}
		}
		if first < math.MaxInt64 {
			key[op] = max(key[op], first)
		}
	}
	for _, op := range g.Body {
		if s, ok := pl.stage[op]; ok {
			settle(op, s, key[op])
		}
	}
	for s := range per {
		sort.SliceStable(per[s], func(i, j int) bool { return key[per[s][i]] < key[per[s][j]] })
	}
	// Sends and recvs, and each stage's copies of free values.
	type need struct {
		v  *ir.Value
		to int
	}
	tags := map[need]int64{}
	pairTags := map[[2]int]int64{}
	var order []need
	stages := make([]*ir.Func, pl.pp)
	bodies := make([][]*ir.Op, pl.pp)
	args := make([]map[*ir.Value]*ir.Value, pl.pp)
	for s := range stages {
		stages[s] = &ir.Func{Name: fmt.Sprintf("%s.stage%d", g.Name, s), Attrs: g.Attrs.Clone()}
		if stages[s].Attrs == nil {
			stages[s].Attrs = ir.Attrs{}
		}
		stages[s].Attrs[StageAttr] = ir.IntAttr(int64(s))
		stages[s].Attrs[StagesAttr] = ir.IntAttr(int64(pl.pp))
		args[s] = map[*ir.Value]*ir.Value{}
	}
	local := make([]map[*ir.Value]*ir.Value, pl.pp) // value -> the stage's
	var failed error
	var localOf func(s int, x *ir.Value) *ir.Value
	arg := func(s int, a *ir.Value) *ir.Value {
		if v, ok := args[s][a]; ok {
			return v
		}
		info := *a.Arg
		info.Attrs = a.Arg.Attrs.Clone()
		v := &ir.Value{Name: a.Name, Type: a.Type, Index: len(stages[s].Args), Offset: ir.NoOffset, Arg: &info}
		stages[s].Args = append(stages[s].Args, v)
		args[s][a] = v
		return v
	}
	localOf = func(s int, x *ir.Value) *ir.Value {
		if v, ok := local[s][x]; ok {
			return v
		}
		var v *ir.Value
		switch {
		case pl.free[x] && x.Def == nil:
			v = arg(s, x)
		case pl.free[x]:
			// The stage makes its own copy.
			in := make([]*ir.Value, len(x.Def.Operands))
			for i, y := range x.Def.Operands {
				in[i] = localOf(s, y)
			}
			c, err := g.NewOp(x.Def.Kind, in, x.Def.Attrs.Clone(), x.Def.Loc, x.Name)
			if err != nil {
				failed = err
				return x
			}
			bodies[s] = append(bodies[s], c)
			for i, r := range x.Def.Results {
				local[s][r] = c.Results[i]
			}
			return c.Results[x.Index]
		case x.Def == nil && pl.homeAt(x) == s:
			v = arg(s, x)
		default:
			// Made on another stage: received.
			n := need{x, s}
			from := pl.homeAt(x)
			if x.Def != nil {
				from = pl.stage[x.Def]
			}
			// Tags count the values each stage sends each other.
			tag := pairTags[[2]int{from, s}]
			if tag > ir.MaxTag {
				failed = fmt.Errorf("more than %d values cross from stage %d to stage %d, more than sends' tags can name", ir.MaxTag+1, from, s)
				return x
			}
			pairTags[[2]int{from, s}]++
			tags[n] = tag
			order = append(order, n)
			r, err := g.NewOp("recv", nil, ir.Attrs{"offset": ir.IntAttr(int64((from - s) * pl.dp)), "tag": ir.IntAttr(tag),
				"shape": ir.IntsAttr(x.Type.Shape...), "dtype": ir.TypeAttr(x.Type.DType)}, ir.Location{}, x.Name+".recv")
			if err != nil {
				failed = err
				return x
			}
			bodies[s] = append(bodies[s], r)
			v = r.Results[0]
		}
		local[s][x] = v
		return v
	}
	for s := range per {
		local[s] = map[*ir.Value]*ir.Value{}
	}
	var counterWrites []*ir.Op // of counters every stage holds a copy of
	for s, ops := range per {
		for _, op := range ops {
			if d := op.Def(); d != nil && len(d.Writes) > 0 && pl.free[op.Operands[d.Writes[0]]] {
				counterWrites = append(counterWrites, op)
				continue
			}
			for i, x := range op.Operands {
				op.Operands[i] = localOf(s, x)
			}
			bodies[s] = append(bodies[s], op)
			for _, r := range op.Results {
				local[s][r] = r
			}
		}
	}
	// A counter advances at the end of every stage that holds a copy
	// (stage 0 holds one that no stage reads).
	for _, w := range counterWrites {
		held := false
		for s := range bodies {
			_, ok := args[s][w.Operands[0]]
			held = held || ok
		}
		if !held {
			arg(0, w.Operands[0])
		}
		for s := range bodies {
			if _, ok := args[s][w.Operands[0]]; !ok {
				continue
			}
			in := make([]*ir.Value, len(w.Operands))
			for i, x := range w.Operands {
				in[i] = localOf(s, x)
			}
			c, err := g.NewOp(w.Kind, in, w.Attrs.Clone(), w.Loc, "")
			if err != nil {
				return nil, err
			}
			bodies[s] = append(bodies[s], c)
			pl.stage[c] = s
		}
	}
	// Results: each stage returns those it makes, and the gradients of
	// the parameters it holds.
	resultIndex := make([][]int64, pl.pp)
	homeByName := map[string]int{}
	for _, a := range g.Args {
		homeByName[a.Name] = pl.homeAt(a)
	}
	for i, r := range g.Results {
		s := pl.homeAt(r.Value)
		if r.Value.Def != nil {
			if st, ok := pl.stage[r.Value.Def]; ok {
				s = st
			}
		}
		if h, ok := homeByName[r.Attrs.String("param", "")]; ok && r.Role() == ir.RoleGrad {
			s = h
		}
		v := localOf(s, r.Value)
		stages[s].Results = append(stages[s].Results, ir.Result{Name: r.Name, Value: v, Attrs: r.Attrs.Clone()})
		resultIndex[s] = append(resultIndex[s], int64(i))
	}
	for s, idx := range resultIndex {
		stages[s].Attrs[ResultsAttr] = ir.IntsAttr(idx...)
	}
	// Arguments no stage reads stay the step's: stage 0 takes them.
	for _, a := range g.Args {
		taken := false
		for s := range args {
			_, ok := args[s][a]
			taken = taken || ok
		}
		if !taken {
			arg(0, a)
		}
	}
	for s, f := range stages {
		var idx []int64
		for _, a := range f.Args {
			for w, v := range args[s] {
				if v == a {
					idx = append(idx, int64(w.Index))
				}
			}
		}
		stages[s].Attrs[ArgsAttr] = ir.IntsAttr(idx...)
	}
	if failed != nil {
		return nil, failed
	}
	// Each send right after its value is made (arguments: first).
	sends := map[*ir.Value][]need{}
	for _, n := range order {
		sends[n.v] = append(sends[n.v], n)
	}
	send := func(s int, n need) (*ir.Op, error) {
		return g.NewOp("send", []*ir.Value{localOf(s, n.v)}, ir.Attrs{"offset": ir.IntAttr(int64((n.to - s) * pl.dp)), "tag": ir.IntAttr(tags[n])}, ir.Location{}, n.v.Name+".send")
	}
	for s := range bodies {
		var body []*ir.Op
		for _, a := range g.Args {
			if pl.homeAt(a) == s && !pl.free[a] {
				for _, n := range sends[a] {
					op, err := send(s, n)
					if err != nil {
						return nil, err
					}
					body = append(body, op)
				}
			}
		}
		for _, op := range bodies[s] {
			body = append(body, op)
			if pl.stage[op] != s {
				continue // a recv or a copy
			}
			for _, r := range op.Results {
				for _, n := range sends[r] {
					sop, err := send(s, n)
					if err != nil {
						return nil, err
					}
					body = append(body, sop)
				}
			}
		}
		stages[s].Body = body
	}
	if failed != nil {
		return nil, failed
	}
	for _, s := range stages {
		passes.RemoveDeadOps(s)
	}
	if err := deadlockFree(stages); err != nil {
		return nil, err
	}
	return stages, nil
}

// deadlockFree runs the stages' sends and recvs in their order, sends
// never waiting: an error when every stage waits.
func deadlockFree(stages []*ir.Func) error {
	_, _, err := simulateStages(stages, func(*ir.Op) float64 { return 0 })
	return err
}

// StageValues gives each stage its arguments, taken by name from the
// whole step's (wholeArgs, with their values args).
func StageValues(stages []*ir.Func, wholeArgs []*ir.Value, args []*interp.Tensor) ([][]*interp.Tensor, error) {
	byName := map[string]*interp.Tensor{}
	for i, a := range wholeArgs {
		byName[a.Name] = args[i]
	}
	out := make([][]*interp.Tensor, len(stages))
	for s, f := range stages {
		for _, a := range f.Args {
			v, ok := byName[a.Name]
			if !ok {
				return nil, fmt.Errorf("stage %d reads %s, which the step does not take", s, a.Ref())
			}
			out[s] = append(out[s], v)
		}
	}
	return out, nil
}

// JoinStages is the whole step's results, and its arguments after the
// run (each from the stage that updates it, else as given), from the
// stages' results and final arguments.
func JoinStages(stages []*ir.Func, wholeArgs []*ir.Value, args []*interp.Tensor, results, finals [][]*interp.Tensor) ([]*interp.Tensor, []*interp.Tensor) {
	n := 0
	for _, f := range stages {
		for _, i := range f.Attrs.Ints(ResultsAttr, nil) {
			n = max(n, int(i)+1)
		}
	}
	res := make([]*interp.Tensor, n)
	final := map[string]*interp.Tensor{}
	for s, f := range stages {
		for j, i := range f.Attrs.Ints(ResultsAttr, nil) {
			res[i] = results[s][j]
		}
		for j, a := range f.Args {
			if a.Arg.InOut {
				final[a.Name] = finals[s][j]
			}
		}
	}
	out := make([]*interp.Tensor, len(wholeArgs))
	for i, a := range wholeArgs {
		out[i] = args[i]
		if v, ok := final[a.Name]; ok {
			out[i] = v
		}
	}
	return res, out
}

// WholeStep is a view of the step the stages were cut from: its
// arguments (each as a stage takes it) and results (each as a stage
// returns it), in the step's order. It is for naming and drawing the
// step's values; it has no body.
func WholeStep(stages []*ir.Func) (*ir.Func, error) {
	if len(stages) == 0 {
		return nil, fmt.Errorf("no stages")
	}
	w := &ir.Func{Name: strings.TrimSuffix(stages[0].Name, ".stage0")}
	args := map[int64]*ir.Value{}
	owner := map[int64]*ir.Func{}
	results := map[int64]ir.Result{}
	for _, f := range stages {
		ai, ri := f.Attrs.Ints(ArgsAttr, nil), f.Attrs.Ints(ResultsAttr, nil)
		if len(ai) != len(f.Args) || len(ri) != len(f.Results) {
			return nil, fmt.Errorf("@%s: its %s and %s attributes do not match its arguments and results", f.Name, ArgsAttr, ResultsAttr)
		}
		for j, i := range ai {
			args[i] = f.Args[j]
			owner[i] = f
		}
		for j, i := range ri {
			results[i] = f.Results[j]
		}
	}
	for i := int64(0); i < int64(len(args)); i++ {
		a, ok := args[i]
		if !ok {
			return nil, fmt.Errorf("no stage takes argument %d of the step", i)
		}
		c := *a
		c.Index = int(i)
		c.Type = WholeType(a, RanksOf(owner[i]))
		w.Args = append(w.Args, &c)
	}
	for i := int64(0); i < int64(len(results)); i++ {
		r, ok := results[i]
		if !ok {
			return nil, fmt.Errorf("no stage returns result %d of the step", i)
		}
		w.Results = append(w.Results, r)
	}
	return w, nil
}

// RankPrograms lists the stage each rank runs: stage s on ranks s·dp to
// s·dp+dp−1, dp its ranks attribute.
func RankPrograms(stages []*ir.Func) []*ir.Func {
	var out []*ir.Func
	for _, f := range stages {
		for range RanksOf(f) {
			out = append(out, f)
		}
	}
	return out
}

// RankValues gives each rank its arguments, cut from the whole step's
// (wholeArgs, args) as its stage takes them.
func RankValues(stages []*ir.Func, wholeArgs []*ir.Value, args []*interp.Tensor) ([][]*interp.Tensor, error) {
	per, err := StageValues(stages, wholeArgs, args)
	if err != nil {
		return nil, err
	}
	var out [][]*interp.Tensor
	for s, f := range stages {
		parts, err := ShardValues(f, per[s])
		if err != nil {
			return nil, fmt.Errorf("stage %d: %v", s, err)
		}
		out = append(out, parts...)
	}
	return out, nil
}

// JoinRanks is JoinStages over the ranks' results and final arguments:
// each stage's results as its first rank has them (its ranks agree), and
// its arguments joined from its ranks' parts.
func JoinRanks(stages []*ir.Func, wholeArgs []*ir.Value, args []*interp.Tensor, results, finals [][]*interp.Tensor) ([]*interp.Tensor, []*interp.Tensor) {
	var res, fin [][]*interp.Tensor
	r := 0
	for _, f := range stages {
		n := RanksOf(f)
		res = append(res, results[r])
		fin = append(fin, JoinValues(f, finals[r:r+n]))
		r += n
	}
	return JoinStages(stages, wholeArgs, args, res, fin)
}
