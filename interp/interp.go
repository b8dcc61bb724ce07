package interp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/kiln-compiler/kiln/ir"
)

// runtime is the state of one run that kernels may share: with RunRanks,
// the rank and what joins it to the others.
type runtime struct {
	rank int64
	comm *comm
}

// Options control a run (random_uniform draws from its own seed
// attribute, as compiled code does, so a run needs no seed).
type Options struct {
	// Observe, when set, sees every op of the body after it ran, with its
	// results, before the values whose last use it was are released. The
	// tensors are the run's own: Observe must not change or keep them.
	Observe func(i int, op *ir.Op, results []*Tensor)
	// ObserveRank is Observe for RunRanks, told the rank; the ranks run
	// at once, so it must be safe for concurrent use.
	ObserveRank func(rank, i int, op *ir.Op, results []*Tensor)
}

// Run executes f on args (one per argument, in order) and returns its
// results. Arguments must have exactly the declared types; they are never
// modified (inout arguments are updated on copies: see RunWithUpdates).
func Run(f *ir.Func, args []*Tensor, opt Options) ([]*Tensor, error) {
	res, _, err := RunWithUpdates(f, args, opt)
	return res, err
}

// RunWithUpdates is Run that also returns the final value of every
// argument: the updated copy for inout arguments (optimizer steps), the
// argument itself otherwise.
func RunWithUpdates(f *ir.Func, args []*Tensor, opt Options) ([]*Tensor, []*Tensor, error) {
	return runFunc(f, args, opt)
}

func runFunc(f *ir.Func, args []*Tensor, opt Options) ([]*Tensor, []*Tensor, error) {
	return runOn(f, args, opt, &runtime{})
}

// RunRanks runs f on len(args) ranks at once, rank r on args[r], the
// collectives exchanging among them (an SPMD program, as mpirun starts
// it). It returns each rank's results and final arguments; when a rank
// fails, the error names it.
func RunRanks(f *ir.Func, args [][]*Tensor, opt Options) ([][]*Tensor, [][]*Tensor, error) {
	fs := make([]*ir.Func, len(args))
	for r := range fs {
		fs[r] = f
	}
	return RunPrograms(fs, args, opt)
}

// RunPrograms is RunRanks where rank r runs fs[r] (the stages of a
// pipeline): their sends and recvs meet across the ranks, and a run in
// which every rank waits is an error rather than a hang.
func RunPrograms(fs []*ir.Func, args [][]*Tensor, opt Options) ([][]*Tensor, [][]*Tensor, error) {
	n := len(args)
	if len(fs) != n {
		return nil, nil, fmt.Errorf("%d programs for %d ranks", len(fs), n)
	}
	c := newComm(int64(n))
	res, final, errs := make([][]*Tensor, n), make([][]*Tensor, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range args {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r], final[r], errs[r] = runOn(fs[r], args[r], opt, &runtime{rank: int64(r), comm: c})
			if errs[r] != nil {
				c.fail(errs[r])
			}
			c.finish()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil && !errors.Is(err, errOtherRank) {
			return nil, nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if k, n := c.unread(); n > 0 {
		return nil, nil, fmt.Errorf("rank %d sent %d tensors with tag %d to rank %d that no recv took", k.from, n, k.tag, k.to)
	}
	return res, final, nil
}

func runOn(f *ir.Func, args []*Tensor, opt Options, rt *runtime) ([]*Tensor, []*Tensor, error) {
	if len(args) != len(f.Args) {
		return nil, nil, fmt.Errorf("@%s takes %d arguments, got %d", f.Name, len(f.Args), len(args))
	}
	env := map[*ir.Value]*Tensor{}
	final := make([]*Tensor, len(args))
	for i, a := range f.Args {
		if args[i] == nil || !args[i].Type.Equal(a.Type) {
			got := "nothing"
			if args[i] != nil {
				got = args[i].Type.String()
			}
			return nil, nil, fmt.Errorf("argument %s: got %s, want %s", a.Ref(), got, a.Type)
		}
		final[i] = args[i]
		if a.Arg.InOut {
			final[i] = args[i].Clone()
		}
		env[a] = final[i]
	}
	last := lastUses(f)
	for i, op := range f.Body {
		if err := exec(op, env, rt); err != nil {
			return nil, nil, err
		}
		if opt.Observe != nil || opt.ObserveRank != nil {
			res := make([]*Tensor, len(op.Results))
			for j, r := range op.Results {
				res[j] = env[r]
			}
			if opt.Observe != nil {
				opt.Observe(i, op, res)
			}
			if opt.ObserveRank != nil {
				opt.ObserveRank(int(rt.rank), i, op, res)
			}
		}
		for _, v := range last[i] {
			delete(env, v)
		}
	}
	out := make([]*Tensor, len(f.Results))
	for i, r := range f.Results {
		out[i] = env[r.Value]
	}
	return out, final, nil
}

// lastUses lists, for each op index, the values whose last use it is
// (function results are never released).
func lastUses(f *ir.Func) [][]*ir.Value {
	lastAt := map[*ir.Value]int{}
	for i, op := range f.Body {
		for _, v := range op.Operands {
			lastAt[v] = i
		}
		for _, r := range op.Results {
			if _, used := lastAt[r]; !used {
				lastAt[r] = i
			}
		}
	}
	for _, r := range f.Results {
		delete(lastAt, r.Value)
	}
	out := make([][]*ir.Value, len(f.Body))
	for v, i := range lastAt {
		out[i] = append(out[i], v)
	}
	return out
}

func exec(op *ir.Op, env map[*ir.Value]*Tensor, rt *runtime) error {
	in := make([]*Tensor, len(op.Operands))
	for i, v := range op.Operands {
		in[i] = env[v]
		if in[i] == nil {
			return fmt.Errorf("%s: operand %s has no value", describe(op), v.Ref())
		}
	}
	out := make([]ir.Type, len(op.Results))
	for i, r := range op.Results {
		out[i] = r.Type
	}
	var res []*Tensor
	var err error
	if op.Region != nil {
		res, err = execRegion(op.Region, in, rt)
	} else {
		k := kernels[op.Kind]
		if k == nil {
			return fmt.Errorf("%s: the interpreter has no kernel for op %q", describe(op), op.Kind)
		}
		res, err = k(op, in, out, rt)
	}
	if err != nil {
		var inner *OpError
		if errors.As(err, &inner) {
			return err // the op inside a fused region says more
		}
		return &OpError{Op: op, Err: err}
	}
	for i, r := range op.Results {
		t := res[i]
		if !t.Type.Shape.Equal(r.Type.Shape) || t.Len() != int(r.Type.NumElements()) {
			return fmt.Errorf("%s: kernel produced %s for %s", describe(op), t.Type, r.Type)
		}
		if t.Type.DType != r.Type.DType {
			t = &Tensor{Type: r.Type, F: t.F, I: t.I}
		}
		t.round()
		env[r] = t
	}
	return nil
}

func execRegion(r *ir.Region, in []*Tensor, rt *runtime) ([]*Tensor, error) {
	env := map[*ir.Value]*Tensor{}
	for i, a := range r.Args {
		env[a] = in[i]
	}
	for _, op := range r.Body {
		if err := exec(op, env, rt); err != nil {
			return nil, err
		}
	}
	out := make([]*Tensor, len(r.Yield))
	for i, y := range r.Yield {
		out[i] = env[y]
	}
	return out, nil
}

// OpError is an input the interpreter cannot run: Op (the innermost, in
// fused regions) failed with Err, for instance on an index out of range.
type OpError struct {
	Op  *ir.Op
	Err error
}

func (e *OpError) Error() string { return describe(e.Op) + ": " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

func describe(op *ir.Op) string {
	s := "op " + op.Kind
	if len(op.Results) > 0 {
		s += " defining " + op.Results[0].Ref()
	}
	if !op.Loc.IsUnknown() {
		s += " at " + op.Loc.String()
	}
	return s
}

// IndexBound returns, for an integer argument used as indices (the
// operands that op records declare as run-time indices: gather indices,
// cross-entropy labels, lerp_gather's index vectors), the exclusive upper
// bound of the values valid for every use; ok is false for other
// arguments.
func IndexBound(f *ir.Func, arg *ir.Value) (bound int64, ok bool) {
	found := false
	// A fused kernel reads arg through the region argument at the same
	// position as its operand.
	uses := map[*ir.Value]bool{arg: true}
	f.Walk(func(op *ir.Op) {
		if op.Region != nil {
			for k, x := range op.Operands {
				if uses[x] && k < len(op.Region.Args) {
					uses[op.Region.Args[k]] = true
				}
			}
		}
		for _, x := range ir.IndexOperands(op) {
			if uses[op.Operands[x.Operand]] && (!found || x.Bound < bound) {
				bound, found = x.Bound, true
			}
		}
	})
	return bound, found
}

// RandomArgs draws a value for every argument from seed, as the design
// notes' Contracts define: floating arguments from normal(0, 1), integer
// arguments that index uniformly within the indexed dimension, other
// integers uniformly in [0, 10), bools uniformly.
func RandomArgs(f *ir.Func, seed uint64) []*Tensor {
	return RandomArgsBounded(f.Args, seed, func(i int) (int64, bool) { return IndexBound(f, f.Args[i]) })
}

// RandomArgsBounded is RandomArgs of arguments args whose index bounds
// bound gives (the functions that read them may be others: a partitioned
// step's ranks or stages).
func RandomArgsBounded(args []*ir.Value, seed uint64, bound func(i int) (int64, bool)) []*Tensor {
	return RandomArgsExcept(args, seed, bound, func(int) bool { return false })
}

// RandomArgsExcept is RandomArgsBounded without the arguments given
// reports (nil in their place): their values are drawn from the stream
// but not kept, so that the other arguments get the same values, and
// take no memory.
func RandomArgsExcept(args []*ir.Value, seed uint64, bound func(i int) (int64, bool), given func(i int) bool) []*Tensor {
	rng := rand.New(rand.NewPCG(seed, 0x6172677321))
	out := make([]*Tensor, len(args))
	for i, a := range args {
		b, ok := bound(i)
		switch {
		case given(i):
			skipDraws(a.Type, b, ok, rng)
		case ir.KeepsInit(a):
			skipDraws(a.Type, b, ok, rng) // drawn all the same, so that the other draws stay put
			out[i] = FromDense(a.Arg.Init)
			out[i].round() // as its dtype holds it (0.001 in f32 is 0.0010000000475)
		default:
			out[i] = randomTensor(a.Type, b, ok, rng)
		}
	}
	return out
}

// RandomTensor draws one argument's value (see RandomArgs).
func RandomTensor(f *ir.Func, a *ir.Value, rng *rand.Rand) *Tensor {
	b, ok := IndexBound(f, a)
	return randomTensor(a.Type, b, ok, rng)
}

func randomTensor(ty ir.Type, b int64, known bool, rng *rand.Rand) *Tensor {
	t := New(ty)
	for j := range t.F {
		t.F[j] = rng.NormFloat64()
	}
	t.round()
	bound := drawBound(ty, b, known)
	for j := range t.I {
		t.I[j] = rng.Int64N(bound)
	}
	return t
}

// skipDraws advances rng past the draws randomTensor would make.
func skipDraws(ty ir.Type, b int64, known bool, rng *rand.Rand) {
	n := ty.NumElements()
	if ty.DType.IsFloat() {
		for range n {
			rng.NormFloat64()
		}
		return
	}
	bound := drawBound(ty, b, known)
	for range n {
		rng.Int64N(bound)
	}
}

// drawBound is the bound of a random integer argument: an index's bound
// when known, 2 for bools, else 10.
func drawBound(ty ir.Type, b int64, known bool) int64 {
	bound := int64(10)
	if known {
		bound = b
	}
	if ty.DType == ir.Bool {
		bound = 2
	}
	return max(bound, 1)
}

// EvalOp runs a single op on concrete operands (constant folding uses it).
// The op's operands and results must carry their types.
func EvalOp(op *ir.Op, in []*Tensor) ([]*Tensor, error) {
	env := map[*ir.Value]*Tensor{}
	for i, v := range op.Operands {
		env[v] = in[i]
	}
	rt := &runtime{}
	if err := exec(op, env, rt); err != nil {
		return nil, err
	}
	out := make([]*Tensor, len(op.Results))
	for i, r := range op.Results {
		out[i] = env[r]
	}
	return out, nil
}

// ToDense converts a tensor to a constant of the same type.
func (x *Tensor) ToDense() *ir.Dense {
	return &ir.Dense{Type: x.Type, Floats: append([]float64(nil), x.F...), Ints: append([]int64(nil), x.I...)}
}
