package planner

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

// Session is how the planner runs passes for its caller.
type Session struct {
	// Inst instruments the passes of the pipeline the plan keeps (what
	// the user sees printed, dumped and timed); the toolbox's trials run
	// quietly, verified as Inst says.
	Inst passes.Instrumentation
	// Resolve finds passes outside the registry (ext:NAME).
	Resolve passes.Resolver
	// Pipeline, when set, sees each pipeline the planner runs for real
	// (--print-pipeline).
	Pipeline func(passes.Pipeline)
	// Workspace sizes the kernels' workspace of a function (the backend
	// provides it); device budgets need it. nil: none.
	Workspace func(*ir.Func) (int64, error)
}

// LevelPipeline is the pipeline of -O<level> without its budget steps
// (the design notes' Contracts): -O0 assign; -O1
// canonicalize,dce,cse,saveset,fuse,assign; -O2 adds reorder before
// assign; -O3 gives the exact searches more room. The planner adds remat
// after saveset for a budget, and swap before assign for a device budget.
// level < 0 gives "".
func LevelPipeline(level int) string {
	switch {
	case level < 0:
		return ""
	case level == 0:
		return "assign"
	case level == 1:
		return "canonicalize,dce,cse,saveset,fuse,assign"
	case level == 2:
		return "canonicalize,dce,cse,saveset,fuse,reorder,assign"
	}
	return "canonicalize,dce,cse,saveset,fuse,reorder{exact-states=2000000,improve=2000},assign{algo=best}"
}

// planner is one request being planned.
type planner struct {
	req Request
	s   Session
	res *Result
	// remat is the index in the pipeline of the remat step the budget
	// added (-1: none): the toolbox owns it.
	remat int
	// searchAt is where the parallel step the search chooses goes (-1:
	// no search).
	searchAt int
}

// Plan rewrites m as req asks and returns the plan. A request that cannot
// be planned as asked is a *RequestError, a pipeline that breaks a
// pass's contract a *passes.ContractError (both misuses of the command
// line); a budget below what every mechanism together can reach is a
// *FloorError, found before any pass runs; a pass that fails is a
// *passes.PassError. On error m may be half rewritten.
func Plan(m *ir.Module, req Request, s Session) (*Result, error) {
	if req.Device == (costmodel.Device{}) {
		req.Device = costmodel.Default
	}
	if err := req.Check(); err != nil {
		return nil, err
	}
	p := &planner{req: req, s: s, res: &Result{Device: req.Device, Allowed: slices.Clone(req.Allow)}, remat: -1, searchAt: -1}
	pipe, err := p.pipeline()
	if err != nil {
		return nil, err
	}
	if err := passes.CheckContracts(m, pipe, req.Need...); err != nil {
		var ce *passes.ContractError
		if errors.As(err, &ce) {
			return nil, &passes.ContractError{Msg: "pipeline " + pipe.String() + ": " + ce.Msg}
		}
		return nil, err
	}
	if pipe, err = p.searchParallel(m, pipe); err != nil {
		return nil, err
	}
	if pipe, err = p.resolveBudgets(m, pipe); err != nil {
		return nil, err
	}
	pipe = p.placeUpdates(m, pipe)
	return p.res, p.execute(m, pipe)
}

// pipeline is the pipeline the request asks for, budgets unresolved.
func (p *planner) pipeline() (passes.Pipeline, error) {
	r := p.req
	level := r.Level
	if level < 0 && r.Passes == "" && (r.Train != "" || r.Optimizer != "") {
		level = 2
	}
	for _, q := range r.Need {
		if q == passes.Assigned && level < 0 && r.Passes == "" {
			level = 0 // compiled code needs offsets: -O0
		}
	}
	var steps []string
	if r.Train != "" {
		if r.KeepOutputs {
			steps = append(steps, "autodiff{loss="+r.Train+",keep-outputs=true}")
		} else {
			steps = append(steps, "autodiff{loss="+r.Train+"}")
		}
	}
	if r.Precision != "" {
		steps = append(steps, r.precisionStep())
	}
	if r.Microbatches > 1 && r.Parallel == "" {
		steps = append(steps, p.microbatchStep(r.Microbatches))
	}
	if r.Optimizer != "" {
		opts := "kind=" + r.Optimizer
		if r.OptimizerOptions != "" {
			opts += "," + r.OptimizerOptions
		}
		steps = append(steps, "optimizer{"+opts+"}")
	}
	if isSearch(r.Parallel) {
		if r.Microbatches > 1 {
			return nil, &RequestError{"--parallel devices=N searches microbatches of its own: give it without --microbatches"}
		}
		p.searchAt = len(steps)
	} else if r.Parallel != "" {
		spec := r.Parallel
		if r.Microbatches > 1 {
			spec += fmt.Sprintf(",microbatches=%d", r.Microbatches) // each rank accumulates its part
		}
		steps = append(steps, "parallel{"+spec+"}")
	}
	rest := r.Passes
	if level >= 0 {
		rest = LevelPipeline(level)
	}
	if rest != "" {
		steps = append(steps, rest)
	}
	pipe, err := passes.ParsePipeline(strings.Join(steps, ","), p.s.Resolve)
	if err != nil {
		return nil, &RequestError{err.Error()}
	}
	if level >= 2 {
		pipe = p.withBudgets(pipe)
	}
	return pipe, nil
}

// microbatchStep splits the step into n slices, keeping the statistics
// of the whole batch in phases where the step has them: batch
// normalisation's, unless the request allows each slice's (per-slice-bn,
// as PyTorch's gradient accumulation), and every other (a mean loss's
// count of the labels it does not ignore), which no name allows to change.
func (p *planner) microbatchStep(n int) string {
	return fmt.Sprintf("microbatch{n=%d,exact-bn=true}", n)
}

// withBudgets adds the budgets' steps to a level's pipeline: remat after
// saveset, swap before the last assign.
func (p *planner) withBudgets(pipe passes.Pipeline) passes.Pipeline {
	var out passes.Pipeline
	for i, st := range pipe {
		if st.Pass.Name == "assign" && i == len(pipe)-1 && p.req.DeviceBudget != "" {
			out = append(out, step("swap", "device-budget", p.req.DeviceBudget))
		}
		out = append(out, st)
		if st.Pass.Name == "saveset" && p.req.Budget != "" {
			p.remat = len(out)
			out = append(out, step("remat", "budget", p.req.Budget))
		}
	}
	return out
}

// step is the registered pass name with one option.
func step(name, key, value string) passes.Step {
	return passes.Step{Pass: passes.Lookup(name), Args: map[string]string{key: value}}
}

// manager is the pass manager of a run: the session's instrumentation
// and the consumer's needs when it is the plan's, quiet (verification
// only) for a trial.
func (p *planner) manager(quiet bool) *passes.Manager {
	inst := p.s.Inst
	if quiet {
		inst = passes.Instrumentation{VerifyEach: p.s.Inst.VerifyEach, Log: io.Discard, Files: p.s.Inst.Files}
	}
	d := p.req.Device
	mg := &passes.Manager{Inst: inst, Allow: p.req.Allow, Device: &d, Workspace: p.s.Workspace}
	if !quiet {
		mg.Need = p.req.Need // a trial may stop short of what the consumer needs
	}
	return mg
}

// trial runs pipe on a copy of m quietly and returns the copy.
func (p *planner) trial(m *ir.Module, pipe passes.Pipeline) (*ir.Module, *passes.Manager, error) {
	c := cloneModule(m)
	mg := p.manager(true)
	return c, mg, mg.Run(c, pipe)
}

// execute runs the plan's pipeline on m, choosing narrower saved values
// where the request allows them (executeNarrowing).
func (p *planner) execute(m *ir.Module, pipe passes.Pipeline) error {
	return p.executeNarrowing(m, pipe)
}

// executeOnce runs pipe on m; when the budget's remat cannot reach it,
// the toolbox's other tools take over (offload).
func (p *planner) executeOnce(m *ir.Module, pipe passes.Pipeline) error {
	var orig *ir.Module
	note := ""
	if p.remat >= 0 {
		orig = cloneModule(m)
		if pipe, note = p.fitRemat(m, pipe, p.remat); note != "" {
			p.remat++
		}
	}
	if p.s.Pipeline != nil {
		p.s.Pipeline(pipe)
	}
	mg := p.manager(false)
	err := mg.Run(m, pipe)
	p.res.Pipeline, p.res.Runs, p.res.Analyses = pipe, mg.Runs, mg.Analyses
	if err == nil && note != "" {
		p.res.Notes = append(p.res.Notes, Note{"remat", note})
	}
	var pe *passes.PassError
	if orig == nil || !errors.As(err, &pe) || pe.Pass != "remat" {
		return err
	}
	return p.offload(m, orig, pipe, err)
}

func cloneModule(m *ir.Module) *ir.Module {
	out := &ir.Module{}
	for _, f := range m.Funcs {
		out.Funcs = append(out.Funcs, f.Clone())
	}
	return out
}

// bytesArg is an option value of n bytes.
func bytesArg(n int64) string { return strconv.FormatInt(max(1, n), 10) }
