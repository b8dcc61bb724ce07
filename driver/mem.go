package driver

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passes/remat"
	"github.com/kiln-compiler/kiln/progress"

	"github.com/kiln-compiler/kiln/memreport"
)

func init() {
	addCommand(&command{
		name:    "mem",
		usage:   "kiln mem IN [--train[=sum|mean] [--microbatches N]] [--optimizer KIND] [--passes P | -O0..-O3 [--budget B] [--device-budget B]] [--json] [--timeline FILE] [--html FILE] [--remat-sweep]",
		summary: "memory report: bytes of parameters, inputs and outputs, peak, arena, planned, fragmentation, FLOPs, the largest values at the peak",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var pf pipelineFlags
			pf.register(fs)
			pf.levels = &optLevels{}
			pf.levels.register(fs)
			asJSON := fs.Bool("json", false, "write the report as JSON")
			timeline := fs.String("timeline", "", "write a Chrome trace of live bytes and buffers to FILE (Perfetto opens it)")
			htmlOut := fs.String("html", "", "write the report as a self-contained HTML page to FILE (live bytes by category over the schedule, the peak and its culprits)")
			fn := fs.String("func", "", "function to report (default: the first)")
			sweep := fs.Bool("remat-sweep", false, "print peak and added FLOPs of remat at budgets from 100% down to the smallest reachable")
			sweepSolver := fs.String("remat-solver", "best", "remat solver for --remat-sweep")
			return func(e *env, args []string) error {
				if *sweep {
					in, _, err := pf.load(e, args)
					if err != nil {
						return err
					}
					f, err := pickFunc(in, *fn)
					if err != nil {
						return err
					}
					if !slices.Contains(sweepSolvers, *sweepSolver) {
						return usageError{fmt.Sprintf("--remat-solver must be one of %s, not %q%s", strings.Join(sweepSolvers, ", "), *sweepSolver, diag.DidYouMean(*sweepSolver, sweepSolvers))}
					}
					return rematSweep(e, f, *sweepSolver, *asJSON)
				}
				// Each pass's effect on the function: the HTML page's
				// comparison and the mechanisms of every report.
				var effects []memreport.Effect
				dev, err := costmodel.ParseDevice(pf.device)
				if err != nil {
					return usageError{"--device: " + err.Error()}
				}
				pf.observe = func(pass string, m *ir.Module, a *passes.Analyses) {
					g := m.Func(*fn)
					if *fn == "" && len(m.Funcs) > 0 {
						g = m.Funcs[0]
					}
					if g != nil {
						effects = append(effects, memreport.Measure(pass, g, a.Liveness(g), dev))
					}
				}
				in, res, err := pf.load(e, args)
				if err != nil {
					return err
				}
				f, err := pickFunc(in, *fn)
				if err != nil {
					return err
				}
				rep := res.Report(f, pf.timing)
				ps := rep.Passes
				if stages := parallel.Stages(in.module); len(stages) > 1 && *fn == "" {
					// Pipeline stages: a plan each; the report is the
					// largest's, with each stage's as its ranks'.
					var ranks []memreport.RankReport
					for s, g := range stages {
						r := memreport.Build(g, ps, dev)
						for range parallel.RanksOf(g) {
							ranks = append(ranks, memreport.RankOf(g, r, len(ranks)))
						}
						if r.PlannedBytes > rep.PlannedBytes || s == 0 {
							f, rep = g, r
						}
					}
					rep.Ranks = ranks
				} else if n := parallel.RanksOf(f); n > 1 {
					// The ranks of an SPMD step plan alike.
					r0 := memreport.RankOf(f, rep, 0)
					for r := 0; r < n; r++ {
						rr := r0
						rr.Rank = r
						rep.Ranks = append(rep.Ranks, rr)
					}
				}
				if n := len(res.Runs) + 1; len(effects) > n {
					// A pipeline tried again (--budget going on to
					// offload): the last run's effects are the plan's.
					effects = effects[len(effects)-n:]
				}
				if len(effects) == len(res.Runs)+1 {
					rep.Mechanisms = memreport.Mechanisms(effects)
				}
				if *htmlOut != "" {
					rep.Effects = effects
				}
				if *timeline != "" {
					var b bytes.Buffer
					if err := rep.WriteTimeline(&b); err != nil {
						return err
					}
					if err := writeOutput(e, *timeline, b.Bytes()); err != nil {
						return err
					}
				}
				if *htmlOut != "" {
					var b bytes.Buffer
					if err := rep.WriteHTML(&b); err != nil {
						return err
					}
					if err := writeOutput(e, *htmlOut, b.Bytes()); err != nil {
						return err
					}
				}
				if *asJSON {
					return rep.WriteJSON(e.stdout)
				}
				return rep.WriteText(e.stdout)
			}
		},
	})
}

// sweepPoint is one budget of a remat sweep.
type sweepPoint struct {
	Budget         float64 `json:"budget"`
	BudgetBytes    int64   `json:"budget_bytes"`
	PeakBytes      int64   `json:"peak_bytes"`
	RecomputeFLOPs int64   `json:"recompute_flops"`
	ExtraPercent   float64 `json:"extra_flops_percent"`
	Solver         string  `json:"solver"`
}

// rematSweep runs remat on copies of f at budgets of 100%, 90%, ... of
// its peak, down to the first budget it cannot meet.
// sweepSolvers are the remat solvers --remat-solver accepts.
var sweepSolvers = []string{"best", "cheap", "greedy", "sqrt", "exact"}

func rematSweep(e *env, f *ir.Func, solver string, asJSON bool) error {
	text := f.String()
	peak := liveness.Analyze(f).Peak
	total := int64(0)
	for _, op := range f.Body {
		total += ir.OpCost(op).FLOPs
	}
	var points []sweepPoint
	prog := progress.For(e.terminal)
	defer prog.Done()
	for pct := 100; pct >= 5; pct -= 5 {
		prog.Step("remat sweep: budget %d%% of the peak", pct)
		m, err := parser.Parse("sweep", text)
		if err != nil {
			return err
		}
		g := m.Funcs[0]
		budget := peak * int64(pct) / 100
		res, err := remat.Rematerialize(g, budget, solver)
		if err != nil {
			// The sweep ends at the first budget no solver reaches; say so
			// with the reason (its first line: the floor and what is live).
			prog.Done()
			reason, _, _ := strings.Cut(err.Error(), "\n")
			fmt.Fprintf(e.stderr, "remat sweep: stops at %d%%: %s\n", pct, reason)
			break
		}
		extra := 0.0
		if total > 0 {
			extra = 100 * float64(res.FLOPs) / float64(total)
		}
		points = append(points, sweepPoint{Budget: float64(pct) / 100, BudgetBytes: budget, PeakBytes: res.Peak, RecomputeFLOPs: res.FLOPs, ExtraPercent: extra, Solver: res.Solver})
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"func": f.Name, "peak_bytes": peak, "flops": total, "points": points})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "budget\tbudget bytes\tpeak bytes\textra FLOPs\tsolver\t\n")
	for _, p := range points {
		fmt.Fprintf(tw, "%.0f%%\t%d\t%d\t%.2f%%\t%s\t\n", 100*p.Budget, p.BudgetBytes, p.PeakBytes, p.ExtraPercent, p.Solver)
	}
	return tw.Flush()
}
