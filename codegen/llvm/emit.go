// Package llvm emits a lowered program (codegen/loops) as LLVM IR with
// github.com/llir/llvm, and builds it with clang into objects, libraries
// and executables.
//
// The entry point is
//
//	int kiln_<func>(void *arena, void **params, void **inputs, void **outputs)
//
// params holds the param and state arguments in declaration order, inputs
// the data arguments; outputs receives a pointer to each result, which
// lives in the arena (or is an argument the function returns unchanged).
// It returns 0, or loops.StatusIndexOutOfRange when a gather index or a
// cross-entropy label was outside its dimension (the results are then
// computed with that index clamped and must not be used).
package llvm

import (
	"fmt"
	"maps"
	"math"
	"runtime"
	"time"

	"github.com/kiln-compiler/kiln/codegen/loops"
	kir "github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
	"github.com/llir/llvm/ir"
	"github.com/llir/llvm/ir/constant"
	"github.com/llir/llvm/ir/enum"
	"github.com/llir/llvm/ir/types"
	"github.com/llir/llvm/ir/value"
)

// Triple is the target triple of the machine Kiln runs on.
func Triple() string {
	switch runtime.GOARCH {
	case "arm64":
		return "aarch64-unknown-linux-gnu"
	}
	return "x86_64-pc-linux-gnu"
}

// EntryName is the C symbol of a function's entry point.
func EntryName(f *kir.Func) string { return "kiln_" + loops.CName(f.Name) }

var (
	i8p  = types.NewPointer(types.I8)
	i8pp = types.NewPointer(i8p)
)

// Options tune code generation.
type Options struct {
	// Threads is how many threads a parallel loop uses: 0 asks the
	// operating system for the number of online cores when the program
	// runs, 1 emits sequential code.
	Threads int
	// BuildTimeout bounds clang's run in Build (0: no bound): past it the
	// build fails with a message that says so.
	BuildTimeout time.Duration
	// Progress, when set, hears every second how long clang has run.
	Progress func(elapsed time.Duration)
	// CacheDir, when set, is where Build keeps the objects clang compiled
	// (the kernels, the fixed runtime), so that a build of the same
	// kernels links them instead (objectCache); "" compiles everything.
	CacheDir string
	// Parts is how many modules clang compiles a library's or an
	// executable's kernels as, in parallel (0: one per core, each of at
	// least 128 KB of LLVM IR; 1: one module).
	Parts int
}

// module emits one program.
type module struct {
	m        *ir.Module
	opt      Options
	decls    map[string]*ir.Func
	consts   map[*kir.Dense]*ir.Global
	parallel *ir.Func            // kiln_parallel_for, emitted on first use
	ipow     map[string]*ir.Func // kiln_ipow and kiln_upow, emitted on first use
	host     *ir.Global
	status   *ir.Global // kiln_status, emitted on first use
	rank     *ir.Global // kiln_world_rank (defined by the MPI driver), declared on first use
	outlined int
	ranks    int64 // the MPI ranks the program runs as
	// The largest kernel workspace before its panels, and the largest
	// panel of one thread (workspace.go).
	tempsMax, panelMax int64
}

// Emit builds the LLVM module of p.
func Emit(p *loops.Program, opts ...Options) (*ir.Module, error) {
	md := &module{m: ir.NewModule(), decls: map[string]*ir.Func{}, consts: map[*kir.Dense]*ir.Global{}, ranks: Ranks(p)}
	if len(opts) > 0 {
		md.opt = opts[0]
	}
	md.m.TargetTriple = Triple()
	if p.HostBytes > 0 {
		// Host memory of swapped-out tensors: zero-initialised, so it costs
		// nothing until a swap touches it.
		md.host = md.m.NewGlobalDef("kiln_host", constant.NewZeroInitializer(types.NewArray(uint64(p.HostBytes), types.I8)))
		md.host.Linkage = enum.LinkageInternal
		md.host.Align = 64
	}
	var kernels []*ir.Func
	for _, k := range p.Kernels {
		f, err := md.kernel(k)
		if err != nil {
			return nil, err
		}
		kernels = append(kernels, f)
	}
	var restores []*ir.Func
	for _, k := range p.Restore {
		f, err := md.kernel(k)
		if err != nil {
			return nil, err
		}
		restores = append(restores, f)
	}
	arena, params, inputs, outputs := ir.NewParam("arena", i8p), ir.NewParam("params", i8pp), ir.NewParam("inputs", i8pp), ir.NewParam("outputs", i8pp)
	entry := md.m.NewFunc(EntryName(p.Func), types.I32, arena, params, inputs, outputs)
	blk := entry.NewBlock("")
	fe := &fn{md: md, f: entry, entry: blk, cur: blk, arena: arena, params: params, inputs: inputs, bases: map[baseKey]value.Value{}}
	if md.status != nil {
		blk.NewStore(constant.NewInt(types.I32, 0), md.status)
	}
	ws, free := fe.allocWorkspace()
	enter, exit := md.profileHook("kiln_profile_enter"), md.profileHook("kiln_profile_exit")
	// A failure restores the backups taken before it, the last first.
	onFailure := func(backups int) func() {
		return func() {
			for j := backups - 1; j >= 0; j-- {
				fe.cur.NewCall(restores[j], arena, params, inputs, ws)
			}
			free()
		}
	}
	for i, k := range kernels {
		if p.Kernels[i].TestStatus && md.status != nil {
			fe.returnOnFailure(onFailure(p.Kernels[i].Backups))
		}
		fe.cur.NewCall(enter, constant.NewInt(types.I64, int64(i)))
		fe.cur.NewCall(k, arena, params, inputs, ws)
		fe.cur.NewCall(exit, constant.NewInt(types.I64, int64(i)))
	}
	if len(restores) > 0 && md.status != nil {
		fe.returnOnFailure(onFailure(len(restores))) // a check after the last test failed
	}
	free()
	blk = fe.cur
	for i, r := range p.Results {
		ptr := blk.NewBitCast(fe.base(r), i8p)
		slot := blk.NewGetElementPtr(i8p, outputs, constant.NewInt(types.I64, int64(i)))
		blk.NewStore(ptr, slot)
	}
	if md.status == nil {
		blk.NewRet(constant.NewInt(types.I32, 0))
	} else {
		blk.NewRet(blk.NewLoad(types.I32, md.status))
	}
	return md.m, nil
}

// returnOnFailure ends the entry point when the run's status is not 0
// (an index check failed), after cleanup (the arguments written so far
// restored, the workspace released): the kernels after it, which write
// arguments, do not run.
func (e *fn) returnOnFailure(cleanup func()) {
	st := e.cur.NewLoad(types.I32, e.md.status)
	fail, next := e.f.NewBlock(""), e.f.NewBlock("")
	e.cur.NewCondBr(e.cur.NewICmp(enum.IPredNE, st, constant.NewInt(types.I32, 0)), fail, next)
	e.cur = fail
	cleanup()
	e.cur.NewRet(st)
	e.cur = next
}

// profileHook emits a weak kiln_profile_enter(kernel) or
// kiln_profile_exit(kernel) that does nothing: the runtime links versions
// that time each kernel when profiling is on (kiln_profile).
func (md *module) profileHook(name string) *ir.Func {
	if f := md.decls[name]; f != nil {
		return f
	}
	f := md.m.NewFunc(name, types.Void, ir.NewParam("kernel", types.I64))
	f.NewBlock("").NewRet(nil)
	f.Linkage = enum.LinkageWeak
	md.decls[name] = f
	return f
}

// declare returns an external function (libm, libc or an intrinsic).
func (md *module) declare(name string, ret types.Type, params ...types.Type) *ir.Func {
	if f := md.decls[name]; f != nil {
		return f
	}
	ps := make([]*ir.Param, len(params))
	for i, t := range params {
		ps[i] = ir.NewParam("", t)
	}
	f := md.m.NewFunc(name, ret, ps...)
	md.decls[name] = f
	return f
}

// storageType is how a dtype's elements are laid out in memory.
func storageType(d kir.DType) (types.Type, error) {
	switch d {
	case kir.F32:
		return types.Float, nil
	case kir.F64:
		return types.Double, nil
	case kir.F16:
		return types.Half, nil
	case kir.BF16:
		return types.I16, nil
	case kir.I64, kir.U64:
		return types.I64, nil
	case kir.I32:
		return types.I32, nil
	case kir.U32:
		return types.I32, nil
	case kir.I16, kir.U16:
		return types.I16, nil
	case kir.I8, kir.U8, kir.Bool, kir.F8E4M3, kir.F8E5M2:
		return types.I8, nil
	}
	return nil, fmt.Errorf("the LLVM backend does not store %s yet", d)
}

func kindType(k loops.Kind) types.Type {
	switch k {
	case loops.F32:
		return types.Float
	case loops.F64:
		return types.Double
	case loops.Bool:
		return types.I1
	}
	return types.I64
}

type baseKey struct {
	storage loops.Storage
	slot    int
	offset  int64
	data    *kir.Dense
	temp    string
}

// fn emits one function. Allocas and base pointers go to the entry block,
// which dominates everything; code goes to cur.
type fn struct {
	md                    *module
	f                     *ir.Func
	entry, cur            *ir.Block
	arena, params, inputs value.Value
	bases                 map[baseKey]value.Value
	ws                    value.Value // the kernel workspace (i8*)
	tid                   value.Value // this thread's index, for its panel
	layout                *workspace  // where the kernel's workspace buffers lie in ws
	name                  string
	bound                 map[*loops.Var]value.Value
	cache                 []map[loops.Expr]value.Value
	err                   error
}

func (md *module) kernel(k *loops.Kernel) (*ir.Func, error) {
	arena, params, inputs, ws := ir.NewParam("arena", i8p), ir.NewParam("params", i8pp), ir.NewParam("inputs", i8pp), ir.NewParam("ws", i8p)
	f := md.m.NewFunc(k.Name, types.Void, arena, params, inputs, ws)
	f.Linkage = enum.LinkageInternal
	// Kernels stay separate functions: inlining every one into the entry
	// point only slows clang down (and hides kernels from profilers).
	f.FuncAttrs = append(f.FuncAttrs, enum.FuncAttrNoInline)
	entry := f.NewBlock("")
	body := f.NewBlock("")
	layout := layoutWorkspace(k)
	md.tempsMax = max(md.tempsMax, layout.panelsAt)
	md.panelMax = max(md.panelMax, layout.panelBytes)
	e := &fn{md: md, f: f, entry: entry, cur: body, arena: arena, params: params, inputs: inputs, ws: ws, tid: i64(0),
		layout: layout, bases: map[baseKey]value.Value{}, bound: map[*loops.Var]value.Value{}, name: k.Name}
	e.steps(k.Steps)
	e.cur.NewRet(nil)
	entry.NewBr(body)
	if e.err != nil {
		return nil, fmt.Errorf("kernel %s: %v", k.Name, e.err)
	}
	return f, nil
}

func (e *fn) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

// base is a pointer to buffer b's first element, typed by its storage.
func (e *fn) base(b *loops.Buffer) value.Value {
	key := baseKey{storage: b.Storage, slot: b.Slot, offset: b.Offset, data: b.Data}
	if b.Storage == loops.Temp {
		key = baseKey{storage: loops.Temp, temp: b.Name}
	}
	et, err := storageType(b.Type.DType)
	if err != nil {
		e.fail(err)
		et = types.Float
	}
	raw, ok := e.bases[key]
	if !ok {
		blk := e.entry
		switch b.Storage {
		case loops.Arena:
			raw = blk.NewGetElementPtr(types.I8, e.arena, constant.NewInt(types.I64, b.Offset))
		case loops.Param, loops.Input:
			arr := e.params
			if b.Storage == loops.Input {
				arr = e.inputs
			}
			p := blk.NewLoad(i8p, blk.NewGetElementPtr(i8p, arr, constant.NewInt(types.I64, int64(b.Slot))))
			raw = blk.NewGetElementPtr(types.I8, p, constant.NewInt(types.I64, b.Offset))
		case loops.Const:
			raw = blk.NewBitCast(e.md.constant(b.Data), i8p)
		case loops.Temp:
			raw = blk.NewGetElementPtr(types.I8, e.ws, i64(e.layout.temps[b.Name]))
		case loops.Host:
			raw = blk.NewGetElementPtr(types.I8, blk.NewBitCast(e.md.host, i8p), constant.NewInt(types.I64, b.Offset))
		}
		e.bases[key] = raw
	}
	return e.entry.NewBitCast(raw, types.NewPointer(et))
}

func (md *module) constant(d *kir.Dense) *ir.Global {
	if g := md.consts[d]; g != nil {
		return g
	}
	raw := d.RawBytes()
	g := md.m.NewGlobalDef(fmt.Sprintf("const%d", len(md.consts)), constant.NewCharArray(raw))
	g.Immutable = true
	g.Linkage = enum.LinkagePrivate
	g.Align = 16
	md.consts[d] = g
	return g
}

func i64(v int64) value.Value { return constant.NewInt(types.I64, v) }

// loop emits for (i = 0; i < n; i++) body(i), where n is an i64 value.
func (e *fn) loop(n value.Value, body func(i value.Value)) {
	e.loopFrom(i64(0), n, body)
}

// loopFrom emits for (i = lo; i < hi; i++) body(i).
func (e *fn) loopFrom(lo, n value.Value, body func(i value.Value)) {
	ctr := e.entry.NewAlloca(types.I64)
	e.cur.NewStore(lo, ctr)
	head, bodyB, exit := e.f.NewBlock(""), e.f.NewBlock(""), e.f.NewBlock("")
	e.cur.NewBr(head)
	iv := head.NewLoad(types.I64, ctr)
	head.NewCondBr(head.NewICmp(enum.IPredSLT, iv, n), bodyB, exit)
	e.cur = bodyB
	e.push()
	i := bodyB.NewLoad(types.I64, ctr)
	body(i)
	e.pop()
	e.cur.NewStore(e.cur.NewAdd(e.cur.NewLoad(types.I64, ctr), i64(1)), ctr)
	e.cur.NewBr(head)
	e.cur = exit
}

func (e *fn) push() { e.cache = append(e.cache, map[loops.Expr]value.Value{}) }
func (e *fn) pop()  { e.cache = e.cache[:len(e.cache)-1] }

// loops binds vars over extents and runs body in the innermost loop.
func (e *fn) loops(vars []*loops.Var, extents []int64, body func()) {
	if len(vars) == 0 {
		body()
		return
	}
	e.loop(i64(extents[0]), func(i value.Value) {
		e.bound[vars[0]] = i
		e.loops(vars[1:], extents[1:], body)
	})
}

// steps emits a kernel's steps. The variables a step binds (its loops',
// a matmul's) go out of scope after it: outlined parallel stages receive
// every bound variable, and a value left from an earlier loop would not
// dominate the later call.
func (e *fn) steps(steps []loops.Step) {
	for _, s := range steps {
		outer := maps.Clone(e.bound)
		switch s := s.(type) {
		case *loops.Loop:
			e.loop(i64(s.Extent), func(i value.Value) {
				e.bound[s.Var] = i
				e.steps(s.Body)
			})
		case *loops.Stage:
			if dim, ok := e.parallelDim(s); ok {
				e.parallelStage(s, dim)
			} else if s.Matmul != nil {
				e.matmul(s, nil, nil)
			} else {
				e.stage(s)
			}
		case *loops.Collective:
			e.collective(s)
		}
		e.bound = outer
	}
}

func (e *fn) stage(s *loops.Stage) {
	e.loops(s.Vars, s.Extents, func() {
		idx := s.Index
		if idx == nil {
			idx = make([]loops.Expr, len(s.Vars))
			for i, v := range s.Vars {
				idx[i] = v
			}
		}
		store := func() {
			v := e.expr(s.Value)
			e.storeAt(s.Out, idx, v, s.Accumulate)
		}
		if s.Guard == nil {
			store()
			return
		}
		then, done := e.f.NewBlock(""), e.f.NewBlock("")
		e.cur.NewCondBr(e.expr(s.Guard), then, done)
		e.cur = then
		e.push()
		store()
		e.pop()
		e.cur.NewBr(done)
		e.cur = done
	})
}

// flat is the element offset of idx in buffer b.
func (e *fn) flat(b *loops.Buffer, idx []loops.Expr) value.Value {
	s := b.Type.Shape
	st := int64(1)
	var acc value.Value = i64(0)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] != 1 {
			term := e.expr(idx[i])
			if st != 1 {
				term = e.cur.NewMul(term, i64(st))
			}
			if c, ok := acc.(*constant.Int); ok && c.X.Sign() == 0 {
				acc = term
			} else {
				acc = e.cur.NewAdd(acc, term)
			}
		}
		st *= s[i]
	}
	return acc
}

func (e *fn) storeAt(b *loops.Buffer, idx []loops.Expr, v value.Value, accumulate bool) {
	et, _ := storageType(b.Type.DType)
	ptr := e.cur.NewGetElementPtr(et, e.base(b), e.flat(b, idx))
	k := loops.ComputeKind(b.Type.DType)
	if accumulate {
		old := e.fromStorage(e.cur.NewLoad(et, ptr), b.Type.DType)
		v = e.arith(scalar.Add, k, old, v)
	}
	e.cur.NewStore(e.toStorage(v, b.Type.DType), ptr)
}

// fromStorage widens a loaded element to its compute kind.
func (e *fn) fromStorage(v value.Value, d kir.DType) value.Value {
	c := e.cur
	switch d {
	case kir.F16:
		return c.NewFPExt(v, types.Float)
	case kir.BF16:
		return c.NewBitCast(c.NewShl(c.NewZExt(v, types.I32), constant.NewInt(types.I32, 16)), types.Float)
	case kir.F8E4M3, kir.F8E5M2:
		// Converted by the runtime (runtime.c), as the interpreter does.
		return c.NewCall(e.md.declare("kiln_"+d.String()+"_to_f32", types.Float, types.I8), v)
	case kir.I32, kir.I16, kir.I8:
		return c.NewSExt(v, types.I64)
	case kir.U32, kir.U16, kir.U8:
		return c.NewZExt(v, types.I64)
	case kir.Bool:
		return c.NewICmp(enum.IPredNE, v, constant.NewInt(types.I8, 0))
	}
	return v
}

// toStorage narrows a computed value to its storage, rounding to nearest
// even for f16 and bf16.
func (e *fn) toStorage(v value.Value, d kir.DType) value.Value {
	c := e.cur
	switch d {
	case kir.F16:
		return c.NewFPTrunc(v, types.Half)
	case kir.BF16:
		bits := c.NewBitCast(v, types.I32)
		lsb := c.NewAnd(c.NewLShr(bits, constant.NewInt(types.I32, 16)), constant.NewInt(types.I32, 1))
		r := c.NewAdd(c.NewAdd(bits, constant.NewInt(types.I32, 0x7FFF)), lsb)
		return c.NewTrunc(c.NewLShr(r, constant.NewInt(types.I32, 16)), types.I16)
	case kir.F8E4M3, kir.F8E5M2:
		return c.NewCall(e.md.declare("kiln_f32_to_"+d.String(), types.I8, types.Float), v)
	case kir.I32, kir.U32:
		return c.NewTrunc(v, types.I32)
	case kir.I16, kir.U16:
		return c.NewTrunc(v, types.I16)
	case kir.I8, kir.U8:
		return c.NewTrunc(v, types.I8)
	case kir.Bool:
		return c.NewZExt(v, types.I8)
	}
	return v
}

func (e *fn) lookup(x loops.Expr) (value.Value, bool) {
	for i := len(e.cache) - 1; i >= 0; i-- {
		if v, ok := e.cache[i][x]; ok {
			return v, true
		}
	}
	return nil, false
}

// expr emits x in the current block and returns its value.
func (e *fn) expr(x loops.Expr) value.Value {
	if v, ok := e.lookup(x); ok {
		return v
	}
	v := e.emit(x)
	if len(e.cache) > 0 {
		switch x.(type) {
		case *loops.Load, *loops.Unary, *loops.Binary, *loops.Compare, *loops.Select, *loops.Convert, *loops.Reduce, *loops.Mix:
			e.cache[len(e.cache)-1][x] = v
		}
	}
	return v
}

func (e *fn) emit(x loops.Expr) value.Value {
	c := e.cur
	switch x := x.(type) {
	case *loops.Var:
		v, ok := e.bound[x]
		if !ok {
			e.fail(fmt.Errorf("loop variable %d used outside its loop", x.ID))
			return i64(0)
		}
		return v
	case loops.Int:
		return i64(x.V)
	case loops.Float:
		if x.K == loops.F32 {
			return constant.NewFloat(types.Float, float64(float32(x.V)))
		}
		return constant.NewFloat(types.Double, x.V)
	case loops.BoolConst:
		return constant.NewBool(x.V)
	case *loops.Load:
		return e.load(x)
	case *loops.Unary:
		return e.unary(x.Fn, x.X.Kind(), e.expr(x.X))
	case *loops.Binary:
		a := e.expr(x.A)
		b := e.expr(x.B)
		return e.arith(x.Op, x.A.Kind(), a, b)
	case *loops.Compare:
		a, b := e.expr(x.A), e.expr(x.B)
		c = e.cur
		if x.A.Kind().IsFloat() {
			pred := map[scalar.Prim]enum.FPred{scalar.Eq: enum.FPredOEQ, scalar.Ne: enum.FPredUNE, scalar.Lt: enum.FPredOLT, scalar.Le: enum.FPredOLE, scalar.Gt: enum.FPredOGT, scalar.Ge: enum.FPredOGE}[x.Pred]
			return c.NewFCmp(pred, a, b)
		}
		return c.NewICmp(intPred(x.Pred, x.A.Kind()), a, b)
	case *loops.Select:
		cond, a, b := e.expr(x.C), e.expr(x.A), e.expr(x.B)
		return e.cur.NewSelect(cond, a, b)
	case *loops.Convert:
		return e.convert(e.expr(x.X), x.X.Kind(), x.To)
	case *loops.Round:
		return e.fromStorage(e.toStorage(e.expr(x.X), x.To), x.To)
	case *loops.Reduce:
		return e.reduce(x)
	case *accValue:
		return x.v
	case *loops.Guarded:
		return e.guarded(x)
	case *loops.Checked:
		return e.checked(x)
	case *loops.RankIndex:
		if e.md.ranks <= 1 {
			return i64(0)
		}
		// The driver sets kiln_world_rank (MPI's) before the step runs.
		if e.md.rank == nil {
			e.md.rank = e.md.m.NewGlobal("kiln_world_rank", types.I64)
			e.md.rank.Linkage = enum.LinkageExternal
		}
		r := c.NewLoad(types.I64, e.md.rank)
		return c.NewSRem(c.NewSDiv(r, i64(max(1, x.Stride))), i64(max(1, x.Size)))
	case *loops.Mix:
		z := e.expr(x.X)
		c = e.cur
		z = c.NewAdd(z, i64(int64(0x9E3779B97F4A7C15-1<<64)))
		z = c.NewMul(c.NewXor(z, c.NewLShr(z, i64(30))), i64(int64(0xBF58476D1CE4E5B9-1<<64)))
		z = c.NewMul(c.NewXor(z, c.NewLShr(z, i64(27))), i64(int64(0x94D049BB133111EB-1<<64)))
		return c.NewXor(z, c.NewLShr(z, i64(31)))
	}
	e.fail(fmt.Errorf("unknown expression %T", x))
	return i64(0)
}

func (e *fn) load(l *loops.Load) value.Value {
	et, err := storageType(l.Buf.Type.DType)
	if err != nil {
		e.fail(err)
		return constant.NewFloat(types.Float, 0)
	}
	at := e.flat(l.Buf, l.Index)
	var guard value.Value
	if l.Guard != nil {
		guard = e.expr(l.Guard)
		at = e.cur.NewSelect(guard, at, i64(0))
	}
	v := e.fromStorage(e.cur.NewLoad(et, e.cur.NewGetElementPtr(et, e.base(l.Buf), at)), l.Buf.Type.DType)
	if guard != nil {
		k := loops.ComputeKind(l.Buf.Type.DType)
		var other value.Value
		switch k {
		case loops.F32:
			other = constant.NewFloat(types.Float, float64(float32(l.Else)))
		case loops.F64:
			other = constant.NewFloat(types.Double, l.Else)
		case loops.Bool:
			other = constant.NewBool(l.Else != 0)
		default:
			other = i64(int64(l.Else))
		}
		v = e.cur.NewSelect(guard, v, other)
	}
	return v
}

// guarded evaluates g.X in a branch taken only where g.Cond holds.
func (e *fn) guarded(g *loops.Guarded) value.Value {
	cond := e.expr(g.Cond)
	from := e.cur
	then, done := e.f.NewBlock(""), e.f.NewBlock("")
	e.cur.NewCondBr(cond, then, done)
	e.cur = then
	e.push()
	v := e.expr(g.X)
	e.pop()
	thenEnd := e.cur
	e.cur.NewBr(done)
	e.cur = done
	var other value.Value
	switch k := g.X.Kind(); k {
	case loops.F32, loops.F64:
		other = constant.NewFloat(kindType(k).(*types.FloatType), g.Else)
	case loops.Bool:
		other = constant.NewBool(g.Else != 0)
	default:
		other = i64(int64(g.Else))
	}
	return done.NewPhi(ir.NewIncoming(v, thenEnd), ir.NewIncoming(other, from))
}

// checked evaluates c.X and, in a branch taken only where c.Cond fails,
// records the failure in kiln_status (an atomic store: parallel loops
// may fail together).
func (e *fn) checked(c *loops.Checked) value.Value {
	if e.md.status == nil {
		e.md.status = e.md.m.NewGlobalDef("kiln_status", constant.NewInt(types.I32, 0))
		e.md.status.Linkage = enum.LinkageInternal
	}
	ok := e.expr(c.Cond)
	fail, done := e.f.NewBlock(""), e.f.NewBlock("")
	e.cur.NewCondBr(ok, done, fail)
	st := fail.NewStore(constant.NewInt(types.I32, loops.StatusIndexOutOfRange), e.md.status)
	st.Atomic, st.Ordering, st.Align = true, enum.AtomicOrderingMonotonic, 4
	fail.NewBr(done)
	e.cur = done
	return e.expr(c.X)
}

func (e *fn) libm(name string, k loops.Kind, args ...value.Value) value.Value {
	t := kindType(k)
	if k == loops.F32 {
		name += "f"
	}
	ps := make([]types.Type, len(args))
	for i := range ps {
		ps[i] = t
	}
	return e.cur.NewCall(e.md.declare(name, t, ps...), args...)
}

func (e *fn) intrinsic(name string, k loops.Kind, x value.Value) value.Value {
	t := kindType(k)
	suffix := ".f64"
	if k == loops.F32 {
		suffix = ".f32"
	}
	return e.cur.NewCall(e.md.declare("llvm."+name+suffix, t, t), x)
}

// libmUnary are the unary primitives that call the C library (expf or
// exp, ...); llvmUnary those with an LLVM intrinsic.
var (
	libmUnary = map[scalar.Prim]string{scalar.Exp: "exp", scalar.Expm1: "expm1", scalar.Log: "log", scalar.Log1p: "log1p",
		scalar.Tanh: "tanh", scalar.Erf: "erf", scalar.Sin: "sin", scalar.Cos: "cos",
		scalar.Tan: "tan", scalar.Asin: "asin", scalar.Acos: "acos", scalar.Atan: "atan", scalar.Sinh: "sinh", scalar.Cosh: "cosh", scalar.Asinh: "asinh", scalar.Acosh: "acosh", scalar.Atanh: "atanh"}
	llvmUnary = map[scalar.Prim]string{scalar.Sqrt: "sqrt", scalar.Abs: "fabs", scalar.Floor: "floor", scalar.Ceil: "ceil",
		scalar.Round: "roundeven"}
)

func (e *fn) unary(p scalar.Prim, k loops.Kind, x value.Value) value.Value {
	c := e.cur
	switch {
	case p == scalar.Not:
		return c.NewXor(x, constant.True)
	case p == scalar.Neg && k.IsFloat():
		return c.NewFNeg(x)
	case p == scalar.Neg:
		return c.NewSub(i64(0), x)
	case p == scalar.Abs && k == loops.U64:
		return x
	case p == scalar.Abs && !k.IsFloat():
		return c.NewSelect(c.NewICmp(enum.IPredSLT, x, i64(0)), c.NewSub(i64(0), x), x)
	case !k.IsFloat():
	case libmUnary[p] != "":
		return e.libm(libmUnary[p], k, x)
	case llvmUnary[p] != "":
		return e.intrinsic(llvmUnary[p], k, x)
	}
	e.fail(fmt.Errorf("no %s on %s", p, k))
	return x
}

func (e *fn) arith(op scalar.Prim, k loops.Kind, a, b value.Value) value.Value {
	c := e.cur
	if k.IsFloat() {
		switch op {
		case scalar.Add:
			return c.NewFAdd(a, b)
		case scalar.Sub:
			return c.NewFSub(a, b)
		case scalar.Mul:
			return c.NewFMul(a, b)
		case scalar.Div:
			return c.NewFDiv(a, b)
		case scalar.Rem:
			return c.NewFRem(a, b)
		case scalar.Pow:
			return e.libm("pow", k, a, b)
		case scalar.Max, scalar.Min:
			pred := enum.FPredOGT
			if op == scalar.Min {
				pred = enum.FPredOLT
			}
			pick := c.NewOr(c.NewFCmp(enum.FPredUNO, a, a), c.NewFCmp(pred, a, b))
			return c.NewSelect(pick, a, b)
		}
	} else {
		switch op {
		case scalar.Add:
			return c.NewAdd(a, b)
		case scalar.Sub:
			return c.NewSub(a, b)
		case scalar.Mul:
			return c.NewMul(a, b)
		case scalar.Div:
			if k == loops.U64 {
				return c.NewUDiv(a, b)
			}
			return c.NewSDiv(a, b)
		case scalar.Rem:
			if k == loops.U64 {
				return c.NewURem(a, b)
			}
			return c.NewSRem(a, b)
		case scalar.And:
			return c.NewAnd(a, b)
		case scalar.Or:
			return c.NewOr(a, b)
		case scalar.Xor:
			return c.NewXor(a, b)
		case scalar.Shr:
			return c.NewLShr(a, c.NewAnd(b, i64(63)))
		case scalar.Max:
			return c.NewSelect(c.NewICmp(intPred(scalar.Gt, k), a, b), a, b)
		case scalar.Min:
			return c.NewSelect(c.NewICmp(intPred(scalar.Lt, k), a, b), a, b)
		case scalar.Pow:
			return c.NewCall(e.md.intPow(k == loops.U64), a, b)
		}
	}
	e.fail(fmt.Errorf("no %s on %s", op, k))
	return a
}

func (e *fn) convert(v value.Value, from, to loops.Kind) value.Value {
	c := e.cur
	switch {
	case from == to:
		return v
	case from.IsFloat() && to.IsFloat():
		if to == loops.F64 {
			return c.NewFPExt(v, types.Double)
		}
		return c.NewFPTrunc(v, types.Float)
	case from.IsInteger() && to.IsInteger():
		return v // the same bits
	case from.IsFloat() && to.IsInteger():
		// Saturating, NaN to 0 (scalar.Convert); plain fptosi and fptoui
		// are poison out of range.
		name := "llvm.fptosi.sat.i64."
		if to == loops.U64 {
			name = "llvm.fptoui.sat.i64."
		}
		name += map[loops.Kind]string{loops.F32: "f32", loops.F64: "f64"}[from]
		return c.NewCall(e.md.declare(name, types.I64, kindType(from)), v)
	case from.IsFloat() && to == loops.Bool:
		return c.NewFCmp(enum.FPredUNE, v, constant.NewFloat(kindType(from).(*types.FloatType), 0))
	case from == loops.I64 && to.IsFloat():
		return c.NewSIToFP(v, kindType(to))
	case from == loops.U64 && to.IsFloat():
		return c.NewUIToFP(v, kindType(to))
	case from.IsInteger() && to == loops.Bool:
		return c.NewICmp(enum.IPredNE, v, i64(0))
	case from == loops.Bool && to.IsInteger():
		return c.NewZExt(v, types.I64)
	case from == loops.Bool && to.IsFloat():
		return c.NewUIToFP(v, kindType(to))
	}
	e.fail(fmt.Errorf("no conversion from %s to %s", from, to))
	return v
}

// intPow returns kiln_ipow(a, b), integer a^b as scalar.Pow defines it
// (interp.IntPow): by squaring, wrapping; for b < 0 the truncated 1/a^-b.
// Unsigned, kiln_upow reads b unsigned (no negative exponent).
func (md *module) intPow(unsigned bool) *ir.Func {
	name := "kiln_ipow"
	if unsigned {
		name = "kiln_upow"
	}
	if f := md.ipow[name]; f != nil {
		return f
	}
	a, b := ir.NewParam("a", types.I64), ir.NewParam("b", types.I64)
	f := md.m.NewFunc(name, types.I64, a, b)
	f.Linkage = enum.LinkageInternal
	entry, negative, head, body, done := f.NewBlock(""), f.NewBlock(""), f.NewBlock(""), f.NewBlock(""), f.NewBlock("")
	var isNegative value.Value = constant.False
	if !unsigned {
		isNegative = entry.NewICmp(enum.IPredSLT, b, i64(0))
	}
	entry.NewCondBr(isNegative, negative, head)
	// b < 0: 1 for a = 1, ±1 for a = -1 (by b's parity), 0 otherwise.
	odd := negative.NewICmp(enum.IPredNE, negative.NewAnd(b, i64(1)), i64(0))
	minusOne := negative.NewSelect(odd, i64(-1), i64(1))
	isMinusOne := negative.NewSelect(negative.NewICmp(enum.IPredEQ, a, i64(-1)), minusOne, i64(0))
	negative.NewRet(negative.NewSelect(negative.NewICmp(enum.IPredEQ, a, i64(1)), i64(1), isMinusOne))
	r := ir.NewPhi(ir.NewIncoming(i64(1), entry))
	x := ir.NewPhi(ir.NewIncoming(a, entry))
	n := ir.NewPhi(ir.NewIncoming(b, entry))
	head.Insts = append(head.Insts, r, x, n)
	head.NewCondBr(head.NewICmp(enum.IPredEQ, n, i64(0)), done, body)
	bit := body.NewICmp(enum.IPredNE, body.NewAnd(n, i64(1)), i64(0))
	r2 := body.NewSelect(bit, body.NewMul(r, x), r)
	x2 := body.NewMul(x, x)
	n2 := body.NewLShr(n, i64(1))
	body.NewBr(head)
	r.Incs = append(r.Incs, ir.NewIncoming(r2, body))
	x.Incs = append(x.Incs, ir.NewIncoming(x2, body))
	n.Incs = append(n.Incs, ir.NewIncoming(n2, body))
	done.NewRet(r)
	if md.ipow == nil {
		md.ipow = map[string]*ir.Func{}
	}
	md.ipow[name] = f
	return f
}

// intPred is the icmp predicate of a comparison of integers of kind k
// (signed for I64, unsigned for U64).
func intPred(p scalar.Prim, k loops.Kind) enum.IPred {
	if k == loops.U64 || k == loops.Bool { // i1: true is 1, not -1
		return map[scalar.Prim]enum.IPred{scalar.Eq: enum.IPredEQ, scalar.Ne: enum.IPredNE, scalar.Lt: enum.IPredULT, scalar.Le: enum.IPredULE, scalar.Gt: enum.IPredUGT, scalar.Ge: enum.IPredUGE}[p]
	}
	return map[scalar.Prim]enum.IPred{scalar.Eq: enum.IPredEQ, scalar.Ne: enum.IPredNE, scalar.Lt: enum.IPredSLT, scalar.Le: enum.IPredSLE, scalar.Gt: enum.IPredSGT, scalar.Ge: enum.IPredSGE}[p]
}

// identity is the value a reduction by op starts from.
func identity(op scalar.Prim, k loops.Kind) value.Value {
	if k.IsFloat() {
		v := 0.0
		switch op {
		case scalar.Max:
			v = math.Inf(-1)
		case scalar.Min:
			v = math.Inf(1)
		}
		return constant.NewFloat(kindType(k).(*types.FloatType), v)
	}
	if k == loops.Bool { // any (max) starts false, all (min) true
		return constant.NewInt(types.I1, map[bool]int64{true: 1}[op == scalar.Min])
	}
	switch {
	case op == scalar.Max && k == loops.U64:
		return i64(0)
	case op == scalar.Min && k == loops.U64:
		return i64(-1)
	case op == scalar.Max:
		return i64(math.MinInt64)
	case op == scalar.Min:
		return i64(math.MaxInt64)
	}
	return i64(0)
}

func (e *fn) reduce(r *loops.Reduce) value.Value {
	if len(e.cache) == 0 {
		e.push()
		defer e.pop()
	}
	for _, inner := range loops.InvariantReduces(r) {
		e.expr(inner) // cached in this scope, which the loop's body sees
	}
	t := kindType(r.Acc)
	acc := e.entry.NewAlloca(t)
	e.cur.NewStore(identity(r.Op, r.Acc), acc)
	e.loops(r.Vars, r.Extents, func() {
		v := e.expr(r.Body)
		old := e.cur.NewLoad(t, acc)
		var next value.Value
		if r.Op == scalar.Add && r.Acc.IsFloat() {
			// Reassociation lets the vectoriser keep several partial
			// sums, which is also more accurate than one running sum.
			add := e.cur.NewFAdd(old, v)
			add.FastMathFlags = []enum.FastMathFlag{enum.FastMathFlagReassoc}
			next = add
		} else if r.Op == scalar.Add {
			next = e.arith(scalar.Add, r.Acc, old, v)
		} else {
			next = e.arith(r.Op, r.Acc, v, old)
		}
		e.cur.NewStore(next, acc)
	})
	return e.cur.NewLoad(t, acc)
}

// collectiveKinds and reductions number what kiln_collective (the
// driver's MPI runtime) runs.
var (
	collectiveKinds = map[string]int64{"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2, "broadcast": 3}
	reductions      = map[string]int64{"": 0, "sum": 0, "max": 1, "min": 2}
	collectiveTypes = map[kir.DType]int64{kir.F32: 0, kir.F64: 1, kir.I64: 2}
)

// collective calls the driver's kiln_collective on the step's buffers
// (kiln_send or kiln_recv for a send or recv).
func (e *fn) collective(c *loops.Collective) {
	if c.Kind == "send" || c.Kind == "recv" {
		if e.md.ranks <= 1 {
			e.fail(fmt.Errorf("%s in a program of one rank: pipeline stages say how many there are (attribute stages)", c.Kind))
			return
		}
		buf := c.In
		if c.Kind == "recv" {
			buf = c.Out
		}
		fn := e.md.declare("kiln_"+c.Kind, types.Void, i8p, types.I64, types.I64, types.I64)
		p := e.cur.NewBitCast(e.base(buf), i8p)
		e.cur.NewCall(fn, p, i64(buf.Type.SizeBytes()), i64(c.Peer), i64(c.Tag))
		return
	}
	if e.md.ranks <= 1 {
		e.fail(fmt.Errorf("%s over %d ranks in a program of one rank: steps made by the parallel pass say how many ranks they run on (attribute ranks)", c.Kind, c.Size))
		return
	}
	if c.Size > e.md.ranks || c.Stride > e.md.ranks || e.md.ranks%(c.Size*c.Stride) != 0 {
		e.fail(fmt.Errorf("%s: groups of %d ranks, %d apart, do not tile the program's %d ranks", c.Kind, c.Size, c.Stride, e.md.ranks))
		return
	}
	dt, ok := collectiveTypes[c.In.Type.DType]
	if !ok {
		e.fail(fmt.Errorf("%s of %s: compiled collectives carry f32, f64 and i64", c.Kind, c.In.Type))
		return
	}
	i32 := func(v int64) value.Value { return constant.NewInt(types.I32, v) }
	fn := e.md.declare("kiln_collective", types.Void, types.I32, types.I32, i8p, i8p, types.I64, types.I64, types.I64, types.I64, types.I64, types.I64, types.I32)
	in := e.cur.NewBitCast(e.base(c.In), i8p)
	out := e.cur.NewBitCast(e.base(c.Out), i8p)
	e.cur.NewCall(fn, i32(collectiveKinds[c.Kind]), i32(reductions[c.Reduce]), in, out,
		i64(c.Outer), i64(c.D), i64(c.Inner), i64(c.Size), i64(c.Stride), i64(c.Root), i32(dt))
}
