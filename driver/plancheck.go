package driver

import (
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/plancheck"
)

func init() {
	addCommand(&command{
		name:    "plan-check",
		usage:   "kiln plan-check DIR [--seed N] [--timeline FILE]",
		summary: "replay a CUDA launch plan on the CPU: races, stale or unwritten reads, overlapping buffers, results against the interpreter; print the simulated timeline",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			seed := fs.Uint64("seed", 1, "seed of the random arguments")
			tl := fs.String("timeline", "", "write the simulated timeline as Chrome trace JSON to FILE")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usageError{"want exactly one plan directory"}
				}
				for _, name := range cuda.Files {
					e.files.Read(filepath.Join(args[0], name))
				}
				lp, err := plancheck.LoadDir(args[0])
				if err != nil {
					return fmt.Errorf("%s: error: %v", args[0], err)
				}
				r, err := plancheck.CheckPlan(lp, *seed)
				if err != nil {
					return fmt.Errorf("%s: error: %v", args[0], err)
				}
				fmt.Fprintf(e.stdout, "plan %s: ok (%d nodes: %d kernel launches, %d copies, %d events)\n", args[0], r.Nodes, r.Kernels, r.Copies, r.Events)
				fmt.Fprintf(e.stdout, "simulated step  %10.1f us\n", r.Seconds*1e6)
				fmt.Fprintf(e.stdout, "compute         %10.1f us\n", r.ComputeSeconds*1e6)
				fmt.Fprintf(e.stdout, "copies          %10.1f us\n", r.CopySeconds*1e6)
				fmt.Fprintf(e.stdout, "compute stalled %10.1f us (waiting for copies)\n", r.StallSeconds*1e6)
				if *tl != "" {
					data, err := traceJSON(r)
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

// traceJSON is the timeline in Chrome's trace event format: one complete
// event per node, a thread per stream, microseconds.
func traceJSON(r *plancheck.Report) ([]byte, error) {
	type event struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  float64        `json:"dur"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		Args map[string]any `json:"args"`
	}
	events := []event{}
	for _, s := range r.Timeline {
		events = append(events, event{Name: s.Name, Ph: "X", Ts: s.Start * 1e6, Dur: (s.Finish - s.Start) * 1e6, Pid: 1, Tid: s.Stream, Args: map[string]any{"node": s.Node}})
	}
	b, err := json.MarshalIndent(map[string]any{"traceEvents": events, "displayTimeUnit": "ns"}, "", " ")
	return append(b, '\n'), err
}
