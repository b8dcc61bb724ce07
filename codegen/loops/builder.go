package loops

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// builder collects the steps and workspace of one kernel.
type builder struct {
	nvars int
	temps []*Buffer
	steps *[]Step
	opts  Options
}

func (b *builder) vars(n int) []*Var {
	vs := make([]*Var, n)
	for i := range vs {
		b.nvars++
		vs[i] = &Var{ID: b.nvars}
	}
	return vs
}

func (b *builder) temp(name string, t ir.Type) *Buffer {
	buf := &Buffer{Name: fmt.Sprintf("%s%d", name, len(b.temps)), Type: t, Storage: Temp}
	b.temps = append(b.temps, buf)
	return buf
}

func (b *builder) add(s Step) { *b.steps = append(*b.steps, s) }

// lastStage is the step added last, which the caller knows is a stage.
func (b *builder) lastStage() *Stage { return (*b.steps)[len(*b.steps)-1].(*Stage) }

// loop runs body inside a loop over [0, n) and returns its variable.
func (b *builder) loop(n int64, body func(v *Var)) {
	v := b.vars(1)[0]
	l := &Loop{Var: v, Extent: n}
	saved := b.steps
	b.steps = &l.Body
	body(v)
	b.steps = saved
	b.add(l)
}

// store writes fn(idx) at every element of out.
func (b *builder) store(out *Buffer, fn func(idx []Expr) Expr) {
	vs := b.vars(out.Type.Rank())
	b.add(&Stage{Vars: vs, Extents: out.Type.Shape.Clone(), Out: out, Value: conv(fn(exprs(vs)), ComputeKind(out.Type.DType))})
}

// fill sets every element of out to v.
func (b *builder) fill(out *Buffer, v float64) {
	b.store(out, func([]Expr) Expr { return fconst(F64, v) })
}

// scatter adds fn(idx) at out[at(idx)] for every point of the domain
// extents where guard (which may be nil) holds.
func (b *builder) scatter(out *Buffer, extents []int64, at func(idx []Expr) []Expr, guard func(idx []Expr) Expr, fn func(idx []Expr) Expr) {
	vs := b.vars(len(extents))
	idx := exprs(vs)
	s := &Stage{Vars: vs, Extents: extents, Out: out, Index: at(idx), Value: conv(fn(idx), ComputeKind(out.Type.DType)), Accumulate: true}
	if guard != nil {
		s.Guard = guard(idx)
	}
	b.add(s)
}

// reduce folds fn over the domain extents.
func (b *builder) reduce(op scalar.Prim, acc Kind, extents []int64, fn func(r []Expr) Expr) Expr {
	if len(extents) == 0 {
		return conv(fn(nil), acc)
	}
	vs := b.vars(len(extents))
	return &Reduce{Op: op, Vars: vs, Extents: extents, Body: conv(fn(exprs(vs)), acc), Acc: acc}
}

// matmul stores epilogue(Σk a(m,k)·bv(k,n)) at out[at(m,n)] for m < M,
// n < N (accumulating when acc is set).
func (b *builder) matmul(out *Buffer, M, N, K int64, at func(m, n Expr) []Expr, a func(m, k Expr) Expr, bv func(k, n Expr) Expr, epilogue func(acc, m, n Expr) Expr, acc bool) {
	vs := b.vars(3)
	m, n, k := vs[0], vs[1], vs[2]
	kind := ComputeKind(out.Type.DType)
	if !kind.IsFloat() {
		kind = F64
	}
	if M < 4 {
		// A matrix-vector product: one dot product per output, the
		// contraction innermost and contiguous.
		v := b.reduce(scalar.Add, kind, []int64{K}, func(r []Expr) Expr {
			return mul(conv(a(m, r[0]), kind), conv(bv(r[0], n), kind))
		})
		if epilogue != nil {
			v = epilogue(v, m, n)
		}
		b.add(&Stage{Vars: []*Var{m, n}, Extents: []int64{M, N}, Out: out, Index: at(m, n), Accumulate: acc,
			Value: conv(v, ComputeKind(out.Type.DType))})
		return
	}
	var epi func(Expr) Expr
	if epilogue != nil {
		epi = func(acc Expr) Expr { return epilogue(acc, m, n) }
	}
	b.add(&Stage{
		Vars: []*Var{m, n}, Extents: []int64{M, N}, Out: out, Index: at(m, n), Accumulate: acc,
		Matmul: &Matmul{K: k, Extent: K, A: conv(a(m, k), kind), B: conv(bv(k, n), kind), Epilogue: epi},
	})
}
