package driver

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/planner"
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
	observe       func(pass string, m *ir.Module, a *passes.Analyses)
	verifyEach    bool
	validate      bool // --verify-each=interp: plugins' output by translation validation too
	timing        bool
	timingFormat  string
	stats         bool
	dumpDir       string
	reproducerDir string
	pluginDir     string
	pluginTimeout time.Duration
	loadPlugins   inputFlags
	batch         int64
	runningVar    string
	// inputs are the --input NAME=FILE.npy flags: arguments of kiln run,
	// and ONNX graph inputs that a node needs at import time.
	inputs inputFlags
	// argumentInputs: --input also gives arguments' values (kiln run).
	argumentInputs bool
	printPipeline  bool
	// allow names the approximations the passes may make (--allow).
	allow listFlag
	// device is the device every estimate models (--device).
	device string
	// need is what the command's backend needs when the pipeline ends
	// (arena offsets for compiled code).
	need []passes.Property
	// levels, when the command takes them, are -O0..-O3, the budgets and
	// the training flags.
	levels *optLevels
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
	fs.StringVar(&p.runningVar, "running-var", "", runningVarHelp)
	fs.Var(&p.inputs, "input", "NAME=FILE.npy: the value of argument NAME (kiln run), or of an ONNX graph input that a node needs when the model is imported, such as a Reduce's axes (repeatable)")
	fs.StringVar(&p.printBefore, "print-ir-before", "", "comma-separated passes before which to print the IR (to stderr)")
	fs.StringVar(&p.printAfter, "print-ir-after", "", "comma-separated passes after which to print the IR (to stderr)")
	fs.BoolVar(&p.printAfterAll, "print-ir-after-all", false, "print the IR after every pass")
	fs.BoolVar(&p.printAfterChange, "print-ir-after-change", false, "print the IR after every pass that changed it")
	fs.BoolVar(&p.printConstants, "print-constants", false, "print large constants whole in --print-ir-* dumps (they are elided to their type and size otherwise; -o output and dump-dir files are always whole)")
	p.verifyEach = true
	fs.Var(verifyFlag{p}, "verify-each", "verify the IR after every pass: true, false, or interp (also run the interpreter before and after every external pass and compare)")
	fs.BoolVar(&p.timing, "timing", false, "report the wall time of each pass (to stderr)")
	fs.StringVar(&p.timingFormat, "timing-format", "text", "timing report format: text or json")
	fs.BoolVar(&p.stats, "stats", false, "print pass statistics (to stderr)")
	fs.StringVar(&p.dumpDir, "dump-dir", "", "write the IR after each pass to DIR/NN-pass.kir")
	fs.StringVar(&p.reproducerDir, "reproducer-dir", "", "where a failing pass leaves its reproducer (none unless given)")
	fs.StringVar(&p.pluginDir, "plugin-dir", "", "where ext:NAME passes (programs kiln-pass-NAME) are looked up before PATH")
	fs.DurationVar(&p.pluginTimeout, "plugin-timeout", time.Minute, "time limit of one external pass run")
	fs.Var(&p.loadPlugins, "load-pass-plugin", "FILE.so: load passes built with go build -buildmode=plugin (repeatable)")
	fs.StringVar(&p.device, "device", "", "the device the passes and reports model: a preset ("+strings.Join(devicePresets(), ", ")+"), rates (flops=67e12,mem-bw=3.35e12,link-bw=64e9,launch=2e-6,comm-bw=450e9,comm-latency=5e-6,host-bw=100e9), or a preset then the rates that differ (default: default)")
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

// load reads the single input IN and plans it as the flags ask.
func (p *pipelineFlags) load(e *env, args []string) (*input, *planner.Result, error) {
	if len(args) != 1 {
		return nil, nil, usageError{"want exactly one input file (or - for standard input)"}
	}
	if p.batch < 0 {
		return nil, nil, usageError{fmt.Sprintf("--batch must be positive (0 keeps the model's), not %d", p.batch)}
	}
	req, err := p.request()
	if err != nil {
		return nil, nil, err
	}
	if err := checkRunningVar(p.runningVar); err != nil {
		return nil, nil, err
	}
	values, err := importValues(e, p.inputs)
	if err != nil {
		return nil, nil, err
	}
	in, err := readModule(e, args[0], onnx.Options{Batch: p.batch, RunningVar: p.runningVar, Value: values})
	if err != nil {
		return nil, nil, err
	}
	if !p.argumentInputs {
		for _, spec := range p.inputs {
			if name, _, _ := strings.Cut(spec, "="); !slices.Contains(in.bound, name) {
				return nil, nil, fmt.Errorf("kiln: --input %s: no node of the model needs it when the model is imported (this command takes --input only for those; kiln run takes any argument's)", name)
			}
		}
	}
	res, err := p.plan(e, in, req)
	if err != nil {
		return nil, nil, err
	}
	return in, res, nil
}

// request is what the flags ask of the planner.
func (p *pipelineFlags) request() (planner.Request, error) {
	if p.timingFormat != "text" && p.timingFormat != "json" {
		return planner.Request{}, usageError{fmt.Sprintf("--timing-format must be text or json, not %q", p.timingFormat)}
	}
	dev, err := costmodel.ParseDevice(p.device)
	if err != nil {
		return planner.Request{}, usageError{"--device: " + err.Error()}
	}
	req := planner.NewRequest()
	if p.levels != nil {
		if req, err = p.levels.request(); err != nil {
			return planner.Request{}, err
		}
	}
	req.Passes, req.Allow, req.Need, req.Device = p.passes, p.allow, p.need, dev
	if err := req.Check(); err != nil {
		return req, usageError{err.Error()}
	}
	return req, nil
}

// plan rewrites in's module as req asks, reporting the pipeline, timing
// and statistics on stderr as the flags ask.
func (p *pipelineFlags) plan(e *env, in *input, req planner.Request) (*planner.Result, error) {
	for _, so := range p.loadPlugins {
		if err := passes.LoadPlugin(so); err != nil {
			return nil, fmt.Errorf("kiln: %v", err)
		}
	}
	for name := range nameSet(p.printBefore + "," + p.printAfter) {
		if passes.Lookup(name) == nil && !strings.HasPrefix(name, passes.ExternalPrefix) {
			return nil, fmt.Errorf("kiln: --print-ir-before/--print-ir-after name unknown pass %q", name)
		}
	}
	s := planner.Session{
		Inst: passes.Instrumentation{
			PrintBefore:      nameSet(p.printBefore),
			PrintAfter:       nameSet(p.printAfter),
			PrintAfterAll:    p.printAfterAll,
			PrintAfterChange: p.printAfterChange,
			PrintConstants:   p.printConstants,
			VerifyEach:       p.verifyEach,
			ValidateExternal: p.validate,
			DumpDir:          p.dumpDir,
			ReproducerDir:    p.reproducerDir,
			Log:              e.stderr,
			Files:            e.files,
			Progress:         progress.For(e.terminal),
			Observe:          p.observe,
		},
		Resolve:   passes.ExternalResolver(p.pluginDir, p.pluginTimeout),
		Workspace: loops.Workspace,
	}
	if p.printPipeline {
		s.Pipeline = func(pipe passes.Pipeline) { fmt.Fprintf(e.stderr, "pipeline: %s\n", pipe) }
	}
	res, err := planner.Plan(in.module, req, s)
	if res != nil {
		mg := &passes.Manager{Runs: res.Runs}
		if p.timing {
			if werr := mg.WriteTiming(e.stderr, p.timingFormat == "json"); werr != nil {
				return nil, werr
			}
		}
		if p.stats {
			mg.WriteStats(e.stderr)
		}
	}
	var re *planner.RequestError
	var ce *passes.ContractError
	switch {
	case errors.As(err, &re):
		return nil, usageError{re.Msg}
	case errors.As(err, &ce):
		return nil, usageError{ce.Msg}
	case err != nil:
		return nil, fmt.Errorf("%s: error: %v", in.name, err)
	}
	return res, nil
}

// devicePresets are the names --device knows.
func devicePresets() []string {
	var out []string
	for n := range costmodel.Presets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
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

// verifyFlag is --verify-each: a boolean that also takes "interp".
type verifyFlag struct{ p *pipelineFlags }

func (v verifyFlag) String() string {
	if v.p == nil || v.p.verifyEach && !v.p.validate {
		return "true"
	}
	if v.p.validate {
		return "interp"
	}
	return "false"
}

func (v verifyFlag) Set(s string) error {
	switch s {
	case "true", "false":
		v.p.verifyEach, v.p.validate = s == "true", false
	case "interp":
		v.p.verifyEach, v.p.validate = true, true
	default:
		return fmt.Errorf("--verify-each takes true, false or interp, not %q", s)
	}
	return nil
}

func (v verifyFlag) IsBoolFlag() bool { return true }
