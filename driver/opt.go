package driver

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/progress"
)

// pipelineFlags are the flags shared by every command that runs passes.
type pipelineFlags struct {
	passes           string
	printBefore      string
	printAfter       string
	printAfterAll    bool
	printAfterChange bool
	printConstants   bool
	// observe, when set, sees the module before and after each pass.
	observe       func(pass string, m *ir.Module)
	verifyEach    bool
	timing        bool
	timingFormat  string
	stats         bool
	dumpDir       string
	reproducerDir string
	pluginDir     string
	pluginTimeout time.Duration
	loadPlugins   inputFlags
	batch         int64
	printPipeline bool
	// budgetsOf, when set, is the pipeline whose result the fractions of
	// --budget and --device-budget refer to ("" for the input itself).
	budgetsOf *string
	// allow names the approximations the passes may make (--allow).
	allow listFlag
	// need is what the command's backend needs when the pipeline ends
	// (arena offsets for compiled code).
	need []passes.Property
}

// listFlag is a flag that may be given several times, each a
// comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func (p *pipelineFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.passes, "passes", "", "pass pipeline, e.g. 'dce,cse,reorder{algo=best}'")
	fs.BoolVar(&p.printPipeline, "print-pipeline", false, "print the pass pipeline that runs (after -O levels and budgets expand) to stderr")
	fs.Int64Var(&p.batch, "batch", 0, "with an ONNX input: replace the first dimension of the data inputs (0 keeps the model's)")
	fs.StringVar(&p.printBefore, "print-ir-before", "", "comma-separated passes before which to print the IR (to stderr)")
	fs.StringVar(&p.printAfter, "print-ir-after", "", "comma-separated passes after which to print the IR (to stderr)")
	fs.BoolVar(&p.printAfterAll, "print-ir-after-all", false, "print the IR after every pass")
	fs.BoolVar(&p.printAfterChange, "print-ir-after-change", false, "print the IR after every pass that changed it")
	fs.BoolVar(&p.printConstants, "print-constants", false, "print large constants whole in --print-ir-* dumps (they are elided to their type and size otherwise; -o output and dump-dir files are always whole)")
	fs.BoolVar(&p.verifyEach, "verify-each", true, "verify the IR after every pass")
	fs.BoolVar(&p.timing, "timing", false, "report the wall time of each pass (to stderr)")
	fs.StringVar(&p.timingFormat, "timing-format", "text", "timing report format: text or json")
	fs.BoolVar(&p.stats, "stats", false, "print pass statistics (to stderr)")
	fs.StringVar(&p.dumpDir, "dump-dir", "", "write the IR after each pass to DIR/NN-pass.kir")
	fs.StringVar(&p.reproducerDir, "reproducer-dir", "", "where a failing pass leaves its reproducer (default: the temp folder)")
	fs.StringVar(&p.pluginDir, "plugin-dir", "", "where ext:NAME passes (programs kiln-pass-NAME) are looked up before PATH")
	fs.DurationVar(&p.pluginTimeout, "plugin-timeout", time.Minute, "time limit of one external pass run")
	fs.Var(&p.loadPlugins, "load-pass-plugin", "FILE.so: load passes built with go build -buildmode=plugin (repeatable)")
	fs.Var(&p.allow, "allow", "let the passes make the approximation `NAME` (repeatable, or comma-separated): "+strings.Join(passes.ApproximationNames(), ", "))
}

func nameSet(list string) map[string]bool {
	out := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out[n] = true
		}
	}
	return out
}

// load reads the single input IN and runs the pipeline on it.
func (p *pipelineFlags) load(e *env, args []string) (*input, *passes.Manager, error) {
	if len(args) != 1 {
		return nil, nil, usageError{"want exactly one input file (or - for standard input)"}
	}
	if p.batch < 0 {
		return nil, nil, usageError{fmt.Sprintf("--batch must be positive (0 keeps the model's), not %d", p.batch)}
	}
	in, err := readModule(e, args[0], onnx.Options{Batch: p.batch})
	if err != nil {
		return nil, nil, err
	}
	mg, err := p.run(e, in, p.passes)
	if err != nil {
		return nil, nil, err
	}
	return in, mg, nil
}

// run parses the pipeline and applies it to in's module, reporting
// timing and statistics on stderr. It returns the manager for reports.
func (p *pipelineFlags) run(e *env, in *input, pipeline string) (*passes.Manager, error) {
	if p.timingFormat != "text" && p.timingFormat != "json" {
		return nil, usageError{fmt.Sprintf("--timing-format must be text or json, not %q", p.timingFormat)}
	}
	if err := passes.CheckAllowed(p.allow); err != nil {
		return nil, usageError{"--allow: " + err.Error()}
	}
	for _, so := range p.loadPlugins {
		if err := passes.LoadPlugin(so); err != nil {
			return nil, fmt.Errorf("kiln: %v", err)
		}
	}
	pipe, err := passes.ParsePipeline(pipeline, passes.ExternalResolver(p.pluginDir, p.pluginTimeout))
	if err != nil {
		return nil, usageError{err.Error()}
	}
	if p.budgetsOf != nil {
		if pipe, err = resolveBudgets(e, in.module, pipe, *p.budgetsOf); err != nil {
			return nil, fmt.Errorf("%s: error: %v", in.name, err)
		}
		pipeline = pipe.String()
	}
	pipe, placed := choosePlacement(e, in.module, pipe, p.verifyEach)
	if placed != "" {
		pipeline = pipe.String()
	}
	if p.printPipeline {
		fmt.Fprintf(e.stderr, "pipeline: %s\n", pipeline)
	}
	for name := range nameSet(p.printBefore + "," + p.printAfter) {
		if passes.Lookup(name) == nil && !strings.HasPrefix(name, passes.ExternalPrefix) {
			return nil, fmt.Errorf("kiln: --print-ir-before/--print-ir-after name unknown pass %q", name)
		}
	}
	mg := &passes.Manager{Allow: p.allow, Need: p.need, Inst: passes.Instrumentation{
		PrintBefore:      nameSet(p.printBefore),
		PrintAfter:       nameSet(p.printAfter),
		PrintAfterAll:    p.printAfterAll,
		PrintAfterChange: p.printAfterChange,
		PrintConstants:   p.printConstants,
		VerifyEach:       p.verifyEach,
		DumpDir:          p.dumpDir,
		ReproducerDir:    p.reproducerDir,
		Log:              e.stderr,
		Files:            e.files,
		Progress:         progress.For(e.stderr),
		Observe:          p.observe,
	}}
	var orig *ir.Module
	if p.budgetsOf != nil && offloadable(pipe) {
		orig = cloneModule(in.module)
	}
	runErr := mg.Run(in.module, pipe)
	var pe *passes.PassError
	if orig != nil && errors.As(runErr, &pe) && pe.Pass == "remat" {
		// The toolbox's next tool: offload and swap what recomputation
		// and microbatching cannot reach.
		tries, err := withOffload(e, orig, pipe, p.verifyEach)
		var splitErr error
		maxSplit := 0
		failedIn := make([]string, len(tries)) // the pass each failed try stopped in
		for i, try := range tries {
			if try.base >= 0 && failedIn[try.base] != "swap" {
				continue // it would stop where its base did
			}
			if p.printPipeline {
				fmt.Fprintf(e.stderr, "pipeline: %s\n", try.pipe)
			}
			m := cloneModule(orig)
			mg2 := &passes.Manager{Inst: mg.Inst, Allow: mg.Allow, Need: mg.Need}
			if terr := mg2.Run(m, try.pipe); terr != nil {
				var tpe *passes.PassError
				if errors.As(terr, &tpe) {
					failedIn[i] = tpe.Pass
				}
				if try.split > 0 && (splitErr == nil || !errors.As(terr, &tpe) || tpe.Pass != "microbatch") {
					// The last split that could be made names why it failed.
					splitErr, maxSplit = terr, try.split
				} else if try.split == 0 {
					err = terr // the report names the last try of the whole step
				}
				continue
			}
			in.module.Funcs, mg, runErr, pipe = m.Funcs, mg2, nil, try.pipe
			for i := range mg.Runs {
				if mg.Runs[i].Name == "swap" {
					mg.Runs[i].Stats = append(mg.Runs[i].Stats, passes.Stat{Name: "note", Value: try.note})
				}
			}
			break
		}
		if runErr != nil && err != nil {
			runErr = fmt.Errorf("%v\nwith offloading too: %v", runErr, err)
		}
		if runErr != nil && splitErr != nil {
			// Only the headline: its live values are the whole step's, split.
			head, _, _ := strings.Cut(splitErr.Error(), "\n")
			var tpe *passes.PassError
			if errors.As(splitErr, &tpe) && tpe.Pass == "microbatch" {
				// No split could be made: say why the first could not.
				runErr = fmt.Errorf("%v\nno split into microbatches could be made: %s", runErr, head)
			} else {
				runErr = fmt.Errorf("%v\nsplit into %d microbatches, then offloaded: %s", runErr, maxSplit, head)
			}
		}
	}
	if placed != "" {
		for i := range mg.Runs {
			if mg.Runs[i].Name == "optimizer" {
				mg.Runs[i].Stats = append(mg.Runs[i].Stats, passes.Stat{Name: "note", Value: placed})
			}
		}
	}
	if p.timing {
		if err := mg.WriteTiming(e.stderr, p.timingFormat == "json"); err != nil {
			return nil, err
		}
	}
	if p.stats {
		mg.WriteStats(e.stderr)
	}
	var ce *passes.ContractError
	if errors.As(runErr, &ce) {
		return nil, usageError{"pipeline " + pipe.String() + ": " + ce.Msg}
	}
	if runErr != nil {
		return nil, fmt.Errorf("%s: error: %v", in.name, runErr)
	}
	return mg, nil
}

func init() {
	addCommand(&command{
		name:    "opt",
		usage:   "kiln opt IN [--passes P] [-o OUT]",
		summary: "parse, verify, run passes and print the IR (without passes: a checker)",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var pf pipelineFlags
			pf.register(fs)
			out := fs.String("o", "-", "output file (- for standard output)")
			return func(e *env, args []string) error {
				in, _, err := pf.load(e, args)
				if err != nil {
					return err
				}
				return writeOutput(e, *out, []byte(in.module.String()))
			}
		},
	})
	addCommand(&command{
		name:    "passes",
		usage:   "kiln passes",
		summary: "list every pass with its summary and options",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			return func(e *env, args []string) error {
				if len(args) != 0 {
					return usageError{"takes no arguments"}
				}
				for _, p := range passes.All() {
					fmt.Fprintf(e.stdout, "%s\n    %s\n", p.Name, p.Summary)
					for _, c := range []struct {
						what  string
						props []passes.Property
					}{{"needs", p.Requires}, {"cannot run on", p.Excludes}, {"makes", p.Establishes}, {"undoes", p.Invalidates}} {
						if len(c.props) > 0 {
							words := make([]string, len(c.props))
							for i, q := range c.props {
								words[i] = q.String()
							}
							fmt.Fprintf(e.stdout, "    %s: %s\n", c.what, strings.Join(words, ", "))
						}
					}
					for _, o := range p.Options {
						kind := o.Kind.String()
						if o.Kind == passes.EnumOption {
							kind = strings.Join(o.Enum, "|")
						}
						if o.Range != "" {
							if o.Kind == passes.SizeOption {
								kind += ", a fraction in " + o.Range
							} else {
								kind += " in " + o.Range
							}
						}
						def := ""
						if o.Default != "" {
							def = " (default " + o.Default + ")"
						}
						fmt.Fprintf(e.stdout, "    %s=<%s>%s: %s\n", o.Name, kind, def, o.Doc)
					}
				}
				return nil
			}
		},
	})
}

// writeOutput writes data to path ("-" is standard output), never over
// an input of the command or another of its outputs.
func writeOutput(e *env, path string, data []byte) error {
	return writeOutputMode(e, path, data, 0o644)
}

func writeOutputMode(e *env, path string, data []byte, mode os.FileMode) error {
	if path == "-" || path == "" {
		_, err := e.stdout.Write(data)
		return err
	}
	if err := e.files.Write(path, data, mode); err != nil {
		return fmt.Errorf("kiln: cannot write %s: %v", path, unwrapPathError(err))
	}
	return nil
}
