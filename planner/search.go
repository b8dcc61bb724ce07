package planner

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/fuse"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passes/remat"
)

// Candidate is one plan Search weighed: each rank's peak and its step
// time in the cost model (after fusion), or why the plan cannot be made.
type Candidate struct {
	Plan    parallel.Plan
	Peak    int64
	Seconds float64
	Fits    bool
	// Remat: the plan fits only with recomputation (remat{budget} at the
	// device's memory, per rank or stage), whose time Seconds counts.
	Remat bool
	Err   error
}

func (c Candidate) String() string {
	name := c.Plan.String()
	if c.Err != nil {
		return name + ": " + c.Err.Error()
	}
	fits := "fits"
	switch {
	case !c.Fits:
		fits = "does not fit"
	case c.Remat:
		fits = "fits with recomputation"
	}
	return fmt.Sprintf("%s: peak %s per rank (%s), %.1f µs per step", name, diag.Bytes(c.Peak), fits, c.Seconds*1e6)
}

// Search weighs the plans that spread f over at most devices ranks with
// what parallel builds: dp dividing devices (the batch must divide too),
// tp dividing devices / dp (tensor parallelism needs MLP or attention
// blocks: a plan it cannot make is listed with its error), and ZeRO
// stages 0 to 3 with dp > 1; and pipelines of pp stages of dp × tp ranks
// each (dp·tp·pp dividing devices, ZeRO 0 or 2) with pp, 2·pp or 4·pp
// microbatches (2·pp beside tp). A plan above
// memory is made to fit by recomputation where it can (remat{budget},
// per rank or stage), at the time that adds. It returns the fastest plan
// in the cost model that fits memory per device (0: any), ties going to
// the smaller peak, and every candidate it weighed. f is unchanged.
func Search(f *ir.Func, devices int, memory, bucket int64, dev costmodel.Device) (parallel.Plan, []Candidate, error) {
	var cands []Candidate
	for dp := 1; dp <= devices; dp++ {
		if devices%dp != 0 {
			continue
		}
		for tp := 1; tp <= devices/dp; tp++ {
			if (devices/dp)%tp != 0 {
				continue
			}
			for _, zero := range []int{0, 1, 2, 3} {
				if dp == 1 && zero > 0 {
					continue
				}
				cands = append(cands, weigh(f, parallel.Plan{DP: dp, TP: tp, Zero: zero, Bucket: bucket, Device: dev}, memory, dev))
			}
		}
	}
	// Pipelines of pp stages, each run by dp × tp ranks (dp·tp·pp
	// dividing devices; ZeRO 0 or 2 with dp > 1), of pp, 2·pp and 4·pp
	// microbatches (2·pp beside tp; a count the batch does not divide is
	// listed with its error).
	for pp := 2; pp <= devices; pp++ {
		for dp := 1; dp*pp <= devices; dp++ {
			for tp := 1; dp*tp*pp <= devices; tp++ {
				if devices%(dp*tp*pp) != 0 {
					continue
				}
				for _, zero := range []int{0, 2} {
					if dp == 1 && zero > 0 {
						continue
					}
					ms := []int{pp, 2 * pp, 4 * pp}
					if tp > 1 {
						ms = []int{2 * pp}
					}
					for _, m := range ms {
						cands = append(cands, weighPipeline(f, parallel.Plan{DP: dp, TP: tp, PP: pp, Zero: zero, Bucket: bucket, Microbatches: m, Device: dev}, memory, dev))
					}
				}
			}
		}
	}
	best := -1
	for i, c := range cands {
		if c.Err != nil || !c.Fits {
			continue
		}
		if best < 0 || c.Seconds < cands[best].Seconds || c.Seconds == cands[best].Seconds && c.Peak < cands[best].Peak {
			best = i
		}
	}
	if best < 0 {
		least := slices.IndexFunc(cands, func(c Candidate) bool { return c.Err == nil })
		for i, c := range cands {
			if c.Err == nil && c.Peak < cands[least].Peak {
				least = i
			}
		}
		if least < 0 {
			return parallel.Plan{}, cands, fmt.Errorf("no plan over %d devices can be made: %v", devices, cands[0].Err)
		}
		return parallel.Plan{}, cands, fmt.Errorf("no plan over %d devices fits %s per device; the smallest, %s, needs %s", devices, diag.Bytes(memory), cands[least].Plan, diag.Bytes(cands[least].Peak))
	}
	return cands[best].Plan, cands, nil
}

// weigh partitions a copy of f by p and measures a rank's peak and step
// time.
func weigh(f *ir.Func, p parallel.Plan, memory int64, dev costmodel.Device) Candidate {
	c := Candidate{Plan: p}
	g := f.Clone()
	if _, c.Err = parallel.Partition(g, p); c.Err == nil {
		c.Peak = liveness.Analyze(g).Peak
		c.Remat = fitByRemat(&g, memory)
		fuse.Fuse(g, fuse.Options{MultiOutput: true})
		c.Seconds = dev.Simulate(g).Seconds
		c.Fits = memory <= 0 || c.Peak <= memory || c.Remat
	}
	return c
}

// fitByRemat reports whether recomputation brings *g, above memory, to
// it; if so *g becomes the recomputing function.
func fitByRemat(g **ir.Func, memory int64) bool {
	if memory <= 0 || liveness.Analyze(*g).Peak <= memory {
		return false
	}
	h := (*g).Clone()
	if _, err := remat.Rematerialize(h, memory, "greedy"); err != nil {
		return false
	}
	*g = h
	return true
}

// weighPipeline cuts a copy of f into p's stages and measures the
// largest stage's peak and the pipeline's step time (PipelineTime, each
// stage fused).
func weighPipeline(f *ir.Func, p parallel.Plan, memory int64, dev costmodel.Device) Candidate {
	c := Candidate{Plan: p}
	stages, _, err := parallel.PipelinePlan(f, p)
	if c.Err = err; err != nil {
		return c
	}
	fits := true
	for i := range stages {
		c.Peak = max(c.Peak, liveness.Analyze(stages[i]).Peak)
		if fitByRemat(&stages[i], memory) {
			c.Remat = true
		} else if memory > 0 && liveness.Analyze(stages[i]).Peak > memory {
			fits = false
		}
		fuse.Fuse(stages[i], fuse.Options{MultiOutput: true})
	}
	c.Seconds, _ = parallel.PipelineTime(stages, dev)
	c.Fits = fits
	return c
}

// searchParallel puts the fastest plan Search finds for the step as it
// stands after pipe[:at] (Request.Parallel "devices=N[,device-memory=M]
// [,bucket=B]") into pipe at at, noting every candidate on the parallel
// pass.
func (p *planner) searchParallel(m *ir.Module, pipe passes.Pipeline) (passes.Pipeline, error) {
	if p.searchAt < 0 {
		return pipe, nil
	}
	at := p.searchAt
	devices, memory, bucket := 0, int64(0), int64(25<<20)
	for _, kv := range strings.Split(p.req.Parallel, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch k {
		case "devices":
			n, err := parseCount(v)
			if err != nil || n > 4096 {
				return nil, &RequestError{fmt.Sprintf("--parallel: devices must be a count from 1 to 4096, not %q", v)}
			}
			devices = n
		case "device-memory", "bucket":
			sz, err := passes.ParseSize(v)
			if err != nil || sz.IsFrac {
				return nil, &RequestError{fmt.Sprintf("--parallel: %s takes bytes, not %q", k, v)}
			}
			if k == "bucket" {
				bucket = sz.Bytes
			} else {
				memory = sz.Bytes
			}
		default:
			return nil, &RequestError{fmt.Sprintf("--parallel: give devices (to search) or dp, tp, pp and zero, not both (%s)", k)}
		}
	}
	base, _, err := p.trial(m, pipe[:at])
	if err != nil {
		return nil, err
	}
	if len(base.Funcs) != 1 {
		return nil, &RequestError{fmt.Sprintf("--parallel devices=%d: the module has %d functions; the search plans one step", devices, len(base.Funcs))}
	}
	f := base.Funcs[0]
	best, cands, err := Search(f, devices, memory, bucket, p.req.Device)
	var lines []string
	for _, c := range cands {
		lines = append(lines, c.String())
	}
	if err != nil {
		return nil, fmt.Errorf("@%s: %v; weighed %s", f.Name, err, strings.Join(lines, "; "))
	}
	p.res.Notes = append(p.res.Notes, Note{"parallel", fmt.Sprintf("chose %s, the fastest in the cost model that fits; weighed %s", best, strings.Join(lines, "; "))})
	chosen, err := passes.ParsePipeline(fmt.Sprintf("parallel{%s,bucket=%d}", best, bucket), nil)
	if err != nil {
		return nil, err
	}
	return slices.Concat(pipe[:at], chosen, pipe[at:]), nil
}

// isSearch reports whether a --parallel spec asks for the search.
func isSearch(spec string) bool {
	for _, kv := range strings.Split(spec, ",") {
		if k, _, _ := strings.Cut(strings.TrimSpace(kv), "="); k == "devices" {
			return true
		}
	}
	return false
}

func parseCount(s string) (int, error) {
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n < 1 || fmt.Sprint(n) != s {
		return 0, fmt.Errorf("%q is not a count of at least 1", s)
	}
	return n, nil
}
