package llvm

import (
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir/scalar"
	"github.com/llir/llvm/ir/enum"
	"github.com/llir/llvm/ir/types"
	"github.com/llir/llvm/ir/value"
)

// Register and cache blocking of matmul stages: mr rows of the result
// share every load of B, nb columns of accumulators stay in L1.
const (
	mr = 4
	nb = 256
)

// matmul emits a matmul stage as
//
//	for each block of nb columns, for each block of mr rows:
//	  acc[mr][nb] = 0
//	  for k: a_r = A(m_r, k); for j: acc[r][j] += a_r * B(k, j)
//	  store epilogue(acc) (or add it)
//
// The innermost loop is a unit-stride loop clang vectorises.
//
// With lo and hi set, only the row blocks [lo, hi) are computed (a
// parallel chunk).
func (e *fn) matmul(s *loops.Stage, lo, hi value.Value) {
	mm := s.Matmul
	if packed(s) {
		e.matmulF32(s, lo, hi)
		return
	}
	if tiny(s) {
		e.matmulTiny(s, lo, hi)
		return
	}
	M, N := s.Extents[0], s.Extents[1]
	mv, nv := s.Vars[0], s.Vars[1]
	k := mm.A.Kind()
	t := kindType(k)
	acc := e.entry.NewAlloca(types.NewArray(mr*nb, t))
	acc.Align = 64
	zero := identity(scalar.Add, k)
	if lo == nil {
		lo, hi = i64(0), i64((M+mr-1)/mr)
	}
	e.loopFrom(lo, hi, func(ib value.Value) {
		e.loop(i64((N+nb-1)/nb), func(jb value.Value) {
			j0 := e.cur.NewMul(jb, i64(nb))
			rem := e.cur.NewSub(i64(N), j0)
			jn := e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, rem, i64(nb)), rem, i64(nb))
			m0 := e.cur.NewMul(ib, i64(mr))
			rows := make([]value.Value, mr)
			for r := range rows {
				m := e.cur.NewAdd(m0, i64(int64(r)))
				rows[r] = e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, m, i64(M)), m, i64(M-1))
			}
			slot := func(r int, j value.Value) value.Value {
				return e.cur.NewGetElementPtr(types.NewArray(mr*nb, t), acc, i64(0), e.cur.NewAdd(j, i64(int64(r*nb))))
			}
			e.loop(jn, func(j value.Value) {
				for r := 0; r < mr; r++ {
					e.cur.NewStore(zero, slot(r, j))
				}
			})
			e.loop(i64(mm.Extent), func(kv value.Value) {
				e.bound[mm.K] = kv
				as := make([]value.Value, mr)
				for r := range as {
					e.push()
					e.bound[mv] = rows[r]
					as[r] = e.expr(mm.A)
					e.pop()
				}
				e.loop(jn, func(j value.Value) {
					e.bound[nv] = e.cur.NewAdd(j0, j)
					b := e.expr(mm.B)
					for r := 0; r < mr; r++ {
						p := slot(r, j)
						old := e.cur.NewLoad(t, p)
						e.cur.NewStore(e.arith(scalar.Add, k, old, e.arith(scalar.Mul, k, as[r], b)), p)
					}
				})
			})
			for r := 0; r < mr; r++ {
				e.storeRow(s, m0, r, j0, jn, func(j value.Value) value.Value { return e.cur.NewLoad(t, slot(r, j)) })
			}
		})
	})
}

// storeRow stores row m0+r of a matmul result (when inside the matrix):
// for j < n, element at(j) through the epilogue at column j0+j.
func (e *fn) storeRow(s *loops.Stage, m0 value.Value, r int, j0, n value.Value, at func(j value.Value) value.Value) {
	mm := s.Matmul
	k := mm.A.Kind()
	m := e.cur.NewAdd(m0, i64(int64(r)))
	then, done := e.f.NewBlock(""), e.f.NewBlock("")
	e.cur.NewCondBr(e.cur.NewICmp(enum.IPredSLT, m, i64(s.Extents[0])), then, done)
	e.cur = then
	e.push()
	e.bound[s.Vars[0]] = m
	e.loop(n, func(j value.Value) {
		e.bound[s.Vars[1]] = e.cur.NewAdd(j0, j)
		v := at(j)
		if mm.Epilogue != nil {
			v = e.expr(mm.Epilogue(&accValue{v: v, k: k}))
		}
		e.storeAt(s.Out, indexOf(s), e.convert(v, k, loops.ComputeKind(s.Out.Type.DType)), s.Accumulate)
	})
	e.pop()
	e.cur.NewBr(done)
	e.cur = done
}

func indexOf(s *loops.Stage) []loops.Expr {
	if s.Index != nil {
		return s.Index
	}
	return []loops.Expr{s.Vars[0], s.Vars[1]}
}

// accValue carries an already computed accumulator into an epilogue
// expression.
type accValue struct {
	v value.Value
	k loops.Kind
}

func (a *accValue) Kind() loops.Kind { return a.k }

// tinyMatmul is the multiply-adds up to which a matmul stage runs as the
// plain triple loop with one accumulator: the register blocking of
// matmul saves nothing on products this small and triples their code,
// which dominates a program of many small layers.
const tinyMatmul = 4096

func tiny(s *loops.Stage) bool {
	return s.Extents[0]*s.Extents[1]*s.Matmul.Extent <= tinyMatmul
}

// matmulTiny emits, for the row blocks [lo, hi) of mr rows (matmul's
// chunks),
//
//	for each row m, column n: acc = 0; for k: acc += A(m,k)·B(k,n); store epilogue(acc)
func (e *fn) matmulTiny(s *loops.Stage, lo, hi value.Value) {
	mm := s.Matmul
	M, N := s.Extents[0], s.Extents[1]
	k := mm.A.Kind()
	t := kindType(k)
	acc := e.entry.NewAlloca(t)
	rowLo, rowHi := value.Value(i64(0)), value.Value(i64(M))
	if lo != nil {
		rowLo = e.cur.NewMul(lo, i64(mr))
		end := e.cur.NewMul(hi, i64(mr))
		rowHi = e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, end, i64(M)), end, i64(M))
	}
	e.loopFrom(rowLo, rowHi, func(m value.Value) {
		e.bound[s.Vars[0]] = m
		e.loop(i64(N), func(n value.Value) {
			e.bound[s.Vars[1]] = n
			e.cur.NewStore(identity(scalar.Add, k), acc)
			e.loop(i64(mm.Extent), func(kv value.Value) {
				e.bound[mm.K] = kv
				prod := e.arith(scalar.Mul, k, e.expr(mm.A), e.expr(mm.B))
				e.cur.NewStore(e.arith(scalar.Add, k, e.cur.NewLoad(t, acc), prod), acc)
			})
			v := value.Value(e.cur.NewLoad(t, acc))
			if mm.Epilogue != nil {
				v = e.expr(mm.Epilogue(&accValue{v: v, k: k}))
			}
			e.storeAt(s.Out, indexOf(s), e.convert(v, k, loops.ComputeKind(s.Out.Type.DType)), s.Accumulate)
		})
	})
}
