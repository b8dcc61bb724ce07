package planner

import (
	"fmt"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/memreport"
	"github.com/kiln-compiler/kiln/passes"
)

// placement is one way the optimizer's updates were tried.
type placement struct {
	name    string
	pipe    passes.Pipeline
	planned int64
	seconds float64
	err     error
}

var placementWords = map[string]string{"early": "early (each right after its gradient)", "end": "at the end (as optimizer.step())"}

// placeUpdates decides where an optimizer{placement=auto} step puts its
// updates: the rest of the pipeline runs on copies of m with the updates
// early and at the end, and the pipeline whose plan needs fewer bytes
// (then less modelled time) is kept, with a note on the optimizer saying
// what each gave. Pipelines without such a step, or with nothing after
// it, come back as they are.
func (p *planner) placeUpdates(m *ir.Module, pipe passes.Pipeline) passes.Pipeline {
	at := -1
	for i, s := range pipe {
		if s.Pass.Name == "optimizer" && (s.Args["placement"] == "" || s.Args["placement"] == "auto") {
			at = i
		}
	}
	if at < 0 || at == len(pipe)-1 {
		return pipe
	}
	var tries []*placement
	for _, name := range []string{"early", "end"} {
		t := &placement{name: name, pipe: append(passes.Pipeline(nil), pipe...)}
		args := map[string]string{"placement": name}
		for k, v := range pipe[at].Args {
			if k != "placement" {
				args[k] = v
			}
		}
		t.pipe[at] = passes.Step{Pass: pipe[at].Pass, Args: args}
		c, _, err := p.trial(m, t.pipe)
		if t.err = err; err == nil {
			for _, f := range c.Funcs {
				t.planned += memreport.Build(f, nil, p.req.Device).PlannedBytes
				t.seconds += p.req.Device.Simulate(f).Seconds
			}
		}
		tries = append(tries, t)
	}
	best := tries[0]
	for _, t := range tries[1:] {
		if best.err != nil || t.err == nil && (t.planned < best.planned || t.planned == best.planned && t.seconds < best.seconds) {
			best = t
		}
	}
	if best.err != nil {
		return pipe // the plan's own run reports the error
	}
	var parts []string
	for _, t := range tries {
		what := fmt.Sprintf("%s, %.1f µs", diag.Bytes(t.planned), t.seconds*1e6)
		if t.err != nil {
			what = "cannot be planned (" + firstLine(t.err) + ")"
		}
		parts = append(parts, t.name+": "+what)
	}
	p.res.Notes = append(p.res.Notes, Note{"optimizer", fmt.Sprintf("updates placed %s, the plan that needs less memory (then less modelled time): %s", placementWords[best.name], strings.Join(parts, "; "))})
	return best.pipe
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
