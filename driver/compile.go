package driver

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/plancheck"
	"github.com/kiln-compiler/kiln/planner"
	"github.com/kiln-compiler/kiln/progress"
)

// optLevels holds -O0..-O3, the budgets the pipelines take, and --train
// and --optimizer, which put autodiff and the optimizer pass before them.
type optLevels struct {
	o                [4]bool
	budget           string
	deviceBudget     string
	train            trainFlag
	optimizer        string
	optimizerOptions string
	microbatches     int
	keepOutputs      bool
	parallel         string
	precision        string
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

// countFlag is a count of at least 1 (0 while the flag is not given).
type countFlag int

func (c *countFlag) String() string { return strconv.Itoa(int(*c)) }
func (c *countFlag) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return fmt.Errorf("takes a count of at least 1, not %q", v)
	}
	*c = countFlag(n)
	return nil
}

func (l *optLevels) register(fs *flag.FlagSet) {
	for i := range l.o {
		usage := "the pipeline " + planner.LevelPipeline(i)
		if i >= 2 {
			usage += " (--budget adds remat after saveset, --device-budget swap before assign; --print-pipeline shows the result)"
		}
		fs.BoolVar(&l.o[i], fmt.Sprintf("O%d", i), false, usage)
	}
	fs.StringVar(&l.budget, "budget", "", "with -O2/-O3: bound the step's peak by recomputation, microbatches, then swapping and offloading: bytes, or a fraction of the step's peak after autodiff alone")
	fs.StringVar(&l.deviceBudget, "device-budget", "", "with -O2/-O3: swap (or recompute) so that the device arena and workspace fit: bytes, or a fraction of the step's after autodiff alone")
	fs.Var(&l.train, "train", "plan the training step: autodiff{loss=sum|mean} (--train alone: sum) runs first; with no -O or --passes, -O2 follows")
	fs.BoolVar(&l.keepOutputs, "keep-outputs", false, "with --train: the step also returns the forward's results after the loss and gradients (a model's logits beside its loss)")
	fs.StringVar(&l.optimizer, "optimizer", "", "after autodiff, the optimizer pass: "+strings.Join(planner.Optimizers, ", "))
	fs.StringVar(&l.optimizerOptions, "optimizer-options", "", "the optimizer pass's options (kiln passes lists them): lr=0.01,momentum=0.9,weight-decay=0,...")
	fs.Var((*countFlag)(&l.microbatches), "microbatches", "with --train: split the step into N slices of the batch and accumulate the gradients (the whole batch's statistics kept in phases unless --allow per-slice-bn)")
	fs.StringVar(&l.precision, "precision", "", "with --train: mixed precision after autodiff, precision{dtype=D[,OPTIONS]}: bf16 or f16 activations and products, f32 master weights, statistics and gradients (f16 with dynamic loss scaling); bf16,saved=fp8 also stores the saved values in fp8 (with --allow fp8-saved)")
	fs.StringVar(&l.parallel, "parallel", "", "with --train: partition the step over ranks, parallel{SPEC} after autodiff and the optimizer (dp=N: data parallelism); devices=N[,device-memory=M] searches for the fastest plan that fits")
}

// request is the planner request of the flags: the level chosen (-1:
// none), the budgets and the training step.
func (l *optLevels) request() (planner.Request, error) {
	req := planner.NewRequest()
	for i, on := range l.o {
		if on {
			if req.Level >= 0 {
				return req, usageError{"give one of -O0, -O1, -O2, -O3"}
			}
			req.Level = i
		}
	}
	req.Budget, req.DeviceBudget = l.budget, l.deviceBudget
	req.Train, req.KeepOutputs, req.Optimizer, req.OptimizerOptions = string(l.train), l.keepOutputs, l.optimizer, l.optimizerOptions
	req.Microbatches, req.Parallel, req.Precision = l.microbatches, l.parallel, l.precision
	return req, nil
}

// lowerForLLVM lowers f, which the pipeline assigned (Manager.Need), to
// loops.
func lowerForLLVM(in *input, f *ir.Func) (*loops.Program, error) {
	if err := passes.Established(&ir.Module{Funcs: []*ir.Func{f}}, passes.Assigned); err != nil {
		return nil, fmt.Errorf("%s: error: %v (an external pass's output? end the pipeline with assign)", in.name, err)
	}
	p, err := llvm.Lower(f)
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
			pf.levels = &optLevels{}
			pf.levels.register(fs)
			target := fs.String("target", "llvm", "llvm, or cuda (-o DIR gets plan.json, kernels.cu, kiln_cuda.h and module.kir)")
			emit := fs.String("emit", "ll", "ll (LLVM IR text), header (C declarations of the entry point), runtime-header (kiln_runtime.h, the ABI of lib), obj, lib (shared library: the step's runtime) or exe (a program over the runtime, reading and writing .npy files); with --target cuda, plan (the default) or exe (the plan with its host program and DIR/build.sh, which builds DIR/step with nvcc)")
			out := fs.String("o", "-", "output file (- for standard output: ll and header only)")
			fn := fs.String("func", "", "function to compile (default: the first)")
			threads := fs.Int("threads", 0, "threads of parallel loops (0: all online cores when the program runs; 1: sequential code)")
			buildTimeout := fs.Duration("build-timeout", DefaultBuildTimeout, "with --emit obj, lib or exe: stop clang past this long, with a message (0: no limit)")
			cache := fs.String("cache", "", "with --emit obj, lib or exe: the directory of compiled kernels kept for the next build of the same kernels, off for none (default: $KILN_CACHE, else kiln/ in the user's cache directory)")
			return func(e *env, args []string) error {
				if *buildTimeout < 0 {
					return usageError{fmt.Sprintf("--build-timeout must be 0 (no limit) or more, not %v", *buildTimeout)}
				}
				if *target == "cuda" {
					cudaEmit := "plan"
					fs.Visit(func(f *flag.Flag) {
						if f.Name == "emit" {
							cudaEmit = *emit
						}
					})
					if cudaEmit != "plan" && cudaEmit != "exe" {
						return usageError{fmt.Sprintf("with --target cuda, --emit must be plan or exe, not %q", cudaEmit)}
					}
					return compileCUDA(e, &pf, args, *fn, *out, cudaEmit == "exe", *threads)
				}
				if *target != "llvm" {
					return usageError{fmt.Sprintf("--target must be llvm or cuda, not %q", *target)}
				}
				if *threads < 0 {
					return usageError{fmt.Sprintf("--threads must be 0 (all cores) or more, not %d", *threads)}
				}
				opt := llvm.Options{Threads: *threads, BuildTimeout: *buildTimeout, CacheDir: objectCacheDir(*cache)}
				switch *emit {
				case "ll", "header", "runtime-header":
				case "obj", "lib", "exe":
					if *out == "-" || *out == "" {
						return usageError{fmt.Sprintf("--emit %s needs -o OUT", *emit)}
					}
				default:
					return usageError{fmt.Sprintf("--emit must be ll, header, obj, lib or exe, not %q", *emit)}
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
						if err := compileLLVM(e, in, f, *emit, opt, filepath.Join(*out, fmt.Sprintf("stage%d%s", s, ext))); err != nil {
							return err
						}
					}
					return nil
				}
				return compileLLVM(e, in, f, *emit, opt, *out)
			}
		},
	})
}

// objectCacheDir is where compile keeps compiled kernels: flag, else
// $KILN_CACHE, else kiln/ in the user's cache directory ("" where none
// can be found); "off" keeps none.
func objectCacheDir(flag string) string {
	dir := flag
	if dir == "" {
		dir = os.Getenv("KILN_CACHE")
	}
	if dir == "off" {
		return ""
	}
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(base, "kiln")
	}
	return filepath.Join(dir, "objects")
}

// DefaultBuildTimeout bounds clang's run for one step (--build-timeout):
// well past what the zoo's largest steps take (ResNet-50's training step,
// under a minute), short of an afternoon.
const DefaultBuildTimeout = 20 * time.Minute

// compileLLVM writes f compiled for the LLVM target as emit says to out.
// A build longer than two seconds shows its time on the terminal's
// progress line.
func compileLLVM(e *env, in *input, f *ir.Func, emit string, opt llvm.Options, out string) error {
	p, err := lowerForLLVM(in, f)
	if err != nil {
		return err
	}
	switch emit {
	case "ll":
		text, err := llvm.Text(p, opt)
		if err != nil {
			return fmt.Errorf("%s: error: @%s: %v", in.name, f.Name, err)
		}
		return writeOutput(e, out, []byte(text))
	case "header":
		return writeOutput(e, out, []byte(llvm.Header(p)))
	case "runtime-header":
		return writeOutput(e, out, []byte(llvm.RuntimeHeader))
	}
	prog := progress.For(e.terminal)
	prog.Step("compile: clang -O3 of @%s (%d kernels)", f.Name, len(p.Kernels))
	opt.Progress = func(d time.Duration) {
		if d >= 2*time.Second {
			limit := ""
			if opt.BuildTimeout > 0 {
				limit = fmt.Sprintf(" of at most %v", opt.BuildTimeout)
			}
			prog.Step("compile: clang -O3 of @%s (%d kernels): %ds%s", f.Name, len(p.Kernels), int(d.Seconds()), limit)
		}
	}
	data, err := llvm.Build(p, emit, opt)
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
// With exe, each directory also gets the program's host side and
// build.sh (cuda.Output.Executable).
func compileCUDA(e *env, pf *pipelineFlags, args []string, fn, out string, exe bool, threads int) error {
	if out == "-" || out == "" {
		return usageError{"--target cuda needs -o DIR"}
	}
	if len(args) != 1 {
		return usageError{"want exactly one input file (or - for standard input)"}
	}
	in, res, err := pf.load(e, args)
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
		if plans[i], err = cuda.Lower(f, res.Device); err != nil {
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
		var extra map[string][]byte
		if exe {
			if extra, err = plan.Executable(threads); err != nil {
				return fmt.Errorf("%s: error: @%s: %v", in.name, funcs[i].Name, err)
			}
		}
		if err := cuda.Write(dirs[i], plan, in.module, extra, e.files); err != nil {
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
