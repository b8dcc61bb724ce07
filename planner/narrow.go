package planner

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/memreport"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/precision"
)

// narrowing is a pipeline of the toolbox that stores the values the
// backward pass reads in a narrower dtype (precision{saved=...}), and the
// approximation that allows it.
type narrowing struct {
	pipe   passes.Pipeline
	saved  string // bf16 or fp8
	approx string
	remat  int // the remat step's index in pipe
}

// narrowings are the pipelines with narrower saved values that the
// request allows by name, beside pipe (whose budget's remat is at
// p.remat): each sets saved= on the pipeline's precision step, or adds
// precision{dtype=f32,saved=...} right after autodiff. None without a
// budget, without autodiff, where the user set saved= already, or where
// the dtype is no wider than the narrowing.
func (p *planner) narrowings(pipe passes.Pipeline) []narrowing {
	if p.remat < 0 {
		return nil
	}
	grad := slices.IndexFunc(pipe, func(s passes.Step) bool { return s.Pass.Name == "autodiff" })
	prec := slices.IndexFunc(pipe, func(s passes.Step) bool { return s.Pass.Name == "precision" })
	if grad < 0 || prec >= 0 && pipe[prec].Args["saved"] != "" && pipe[prec].Args["saved"] != "none" {
		return nil
	}
	width := 4 // bytes of the dtype the step computes in
	if prec >= 0 && pipe[prec].Args["dtype"] != "f32" {
		width = 2 // bf16 (the default) or f16
	}
	var out []narrowing
	for _, c := range []struct {
		saved, approx string
		width         int
	}{{"bf16", precision.BF16Saved, 2}, {"fp8", precision.FP8Saved, 1}} {
		if !p.req.allows(c.approx) || c.width >= width {
			continue
		}
		n := narrowing{pipe: slices.Clone(pipe), saved: c.saved, approx: c.approx, remat: p.remat}
		if prec >= 0 {
			st := n.pipe[prec]
			st.Args = maps.Clone(st.Args)
			st.Args["saved"] = c.saved
			n.pipe[prec] = st
		} else {
			st := passes.Step{Pass: passes.Lookup("precision"), Args: map[string]string{"dtype": "f32", "saved": c.saved}}
			n.pipe = slices.Insert(n.pipe, grad+1, st)
			n.remat++
		}
		out = append(out, n)
	}
	return out
}

// outcome is a candidate plan run quietly: its modelled step time and
// planned bytes, or why it failed.
type outcome struct {
	seconds float64
	bytes   int64
	err     error
}

// executeNarrowing plans pipe as execute does, and, when the request
// allows narrower saved values, also each narrowing; it keeps the plan
// that meets the budget in the least modelled time (then the fewest
// bytes), reruns it for real, and notes on precision what each candidate
// came to. The candidates run quietly on copies of m.
func (p *planner) executeNarrowing(m *ir.Module, pipe passes.Pipeline) error {
	cands := p.narrowings(pipe)
	if len(cands) == 0 {
		return p.executeOnce(m, pipe)
	}
	type cand struct {
		pipe  passes.Pipeline
		remat int
		name  string
		out   outcome
	}
	all := []cand{{pipe: pipe, remat: p.remat, name: "no narrowing"}}
	for _, n := range cands {
		all = append(all, cand{pipe: n.pipe, remat: n.remat, name: n.saved + " saved values (" + n.approx + ")"})
	}
	best := -1
	for i := range all {
		all[i].out = p.quietly(m, all[i].pipe, all[i].remat)
		o := all[i].out
		if o.err != nil {
			continue
		}
		if best < 0 || o.seconds < all[best].out.seconds || o.seconds == all[best].out.seconds && o.bytes < all[best].out.bytes {
			best = i
		}
	}
	if best < 0 {
		return p.executeOnce(m, pipe) // none reaches the budget: the plan's own error
	}
	p.remat = all[best].remat
	if err := p.executeOnce(m, all[best].pipe); err != nil {
		return err
	}
	note := fmt.Sprintf("the budget toolbox weighed narrower saved values and kept %s: %.1f µs modelled, %s planned", all[best].name, all[best].out.seconds*1e6, diag.Bytes(all[best].out.bytes))
	for i, c := range all {
		if i == best {
			continue
		}
		if c.out.err != nil {
			note += fmt.Sprintf("; %s failed (%s)", c.name, firstLine(c.out.err))
		} else {
			note += fmt.Sprintf("; %s: %.1f µs, %s", c.name, c.out.seconds*1e6, diag.Bytes(c.out.bytes))
		}
	}
	pass := "precision"
	if best == 0 {
		pass = "remat"
	}
	p.res.Notes = append(p.res.Notes, Note{pass, note})
	return nil
}

// quietly plans pipe (its remat at remat) on a copy of m with no
// instrumentation and no result kept, and returns what it came to.
func (p *planner) quietly(m *ir.Module, pipe passes.Pipeline, remat int) outcome {
	saveRes, saveS, saveRemat := p.res, p.s, p.remat
	defer func() { p.res, p.s, p.remat = saveRes, saveS, saveRemat }()
	p.res = &Result{Device: saveRes.Device, Allowed: saveRes.Allowed}
	p.s.Inst = passes.Instrumentation{VerifyEach: saveS.Inst.VerifyEach}
	p.s.Pipeline = nil
	p.remat = remat
	c := cloneModule(m)
	if err := p.executeOnce(c, pipe); err != nil {
		return outcome{err: err}
	}
	o := outcome{}
	for _, f := range c.Funcs {
		o.seconds += p.req.Device.Simulate(f).Seconds
		o.bytes = max(o.bytes, memreport.Build(f, nil, p.req.Device).PlannedBytes)
	}
	if math.IsNaN(o.seconds) {
		o.err = fmt.Errorf("no modelled time")
	}
	return o
}
