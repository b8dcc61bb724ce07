package llvm

import (
	"context"
	"fmt"
	"github.com/kiln-compiler/kiln/scratch"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	kir "github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
)

// RunOptions tune Run.
type RunOptions struct {
	Repeat  int      // run the function this many times from the same state (default 1)
	Steps   int      // run this many steps in a row, the state advancing (excludes Repeat)
	Seconds *float64 // receives the mean time of one run
	MaxRSS  *int64   // receives the program's peak resident bytes
	Binary  *int64   // receives the executable's size in bytes
	Options          // code generation
}

// Run compiles p into an executable, runs it on args (one per function
// argument, in order) and returns the results and the arguments' final
// values (they differ from args for arguments updated in place).
func Run(p *loops.Program, args []*interp.Tensor, opts ...RunOptions) (results, final []*interp.Tensor, err error) {
	var opt RunOptions
	if len(opts) > 0 {
		opt = opts[0]
	}
	e, err := Compile(p, opt.Options)
	if err != nil {
		return nil, nil, err
	}
	defer e.Close()
	return e.Run(args, opt)
}

// Executable is p compiled once, to run on many argument sets: its
// folder holds the program and each run's files until Close.
type Executable struct {
	p        *loops.Program
	dir, bin string
	exe      []byte
	runs     int
}

// Compile builds p into an executable in a new temporary folder, which
// Close removes.
func Compile(p *loops.Program, opt Options) (*Executable, error) {
	dir, bin, exe, err := built(p, opt)
	if err != nil {
		return nil, err
	}
	return &Executable{p: p, dir: dir, bin: bin, exe: exe}, nil
}

// Close removes the executable's folder.
func (e *Executable) Close() error { return scratch.Remove(e.dir) }

// Run runs the executable on args as Run does (opt.Options is ignored:
// the code is already generated).
func (e *Executable) Run(args []*interp.Tensor, opt RunOptions) (results, final []*interp.Tensor, err error) {
	e.runs++
	dir := filepath.Join(e.dir, fmt.Sprintf("run%d", e.runs))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "out")
	cmdArgs := []string{"--output-dir", out}
	f := e.p.Func
	if len(args) != len(f.Args) {
		return nil, nil, fmt.Errorf("@%s takes %d arguments, got %d", f.Name, len(f.Args), len(args))
	}
	for i, a := range f.Args {
		path := filepath.Join(dir, fmt.Sprintf("arg%d.npy", i))
		if err := writeNpy(path, args[i]); err != nil {
			return nil, nil, err
		}
		cmdArgs = append(cmdArgs, "--input", a.Name+"="+path)
	}
	if opt.Steps > 0 {
		cmdArgs = append(cmdArgs, "--steps", fmt.Sprint(opt.Steps))
	} else if opt.Repeat > 1 || opt.Seconds != nil {
		cmdArgs = append(cmdArgs, "--repeat", fmt.Sprint(max(opt.Repeat, 1)))
	}
	if opt.MaxRSS != nil {
		cmdArgs = append(cmdArgs, "--report-memory")
	}
	msg, err := scratch.CombinedOutput(exec.Command(e.bin, cmdArgs...))
	if opt.Binary != nil {
		*opt.Binary = int64(len(e.exe))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("the compiled program failed: %v\n%s", err, strings.TrimSpace(string(msg)))
	}
	for _, line := range strings.Split(string(msg), "\n") {
		var n int
		switch {
		case opt.Seconds != nil && strings.HasSuffix(line, "seconds per run"):
			fmt.Sscanf(line, "%d runs, %g seconds per run", &n, opt.Seconds)
		case opt.MaxRSS != nil && strings.HasPrefix(line, "peak resident"):
			fmt.Sscanf(line, "peak resident %d bytes", opt.MaxRSS)
		}
	}
	return readOutputs(out, f, args)
}

// built compiles p into the executable bin in the new temporary folder
// dir, which the caller removes; exe is its bytes.
func built(p *loops.Program, opt Options) (dir, bin string, exe []byte, err error) {
	if exe, err = Build(p, "exe", opt); err != nil {
		return "", "", nil, err
	}
	if dir, err = scratch.MkdirTemp("", "kiln-run-"); err != nil {
		return "", "", nil, err
	}
	bin = filepath.Join(dir, "program")
	if err := os.WriteFile(bin, exe, 0o755); err != nil {
		scratch.Remove(dir)
		return "", "", nil, err
	}
	return dir, bin, exe, nil
}

// readOutputs reads what the program wrote to out: each result, and the
// final value of each argument updated in place (args' otherwise).
func readOutputs(out string, f *kir.Func, args []*interp.Tensor) (results, final []*interp.Tensor, err error) {
	for i := range f.Results {
		t, err := readNpy(filepath.Join(out, FileName(resultName(f, i))+".npy"), f.Results[i].Value.Type.DType)
		if err != nil {
			return nil, nil, err
		}
		results = append(results, t)
	}
	for i, a := range f.Args {
		t := args[i]
		if a.Arg != nil && a.Arg.InOut {
			if t, err = readNpy(filepath.Join(out, FileName("updated."+a.Name)+".npy"), a.Type.DType); err != nil {
				return nil, nil, err
			}
		}
		final = append(final, t)
	}
	return results, final, nil
}

// RunRanks compiles the SPMD program p, runs it with mpirun as
// len(args) ranks, rank r on args[r] (its files under DIR/rankR), and
// returns each rank's results and final arguments.
func RunRanks(p *loops.Program, args [][]*interp.Tensor, opts ...RunOptions) (results, final [][]*interp.Tensor, err error) {
	var opt RunOptions
	if len(opts) > 0 {
		opt = opts[0]
	}
	n := len(args)
	if int64(n) != Ranks(p) {
		return nil, nil, fmt.Errorf("@%s runs as %d ranks, got arguments for %d", p.Func.Name, Ranks(p), n)
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		return nil, nil, fmt.Errorf("running %d ranks needs mpirun: apt-get install -y openmpi-bin libopenmpi-dev", n)
	}
	dir, bin, _, err := built(p, opt.Options)
	if err != nil {
		return nil, nil, err
	}
	defer scratch.Remove(dir)
	f := p.Func
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	for r, rargs := range args {
		if len(rargs) != len(f.Args) {
			return nil, nil, fmt.Errorf("@%s takes %d arguments, rank %d got %d", f.Name, len(f.Args), r, len(rargs))
		}
		rd := filepath.Join(in, fmt.Sprintf("rank%d", r))
		if err := os.MkdirAll(rd, 0o755); err != nil {
			return nil, nil, err
		}
		for i, a := range f.Args {
			if err := writeNpy(filepath.Join(rd, FileName(a.Name)+".npy"), rargs[i]); err != nil {
				return nil, nil, err
			}
		}
	}
	cmdArgs := []string{"-np", fmt.Sprint(n), "--oversubscribe"}
	if os.Geteuid() == 0 {
		cmdArgs = append(cmdArgs, "--allow-run-as-root")
	}
	cmdArgs = append(cmdArgs, bin, "--inputs", in, "--output-dir", out)
	msg, err := runMPI(mpirun, cmdArgs)
	if err != nil {
		return nil, nil, fmt.Errorf("mpirun of the compiled program failed: %v\n%s", err, strings.TrimSpace(string(msg)))
	}
	for r := range args {
		res, fin, err := readOutputs(filepath.Join(out, fmt.Sprintf("rank%d", r)), f, args[r])
		if err != nil {
			return nil, nil, fmt.Errorf("rank %d: %v", r, err)
		}
		results, final = append(results, res), append(final, fin)
	}
	return results, final, nil
}

// RunStages runs the programs of a pipeline's stages under mpirun, each
// on as many ranks as its ranks attribute says (stage s on the ranks
// after the earlier stages'), rank r on args[r]: each rank's results and
// final arguments.
func RunStages(ps []*loops.Program, args [][]*interp.Tensor, opt Options) (results, final [][]*interp.Tensor, err error) {
	total := 0
	for _, p := range ps {
		total += int(p.Func.Attrs.Int("ranks", 1))
	}
	if total != len(args) {
		return nil, nil, fmt.Errorf("the stages run on %d ranks, arguments for %d", total, len(args))
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		return nil, nil, fmt.Errorf("running %d pipeline stages needs mpirun: apt-get install -y openmpi-bin libopenmpi-dev", len(ps))
	}
	dir, err := scratch.MkdirTemp("", "kiln-stages-")
	if err != nil {
		return nil, nil, err
	}
	defer scratch.Remove(dir)
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	cmdArgs := []string{"--oversubscribe"}
	if os.Geteuid() == 0 {
		cmdArgs = append(cmdArgs, "--allow-run-as-root")
	}
	var rankFunc []*kir.Func // the function rank r runs
	for s, p := range ps {
		if Ranks(p) != int64(total) {
			return nil, nil, fmt.Errorf("@%s is a stage of a pipeline on %d ranks, not %d", p.Func.Name, Ranks(p), total)
		}
		exe, err := Build(p, "exe", opt)
		if err != nil {
			return nil, nil, fmt.Errorf("@%s: %v", p.Func.Name, err)
		}
		bin := filepath.Join(dir, fmt.Sprintf("stage%d", s))
		if err := os.WriteFile(bin, exe, 0o755); err != nil {
			return nil, nil, err
		}
		f := p.Func
		n := int(f.Attrs.Int("ranks", 1))
		for range n {
			r := len(rankFunc)
			rankFunc = append(rankFunc, f)
			rd := filepath.Join(in, fmt.Sprintf("rank%d", r))
			if err := os.MkdirAll(rd, 0o755); err != nil {
				return nil, nil, err
			}
			if len(args[r]) != len(f.Args) {
				return nil, nil, fmt.Errorf("@%s takes %d arguments, rank %d got %d", f.Name, len(f.Args), r, len(args[r]))
			}
			for i, a := range f.Args {
				if err := writeNpy(filepath.Join(rd, FileName(a.Name)+".npy"), args[r][i]); err != nil {
					return nil, nil, err
				}
			}
		}
		if s > 0 {
			cmdArgs = append(cmdArgs, ":")
		}
		cmdArgs = append(cmdArgs, "-np", fmt.Sprint(n), bin, "--inputs", in, "--output-dir", out)
	}
	msg, err := runMPI(mpirun, cmdArgs)
	if err != nil {
		return nil, nil, fmt.Errorf("mpirun of the stages failed: %v\n%s", err, strings.TrimSpace(string(msg)))
	}
	for r, f := range rankFunc {
		res, fin, err := readOutputs(filepath.Join(out, fmt.Sprintf("rank%d", r)), f, args[r])
		if err != nil {
			return nil, nil, fmt.Errorf("rank %d: %v", r, err)
		}
		results, final = append(results, res), append(final, fin)
	}
	return results, final, nil
}

// MPITimeout bounds an mpirun: ranks that wait for each other forever
// (a recv no rank sends) end as an error, not a hang.
var MPITimeout = 30 * time.Minute

func runMPI(mpirun string, args []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), MPITimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpirun, args...)
	cmd.WaitDelay = 10 * time.Second // ranks that outlive a killed mpirun keep its output open
	msg, err := scratch.CombinedOutput(cmd)
	if ctx.Err() != nil {
		return msg, fmt.Errorf("the ranks did not finish within %v (do they wait for each other?)", MPITimeout)
	}
	return msg, err
}

func writeNpy(path string, t *interp.Tensor) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	werr := npy.Write(fh, t)
	if cerr := fh.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

func readNpy(path string, want kir.DType) (*interp.Tensor, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	return npy.ReadAs(fh, want)
}
