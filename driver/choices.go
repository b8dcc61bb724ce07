package driver

import (
	"fmt"
	"github.com/kiln-compiler/kiln/diag"
	"io"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/memreport"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/swap"
)

// cloneModule copies m deeply.
func cloneModule(m *ir.Module) *ir.Module {
	out := &ir.Module{}
	for _, f := range m.Funcs {
		out.Funcs = append(out.Funcs, f.Clone())
	}
	return out
}

// quietRun runs pipe on m with verification only (no output, no
// progress): the trial runs that decide how the real one goes.
func quietRun(e *env, m *ir.Module, pipe passes.Pipeline, verify bool) (*passes.Manager, error) {
	mg := &passes.Manager{Inst: passes.Instrumentation{VerifyEach: verify, Log: io.Discard, Files: e.files}}
	return mg, mg.Run(m, pipe)
}

// resolveBudgets turns the fractions of --budget and --device-budget
// into bytes of the step before any memory pass: remat's budget into a
// fraction of the peak, swap's into a fraction of the device arena (and
// workspace), both of the module after the reference pipeline ref (the
// autodiff of --train; nothing without it). Passes named in --passes
// keep their own meaning (a fraction of what they start from).
func resolveBudgets(e *env, m *ir.Module, pipe passes.Pipeline, ref string) (passes.Pipeline, error) {
	fracs := false
	for _, s := range pipe {
		fracs = fracs || isFraction(s, "remat", "budget") || isFraction(s, "swap", "device-budget")
	}
	if !fracs {
		return pipe, nil
	}
	base := cloneModule(m)
	if ref != "" {
		refPipe, err := passes.ParsePipeline(ref, nil)
		if err != nil {
			return nil, err
		}
		if _, err := quietRun(e, base, refPipe, false); err != nil {
			return nil, err
		}
	}
	var peak, device int64
	for _, f := range base.Funcs {
		peak = max(peak, liveness.Analyze(f).Peak)
		d, err := swap.DeviceBytes(f)
		if err != nil {
			return nil, err
		}
		device = max(device, d)
	}
	out := make(passes.Pipeline, len(pipe))
	for i, s := range pipe {
		out[i] = s
		for _, c := range []struct {
			pass, opt string
			of        int64
		}{{"remat", "budget", peak}, {"swap", "device-budget", device}} {
			if isFraction(s, c.pass, c.opt) {
				sz, _ := passes.ParseSize(s.Args[c.opt])
				args := map[string]string{}
				for k, v := range s.Args {
					args[k] = v
				}
				args[c.opt] = strconv.FormatInt(max(1, sz.Of(c.of)), 10)
				out[i] = passes.Step{Pass: s.Pass, Args: args}
			}
		}
	}
	return out, nil
}

func isFraction(s passes.Step, pass, opt string) bool {
	if s.Pass.Name != pass {
		return false
	}
	sz, err := passes.ParseSize(s.Args[opt])
	return err == nil && sz.IsFrac
}

// placement is one way the optimizer's updates were tried.
type placement struct {
	name    string
	pipe    passes.Pipeline
	planned int64
	seconds float64
	err     error
}

// choosePlacement decides where an optimizer{placement=auto} step puts
// its updates: the rest of the pipeline runs on copies of m with the
// updates early and at the end, and the pipeline whose plan needs fewer
// bytes (then less modelled time) is returned with a note saying what
// each gave. Pipelines without such a step, or with nothing after it,
// come back as they are.
func choosePlacement(e *env, m *ir.Module, pipe passes.Pipeline, verify bool) (passes.Pipeline, string) {
	at := -1
	for i, s := range pipe {
		if s.Pass.Name == "optimizer" && (s.Args["placement"] == "" || s.Args["placement"] == "auto") {
			at = i
		}
	}
	if at < 0 || at == len(pipe)-1 {
		return pipe, ""
	}
	var tries []*placement
	for _, name := range []string{"early", "end"} {
		p := &placement{name: name, pipe: append(passes.Pipeline(nil), pipe...)}
		args := map[string]string{"placement": name}
		for k, v := range pipe[at].Args {
			if k != "placement" {
				args[k] = v
			}
		}
		p.pipe[at] = passes.Step{Pass: pipe[at].Pass, Args: args}
		trial := cloneModule(m)
		if _, p.err = quietRun(e, trial, p.pipe, verify); p.err == nil {
			for _, f := range trial.Funcs {
				p.planned += memreport.Build(f, nil).PlannedBytes
				p.seconds += costmodel.Default.Simulate(f).Seconds
			}
		}
		tries = append(tries, p)
	}
	best := tries[0]
	for _, p := range tries[1:] {
		if best.err != nil || p.err == nil && (p.planned < best.planned || p.planned == best.planned && p.seconds < best.seconds) {
			best = p
		}
	}
	if best.err != nil {
		return pipe, "" // the real run reports the error
	}
	var parts []string
	for _, p := range tries {
		what := fmt.Sprintf("%s, %.1f µs", diag.Bytes(p.planned), p.seconds*1e6)
		if p.err != nil {
			what = "cannot be planned (" + firstLine(p.err) + ")"
		}
		parts = append(parts, p.name+": "+what)
	}
	return best.pipe, fmt.Sprintf("updates placed %s, the plan that needs less memory (then less modelled time): %s", placementWords[best.name], strings.Join(parts, "; "))
}

var placementWords = map[string]string{"early": "early (each right after its gradient)", "end": "at the end (as optimizer.step())"}

func firstLine(err error) string {
	s := err.Error()
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

// offloadable reports whether pipe has a remat step with a budget in
// bytes and no swap step: when remat cannot reach its budget, --budget
// goes on with offloading (withOffload).
func offloadable(pipe passes.Pipeline) bool {
	remat := false
	for _, s := range pipe {
		switch s.Pass.Name {
		case "swap":
			return false
		case "remat":
			sz, err := passes.ParseSize(s.Args["budget"])
			remat = err == nil && !sz.IsFrac
		}
	}
	return remat
}

// offloadTry is one pipeline withOffload proposes, with its note.
type offloadTry struct {
	pipe  passes.Pipeline
	note  string
	split int // microbatches the step is split into before swap; 0 when not split
	// base is the index of the try this one repeats with swap free to move
	// the data inputs, or -1: it need not run when that try failed before
	// swap.
	base int
}

// withOffload lists pipelines that hand on what remat{budget=B} could
// not reach. The parameters, optimizer state and returned gradients (P
// bytes once the steps before remat ran) may leave the device, so remat
// aims at B + P, then B + P/2, then B + P/4 (a laxer aim leaves larger
// activations for swap, a stricter one more recomputation and
// microbatches), and swap{device-budget=B,peak=true} before assign (B
// bounds the peak, as in remat) swaps, recomputes and offloads
// parameters and gradients until the bytes live on the device fit B.
// Last, the step split into 2, 4 and 8 microbatches right after autodiff
// goes to swap without remat: a small step whose parameters and gradients
// are most of its peak needs the slices' smaller activations and the
// offloading together, and remat, which counts what swap would move,
// refuses such a budget before it tries a split. After them come the same
// tries with swap also free to leave the data inputs in host memory.
func withOffload(e *env, m *ir.Module, pipe passes.Pipeline, verify bool) ([]offloadTry, error) {
	at := -1
	for i, s := range pipe {
		if s.Pass.Name == "remat" {
			at = i
		}
	}
	budget, _ := passes.ParseSize(pipe[at].Args["budget"])
	b := budget.Of(0)
	trial := cloneModule(m)
	if _, err := quietRun(e, trial, pipe[:at], verify); err != nil {
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
	swapStep, err := passes.ParsePipeline(fmt.Sprintf("swap{device-budget=%d,peak=true}", b), nil)
	if err != nil {
		return nil, err
	}
	var tries []offloadTry
	for _, extra := range []int64{movable, movable / 2, movable / 4} {
		var out passes.Pipeline
		out = append(out, pipe[:at]...)
		note := fmt.Sprintf("remat could not reach %s alone: ", diag.Bytes(b))
		if b+extra < peak {
			args := map[string]string{}
			for k, v := range pipe[at].Args {
				args[k] = v
			}
			args["budget"] = strconv.FormatInt(b+extra, 10)
			out = append(out, passes.Step{Pass: pipe[at].Pass, Args: args})
			note += fmt.Sprintf("recomputation and microbatches aimed at %s, ", diag.Bytes(b+extra))
		}
		out = withSwapBeforeAssign(out, pipe[at+1:], swapStep)
		note += fmt.Sprintf("then swap kept the bytes live on the device under %s, by swapping, recomputing and moving parameters, optimizer state and gradients to host memory", diag.Bytes(b))
		tries = append(tries, offloadTry{out, note, 0, -1})
	}
	grad := -1
	for i, s := range pipe[:at] {
		switch s.Pass.Name {
		case "autodiff":
			grad = i
		case "microbatch", "parallel":
			grad = -1
		}
	}
	if grad < 0 {
		return withHostInputs(tries, b)
	}
	for n := 2; n <= 8; n *= 2 {
		split, err := passes.ParsePipeline(fmt.Sprintf("microbatch{n=%d,exact-bn=true}", n), nil)
		if err != nil {
			return nil, err
		}
		var out passes.Pipeline
		out = append(out, pipe[:grad+1]...)
		out = append(out, split...)
		out = append(out, pipe[grad+1:at]...)
		out = withSwapBeforeAssign(out, pipe[at+1:], swapStep)
		note := fmt.Sprintf("remat could not reach %s alone: the step runs as %d microbatches (gradient accumulation; microbatch's own note counts the batch norms that take per-microbatch statistics), then swap kept the bytes live on the device under %s, by swapping, recomputing and moving parameters, optimizer state and gradients to host memory", diag.Bytes(b), n, diag.Bytes(b))
		tries = append(tries, offloadTry{out, note, n, -1})
	}
	return withHostInputs(tries, b)
}

// withHostInputs appends to tries the same tries with swap also free to
// leave the data inputs in host memory: the last resort, since the caller
// must then hand them there (launch plans cannot yet).
func withHostInputs(tries []offloadTry, b int64) ([]offloadTry, error) {
	swapStep, err := passes.ParsePipeline(fmt.Sprintf("swap{device-budget=%d,peak=true,inputs=true}", b), nil)
	if err != nil {
		return nil, err
	}
	for i, try := range tries[:len(tries):len(tries)] {
		out := make(passes.Pipeline, len(try.pipe))
		for j, s := range try.pipe {
			out[j] = s
			if s.Pass.Name == "swap" {
				out[j] = swapStep[0]
			}
		}
		tries = append(tries, offloadTry{out, try.note + ", and leaving the data inputs in host memory", try.split, i})
	}
	return tries, nil
}

// withSwapBeforeAssign appends rest to out with swap placed before rest's
// first assign (swap decides what assign packs), or at the end when rest
// assigns nothing.
func withSwapBeforeAssign(out, rest, swapStep passes.Pipeline) passes.Pipeline {
	placed := false
	for _, s := range rest {
		if s.Pass.Name == "assign" && !placed {
			out, placed = append(out, swapStep...), true
		}
		out = append(out, s)
	}
	if !placed {
		out = append(out, swapStep...)
	}
	return out
}
