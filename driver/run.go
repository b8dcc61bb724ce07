package driver

import (
	"archive/zip"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/scratch"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/parallel"
)

// inputFlags collects repeated --input NAME=FILE.npy flags.
type inputFlags []string

func (f *inputFlags) String() string     { return strings.Join(*f, ",") }
func (f *inputFlags) Set(s string) error { *f = append(*f, s); return nil }

func init() {
	addCommand(&command{
		name:    "run",
		usage:   "kiln run IN [--train[=sum|mean] [--microbatches N]] [--optimizer KIND] [--passes P | -O0..-O3 [--budget B] [--device-budget B]] [--backend interp|llvm] [--input NAME=FILE.npy]... [--inputs DIR] [--seed N] --output-dir DIR",
		summary: "run a function with the reference interpreter and write each result as DIR/NAME.npy",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var pf pipelineFlags
			pf.register(fs)
			pf.argumentInputs = true
			pf.levels = &optLevels{}
			pf.levels.register(fs)
			inputsDir := fs.String("inputs", "", "DIR or FILE.npz: the value of each argument from DIR/NAME.npy when the file exists, or from the archive's NAME.npy member (numpy.savez) (after --input; before init values and random draws)")
			seed := fs.Uint64("seed", 0, "seed of the values drawn for arguments without --input")
			outDir := fs.String("output-dir", "", "folder for the results (created if missing)")
			backend := fs.String("backend", "interp", "interp (the reference interpreter) or llvm (compile with clang and run natively)")
			fn := fs.String("func", "", "function to run (default: the first)")
			threads := fs.Int("threads", 0, "with --backend llvm: threads of parallel loops (0: all cores)")
			repeat := fs.Int("repeat", 1, "run the function this many times and report the mean time of one run on stderr")
			buildTimeout := fs.Duration("build-timeout", DefaultBuildTimeout, "with --backend llvm: stop clang past this long, with a message (0: no limit)")
			return func(e *env, args []string) error {
				if *buildTimeout < 0 {
					return usageError{fmt.Sprintf("--build-timeout must be 0 (no limit) or more, not %v", *buildTimeout)}
				}
				if *outDir == "" {
					return usageError{"--output-dir is required"}
				}
				if *backend != "interp" && *backend != "llvm" {
					return usageError{fmt.Sprintf("--backend must be interp or llvm, not %q", *backend)}
				}
				if *threads < 0 {
					return usageError{fmt.Sprintf("--threads must be 0 (all cores) or more, not %d", *threads)}
				}
				if *repeat < 1 {
					return usageError{fmt.Sprintf("--repeat must be at least 1, not %d", *repeat)}
				}
				if *backend == "llvm" {
					pf.need = []passes.Property{passes.Assigned}
				}
				in, _, err := pf.load(e, args)
				if err != nil {
					return err
				}
				inputs := unbound(pf.inputs, in.bound)
				f, err := pickFunc(in, *fn)
				if err != nil {
					return err
				}
				avail := availableMemory()
				if err := checkHostMemory(args[0], f, *backend == "interp", avail); err != nil {
					return err
				}
				limitHeap(avail)
				if stages := parallel.Stages(in.module); len(stages) > 1 && *fn == "" {
					run := func(parts [][]*interp.Tensor) ([][]*interp.Tensor, [][]*interp.Tensor, error) {
						return interp.RunPrograms(parallel.RankPrograms(stages), parts, interp.Options{})
					}
					if *backend == "llvm" {
						if *repeat > 1 {
							return usageError{"--repeat times the compiled program of one device; pipeline stages under mpirun are not timed yet (use --backend interp)"}
						}
						run = func(parts [][]*interp.Tensor) ([][]*interp.Tensor, [][]*interp.Tensor, error) {
							var ps []*loops.Program
							for _, g := range stages {
								p, err := lowerForLLVM(in, g)
								if err != nil {
									return nil, nil, err
								}
								ps = append(ps, p)
							}
							return llvm.RunStages(ps, parts, llvm.Options{Threads: *threads})
						}
					}
					timed := run
					run = func(parts [][]*interp.Tensor) (res [][]*interp.Tensor, final [][]*interp.Tensor, err error) {
						start := time.Now()
						for r := 0; r < max(1, *repeat) && err == nil; r++ {
							res, final, err = timed(parts)
						}
						if *repeat > 1 && err == nil {
							fmt.Fprintf(e.stderr, "kiln: %s backend: %d runs, %.6f seconds per run\n", *backend, *repeat, time.Since(start).Seconds()/float64(*repeat))
						}
						return res, final, err
					}
					return runStages(e, stages, inputs, *inputsDir, *seed, *outDir, run)
				}
				ranks := parallel.RanksOf(f)
				vals, err := argumentValues(e, wholeView(f, ranks), ownBound(f), inputs, *inputsDir, *seed)
				if err != nil {
					return err
				}
				var res, final []*interp.Tensor
				var seconds float64
				if ranks > 1 && *backend == "interp" {
					res, final, err = runRanks(f, vals, *repeat, &seconds)
				} else if *backend == "llvm" {
					opt := llvm.RunOptions{Repeat: *repeat, Options: llvm.Options{Threads: *threads, BuildTimeout: *buildTimeout}}
					if *repeat > 1 {
						opt.Seconds = &seconds
					}
					res, final, err = runCompiled(e, &pf, in, f, vals, opt)
					if err != nil {
						return err
					}
				} else {
					for r := 0; r < *repeat && err == nil; r++ {
						start := time.Now()
						res, final, err = interp.RunWithUpdates(f, vals, interp.Options{})
						seconds += time.Since(start).Seconds() / float64(*repeat)
					}
				}
				if *repeat > 1 && err == nil {
					fmt.Fprintf(e.stderr, "kiln: %s backend: %d runs, %.6f seconds per run\n", *backend, *repeat, seconds)
				}
				var opErr *interp.OpError
				if errors.As(err, &opErr) && opErr.Op.Pos.IsValid() && len(opErr.Op.Results) > 0 {
					return fmt.Errorf("%s: error: %s %s: %v", opErr.Op.Pos, opErr.Op.Kind, opErr.Op.Results[0].Ref(), opErr.Err)
				}
				if err != nil {
					return fmt.Errorf("kiln: run failed: %v", err)
				}
				return writeStep(e, f, res, final, *outDir)
			}
		},
	})
}

// runStages runs pipeline stages (run: in the interpreter or compiled),
// a rank each, on the values of the step they were cut from, and writes
// what the one-device run writes.
func runStages(e *env, stages []*ir.Func, inputs []string, inputsDir string, seed uint64, outDir string,
	run func(parts [][]*interp.Tensor) ([][]*interp.Tensor, [][]*interp.Tensor, error)) error {
	whole, err := parallel.WholeStep(stages)
	if err != nil {
		return err
	}
	// An argument's index bound is that of the stages that read it.
	bound := func(i int) (b int64, ok bool) {
		for _, f := range stages {
			for j, k := range f.Attrs.Ints(parallel.ArgsAttr, nil) {
				if int(k) == i {
					if c, found := interp.IndexBound(f, f.Args[j]); found && (!ok || c < b) {
						b, ok = c, true
					}
				}
			}
		}
		return b, ok
	}
	vals, err := argumentValues(e, whole, bound, inputs, inputsDir, seed)
	if err != nil {
		return err
	}
	parts, err := parallel.RankValues(stages, whole.Args, interp.CloneAll(vals))
	if err != nil {
		return err
	}
	res, final, err := run(parts)
	if err != nil {
		return fmt.Errorf("kiln: run failed: %v", err)
	}
	out, updated := parallel.JoinRanks(stages, whole.Args, vals, res, final)
	return writeStep(e, whole, out, updated, outDir)
}

// writeStep writes f's results, then the arguments it updates in place
// (optimizer steps) as updated.<name>.npy.
func writeStep(e *env, f *ir.Func, res, final []*interp.Tensor, outDir string) error {
	var names []string
	for i := range f.Results {
		names = append(names, f.ResultName(i))
	}
	for i, a := range f.Args {
		if a.Arg.InOut {
			names = append(names, "updated."+a.Name)
			res = append(res, final[i])
		}
	}
	return writeResults(e, names, res, outDir)
}

// pickFunc returns the named function, or the first one.
func pickFunc(in *input, name string) (*ir.Func, error) {
	if len(in.module.Funcs) == 0 {
		return nil, fmt.Errorf("%s: error: the module has no function", in.name)
	}
	if name == "" {
		return in.module.Funcs[0], nil
	}
	if f := in.module.Func(name); f != nil {
		return f, nil
	}
	return nil, fmt.Errorf("%s: error: no function @%s", in.name, name)
}

// argumentValues gives every argument a value: --input files first, then
// the argument's initial value, then a seeded random draw.
// bound gives the index bound of argument i (interp.IndexBound in the
// function that reads it), for the random draws.
func argumentValues(e *env, f *ir.Func, bound func(i int) (int64, bool), inputs []string, inputsDir string, seed uint64) ([]*interp.Tensor, error) {
	given := map[string]*interp.Tensor{}
	load := func(arg *ir.Value, file string) (*interp.Tensor, error) {
		name := arg.Name
		e.files.Read(file)
		// No further than the data and a header of at most 1 MiB, and one
		// byte (the reader then refuses what follows the data).
		data, err := readRegular(file, arg.Type.SizeBytes()+(1<<20)+64)
		if err != nil {
			return nil, fmt.Errorf("kiln: --input %s: %v", name, unwrapPathError(err))
		}
		t, err := npy.ReadAs(bytes.NewReader(data), arg.Type.DType)
		if err != nil {
			return nil, fmt.Errorf("kiln: --input %s: %s: %v", name, file, err)
		}
		if !t.Type.Equal(arg.Type) {
			return nil, fmt.Errorf("kiln: --input %s: %s holds %s, but argument %s is %s", name, file, t.Type, arg.Ref(), arg.Type)
		}
		return t, nil
	}
	for _, spec := range inputs {
		name, file, ok := strings.Cut(spec, "=")
		if !ok || name == "" || file == "" {
			return nil, usageError{fmt.Sprintf("--input %q: want NAME=FILE.npy", spec)}
		}
		var arg *ir.Value
		for _, a := range f.Args {
			if a.Name == name {
				arg = a
			}
		}
		if given[name] != nil {
			return nil, usageError{fmt.Sprintf("--input %s is given twice", name)}
		}
		if arg == nil {
			names := make([]string, len(f.Args))
			for i, a := range f.Args {
				names[i] = a.Name
			}
			return nil, fmt.Errorf("kiln: --input %s: @%s has no argument %q%s", spec, f.Name, name, diag.Among(name, names))
		}
		t, err := load(arg, file)
		if err != nil {
			return nil, err
		}
		given[name] = t
	}
	if inputsDir != "" {
		st, err := os.Stat(inputsDir)
		switch {
		case err != nil:
			return nil, fmt.Errorf("kiln: --inputs %s: %v", inputsDir, unwrapPathError(err))
		case !st.IsDir() && !st.Mode().IsRegular():
			return nil, fmt.Errorf("kiln: --inputs %s is neither a folder nor an .npz file", inputsDir)
		}
	}
	if st, err := os.Stat(inputsDir); inputsDir != "" && err == nil && st.Mode().IsRegular() {
		// --inputs FILE.npz: NAME.npy members, as numpy.savez writes.
		if err := npzValues(e, f, inputsDir, given); err != nil {
			return nil, err
		}
	} else if inputsDir != "" {
		// --inputs DIR: NAME.npy for every argument no --input names.
		for _, a := range f.Args {
			path := filepath.Join(inputsDir, FileName(a.Name))
			if given[a.Name] != nil {
				continue
			}
			if _, err := os.Stat(path); err != nil {
				continue
			}
			t, err := load(a, path)
			if err != nil {
				return nil, err
			}
			given[a.Name] = t
		}
	}
	random := interp.RandomArgsExcept(f.Args, seed, bound, func(i int) bool { return given[f.Args[i].Name] != nil || f.Args[i].Arg.Init != nil })
	vals := make([]*interp.Tensor, len(f.Args))
	for i, a := range f.Args {
		switch {
		case given[a.Name] != nil:
			vals[i] = given[a.Name]
		case a.Arg.Init != nil:
			vals[i] = interp.FromDense(a.Arg.Init)
		default:
			vals[i] = random[i]
		}
	}
	return vals, nil
}

// npzValues reads the members NAME.npy of the .npz archive path (stored
// or deflated, as numpy.savez and savez_compressed write) into given, for
// the arguments no --input names. A member that names no argument is an
// error, of two members with one name the last counts (as in numpy), and
// a member is read no further than its argument's size (a compressed bomb
// cannot exhaust memory).
func npzValues(e *env, f *ir.Func, path string, given map[string]*interp.Tensor) error {
	e.files.Read(path)
	z, err := zip.OpenReader(path)
	if err != nil {
		return fmt.Errorf("kiln: --inputs %s: not a .npz archive: %v", path, err)
	}
	defer z.Close()
	args := map[string]*ir.Value{}
	for _, a := range f.Args {
		args[a.Name] = a
	}
	last := map[string]*zip.File{} // numpy keeps the last of two members with one name
	for _, m := range z.File {
		last[m.Name] = m
	}
	for _, m := range z.File {
		if last[m.Name] != m {
			continue
		}
		name := strings.TrimSuffix(m.Name, ".npy")
		a := args[name]
		if a == nil {
			names := make([]string, 0, len(f.Args))
			for _, x := range f.Args {
				names = append(names, x.Name)
			}
			return fmt.Errorf("kiln: --inputs %s: member %q names no argument of @%s%s", path, m.Name, f.Name, diag.Among(name, names))
		}
		if given[name] != nil {
			continue // --input wins
		}
		r, err := m.Open()
		if err != nil {
			return fmt.Errorf("kiln: --inputs %s: %s: %v", path, m.Name, err)
		}
		limit := a.Type.SizeBytes() + 1<<16 // the data and a generous header
		data, err := io.ReadAll(io.LimitReader(r, limit+1))
		r.Close()
		if err != nil {
			return fmt.Errorf("kiln: --inputs %s: %s: %v", path, m.Name, err)
		}
		if int64(len(data)) > limit {
			return fmt.Errorf("kiln: --inputs %s: %s is larger than argument %s (%s) needs", path, m.Name, a.Ref(), a.Type)
		}
		t, err := npy.ReadAs(bytes.NewReader(data), a.Type.DType)
		if err != nil {
			return fmt.Errorf("kiln: --inputs %s: %s: %v", path, m.Name, err)
		}
		if !t.Type.Equal(a.Type) {
			return fmt.Errorf("kiln: --inputs %s: %s holds %s, but argument %s is %s", path, m.Name, t.Type, a.Ref(), a.Type)
		}
		given[name] = t
	}
	return nil
}

// FileName maps a result name to its file name: every character outside
// A-Za-z0-9._- becomes _.
func FileName(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, name) + ".npy"
}

// writeResults writes every tensor as DIR/NAME.npy, all or nothing: two
// names that map to one file, or a file that is an input of the command,
// stop it before anything is written; the files are written into a
// staging folder in DIR and then renamed into place.
func writeResults(e *env, names []string, res []*interp.Tensor, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("kiln: cannot create %s: %v", dir, unwrapPathError(err))
	}
	seen := map[string]string{}
	data := make([][]byte, len(res))
	for i, t := range res {
		file := FileName(names[i])
		if prev, dup := seen[file]; dup {
			return fmt.Errorf("kiln: outputs %s and %s would both be written to %s", strconv.Quote(prev), strconv.Quote(names[i]), filepath.Join(dir, file))
		}
		seen[file] = names[i]
		if err := e.files.Check(filepath.Join(dir, file)); err != nil {
			return fmt.Errorf("kiln: output %s: %v", strconv.Quote(names[i]), err)
		}
		var b bytes.Buffer
		if err := npy.Write(&b, t); err != nil {
			return fmt.Errorf("kiln: output %s: %v", strconv.Quote(names[i]), err)
		}
		data[i] = b.Bytes()
	}
	stage, err := scratch.MkdirTemp(dir, ".kiln-run-*")
	if err != nil {
		return fmt.Errorf("kiln: cannot write to %s: %v", dir, unwrapPathError(err))
	}
	defer scratch.Remove(stage)
	for i := range res {
		if err := os.WriteFile(filepath.Join(stage, FileName(names[i])), data[i], 0o644); err != nil {
			return fmt.Errorf("kiln: cannot write %s: %v", FileName(names[i]), unwrapPathError(err))
		}
	}
	for i := range res {
		file := FileName(names[i])
		if err := os.Rename(filepath.Join(stage, file), filepath.Join(dir, file)); err != nil {
			return fmt.Errorf("kiln: cannot write %s: %v", filepath.Join(dir, file), unwrapPathError(err))
		}
	}
	return nil
}

// ownBound is the index bound of f's argument i in f.
func ownBound(f *ir.Func) func(int) (int64, bool) {
	return func(i int) (int64, bool) { return interp.IndexBound(f, f.Args[i]) }
}

// wholeView is f with each sharded argument at the type of the whole
// tensor the ranks share (f itself on one rank): the inputs a user gives
// and the random draws are those of the one-device step.
func wholeView(f *ir.Func, ranks int) *ir.Func {
	if ranks <= 1 {
		return f
	}
	g := *f
	g.Args = make([]*ir.Value, len(f.Args))
	for i, a := range f.Args {
		w := *a
		w.Type = parallel.WholeType(a, ranks)
		g.Args[i] = &w
	}
	return &g
}

// runRanks runs the SPMD step f on its ranks in the interpreter, each on
// its part of vals; the ranks' results agree (they are all-reduced or
// all-gathered), so rank 0's stand for the step, and arguments updated
// in parts (ZeRO) are joined.
func runRanks(f *ir.Func, vals []*interp.Tensor, repeat int, seconds *float64) ([]*interp.Tensor, []*interp.Tensor, error) {
	var res, final [][]*interp.Tensor
	for r := 0; r < max(1, repeat); r++ {
		parts, err := parallel.ShardValues(f, vals)
		if err != nil {
			return nil, nil, err
		}
		start := time.Now()
		res, final, err = interp.RunRanks(f, parts, interp.Options{})
		*seconds += time.Since(start).Seconds() / float64(max(1, repeat))
		if err != nil {
			return nil, nil, err
		}
	}
	return res[0], parallel.JoinValues(f, final), nil
}
