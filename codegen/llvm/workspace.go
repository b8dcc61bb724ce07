package llvm

import (
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/llir/llvm/ir"
	"github.com/llir/llvm/ir/constant"
	"github.com/llir/llvm/ir/enum"
	"github.com/llir/llvm/ir/types"
	"github.com/llir/llvm/ir/value"
)

// Kernel workspace (im2col chunks, statistics, packed matmul panels) lives
// in one block that the entry point allocates when it starts and frees
// when it returns. Every kernel lays its buffers out from the block's
// first byte: its temporaries at fixed offsets, then one packed panel per
// thread. Kernels run one after another, so they share the block, and the
// program's resident workspace is that of its largest kernel rather than
// whatever the C allocator keeps of many differently sized blocks. The
// block's first word holds the thread count the entry point sized it for;
// parallel loops use no more threads than that.
type workspace struct {
	temps      map[string]int64 // offset of each temporary
	panelsAt   int64            // offset of thread 0's panel
	panelBytes int64            // one thread's panel
}

const (
	wsAlign  = 64
	wsHeader = 64 // the thread count, padded to a cache line
)

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// layoutWorkspace places k's temporaries and sizes its panels.
func layoutWorkspace(k *loops.Kernel) *workspace {
	w := &workspace{temps: map[string]int64{}, panelsAt: wsHeader}
	for _, t := range k.Temps {
		w.temps[t.Name] = w.panelsAt
		w.panelsAt += alignUp(max(t.Type.SizeBytes(), 1), wsAlign)
	}
	var visit func([]loops.Step)
	visit = func(steps []loops.Step) {
		for _, s := range steps {
			switch s := s.(type) {
			case *loops.Loop:
				visit(s.Body)
			case *loops.Stage:
				if s.Matmul != nil && packed(s) {
					w.panelBytes = max(w.panelBytes, threadPanelBytes(s))
				}
			}
		}
	}
	visit(k.Steps)
	return w
}

// threads is how many threads parallel loops may use, in [1, maxThreads]:
// the --threads option, or the cores online when the entry point starts.
func (e *fn) threads() value.Value {
	if e.md.opt.Threads > 0 {
		return i64(int64(min(e.md.opt.Threads, maxThreads)))
	}
	c := e.cur
	n := c.NewCall(e.md.declare("sysconf", types.I64, types.I32), constant.NewInt(types.I32, 84)) // _SC_NPROCESSORS_ONLN
	n2 := c.NewSelect(c.NewICmp(enum.IPredSLT, n, i64(maxThreads)), n, i64(maxThreads))
	return c.NewSelect(c.NewICmp(enum.IPredSLT, n2, i64(1)), i64(1), n2)
}

// allocWorkspace emits the entry point's allocation of the workspace:
// the header, the largest kernel's temporaries and a panel per thread
// (pages a kernel never touches cost no memory). A program without
// temporaries or parallel loops gets none: ws is null.
func (e *fn) allocWorkspace() (ws value.Value, free func()) {
	md := e.md
	if md.tempsMax <= wsHeader && md.panelMax == 0 && md.parallel == nil {
		return constant.NewNull(i8p), func() {}
	}
	threads := e.threads()
	base := alignUp(max(md.tempsMax, wsHeader), wsAlign)
	size := value.Value(i64(base))
	if t, ok := threads.(*constant.Int); ok {
		size = i64(base + t.X.Int64()*md.panelMax)
	} else if md.panelMax > 0 {
		size = e.cur.NewAdd(size, e.cur.NewMul(threads, i64(md.panelMax)))
	}
	ws = e.cur.NewCall(md.wsHook("kiln_ws_acquire"), size)
	e.cur.NewStore(threads, e.cur.NewBitCast(ws, types.NewPointer(types.I64)))
	return ws, func() { e.cur.NewCall(md.wsHook("kiln_ws_release"), ws) }
}

// wsHook emits a weak kiln_ws_acquire(bytes) or kiln_ws_release(block):
// malloc and free (malloc, not aligned_alloc: glibc's aligned_alloc of a
// few MiB, made on every call, kept three times the block resident). The
// runtime (csrc/runtime.c) links versions that keep one block from run to
// run in their place.
func (md *module) wsHook(name string) *ir.Func {
	if f := md.decls[name]; f != nil {
		return f
	}
	var f *ir.Func
	if name == "kiln_ws_acquire" {
		n := ir.NewParam("n", types.I64)
		f = md.m.NewFunc(name, i8p, n)
		b := f.NewBlock("")
		b.NewRet(b.NewCall(md.declare("malloc", i8p, types.I64), n))
	} else {
		p := ir.NewParam("p", i8p)
		f = md.m.NewFunc(name, types.Void, p)
		b := f.NewBlock("")
		b.NewCall(md.declare("free", types.Void, i8p), p)
		b.NewRet(nil)
	}
	f.Linkage = enum.LinkageWeak
	md.decls[name] = f
	return f
}

// threadCount loads the thread count from the workspace header.
func (e *fn) threadCount() value.Value {
	return e.cur.NewLoad(types.I64, e.cur.NewBitCast(e.ws, types.NewPointer(types.I64)))
}

// panel is this thread's packed panel of the kernel's matmul stages.
func (e *fn) panel() value.Value {
	off := e.cur.NewAdd(i64(e.layout.panelsAt), e.cur.NewMul(e.tid, i64(e.layout.panelBytes)))
	return e.cur.NewBitCast(e.cur.NewGetElementPtr(types.I8, e.ws, off), types.NewPointer(types.Float))
}
