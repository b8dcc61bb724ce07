package driver

import (
	"bytes"
	"flag"

	"github.com/kiln-compiler/kiln/memreport"
)

func init() {
	addCommand(&command{
		name:    "mem",
		usage:   "kiln mem IN [--passes P] [--json] [--timeline FILE]",
		summary: "memory report: bytes of parameters, inputs and outputs, peak, arena, planned, fragmentation, FLOPs, the largest values at the peak",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var pf pipelineFlags
			pf.register(fs)
			asJSON := fs.Bool("json", false, "write the report as JSON")
			timeline := fs.String("timeline", "", "write a Chrome trace of live bytes and buffers to FILE (Perfetto opens it)")
			fn := fs.String("func", "", "function to report (default: the first)")
			return func(e *env, args []string) error {
				in, mg, err := pf.load(e, args)
				if err != nil {
					return err
				}
				f, err := pickFunc(in, *fn)
				if err != nil {
					return err
				}
				var ps []memreport.Pass
				for _, r := range mg.Runs {
					p := memreport.Pass{Name: r.Name}
					if pf.timing {
						s := r.Seconds
						p.Seconds = &s
					}
					ps = append(ps, p)
				}
				rep := memreport.Build(f, ps)
				if *timeline != "" {
					var b bytes.Buffer
					if err := rep.WriteTimeline(&b); err != nil {
						return err
					}
					if err := writeOutput(e, *timeline, b.Bytes(), args[0]); err != nil {
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
