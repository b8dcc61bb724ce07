package llvm

import (
	"fmt"
	"sort"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/llir/llvm/ir"
	"github.com/llir/llvm/ir/constant"
	"github.com/llir/llvm/ir/enum"
	"github.com/llir/llvm/ir/types"
	"github.com/llir/llvm/ir/value"
)

// Stages with at least this much work (loop points times the points of
// their reductions) run on several threads.
const parallelWork = 1 << 16

// work estimates the scalar operations of evaluating x once.
func work(x loops.Expr) int64 {
	switch x := x.(type) {
	case *loops.Reduce:
		n := int64(1)
		for _, e := range x.Extents {
			n *= e
		}
		return n * (1 + work(x.Body))
	case *loops.Unary:
		return work(x.X)
	case *loops.Binary:
		return work(x.A) + work(x.B)
	case *loops.Compare:
		return work(x.A) + work(x.B)
	case *loops.Select:
		return work(x.C) + work(x.A) + work(x.B)
	case *loops.Convert:
		return work(x.X)
	}
	return 0
}

// parallelDim chooses the loop a stage splits across threads: the
// outermost of its domain with more than one iteration (a matmul splits
// its row blocks, reported as dimension 0). Stages that accumulate into
// indices of their own choosing (scatters) stay sequential: two threads
// could add to one element.
func (e *fn) parallelDim(s *loops.Stage) (int, bool) {
	if e.md.opt.Threads == 1 || s.Guard != nil || (s.Accumulate && s.Matmul == nil) {
		return 0, false
	}
	total := int64(1)
	for _, x := range s.Extents {
		total *= x
	}
	if s.Matmul != nil {
		_, n := matmulChunks(s)
		return 0, total*s.Matmul.Extent >= parallelWork && n > 1
	}
	if total*(1+work(s.Value)) < parallelWork {
		return 0, false
	}
	for d, x := range s.Extents {
		if x > 1 {
			return d, true
		}
	}
	return 0, false
}

// parallelStage outlines the stage into a function of a range of its
// dimension dim and runs it through kiln_parallel_for. The outlined
// function receives a context: arena, params, inputs, the kernel's
// workspace and the values of the enclosing loop variables.
func (e *fn) parallelStage(s *loops.Stage, dim int) {
	vars := make([]*loops.Var, 0, len(e.bound))
	for v := range e.bound {
		vars = append(vars, v)
	}
	sort.Slice(vars, func(i, j int) bool { return vars[i].ID < vars[j].ID })
	slots := 3 + len(e.temps) + len(vars)
	ctxT := types.NewArray(uint64(slots), types.I64)
	ctx := e.entry.NewAlloca(ctxT)
	put := func(i int, v value.Value) {
		if _, ok := v.Type().(*types.PointerType); ok {
			v = e.cur.NewPtrToInt(v, types.I64)
		}
		e.cur.NewStore(v, e.cur.NewGetElementPtr(ctxT, ctx, i64(0), i64(int64(i))))
	}
	put(0, e.arena)
	put(1, e.params)
	put(2, e.inputs)
	for i, t := range e.temps {
		put(3+i, t)
	}
	for i, v := range vars {
		put(3+len(e.temps)+i, e.bound[v])
	}

	md := e.md
	md.outlined++
	pctx, lo, hi := ir.NewParam("ctx", i8p), ir.NewParam("lo", types.I64), ir.NewParam("hi", types.I64)
	f := md.m.NewFunc(fmt.Sprintf("%s_p%d", e.name, md.outlined), types.Void, pctx, lo, hi)
	f.Linkage = enum.LinkageInternal
	entry := f.NewBlock("")
	body := f.NewBlock("")
	slot := entry.NewBitCast(pctx, types.NewPointer(ctxT))
	get := func(i int) value.Value {
		return entry.NewLoad(types.I64, entry.NewGetElementPtr(ctxT, slot, i64(0), i64(int64(i))))
	}
	o := &fn{md: md, f: f, entry: entry, cur: body, bases: map[baseKey]value.Value{}, bound: map[*loops.Var]value.Value{}, name: e.name}
	o.arena = entry.NewIntToPtr(get(0), i8p)
	o.params = entry.NewIntToPtr(get(1), i8pp)
	o.inputs = entry.NewIntToPtr(get(2), i8pp)
	for i, name := range e.tempNames {
		o.bases[baseKey{storage: loops.Temp, temp: name}] = entry.NewIntToPtr(get(3+i), i8p)
	}
	for i, v := range vars {
		o.bound[v] = get(3 + len(e.temps) + i)
	}
	if s.Matmul != nil {
		o.matmul(s, lo, hi)
	} else {
		for d := 0; d < dim; d++ {
			o.bound[s.Vars[d]] = i64(0)
		}
		o.loopFrom(lo, hi, func(i value.Value) {
			o.bound[s.Vars[dim]] = i
			rest := &loops.Stage{Vars: s.Vars[dim+1:], Extents: s.Extents[dim+1:], Out: s.Out, Value: s.Value, Accumulate: s.Accumulate}
			rest.Index = s.Index
			if rest.Index == nil {
				rest.Index = make([]loops.Expr, len(s.Vars))
				for k, v := range s.Vars {
					rest.Index[k] = v
				}
			}
			o.stage(rest)
		})
	}
	o.cur.NewRet(nil)
	entry.NewBr(body)
	if o.err != nil {
		e.fail(o.err)
	}
	n := s.Extents[dim]
	if s.Matmul != nil {
		_, n = matmulChunks(s)
	}
	e.cur.NewCall(md.parallelFor(), f, e.cur.NewBitCast(ctx, i8p), i64(n))
}

var bodyType = types.NewPointer(types.NewFunc(types.Void, i8p, types.I64, types.I64))

// parallelFor emits kiln_parallel_for(body, ctx, n): it splits [0, n)
// into one contiguous chunk per thread, runs the first on the calling
// thread and the others on new POSIX threads, and joins them. A thread
// that cannot be created runs its chunk on the caller.
func (md *module) parallelFor() *ir.Func {
	if md.parallel != nil {
		return md.parallel
	}
	taskT := types.NewStruct(bodyType, i8p, types.I64, types.I64)
	arg := ir.NewParam("task", i8p)
	tramp := md.m.NewFunc("kiln_task", i8p, arg)
	tramp.Linkage = enum.LinkageInternal
	tb := tramp.NewBlock("")
	tp := tb.NewBitCast(arg, types.NewPointer(taskT))
	field := func(b *ir.Block, p value.Value, i int64, t types.Type) value.Value {
		return b.NewLoad(t, b.NewGetElementPtr(taskT, p, constant.NewInt(types.I32, 0), constant.NewInt(types.I32, i)))
	}
	tb.NewCall(field(tb, tp, 0, bodyType), field(tb, tp, 1, i8p), field(tb, tp, 2, types.I64), field(tb, tp, 3, types.I64))
	tb.NewRet(constant.NewNull(i8p))

	bodyP, ctxP, nP := ir.NewParam("body", bodyType), ir.NewParam("ctx", i8p), ir.NewParam("n", types.I64)
	f := md.m.NewFunc("kiln_parallel_for", types.Void, bodyP, ctxP, nP)
	f.Linkage = enum.LinkageInternal
	entry := f.NewBlock("")
	start := f.NewBlock("")
	e := &fn{md: md, f: f, entry: entry, cur: start}
	const maxThreads = 256
	var threads value.Value
	if md.opt.Threads > 0 {
		threads = i64(int64(md.opt.Threads))
	} else {
		threads = e.cur.NewCall(md.declare("sysconf", types.I64, types.I32), constant.NewInt(types.I32, 84)) // _SC_NPROCESSORS_ONLN
	}
	c := e.cur
	clampMin := func(a, b value.Value) value.Value { return c.NewSelect(c.NewICmp(enum.IPredSLT, a, b), a, b) }
	threads = clampMin(clampMin(threads, nP), i64(maxThreads))
	threads = c.NewSelect(c.NewICmp(enum.IPredSLT, threads, i64(1)), i64(1), threads)
	tasks := entry.NewAlloca(types.NewArray(maxThreads, taskT))
	tids := entry.NewAlloca(types.NewArray(maxThreads, types.I64))
	chunk := func(t value.Value) value.Value { return e.cur.NewSDiv(e.cur.NewMul(nP, t), threads) }
	create := md.declare("pthread_create", types.I32, types.NewPointer(types.I64), i8p, tramp.Type(), i8p)
	join := md.declare("pthread_join", types.I32, types.I64, types.NewPointer(i8p))
	e.loopFrom(i64(1), threads, func(t value.Value) {
		c := e.cur
		task := c.NewGetElementPtr(types.NewArray(maxThreads, taskT), tasks, i64(0), t)
		set := func(i int64, v value.Value) {
			c.NewStore(v, c.NewGetElementPtr(taskT, task, constant.NewInt(types.I32, 0), constant.NewInt(types.I32, i)))
		}
		set(0, bodyP)
		set(1, ctxP)
		set(2, chunk(t))
		set(3, chunk(c.NewAdd(t, i64(1))))
		tid := c.NewGetElementPtr(types.NewArray(maxThreads, types.I64), tids, i64(0), t)
		rc := c.NewCall(create, tid, constant.NewNull(i8p), tramp, c.NewBitCast(task, i8p))
		failed, done := f.NewBlock(""), f.NewBlock("")
		c.NewCondBr(c.NewICmp(enum.IPredNE, rc, constant.NewInt(types.I32, 0)), failed, done)
		failed.NewCall(tramp, failed.NewBitCast(task, i8p))
		failed.NewStore(i64(0), tid)
		failed.NewBr(done)
		e.cur = done
	})
	e.cur.NewCall(bodyP, ctxP, i64(0), chunk(i64(1)))
	e.loopFrom(i64(1), threads, func(t value.Value) {
		c := e.cur
		tid := c.NewLoad(types.I64, c.NewGetElementPtr(types.NewArray(maxThreads, types.I64), tids, i64(0), t))
		call, done := f.NewBlock(""), f.NewBlock("")
		c.NewCondBr(c.NewICmp(enum.IPredNE, tid, i64(0)), call, done)
		call.NewCall(join, tid, constant.NewNull(types.NewPointer(i8p)))
		call.NewBr(done)
		e.cur = done
	})
	e.cur.NewRet(nil)
	entry.NewBr(start)
	md.parallel = f
	return f
}
