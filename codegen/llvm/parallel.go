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
	case *loops.Round:
		return work(x.X)
	case *loops.Checked:
		return work(x.Cond) + work(x.X)
	}
	return 0
}

// parallelDim chooses the loop a stage splits across threads: the
// outermost of its domain with more than one iteration (a matmul splits
// its row blocks, reported as dimension 0). A stage that accumulates into
// indices of its own choosing (a scatter) splits only along a loop whose
// variable, and every outer one's, is its own index of the output (a max
// pool's gradient scatters within its image and channel): threads then
// add into disjoint slices. Other scatters stay sequential: two threads
// could add to one element.
func (e *fn) parallelDim(s *loops.Stage) (int, bool) {
	if e.md.opt.Threads == 1 || s.Guard != nil {
		return 0, false
	}
	if s.Accumulate && s.Matmul == nil {
		d := 0
		for d < len(s.Extents) && s.Extents[d] <= 1 {
			d++
		}
		if d == len(s.Extents) || !indexedBy(s, d) {
			return 0, false
		}
	}
	total := int64(1)
	for _, x := range s.Extents {
		total *= x
	}
	if s.Matmul != nil {
		_, n := matmulChunks(s)
		return 0, total*s.Matmul.Extent >= parallelWork && n > 1
	}
	cost := 1 + work(s.Value)
	for _, x := range s.Index {
		cost += work(x) // a scatter's target may be a search (a max-pool gradient's first maximum)
	}
	if total*cost < parallelWork {
		return 0, false
	}
	for d, x := range s.Extents {
		if x > 1 {
			return d, true
		}
	}
	return 0, false
}

// indexedBy reports whether s stores at its loop variables 0..d
// themselves in its output's first d+1 dimensions (a stage without an
// Index stores at its whole domain).
func indexedBy(s *loops.Stage, d int) bool {
	if s.Index == nil {
		return true
	}
	if len(s.Index) <= d {
		return false
	}
	for k := 0; k <= d; k++ {
		if v, ok := s.Index[k].(*loops.Var); !ok || v != s.Vars[k] {
			return false
		}
	}
	return true
}

// parallelStage runs the stage on several threads, split along its
// dimension dim (a matmul splits as matmulChunks says).
func (e *fn) parallelStage(s *loops.Stage, dim int) {
	if s.Matmul != nil {
		byColumns, n := matmulChunks(s)
		if packed(s) && !byColumns {
			e.parallelRows(s, n)
			return
		}
		call := e.outline(0, func(o *fn, lo, hi value.Value, _ []value.Value) { o.matmul(s, lo, hi) })
		call(nil, n)
		return
	}
	call := e.outline(0, func(o *fn, lo, hi value.Value, _ []value.Value) {
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
	})
	call(nil, s.Extents[dim])
}

// parallelRows runs an f32 matmul with too few panels to share out: this
// thread packs each panel (K-blocked: each block of it) once, then all
// threads compute its n row blocks.
func (e *fn) parallelRows(s *loops.Stage, n int64) {
	call := e.outline(6, func(o *fn, lo, hi value.Value, extra []value.Value) {
		panel := o.entry.NewIntToPtr(extra[0], types.NewPointer(types.Float))
		var acc value.Value
		if kBlocked(s) {
			acc = o.entry.NewIntToPtr(extra[1], types.NewPointer(types.Float))
		}
		o.panelTiles(s, panel, acc, extra[2], extra[3], lo, hi, extra[4], extra[5])
	})
	panel := e.panel()
	w := panelWidth(s.Extents[1])
	K := s.Matmul.Extent
	e.loop(i64((s.Extents[1]+w-1)/w), func(jb value.Value) {
		if !kBlocked(s) {
			j0, jn := e.packPanel(s, panel, jb, i64(0), i64(K))
			call([]value.Value{panel, i64(0), j0, jn, i64(0), i64(K)}, n)
			return
		}
		acc := e.accBuf(s, panel)
		e.zeroAccRows(s, acc, i64(0), i64(n))
		j0, jn := e.panelColumns(s, jb)
		e.kBlocks(s, func(k0, kn value.Value) {
			e.packPanel(s, panel, jb, k0, kn)
			call([]value.Value{panel, acc, j0, jn, k0, kn}, n)
		})
		e.storeAccRows(s, acc, j0, jn, i64(0), i64(n))
	})
}

// outline emits body as a function of a range [lo, hi) of chunks and
// returns call, which runs it through kiln_parallel_for over n chunks at
// the current point. The outlined function receives a context: arena,
// params, inputs, the workspace, the values of the loop variables bound
// when outline was called, and nExtra more values that call passes
// (pointers or i64s, read back as i64s).
func (e *fn) outline(nExtra int, body func(o *fn, lo, hi value.Value, extra []value.Value)) (call func(extra []value.Value, n int64)) {
	vars := make([]*loops.Var, 0, len(e.bound))
	for v := range e.bound {
		vars = append(vars, v)
	}
	sort.Slice(vars, func(i, j int) bool { return vars[i].ID < vars[j].ID })
	const fixed = 4 // arena, params, inputs, ws
	slots := fixed + len(vars) + nExtra
	ctxT := types.NewArray(uint64(slots), types.I64)
	ctx := e.entry.NewAlloca(ctxT)

	md := e.md
	md.outlined++
	pctx, lo, hi, tid := ir.NewParam("ctx", i8p), ir.NewParam("lo", types.I64), ir.NewParam("hi", types.I64), ir.NewParam("tid", types.I64)
	f := md.m.NewFunc(fmt.Sprintf("%s_p%d", e.name, md.outlined), types.Void, pctx, lo, hi, tid)
	f.Linkage = enum.LinkageInternal
	entry := f.NewBlock("")
	start := f.NewBlock("")
	slot := entry.NewBitCast(pctx, types.NewPointer(ctxT))
	get := func(i int) value.Value {
		return entry.NewLoad(types.I64, entry.NewGetElementPtr(ctxT, slot, i64(0), i64(int64(i))))
	}
	o := &fn{md: md, f: f, entry: entry, cur: start, bases: map[baseKey]value.Value{}, bound: map[*loops.Var]value.Value{},
		name: e.name, layout: e.layout, tid: tid}
	o.arena = entry.NewIntToPtr(get(0), i8p)
	o.params = entry.NewIntToPtr(get(1), i8pp)
	o.inputs = entry.NewIntToPtr(get(2), i8pp)
	o.ws = entry.NewIntToPtr(get(3), i8p)
	for i, v := range vars {
		o.bound[v] = get(fixed + i)
	}
	extra := make([]value.Value, nExtra)
	for i := range extra {
		extra[i] = get(fixed + len(vars) + i)
	}
	body(o, lo, hi, extra)
	o.cur.NewRet(nil)
	entry.NewBr(start)
	if o.err != nil {
		e.fail(o.err)
	}

	return func(extraVals []value.Value, n int64) {
		put := func(i int, v value.Value) {
			if _, ok := v.Type().(*types.PointerType); ok {
				v = e.cur.NewPtrToInt(v, types.I64)
			}
			e.cur.NewStore(v, e.cur.NewGetElementPtr(ctxT, ctx, i64(0), i64(int64(i))))
		}
		put(0, e.arena)
		put(1, e.params)
		put(2, e.inputs)
		put(3, e.ws)
		for i, v := range vars {
			put(fixed+i, e.bound[v])
		}
		for i, v := range extraVals {
			put(fixed+len(vars)+i, v)
		}
		e.cur.NewCall(md.parallelFor(), f, e.cur.NewBitCast(ctx, i8p), i64(n), e.threadCount())
	}
}

var bodyType = types.NewPointer(types.NewFunc(types.Void, i8p, types.I64, types.I64, types.I64))

// maxThreads bounds the threads of one parallel loop.
const maxThreads = 256

// parallelFor emits kiln_parallel_for(body, ctx, n, threads): it splits
// [0, n) into one contiguous chunk per thread (at most threads of them),
// calls body(ctx, lo, hi, thread index) for each, runs the first on the calling
// thread and the others on new POSIX threads, and joins them. A thread
// that cannot be created runs its chunk on the caller. The definition is
// weak: the runtime (csrc/runtime.c) links a thread pool in its place,
// which splits the chunks the same way.
func (md *module) parallelFor() *ir.Func {
	if md.parallel != nil {
		return md.parallel
	}
	taskT := types.NewStruct(bodyType, i8p, types.I64, types.I64, types.I64)
	arg := ir.NewParam("task", i8p)
	tramp := md.m.NewFunc("kiln_task", i8p, arg)
	tramp.Linkage = enum.LinkageInternal
	tb := tramp.NewBlock("")
	tp := tb.NewBitCast(arg, types.NewPointer(taskT))
	field := func(b *ir.Block, p value.Value, i int64, t types.Type) value.Value {
		return b.NewLoad(t, b.NewGetElementPtr(taskT, p, constant.NewInt(types.I32, 0), constant.NewInt(types.I32, i)))
	}
	tb.NewCall(field(tb, tp, 0, bodyType), field(tb, tp, 1, i8p), field(tb, tp, 2, types.I64), field(tb, tp, 3, types.I64), field(tb, tp, 4, types.I64))
	tb.NewRet(constant.NewNull(i8p))

	bodyP, ctxP, nP, threadsP := ir.NewParam("body", bodyType), ir.NewParam("ctx", i8p), ir.NewParam("n", types.I64), ir.NewParam("threads", types.I64)
	f := md.m.NewFunc("kiln_parallel_for", types.Void, bodyP, ctxP, nP, threadsP)
	f.Linkage = enum.LinkageWeak // the runtime's thread pool replaces it
	entry := f.NewBlock("")
	start := f.NewBlock("")
	e := &fn{md: md, f: f, entry: entry, cur: start}
	// threads is the count the workspace holds panels for: never use
	// more, and never more than there are chunks.
	c := e.cur
	threads := c.NewSelect(c.NewICmp(enum.IPredSLT, threadsP, nP), value.Value(threadsP), nP)
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
		set(4, t)
		tid := c.NewGetElementPtr(types.NewArray(maxThreads, types.I64), tids, i64(0), t)
		rc := c.NewCall(create, tid, constant.NewNull(i8p), tramp, c.NewBitCast(task, i8p))
		failed, done := f.NewBlock(""), f.NewBlock("")
		c.NewCondBr(c.NewICmp(enum.IPredNE, rc, constant.NewInt(types.I32, 0)), failed, done)
		failed.NewCall(tramp, failed.NewBitCast(task, i8p))
		failed.NewStore(i64(0), tid)
		failed.NewBr(done)
		e.cur = done
	})
	e.cur.NewCall(bodyP, ctxP, i64(0), chunk(i64(1)), i64(0))
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
