package optest

import (
	"fmt"
	"math"
	"slices"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// A tracer runs a loop program (codegen/loops) on concrete inputs and
// records, for every element it stores, which elements of the program's
// arguments the stored value was computed from: the dependencies of its
// loads, their indices' and every operand's, and of guards and
// accumulations, unioned. Both sides of a select count, so the sets are
// an upper bound of the true dependencies, whatever the data.

// deps is a sorted set of argument elements (tracer.base numbers them).
type deps []int32

func (a deps) union(b deps) deps {
	switch {
	case len(a) == 0:
		return b
	case len(b) == 0:
		return a
	}
	out := make(deps, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || i < len(a) && a[i] < b[j]:
			out = append(out, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// val is a scalar as the loop language computes it, with its
// dependencies.
type val struct {
	f float64
	i int64
	b bool
	d deps
}

// memKey is the address of one element: where it is stored and its byte
// address there (temporaries are told apart by name).
type memKey struct {
	storage loops.Storage
	slot    int
	name    string
	addr    int64
}

type tracer struct {
	prog *loops.Program
	mem  map[memKey]val
	vars map[int]int64
	// base[k] numbers the first element of argument k of prog.Func.
	base []int32
}

// trace runs every kernel of p on args (the arguments of p.Func, in
// order) and returns, for each of p's results, each element's value and
// dependencies.
func trace(p *loops.Program, args []*interp.Tensor) ([][]val, error) {
	t := &tracer{prog: p, mem: map[memKey]val{}, vars: map[int]int64{}}
	n := int32(0)
	for k, a := range p.Func.Args {
		t.base = append(t.base, n)
		x := args[k]
		b := t.argBuffer(a)
		for e := 0; e < x.Len(); e++ {
			v := val{d: deps{n + int32(e)}}
			if x.F != nil {
				v.f = x.F[e]
			} else {
				v.i, v.b = x.I[e], x.I[e] != 0
			}
			t.mem[t.key(b, int64(e))] = v
		}
		n += int32(x.Len())
	}
	for _, k := range p.Kernels {
		if err := t.steps(k.Steps); err != nil {
			return nil, fmt.Errorf("%s: %v", k.Name, err)
		}
	}
	out := make([][]val, len(p.Results))
	for i, b := range p.Results {
		for e := int64(0); e < b.Type.NumElements(); e++ {
			out[i] = append(out[i], t.load(b, e))
		}
	}
	return out, nil
}

// argBuffer is the buffer through which p reads argument a.
func (t *tracer) argBuffer(a *ir.Value) *loops.Buffer {
	for i, v := range t.prog.Params {
		if v == a {
			return &loops.Buffer{Type: a.Type, Storage: loops.Param, Slot: i}
		}
	}
	for i, v := range t.prog.Inputs {
		if v == a {
			return &loops.Buffer{Type: a.Type, Storage: loops.Input, Slot: i}
		}
	}
	panic("optest: argument " + a.Name + " is not the program's")
}

func (t *tracer) key(b *loops.Buffer, flat int64) memKey {
	k := memKey{storage: b.Storage, slot: b.Slot, addr: b.Offset + flat*b.Type.DType.Size()}
	if b.Storage == loops.Temp {
		k.name = b.Name
	}
	return k
}

func (t *tracer) load(b *loops.Buffer, flat int64) val {
	if b.Storage == loops.Const {
		if b.Type.DType.IsFloat() {
			return val{f: b.Data.Float(flat)}
		}
		i := b.Data.Int(flat)
		return val{i: i, b: i != 0}
	}
	return t.mem[t.key(b, flat)]
}

func (t *tracer) steps(steps []loops.Step) error {
	for _, s := range steps {
		switch s := s.(type) {
		case *loops.Loop:
			for i := int64(0); i < s.Extent; i++ {
				t.vars[s.Var.ID] = i
				if err := t.steps(s.Body); err != nil {
					return err
				}
			}
		case *loops.Stage:
			if err := t.stage(s); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown step %T", s)
		}
	}
	return nil
}

// domain calls fn at every point of vars × extents.
func (t *tracer) domain(vars []*loops.Var, extents []int64, fn func() error) error {
	if len(vars) == 0 {
		return fn()
	}
	for i := int64(0); i < extents[0]; i++ {
		t.vars[vars[0].ID] = i
		if err := t.domain(vars[1:], extents[1:], fn); err != nil {
			return err
		}
	}
	return nil
}

func (t *tracer) stage(s *loops.Stage) error {
	return t.domain(s.Vars, s.Extents, func() error {
		var guard deps
		if s.Guard != nil {
			g := t.eval(s.Guard)
			if !g.b {
				return nil
			}
			guard = g.d
		}
		idx := s.Index
		if idx == nil {
			idx = make([]loops.Expr, len(s.Vars))
			for i, v := range s.Vars {
				idx[i] = v
			}
		}
		flat, d, err := t.flat(s.Out, idx)
		if err != nil {
			return err
		}
		var v val
		if s.Matmul != nil {
			v = t.matmul(s.Matmul)
		} else {
			v = t.eval(s.Value)
		}
		v = convert(v, s.Value, loops.ComputeKind(s.Out.Type.DType))
		v.d = v.d.union(d).union(guard)
		if s.Accumulate {
			old := t.load(s.Out, flat)
			v.f, v.i = old.f+v.f, old.i+v.i
			v.d = v.d.union(old.d)
		}
		t.mem[t.key(s.Out, flat)] = v
		return nil
	})
}

// convert turns the value e computed into kind k (a stage stores in its
// output's kind; a nil e is a matmul, already a float).
func convert(v val, e loops.Expr, k loops.Kind) val {
	if e == nil {
		return v
	}
	return convertKind(v, e.Kind(), k)
}

func convertKind(v val, from, to loops.Kind) val {
	switch {
	case from == to, from.IsFloat() && to.IsFloat():
		return v
	case to.IsFloat() && from == loops.I64:
		v.f = float64(v.i)
	case to.IsFloat() && from == loops.Bool:
		v.f = b2f(v.b)
	case to == loops.I64 && from.IsFloat():
		v.i = scalar.SaturatingInt(v.f)
	case to == loops.I64 && from == loops.Bool:
		v.i = int64(b2f(v.b))
	case to == loops.Bool && from.IsFloat():
		v.b = v.f != 0
	case to == loops.Bool && from == loops.I64:
		v.b = v.i != 0
	}
	return v
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// flat is the row-major element index of idx in b, with the
// dependencies of the index expressions.
func (t *tracer) flat(b *loops.Buffer, idx []loops.Expr) (int64, deps, error) {
	var d deps
	flat := int64(0)
	for i, e := range idx {
		v := t.eval(e)
		d = d.union(v.d)
		if v.i < 0 || v.i >= b.Type.Shape[i] {
			return 0, nil, fmt.Errorf("index %d of %s out of range: %d", i, b, v.i)
		}
		flat = flat*b.Type.Shape[i] + v.i
	}
	return flat, d, nil
}

// accVal is the accumulated sum of a matmul stage, as its epilogue sees it.
type accVal struct{ v val }

func (accVal) Kind() loops.Kind { return loops.F64 }

func (t *tracer) matmul(m *loops.Matmul) val {
	var acc val
	for k := int64(0); k < m.Extent; k++ {
		t.vars[m.K.ID] = k
		a, b := t.eval(m.A), t.eval(m.B)
		acc.f += a.f * b.f
		acc.d = acc.d.union(a.d).union(b.d)
	}
	if m.Epilogue == nil {
		return acc
	}
	return t.eval(m.Epilogue(accVal{acc}))
}

func (t *tracer) eval(e loops.Expr) val {
	switch e := e.(type) {
	case accVal:
		return e.v
	case *loops.Var:
		return val{i: t.vars[e.ID]}
	case loops.Int:
		return val{i: e.V}
	case loops.Float:
		return val{f: e.V}
	case loops.BoolConst:
		return val{b: e.V}
	case *loops.Load:
		var gd deps
		if e.Guard != nil {
			g := t.eval(e.Guard)
			if !g.b {
				return convertKind(val{f: e.Else, i: int64(e.Else), b: e.Else != 0, d: g.d}, loops.F64, loops.F64)
			}
			gd = g.d
		}
		flat, d, err := t.flat(e.Buf, e.Index)
		if err != nil {
			panic(err)
		}
		v := t.load(e.Buf, flat)
		v.d = v.d.union(d).union(gd)
		return v
	case *loops.Unary:
		x := t.eval(e.X)
		switch e.X.Kind() {
		case loops.Bool:
			x.b = !x.b
		case loops.I64:
			x.i = interp.IntUnary(e.Fn)(x.i)
		default:
			x.f = interp.FloatUnary(e.Fn)(x.f)
		}
		return x
	case *loops.Binary:
		a, b := t.eval(e.A), t.eval(e.B)
		out := val{d: a.d.union(b.d)}
		switch e.A.Kind() {
		case loops.Bool:
			switch e.Op {
			case scalar.And:
				out.b = a.b && b.b
			case scalar.Or:
				out.b = a.b || b.b
			default:
				out.b = a.b != b.b
			}
		case loops.I64:
			out.i = interp.IntBinary(e.Op)(a.i, b.i)
		default:
			out.f = interp.FloatBinary(e.Op)(a.f, b.f)
		}
		return out
	case *loops.Compare:
		a, b := t.eval(e.A), t.eval(e.B)
		out := val{d: a.d.union(b.d)}
		switch e.A.Kind() {
		case loops.Bool:
			out.b = interp.IntBinary(e.Pred)(int64(b2f(a.b)), int64(b2f(b.b))) != 0
		case loops.I64:
			out.b = interp.IntBinary(e.Pred)(a.i, b.i) != 0
		default:
			out.b = interp.FloatCompare(e.Pred)(a.f, b.f)
		}
		return out
	case *loops.Select:
		c, a, b := t.eval(e.C), t.eval(e.A), t.eval(e.B)
		out := b
		if c.b {
			out = a
		}
		out.d = c.d.union(a.d).union(b.d)
		return out
	case *loops.Convert:
		return convertKind(t.eval(e.X), e.X.Kind(), e.To)
	case *loops.Round:
		x := t.eval(e.X)
		x.f = ir.RoundTo(e.To, x.f)
		return x
	case *loops.Reduce:
		acc := val{}
		switch {
		case e.Op == scalar.Max && e.Acc.IsFloat():
			acc.f = math.Inf(-1)
		case e.Op == scalar.Min && e.Acc.IsFloat():
			acc.f = math.Inf(1)
		case e.Op == scalar.Max:
			acc.i = math.MinInt64
		case e.Op == scalar.Min:
			acc.i = math.MaxInt64
		}
		err := t.domain(e.Vars, e.Extents, func() error {
			v := t.eval(e.Body)
			acc.d = acc.d.union(v.d)
			if e.Acc.IsFloat() {
				acc.f = interp.FloatBinary(e.Op)(acc.f, v.f)
			} else {
				acc.i = interp.IntBinary(e.Op)(acc.i, v.i)
			}
			return nil
		})
		if err != nil {
			panic(err)
		}
		return acc
	case *loops.Guarded:
		c := t.eval(e.Cond)
		if !c.b {
			return val{f: e.Else, i: int64(e.Else), b: e.Else != 0, d: c.d}
		}
		x := t.eval(e.X)
		x.d = x.d.union(c.d)
		return x
	case *loops.RankIndex:
		return val{} // a program of one rank
	case *loops.Mix:
		x := t.eval(e.X)
		x.i = int64(interp.Mix64(uint64(x.i)))
		return x
	case *loops.Checked:
		c, x := t.eval(e.Cond), t.eval(e.X)
		x.d = x.d.union(c.d)
		return x
	}
	panic(fmt.Sprintf("optest: the tracer has no meaning for %T", e))
}

// unflat is the multi-index of element flat of shape s.
func unflat(flat int64, s ir.Shape) []int64 {
	idx := make([]int64, len(s))
	for d := len(s) - 1; d >= 0; d-- {
		idx[d] = flat % s[d]
		flat /= s[d]
	}
	return idx
}

// element names dependency k: its argument and multi-index.
func (t *tracer) element(k int32) (int, []int64) {
	a := sortSearch(t.base, k)
	return a, unflat(int64(k-t.base[a]), t.prog.Func.Args[a].Type.Shape)
}

// sortSearch is the last i with base[i] <= k.
func sortSearch(base []int32, k int32) int {
	i, _ := slices.BinarySearch(base, k+1)
	return i - 1
}
