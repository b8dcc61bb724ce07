package driver

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/plancheck"
	"github.com/kiln-compiler/kiln/progress"
)

func init() {
	addCommand(&command{
		name:    "plan-check",
		usage:   "kiln plan-check DIR [--replay | --fast] [--seed N] [--timeline FILE] [--html FILE]",
		summary: "replay a CUDA launch plan on the CPU: races, stale or unwritten reads, overlapping buffers, results against the interpreter; print the simulated timeline",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			seed := fs.Uint64("seed", 1, "seed of the random arguments")
			tl := fs.String("timeline", "", "write the simulated timeline as Chrome trace JSON to FILE")
			forceReplay := fs.Bool("replay", false, fmt.Sprintf("replay the numbers against the interpreter whatever the step's size (by default only steps up to %.0f GFLOPs are replayed)", plancheck.ReplayFLOPs/1e9))
			htmlOut := fs.String("html", "", "write a self-contained HTML page of the plan to FILE: what was checked, the streams over time, device and host memory over time")
			fast := fs.Bool("fast", false, "check structure, memory, races and lifetimes only, without the numeric replay")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usageError{"want exactly one plan directory"}
				}
				for _, name := range cuda.Files {
					e.files.Read(filepath.Join(args[0], name))
				}
				if *forceReplay && *fast {
					return usageError{"give --replay or --fast, not both"}
				}
				if !fileExists(filepath.Join(args[0], "plan.json")) && fileExists(filepath.Join(args[0], "stage0", "plan.json")) {
					if *tl != "" || *htmlOut != "" {
						return usageError{"--timeline and --html show one plan: give a stage's directory (DIR/stage0, …) with --fast"}
					}
					return planCheckStages(e, args[0], *seed, *forceReplay, *fast)
				}
				lp, err := plancheck.LoadDir(args[0])
				if err != nil {
					return fmt.Errorf("%s: error: %v", args[0], err)
				}
				lp.Progress = progress.For(e.terminal)
				lp.MemoryLimit = availableMemory() / 2
				flops := plancheck.StepFLOPs(lp.Func)
				check := plancheck.CheckStructure
				if *forceReplay || !*fast && flops <= plancheck.ReplayFLOPs {
					check = func(lp *plancheck.Plan) (*plancheck.Report, error) { return plancheck.CheckPlan(lp, *seed) }
				}
				r, err := check(lp)
				if err != nil {
					return fmt.Errorf("%s: error: %v", args[0], err)
				}
				if r.Ranks > 1 {
					fmt.Fprintf(e.stdout, "plan %s: ok (%d nodes: %d kernel launches%s, %d copies, %d NCCL calls, %d events; %d ranks)\n", args[0], r.Nodes, r.Kernels, libraryCalls(r), r.Copies, r.Collectives, r.Events, r.Ranks)
				} else {
					fmt.Fprintf(e.stdout, "plan %s: ok (%d nodes: %d kernel launches%s, %d copies, %d events)\n", args[0], r.Nodes, r.Kernels, libraryCalls(r), r.Copies, r.Events)
				}
				switch {
				case r.Replayed && r.Ranks > 1:
					fmt.Fprintf(e.stdout, "checked         structure, memory, races, lifetimes; results replayed against the interpreter on all %d ranks together\n", r.Ranks)
				case r.Replayed:
					fmt.Fprintf(e.stdout, "checked         structure, memory, races, lifetimes; results replayed against the interpreter%s\n", recomputed(r))
				case *fast:
					fmt.Fprintf(e.stdout, "checked         structure, memory, races, lifetimes (--fast: results not replayed)\n")
				default:
					fmt.Fprintf(e.stdout, "checked         structure, memory, races, lifetimes; results not replayed: the step's %.1f GFLOPs are above %.0f (--replay forces it)\n", flops/1e9, plancheck.ReplayFLOPs/1e9)
				}
				fmt.Fprintf(e.stdout, "simulated step  %10.1f us\n", r.Seconds*1e6)
				fmt.Fprintf(e.stdout, "compute         %10.1f us\n", r.ComputeSeconds*1e6)
				fmt.Fprintf(e.stdout, "copies          %10.1f us\n", r.CopySeconds*1e6)
				if r.HostCalls > 0 {
					fmt.Fprintf(e.stdout, "host            %10.1f us (%d calls: updates of parameters held in host memory)\n", r.HostSeconds*1e6, r.HostCalls)
				}
				if r.Collectives > 0 {
					fmt.Fprintf(e.stdout, "collectives     %10.1f us (NCCL, on the communication stream)\n", r.CommSeconds*1e6)
				}
				fmt.Fprintf(e.stdout, "compute stalled %10.1f us (waiting for copies)\n", r.StallSeconds*1e6)
				if *htmlOut != "" {
					var b bytes.Buffer
					if err := plancheck.WriteHTML(&b, lp.Plan, r); err != nil {
						return err
					}
					if err := writeOutput(e, *htmlOut, b.Bytes()); err != nil {
						return err
					}
				}
				if *tl != "" {
					data, err := traceJSON(r, lp.Plan)
					if err != nil {
						return err
					}
					if err := writeOutput(e, *tl, data); err != nil {
						return err
					}
				}
				return nil
			}
		},
	})
}

// traceJSON is the timeline in Chrome's trace event format (Perfetto
// opens it): one complete event per node on a track named after its
// stream, in microseconds of simulated time, and counter tracks of the
// device and host bytes live as each op starts.
func traceJSON(r *plancheck.Report, p *cuda.Plan) ([]byte, error) {
	type event struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  float64        `json:"dur,omitempty"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		Args map[string]any `json:"args"`
	}
	events := []event{{Name: "process_name", Ph: "M", Pid: 1, Args: map[string]any{"name": "plan " + p.Function}}}
	for _, st := range p.Streams {
		events = append(events, event{Name: "thread_name", Ph: "M", Pid: 1, Tid: st.ID, Args: map[string]any{"name": fmt.Sprintf("stream %d (%s)", st.ID, st.Name)}})
	}
	start := map[int]float64{} // op -> when its first node starts
	for _, s := range r.Timeline {
		events = append(events, event{Name: s.Name, Ph: "X", Ts: s.Start * 1e6, Dur: (s.Finish - s.Start) * 1e6, Pid: 1, Tid: s.Stream, Args: map[string]any{"node": s.Node}})
		if op := p.Nodes[s.Node].Op; op >= 0 {
			if t, ok := start[op]; !ok || s.Start < t {
				start[op] = s.Start
			}
		}
	}
	ops := make([]int, 0, len(start))
	for op := range start {
		ops = append(ops, op)
	}
	sort.Ints(ops)
	for _, space := range []string{"device", "host"} {
		diff := map[int]int64{}
		for _, b := range p.Buffers {
			if b.Space == space {
				diff[b.FirstOp] += b.SizeBytes
				diff[b.LastOp+1] -= b.SizeBytes
			}
		}
		live, prev := int64(0), 0
		for _, op := range ops {
			for i := prev; i <= op; i++ {
				live += diff[i]
			}
			prev = op + 1
			events = append(events, event{Name: space + " memory", Ph: "C", Ts: start[op] * 1e6, Pid: 1, Args: map[string]any{"bytes": live}})
		}
	}
	b, err := json.MarshalIndent(map[string]any{"traceEvents": events, "displayTimeUnit": "ms"}, "", " ")
	return append(b, '\n'), err
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// planCheckStages checks the plans of a pipeline's stages, DIR/stage0,
// DIR/stage1, …, replaying them together (their sends meet their recvs).
func planCheckStages(e *env, dir string, seed uint64, forceReplay, fast bool) error {
	var lps []*plancheck.Plan
	flops := 0.0
	for s := 0; fileExists(filepath.Join(dir, fmt.Sprintf("stage%d", s), "plan.json")); s++ {
		sub := filepath.Join(dir, fmt.Sprintf("stage%d", s))
		for _, name := range cuda.Files {
			e.files.Read(filepath.Join(sub, name))
		}
		lp, err := plancheck.LoadDir(sub)
		if err != nil {
			return fmt.Errorf("%s: error: %v", sub, err)
		}
		flops += plancheck.StepFLOPs(lp.Func) * float64(max(1, lp.Ranks))
		lps = append(lps, lp)
	}
	lps[0].Progress = progress.For(e.terminal)
	lps[0].MemoryLimit = availableMemory() / 2
	replay := forceReplay || !fast && flops <= plancheck.ReplayFLOPs
	reports, err := plancheck.CheckStages(lps, seed, replay)
	if err != nil {
		return fmt.Errorf("%s: error: %v", dir, err)
	}
	ranks := max(1, lps[0].Ranks)
	fmt.Fprintf(e.stdout, "pipeline %s: ok (%d stages of %d rank(s) each)\n", dir, len(lps), ranks)
	for s, r := range reports {
		fmt.Fprintf(e.stdout, "stage %d         %d nodes: %d kernel launches%s, %d copies, %d NCCL calls, %d events; simulated %.1f us\n", s, r.Nodes, r.Kernels, libraryCalls(r), r.Copies, r.Collectives, r.Events, r.Seconds*1e6)
	}
	switch {
	case replay:
		fmt.Fprintf(e.stdout, "checked         structure, memory, races, lifetimes of each stage; results replayed against the interpreter on all %d ranks together, sends meeting recvs\n", len(lps)*ranks)
	case fast:
		fmt.Fprintf(e.stdout, "checked         structure, memory, races, lifetimes of each stage (--fast: results not replayed)\n")
	default:
		fmt.Fprintf(e.stdout, "checked         structure, memory, races, lifetimes of each stage; results not replayed: the stages' %.1f GFLOPs are above %.0f (--replay forces it)\n", flops/1e9, plancheck.ReplayFLOPs/1e9)
	}
	return nil
}

// libraryCalls is ", N library calls" for a plan that makes any.
func libraryCalls(r *plancheck.Report) string {
	if r.LibraryCalls == 0 {
		return ""
	}
	return fmt.Sprintf(", %d library calls", r.LibraryCalls)
}

// recomputed says how many library calls the replay recomputed.
func recomputed(r *plancheck.Report) string {
	if r.GEMMsChecked == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d library calls recomputed from their parameters)", r.GEMMsChecked)
}
