package driver

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/plancheck"
	"github.com/kiln-compiler/kiln/progress"
)

// optLevels holds -O0..-O3, the budgets the pipelines take, and --train
// and --optimizer, which put autodiff and the optimizer pass before them.
type optLevels struct {
	o            [4]bool
	budget       string
	deviceBudget string
	train        trainFlag
	optimizer    string
	microbatches int
	parallel     string
}

// trainFlag is --train[=sum|mean]: "" when absent, the loss otherwise.
type trainFlag string

func (t *trainFlag) String() string   { return string(*t) }
func (t *trainFlag) IsBoolFlag() bool { return true }
func (t *trainFlag) Set(v string) error {
	switch v {
	case "true", "sum":
		*t = "sum"
	case "mean":
		*t = "mean"
	case "false":
		*t = ""
	default:
		return fmt.Errorf("--train takes sum or mean, not %q%s", v, diag.DidYouMean(v, []string{"sum", "mean"}))
	}
	return nil
}

var optimizerKinds = []string{"sgd", "momentum", "adam", "adamw"}

func (l *optLevels) register(fs *flag.FlagSet) {
	for i := range l.o {
		usage := fmt.Sprintf("the pipeline %s", OptPipeline(i, "", ""))
		if i >= 2 {
			usage += " (--budget adds remat, --device-budget swap; --print-pipeline shows the result)"
		}
		fs.BoolVar(&l.o[i], fmt.Sprintf("O%d", i), false, usage)
	}
	fs.StringVar(&l.budget, "budget", "", "with -O2/-O3: recompute (and split into microbatches) under this peak budget: bytes, or a fraction of the step's peak before any memory pass (after autodiff alone)")
	fs.StringVar(&l.deviceBudget, "device-budget", "", "with -O2/-O3: swap (or recompute) so that the device arena and workspace fit: bytes, or a fraction of the step's before any memory pass (after autodiff alone)")
	fs.Var(&l.train, "train", "plan the training step: autodiff{loss=sum|mean} (--train alone: sum) runs first; with no -O or --passes, -O2 follows")
	fs.StringVar(&l.optimizer, "optimizer", "", "after autodiff, the optimizer pass: "+strings.Join(optimizerKinds, ", "))
	fs.IntVar(&l.microbatches, "microbatches", 0, "with --train: split the step into N slices of the batch and accumulate the gradients (microbatch{n=N}, before the optimizer)")
	fs.StringVar(&l.parallel, "parallel", "", "with --train: partition the step over ranks, parallel{SPEC} after autodiff and the optimizer (dp=N: data parallelism)")
}

// apply puts the chosen level's pipeline into pf, after autodiff and the
// optimizer when --train and --optimizer ask for them (a usage error when
// --passes is given with a level). A command whose backend needs arena
// offsets (compiled code) runs -O0 when nothing else is asked for, and
// refuses a --passes pipeline that does not end with them.
func (l *optLevels) apply(pf *pipelineFlags) error {
	level := -1
	if (l.train != "" || l.optimizer != "") && pf.passes == "" {
		level = 2
	}
	if slices.Contains(pf.need, passes.Assigned) && pf.passes == "" && level < 0 {
		level = 0
	}
	named, err := l.pipeline(level)
	if err != nil {
		return err
	}
	if named != "" && pf.passes != "" {
		return usageError{"give --passes or an -O level, not both"}
	}
	if l.optimizer != "" && !slices.Contains(optimizerKinds, l.optimizer) {
		return usageError{fmt.Sprintf("--optimizer must be one of %s, not %q%s", strings.Join(optimizerKinds, ", "), l.optimizer, diag.DidYouMean(l.optimizer, optimizerKinds))}
	}
	if l.microbatches < 0 || l.microbatches > 0 && l.train == "" {
		return usageError{fmt.Sprintf("--microbatches takes a count of at least 1 and needs --train (got %d)", l.microbatches)}
	}
	var pre []string
	if l.train != "" {
		pre = append(pre, "autodiff{loss="+string(l.train)+"}")
	}
	if l.budget != "" || l.deviceBudget != "" {
		ref := strings.Join(pre, ",")
		pf.budgetsOf = &ref
	}
	if l.microbatches > 1 && l.parallel == "" {
		pre = append(pre, fmt.Sprintf("microbatch{n=%d}", l.microbatches))
	}
	if l.optimizer != "" {
		pre = append(pre, "optimizer{kind="+l.optimizer+"}")
	}
	if l.parallel != "" {
		if l.train == "" {
			return usageError{"--parallel partitions a training step: it needs --train"}
		}
		spec := l.parallel
		if l.microbatches > 1 {
			spec += fmt.Sprintf(",microbatches=%d", l.microbatches) // each rank accumulates its part
		}
		pre = append(pre, "parallel{"+spec+"}")
	}
	rest := pf.passes
	if named != "" {
		rest = named
	}
	if rest != "" {
		pre = append(pre, rest)
	}
	pf.passes = strings.Join(pre, ",")
	return nil
}

// pipeline is the named pipeline chosen (level when no -O flag is given),
// or "" when none is.
func (l *optLevels) pipeline(level int) (string, error) {
	chosen := false
	for i, on := range l.o {
		if on {
			if chosen {
				return "", usageError{"give one of -O0, -O1, -O2, -O3"}
			}
			chosen, level = true, i
		}
	}
	if (l.budget != "" || l.deviceBudget != "") && level < 2 {
		return "", usageError{"--budget and --device-budget need -O2 or -O3"}
	}
	return OptPipeline(level, l.budget, l.deviceBudget), nil
}

// OptPipeline is the pipeline of -O<level> (the Contracts in the design
// notes, with saveset added by the memory issue): -O0 assign; -O1
// canonicalize,dce,cse,saveset,fuse,assign; -O2 adds reorder before
// assign, remat (after saveset, so that a budget never gives a higher
// plan than none) when a budget is given and swap (after
// reorder, which then sees the final schedule) when a device budget is;
// -O3 gives the exact searches more room. level < 0 gives "".
func OptPipeline(level int, budget, deviceBudget string) string {
	switch {
	case level < 0:
		return ""
	case level == 0:
		return "assign"
	case level == 1:
		return "canonicalize,dce,cse,saveset,fuse,assign"
	}
	p := "canonicalize,dce,cse,saveset"
	if budget != "" {
		p += ",remat{budget=" + budget + "}"
	}
	swap := ""
	if deviceBudget != "" {
		swap = ",swap{device-budget=" + deviceBudget + "}"
	}
	if level == 2 {
		return p + ",fuse,reorder" + swap + ",assign"
	}
	return p + ",fuse,reorder{exact-states=2000000,improve=2000}" + swap + ",assign{algo=best}"
}

// lowerForLLVM lowers f, which the pipeline assigned (Manager.Need), to
// loops.
func lowerForLLVM(in *input, f *ir.Func) (*loops.Program, error) {
	if err := passes.Established(&ir.Module{Funcs: []*ir.Func{f}}, passes.Assigned); err != nil {
		return nil, fmt.Errorf("%s: error: %v (an external pass's output? end the pipeline with assign)", in.name, err)
	}
	p, err := loops.Lower(f)
	if err != nil {
		return nil, fmt.Errorf("%s: error: @%s: %v", in.name, f.Name, err)
	}
	return p, nil
}

func init() {
	addCommand(&command{
		name:    "compile",
		usage:   "kiln compile IN --target llvm|cuda [--train[=sum|mean] [--microbatches N]] [--optimizer KIND] [--passes P | -O0..-O3 [--budget B] [--device-budget B]] [--emit ll|header|obj|lib|exe] [--func NAME] -o OUT",
		summary: "compile a function to LLVM IR, a C header, an object, a shared library or an executable; or to a CUDA launch plan directory",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			pf := pipelineFlags{need: []passes.Property{passes.Assigned}}
			pf.register(fs)
			var ol optLevels
			ol.register(fs)
			target := fs.String("target", "llvm", "llvm, or cuda (-o DIR gets plan.json, kernels.cu, kiln_cuda.h and module.kir)")
			emit := fs.String("emit", "ll", "ll (LLVM IR text), header (C declarations), obj, lib (shared library) or exe (with a .npy driver)")
			out := fs.String("o", "-", "output file (- for standard output: ll and header only)")
			fn := fs.String("func", "", "function to compile (default: the first)")
			threads := fs.Int("threads", 0, "threads of parallel loops (0: all online cores when the program runs; 1: sequential code)")
			return func(e *env, args []string) error {
				if *target == "cuda" {
					if err := ol.apply(&pf); err != nil {
						return err
					}
					return compileCUDA(e, &pf, args, *fn, *out)
				}
				if *target != "llvm" {
					return usageError{fmt.Sprintf("--target must be llvm or cuda, not %q", *target)}
				}
				if *threads < 0 {
					return usageError{fmt.Sprintf("--threads must be 0 (all cores) or more, not %d", *threads)}
				}
				switch *emit {
				case "ll", "header":
				case "obj", "lib", "exe":
					if *out == "-" || *out == "" {
						return usageError{fmt.Sprintf("--emit %s needs -o OUT", *emit)}
					}
				default:
					return usageError{fmt.Sprintf("--emit must be ll, header, obj, lib or exe, not %q", *emit)}
				}
				if err := ol.apply(&pf); err != nil {
					return err
				}
				if len(args) != 1 {
					return usageError{"want exactly one input file (or - for standard input)"}
				}
				in, _, err := pf.load(e, args)
				if err != nil {
					return err
				}
				f, err := pickFunc(in, *fn)
				if err != nil {
					return err
				}
				if stages := parallel.Stages(in.module); len(stages) > 1 && *fn == "" {
					// A pipeline: a file per stage, OUT/stage0, OUT/stage1, …
					if *out == "-" || *out == "" {
						return usageError{"a pipeline compiles to a file per stage: give -o DIR"}
					}
					if err := os.MkdirAll(*out, 0o755); err != nil {
						return fmt.Errorf("kiln: cannot write %s: %v", *out, unwrapPathError(err))
					}
					ext := map[string]string{"ll": ".ll", "header": ".h", "obj": ".o", "lib": ".so", "exe": ""}[*emit]
					for s, f := range stages {
						if err := compileLLVM(e, &pf, in, f, *emit, *threads, filepath.Join(*out, fmt.Sprintf("stage%d%s", s, ext))); err != nil {
							return err
						}
					}
					return nil
				}
				return compileLLVM(e, &pf, in, f, *emit, *threads, *out)
			}
		},
	})
}

// compileLLVM writes f compiled for the LLVM target as emit says to out.
func compileLLVM(e *env, pf *pipelineFlags, in *input, f *ir.Func, emit string, threads int, out string) error {
	p, err := lowerForLLVM(in, f)
	if err != nil {
		return err
	}
	switch emit {
	case "ll":
		text, err := llvm.Text(p, llvm.Options{Threads: threads})
		if err != nil {
			return fmt.Errorf("%s: error: @%s: %v", in.name, f.Name, err)
		}
		return writeOutput(e, out, []byte(text))
	case "header":
		return writeOutput(e, out, []byte(llvm.Header(p)))
	}
	prog := progress.For(e.stderr)
	prog.Step("compile: clang -O2 of @%s (%d kernels)", f.Name, len(p.Kernels))
	data, err := llvm.Build(p, emit, llvm.Options{Threads: threads})
	prog.Done()
	if err != nil {
		return fmt.Errorf("kiln: %v", err)
	}
	mode := os.FileMode(0o644)
	if emit != "obj" {
		mode = 0o755
	}
	return writeOutputMode(e, out, data, mode)
}

// compileCUDA writes the launch plan directory of one function.
func compileCUDA(e *env, pf *pipelineFlags, args []string, fn, out string) error {
	if out == "-" || out == "" {
		return usageError{"--target cuda needs -o DIR"}
	}
	if len(args) != 1 {
		return usageError{"want exactly one input file (or - for standard input)"}
	}
	in, _, err := pf.load(e, args)
	if err != nil {
		return err
	}
	f, err := pickFunc(in, fn)
	if err != nil {
		return err
	}
	funcs, dirs := []*ir.Func{f}, []string{out}
	if stages := parallel.Stages(in.module); len(stages) > 1 && fn == "" {
		// A pipeline: a plan per stage, in DIR/stage0, DIR/stage1, …
		funcs, dirs = stages, nil
		for s := range stages {
			dirs = append(dirs, filepath.Join(out, fmt.Sprintf("stage%d", s)))
		}
	}
	if err := passes.Established(&ir.Module{Funcs: funcs}, passes.Assigned); err != nil {
		return fmt.Errorf("%s: error: %v (an external pass's output? end the pipeline with assign)", in.name, err)
	}
	plans := make([]*cuda.Output, len(funcs))
	for i, f := range funcs {
		if plans[i], err = cuda.Lower(f, costmodel.Default); err != nil {
			return fmt.Errorf("%s: error: @%s: %v", in.name, f.Name, err)
		}
	}
	if len(plans) > 1 {
		stages := make([]*cuda.Plan, len(plans))
		for i, p := range plans {
			stages[i] = p.Plan
		}
		if err := plancheck.Rendezvous(stages); err != nil {
			return fmt.Errorf("%s: error: the stages' launch plans: %v", in.name, err)
		}
	}
	for i, plan := range plans {
		if err := cuda.Write(dirs[i], plan, in.module, e.files); err != nil {
			return fmt.Errorf("kiln: cannot write %s: %v", dirs[i], unwrapPathError(err))
		}
	}
	return nil
}

// runCompiled builds f into an executable and runs it on vals.
func runCompiled(e *env, pf *pipelineFlags, in *input, f *ir.Func, vals []*interp.Tensor, opt llvm.RunOptions) (res, final []*interp.Tensor, err error) {
	p, err := lowerForLLVM(in, f)
	if err != nil {
		return nil, nil, err
	}
	if n := parallel.RanksOf(f); n > 1 {
		// An SPMD step: mpirun runs the ranks, each on its part.
		parts, err := parallel.ShardValues(f, vals)
		if err != nil {
			return nil, nil, fmt.Errorf("kiln: %v", err)
		}
		rres, rfinal, err := llvm.RunRanks(p, parts, opt)
		if err != nil {
			return nil, nil, fmt.Errorf("kiln: %v", err)
		}
		return rres[0], parallel.JoinValues(f, rfinal), nil
	}
	res, final, err = llvm.Run(p, vals, opt)
	if err != nil {
		return nil, nil, fmt.Errorf("kiln: %v", err)
	}
	return res, final, nil
}
