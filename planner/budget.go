package planner

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/memreport"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/fuse"
	mb "github.com/kiln-compiler/kiln/passes/microbatch"
	"github.com/kiln-compiler/kiln/passes/remat"
	"github.com/kiln-compiler/kiln/passes/swap"
)

// FloorError is a budget below what every mechanism together can reach:
// recomputation, the finest split of the batch, and every parameter,
// optimizer state and input offloaded to the host. At some op its
// operands, or its results, must be on the device together.
type FloorError struct {
	Budget, Floor int64
	Op            *ir.Op // where the floor is reached
	Split         int    // the finest split it assumes (1: none can be made)
	Given         bool   // Split is the split of one try, not the finest
}

func (e *FloorError) Error() string {
	where := e.Op.Kind
	if !e.Op.Loc.IsUnknown() {
		where += " at " + e.Op.Loc.String()
	} else if e.Op.Pos.IsValid() {
		where += " at " + e.Op.Pos.String()
	}
	split := "the batch split as finely as it can be (into %d)"
	switch {
	case e.Given:
		split = "the batch split into %d"
	case e.Split <= 1:
		split = "no split of the batch (none can be made)%.0d"
	}
	return fmt.Sprintf("the budget of %s (%d bytes) is below %s (%d bytes), the least any plan reaches: %s needs its operands (or its results) on the device together, with "+split+", recomputation and every parameter, state and input in host memory",
		diag.Bytes(e.Budget), e.Budget, diag.Bytes(e.Floor), e.Floor, where, e.Split)
}

// resolveBudgets turns the fractions of the budgets into bytes of the
// step after autodiff alone (the remat step's peak, swap's device
// memory), and refuses a peak budget below the floor of every mechanism.
func (p *planner) resolveBudgets(m *ir.Module, pipe passes.Pipeline) (passes.Pipeline, error) {
	if p.req.Budget == "" && p.req.DeviceBudget == "" {
		return pipe, nil
	}
	ref := pipe[:0]
	if p.req.Train != "" {
		ref = pipe[:1] // autodiff
	}
	base, _, err := p.trial(m, ref)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(pipe)
	for i, st := range out {
		for _, c := range []struct{ pass, opt string }{{"remat", "budget"}, {"swap", "device-budget"}} {
			if st.Pass.Name != c.pass {
				continue
			}
			sz, err := passes.ParseSize(st.Args[c.opt])
			if err != nil {
				return nil, &RequestError{err.Error()}
			}
			var whole int64
			for _, f := range base.Funcs {
				if c.pass == "remat" {
					whole = max(whole, liveness.Analyze(f).Peak)
					continue
				}
				d, err := swap.DeviceBytes(f, p.workspace)
				if err != nil {
					return nil, err
				}
				whole = max(whole, d)
			}
			if sz.IsFrac {
				out[i] = step(c.pass, c.opt, bytesArg(sz.Of(whole)))
			}
		}
	}
	if p.remat >= 0 {
		budget, _ := passes.ParseSize(out[p.remat].Args["budget"])
		for _, f := range base.Funcs {
			if err := p.floor(f, budget.Bytes); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// workspace is the session's workspace sizes, or none.
func (p *planner) workspace(f *ir.Func) (int64, error) {
	if p.s.Workspace == nil {
		return 0, nil
	}
	return p.s.Workspace(f)
}

// maxSplit is the most microbatches the toolbox splits a step into.
const maxSplit = 64

// floor refuses budget when no plan of f can reach it: at every op that
// runs on the device (in-place updates may run on the host), its operands
// must be on the device together, and so must its results; the values
// that hold rows of the batch shrink with the finest split that can be
// made, and nothing else does.
func (p *planner) floor(f *ir.Func, budget int64) error {
	n, sliced := 1, map[*ir.Value]bool{}
	if b := batchOf(f); b > 0 {
		opts := mb.Options{PerSliceBN: p.req.allows(passes.PerSliceBN)}
		for k := min(b, maxSplit); k >= 2; k-- {
			if b%int64(k) != 0 {
				continue
			}
			if s, err := mb.Sliced(f, int(k), opts); err == nil {
				n, sliced = int(k), s
				break
			}
		}
	}
	if e := floorAt(f, budget, n, sliced); e.Op != nil && budget < e.Floor {
		return e
	}
	return nil
}

// splitFloor is the floor of f split into n (swap free to move every
// parameter, state and input to the host), or nil when f cannot be split
// so.
func (p *planner) splitFloor(f *ir.Func, budget int64, n int) *FloorError {
	b := batchOf(f)
	if b <= 0 || b%int64(n) != 0 {
		return nil
	}
	sliced, err := mb.Sliced(f, n, mb.Options{PerSliceBN: p.req.allows(passes.PerSliceBN)})
	if err != nil {
		return nil
	}
	if e := floorAt(f, budget, n, sliced); e.Op != nil {
		e.Given = true
		return e
	}
	return nil
}

// floorAt is the floor of f with the values sliced holding a share of n:
// the most that one op's operands, or its results, need together.
func floorAt(f *ir.Func, budget int64, n int, sliced map[*ir.Value]bool) *FloorError {
	size := func(v *ir.Value) int64 {
		if sliced[v] {
			return v.Type.SizeBytes() / int64(n)
		}
		return v.Type.SizeBytes()
	}
	e := &FloorError{Budget: budget, Split: n}
	for _, op := range f.Body {
		if d := op.Def(); d == nil || len(d.Writes) > 0 || d.View {
			continue
		}
		var in, out int64
		seen := map[*ir.Value]bool{}
		for _, v := range op.Operands {
			if !seen[v] && !ir.HostResult(v) {
				seen[v] = true
				in += size(v)
			}
		}
		for _, r := range op.Results {
			out += size(r)
		}
		if w := max(in, out); w > e.Floor {
			e.Floor, e.Op = w, op
		}
	}
	return e
}

// batchOf is the batch a split would cut: dimension 0 of the first data
// argument (0: none).
func batchOf(f *ir.Func) int64 {
	for _, a := range f.Args {
		if a.Arg.Kind == ir.ArgData && a.Type.Rank() > 0 {
			return a.Type.Shape[0]
		}
	}
	return 0
}

// fitRemat decides how the remat step at pipe[at] reaches its budget at
// the least modelled step time: by recomputation alone, or by
// recomputation in 2, 4, 8, ... microbatches (a split computes what the
// whole step does, so time alone decides; it is the way to go when
// recomputation alone cannot reach the budget). A split becomes a
// microbatch step before remat: the pipeline returned has remat at at+1
// then, and note says why.
func (p *planner) fitRemat(m *ir.Module, pipe passes.Pipeline, at int) (out passes.Pipeline, note string) {
	pre, _, err := p.trial(m, pipe[:at])
	if err != nil {
		return pipe, "" // the plan's own run reports it
	}
	budget, _ := passes.ParseSize(pipe[at].Args["budget"])
	split := 0
	for _, f := range pre.Funcs {
		n, why := p.fit(f, budget.Bytes)
		if n > split {
			split, note = n, why
		}
	}
	if split < 2 {
		return pipe, ""
	}
	ms, err := passes.ParsePipeline(p.microbatchStep(split), nil)
	if err != nil {
		return pipe, ""
	}
	return slices.Concat(pipe[:at], ms, pipe[at:]), note
}

// fitSolver is the remat solver fit weighs its candidates with: greedy
// is linear in the saved values, where best's exact search over subsets
// grows with every slice of a split; the remat step that runs after the
// decision uses the solver it names.
const fitSolver = "greedy"

// fit is the number of microbatches f should run as to reach budget
// fastest with recomputation in them (0: recomputation alone), and a note
// saying why.
func (p *planner) fit(f *ir.Func, budget int64) (int, string) {
	// Every argument on the device stays there through a recomputing plan
	// (remat moves nothing to the host, and a split slices the batch
	// inside the step, keeping its inputs whole), and the results are
	// there together at the end: a budget below that is out of
	// recomputation's reach at any split, and trying splits of a large
	// step takes minutes.
	if remat.StepFloor(f) > budget {
		return 0, ""
	}
	g := f.Clone()
	res, err := remat.Rematerialize(g, budget, fitSolver)
	var be *remat.BudgetError
	if err != nil && !errors.As(err, &be) || err == nil && res.FLOPs == 0 {
		return 0, ""
	}
	aloneSecs := math.Inf(1)
	if err == nil {
		aloneSecs = p.fusedSeconds(g)
	}
	opts := mb.Options{PerSliceBN: p.req.allows(passes.PerSliceBN)}
	bestN, bestSecs := 0, aloneSecs
	var bestSplit mb.Stats
	reached := int64(math.MaxInt64)
	if be != nil {
		reached = be.Reached
	}
	for n := 2; n <= maxSplit; n *= 2 {
		h := f.Clone()
		st, serr := mb.SplitWith(h, n, opts)
		var wb *mb.WholeBatchError
		if errors.As(serr, &wb) {
			st, serr = mb.SplitExact(h, n, opts)
		}
		if serr != nil {
			break
		}
		_, rerr := remat.Rematerialize(h, budget, fitSolver)
		if rerr != nil {
			var e *remat.BudgetError
			if !errors.As(rerr, &e) || e.Reached > reached-reached/50 {
				break // twice the slices gained under 2%: what stays whole holds the peak
			}
			reached = e.Reached
			continue
		}
		secs := p.fusedSeconds(h)
		if secs >= bestSecs {
			break // more slices only add launches and accumulation
		}
		bestN, bestSecs, bestSplit = n, secs, st
	}
	if bestN == 0 {
		return 0, ""
	}
	var note string
	if math.IsInf(aloneSecs, 1) {
		note = fmt.Sprintf("recomputation alone reached %s; the step runs as %d microbatches (gradient accumulation)", diag.Bytes(be.Reached), bestN)
	} else {
		note = fmt.Sprintf("the step runs as %d microbatches (gradient accumulation): with recomputation in them it takes %.1f µs in the cost model, recomputation alone (%d FLOPs) %.1f µs", bestN, bestSecs*1e6, res.FLOPs, aloneSecs*1e6)
	}
	switch {
	case bestSplit.BatchNorms > 0:
		note += fmt.Sprintf(", and batch normalisation takes its statistics per microbatch of %d (allowed: %s)", bestSplit.Batch/int64(bestN), passes.PerSliceBN)
	case bestSplit.Phases > 0:
		note += fmt.Sprintf(", in %d phases that keep the whole batch's statistics", bestSplit.Phases)
	}
	return bestN, note
}

// fusedSeconds is f's modelled step time once fuse has merged its
// kernels, as the pipelines after remat run it.
func (p *planner) fusedSeconds(f *ir.Func) float64 {
	g := f.Clone()
	fuse.Fuse(g, fuse.Options{MultiOutput: true})
	return p.req.Device.Simulate(g).Seconds
}

// offloadTry is one pipeline the toolbox runs when remat alone cannot
// reach the budget, with what it did in words.
type offloadTry struct {
	pipe  passes.Pipeline
	note  string
	split int // microbatches the step is split into before swap; 0 when not split
	// floor, when set, is above the budget: no plan of this split reaches
	// it, and the try does not run.
	floor *FloorError
	// base is the index of the try this one repeats with swap free to move
	// the data inputs, or -1: it need not run when that try failed before
	// swap.
	base int
}

// offload runs the toolbox's other tools on orig (the request's input)
// after pipe's remat failed with failure: parameters, optimizer state and
// gradients may leave the device, so remat aims at B + P, then B + P/2,
// then B + P/4 (P their bytes; a laxer aim leaves larger activations to
// swap, a stricter one more recomputation and microbatches), and swap
// keeps the bytes live on the device under B; then the step split into 2,
// 4 and 8 microbatches right after autodiff goes to swap without remat;
// last, the same tries with swap also free to leave the data inputs in
// host memory. The first try that succeeds is the plan, with a note on
// its swap step; if none does, the error names why each kind failed.
func (p *planner) offload(m, orig *ir.Module, pipe passes.Pipeline, failure error) error {
	tries, err := p.offloadTries(orig, pipe)
	if err != nil {
		return fmt.Errorf("%w\nwith offloading too: %v", failure, err)
	}
	var splitErr, wholeErr error
	maxSplit := 0
	failedIn := make([]string, len(tries)) // the pass each failed try stopped in
	for i, try := range tries {
		if try.base >= 0 && failedIn[try.base] != "swap" {
			continue // it would stop where its base did
		}
		if try.floor != nil {
			p.res.Tries = append(p.res.Tries, Try{Pipeline: try.pipe, Err: try.floor})
			failedIn[i] = "floor"
			if splitErr == nil {
				splitErr, maxSplit = try.floor, try.split
			}
			continue
		}
		splitNote := ""
		if at := slices.IndexFunc(try.pipe, func(s passes.Step) bool { return s.Pass.Name == "remat" }); at >= 0 {
			try.pipe, splitNote = p.fitRemat(orig, try.pipe, at)
		}
		if p.s.Pipeline != nil {
			p.s.Pipeline(try.pipe)
		}
		c := cloneModule(orig)
		mg := p.manager(false)
		terr := mg.Run(c, try.pipe)
		p.res.Tries = append(p.res.Tries, Try{Pipeline: try.pipe, Err: terr})
		if terr != nil {
			var tpe *passes.PassError
			if errors.As(terr, &tpe) {
				failedIn[i] = tpe.Pass
			}
			if try.split > 0 && (splitErr == nil || !errors.As(terr, &tpe) || tpe.Pass != "microbatch") {
				// The last split that could be made names why it failed.
				splitErr, maxSplit = terr, try.split
			} else if try.split == 0 {
				wholeErr = terr // the report names the last try of the whole step
			}
			continue
		}
		m.Funcs = c.Funcs
		p.res.Pipeline, p.res.Runs, p.res.Analyses = try.pipe, mg.Runs, mg.Analyses
		if splitNote != "" {
			p.res.Notes = append(p.res.Notes, Note{"remat", splitNote})
		}
		p.res.Notes = append(p.res.Notes, Note{"swap", try.note})
		return nil
	}
	if wholeErr != nil {
		failure = fmt.Errorf("%w\nwith offloading too: %v", failure, wholeErr)
	}
	if splitErr != nil {
		// Only the headline: its live values are the whole step's, split.
		head, _, _ := strings.Cut(splitErr.Error(), "\n")
		var tpe *passes.PassError
		if errors.As(splitErr, &tpe) && tpe.Pass == "microbatch" {
			failure = fmt.Errorf("%w\nno split into microbatches could be made: %s", failure, head)
		} else {
			failure = fmt.Errorf("%w\nsplit into %d microbatches, then offloaded: %s", failure, maxSplit, head)
		}
	}
	return failure
}

// offloadTries lists the toolbox's pipelines after remat (at p.remat in
// pipe) could not reach its budget.
func (p *planner) offloadTries(orig *ir.Module, pipe passes.Pipeline) ([]offloadTry, error) {
	at := p.remat
	budget, _ := passes.ParseSize(pipe[at].Args["budget"])
	b := budget.Of(0)
	trial, _, err := p.trial(orig, pipe[:at])
	if err != nil {
		return nil, err
	}
	var movable, peak int64
	for _, f := range trial.Funcs {
		info := liveness.Analyze(f)
		peak = max(peak, info.Peak)
		grads := int64(0)
		for _, r := range f.Results {
			if r.Role() == ir.RoleGrad {
				grads += r.Value.Type.SizeBytes()
			}
		}
		movable = max(movable, info.ParamBytes+info.StateBytes+grads)
	}
	swapStep := passes.Step{Pass: passes.Lookup("swap"), Args: map[string]string{"device-budget": bytesArg(b), "peak": "true"}}
	// The steps before remat, without a split remat's fit put there.
	before := slices.DeleteFunc(slices.Clone(pipe[:at]), func(s passes.Step) bool {
		return s.Pass.Name == "microbatch" && !slices.Contains(p.requestedSplit(), s.String())
	})
	var tries []offloadTry
	for _, extra := range []int64{movable, movable / 2, movable / 4} {
		out := slices.Clone(before)
		note := fmt.Sprintf("remat could not reach %s alone: ", diag.Bytes(b))
		if b+extra < peak {
			out = append(out, step("remat", "budget", bytesArg(b+extra)))
			note += fmt.Sprintf("recomputation and microbatches aimed at %s, ", diag.Bytes(b+extra))
		}
		out = withSwapBeforeAssign(out, pipe[at+1:], swapStep)
		note += fmt.Sprintf("then swap kept the bytes live on the device under %s, by swapping, recomputing and moving parameters, optimizer state and gradients to host memory", diag.Bytes(b))
		tries = append(tries, offloadTry{pipe: out, note: note, base: -1})
	}
	grad := -1 // the split goes after autodiff, and after precision right behind it
	for i, s := range before {
		switch s.Pass.Name {
		case "autodiff":
			grad = i
		case "precision":
			if grad == i-1 {
				grad = i
			}
		case "microbatch", "parallel":
			grad = -1
		}
	}
	// The floors of the splits are those of the step the tries split: the
	// steps before remat without a split of remat's fit.
	unsplit := trial
	if len(before) != at {
		if unsplit, _, err = p.trial(orig, before); err != nil {
			return nil, err
		}
	}
	if grad >= 0 {
		for n := 2; n <= 8; n *= 2 {
			split, err := passes.ParsePipeline(p.microbatchStep(n), nil)
			if err != nil {
				return nil, err
			}
			out := slices.Concat(before[:grad+1], split, before[grad+1:])
			out = withSwapBeforeAssign(out, pipe[at+1:], swapStep)
			note := fmt.Sprintf("remat could not reach %s alone: the step runs as %d microbatches (gradient accumulation), then swap kept the bytes live on the device under %s, by swapping, recomputing and moving parameters, optimizer state and gradients to host memory", diag.Bytes(b), n, diag.Bytes(b))
			try := offloadTry{pipe: out, note: note, split: n, base: -1}
			for _, f := range unsplit.Funcs {
				if e := p.splitFloor(f, b, n); e != nil && b < e.Floor && (try.floor == nil || e.Floor > try.floor.Floor) {
					try.floor = e
				}
			}
			tries = append(tries, try)
		}
	}
	// Last resort: the data inputs may stay in host memory (the caller
	// must then hand them there; launch plans cannot yet).
	inputs := swapStep
	inputs.Args = map[string]string{"device-budget": bytesArg(b), "peak": "true", "inputs": "true"}
	for i, try := range tries[:len(tries):len(tries)] {
		out := slices.Clone(try.pipe)
		for j, s := range out {
			if s.Pass.Name == "swap" {
				out[j] = inputs
			}
		}
		tries = append(tries, offloadTry{pipe: out, note: try.note + ", and leaving the data inputs in host memory", split: try.split, base: i, floor: try.floor})
	}
	return tries, nil
}

// requestedSplit is the microbatch step the request itself asks for, if
// any.
func (p *planner) requestedSplit() []string {
	if p.req.Microbatches > 1 && p.req.Parallel == "" {
		ps, err := passes.ParsePipeline(p.microbatchStep(p.req.Microbatches), nil)
		if err == nil {
			return []string{ps[0].String()}
		}
	}
	return nil
}

// withSwapBeforeAssign appends rest to out with swap placed before rest's
// first assign (swap decides what assign packs), or at the end when rest
// assigns nothing.
func withSwapBeforeAssign(out, rest passes.Pipeline, swapStep passes.Step) passes.Pipeline {
	placed := false
	for _, s := range rest {
		if s.Pass.Name == "assign" && !placed {
			out, placed = append(out, swapStep), true
		}
		out = append(out, s)
	}
	if !placed {
		out = append(out, swapStep)
	}
	return out
}

// Report is the report of f as planned, the planner's notes on its passes
// included, its times on the request's device.
func (r *Result) Report(f *ir.Func, timing bool) *memreport.Report {
	var ps []memreport.Pass
	for _, run := range r.Runs {
		p := memreport.Pass{Name: run.Name, Notes: r.NotesOf(run.Name)}
		if timing {
			s := run.Seconds
			p.Seconds = &s
		}
		ps = append(ps, p)
	}
	rep := memreport.BuildFrom(r.Analyses.Liveness(f), ps, r.Device)
	rep.Allowed = append(rep.Allowed, r.Allowed...)
	for _, run := range r.Runs {
		for _, a := range run.Approximations {
			rep.Approximations = append(rep.Approximations, memreport.Approximation{Pass: run.Name, Name: a.Name, What: a.What})
		}
	}
	return rep
}
