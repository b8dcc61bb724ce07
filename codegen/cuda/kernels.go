package cuda

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// BlockSize is the threads per block of every launch.
const BlockSize = 256

// bufKey identifies the memory a kernel pointer argument points at.
type bufKey struct {
	storage loops.Storage
	slot    int
	offset  int64
	temp    string
}

func keyOf(b *loops.Buffer) bufKey {
	k := bufKey{storage: b.Storage, slot: b.Slot, offset: b.Offset}
	if b.Storage == loops.Temp {
		k.temp = b.Name
	}
	return k
}

// pointerArg is one pointer parameter of a generated kernel.
type pointerArg struct {
	key   bufKey
	buf   *loops.Buffer // the first view of it the stage uses
	size  int64         // bytes the stage may touch
	read  bool
	write bool
}

// mode is how a stage uses the buffer: "read", "write" or "readwrite".
func (p *pointerArg) mode() string {
	switch {
	case p.read && p.write:
		return "readwrite"
	case p.write:
		return "write"
	}
	return "read"
}

// stageKernel is one stage of a loop program as a CUDA kernel: one thread
// per point of the stage's domain; loop variables of enclosing Loops are
// scalar parameters.
type stageKernel struct {
	name    string
	stage   *loops.Stage
	outer   []*loops.Var
	extents []int64 // of the outer loops, whose values the scalar arguments carry
	ptrs    []*pointerArg
	threads int64
	source  string
	// host makes a C function that loops over the points on the host
	// (an optimizer update of offloaded parameters) instead of a kernel.
	host bool
	// override replaces expressions of the stage by others (a split
	// reduction by the fold of its partials).
	override map[loops.Expr]loops.Expr
	// body writes the stage as a device function NAME_b that takes its
	// block index as a last parameter, for a combined launch (merge.go).
	body bool
	// plain are the pointers the device function takes without
	// __restrict__ (merge.go, unrestrict).
	plain map[bufKey]bool
	// tile, for a product stage, makes it a tiled device function
	// (tiled.go), which only a cooperative kernel calls: its blocks
	// synchronise.
	tile *tiling
	// fold, when set, are the reductions of the stage that a block of
	// threads folds together, a block per point (fold.go); only a
	// cooperative kernel calls such a stage.
	fold []*loops.Reduce
}

// barriers says whether k's device function synchronises its block, so
// that only a cooperative kernel may call it.
func (k *stageKernel) barriers() bool { return k.tile != nil || k.fold != nil }

// cw writes the C body of one kernel.
type cw struct {
	fold   map[*loops.Reduce]bool // folded by the block (stageKernel.fold)
	b      strings.Builder
	indent int
	n      int
	scopes []map[loops.Expr]string
	vars   map[*loops.Var]string
	ptrs   map[bufKey]string
	consts *constTable
	host   bool // writing a host function: no device-only state
	// override: expressions written as others (stageKernel.override)
	override map[loops.Expr]loops.Expr
	err      error
}

// constTable holds the constant arrays of kernels.cu.
type constTable struct {
	names map[*ir.Dense]string
	defs  []string
}

func (w *cw) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *cw) line(format string, args ...any) {
	w.b.WriteString(strings.Repeat("  ", w.indent))
	fmt.Fprintf(&w.b, format, args...)
	w.b.WriteByte('\n')
}

func (w *cw) push() { w.scopes = append(w.scopes, map[loops.Expr]string{}) }
func (w *cw) pop()  { w.scopes = w.scopes[:len(w.scopes)-1] }

func (w *cw) tmp() string {
	w.n++
	return "t" + strconv.Itoa(w.n)
}

// cType is the C type an expression kind computes in.
func cType(k loops.Kind) string {
	return [...]string{"float", "double", "long long", "bool", "unsigned long long"}[k]
}

// storageType is the C type a dtype is stored as.
func storageType(d ir.DType) (string, error) {
	switch d {
	case ir.F32:
		return "float", nil
	case ir.F64:
		return "double", nil
	case ir.F16, ir.BF16:
		return "unsigned short", nil
	case ir.I64:
		return "long long", nil
	case ir.U64:
		return "unsigned long long", nil
	case ir.I32:
		return "int", nil
	case ir.U32:
		return "unsigned int", nil
	case ir.I16:
		return "short", nil
	case ir.U16:
		return "unsigned short", nil
	case ir.I8:
		return "signed char", nil
	case ir.U8, ir.Bool, ir.F8E4M3, ir.F8E5M2:
		return "unsigned char", nil
	}
	return "", fmt.Errorf("the CUDA backend does not store %s yet", d)
}

func literal(x loops.Expr) (string, bool) {
	switch x := x.(type) {
	case loops.Int:
		if x.V == math.MinInt64 {
			return "(-9223372036854775807LL - 1)", true
		}
		return strconv.FormatInt(x.V, 10) + "LL", true
	case loops.BoolConst:
		return strconv.FormatBool(x.V), true
	case loops.Float:
		return floatLit(x.V, x.K), true
	}
	return "", false
}

func floatLit(v float64, k loops.Kind) string {
	suffix, fn := "", ""
	if k == loops.F32 {
		suffix, fn = "f", "f"
	}
	switch {
	case math.IsNaN(v):
		return "__builtin_nan" + fn + "(\"\")"
	case math.IsInf(v, 1):
		return "__builtin_huge_val" + fn + "()"
	case math.IsInf(v, -1):
		return "(-__builtin_huge_val" + fn + "())"
	}
	s := strconv.FormatFloat(v, 'e', -1, 64)
	if k == loops.F32 {
		s = strconv.FormatFloat(float64(float32(v)), 'e', -1, 32)
	}
	return s + suffix
}

func (w *cw) lookup(x loops.Expr) (string, bool) {
	for i := len(w.scopes) - 1; i >= 0; i-- {
		if s, ok := w.scopes[i][x]; ok {
			return s, true
		}
	}
	return "", false
}

// expr returns a C expression (a name or a literal) for x, emitting the
// statements that compute it; each node is computed once per scope.
func (w *cw) expr(x loops.Expr) string {
	if s, ok := literal(x); ok {
		return s
	}
	if v, ok := x.(*loops.Var); ok {
		name, ok := w.vars[v]
		if !ok {
			w.fail(fmt.Errorf("loop variable %d used outside its loop", v.ID))
			return "0"
		}
		return name
	}
	if a, ok := x.(accRef); ok {
		return a.name
	}
	if s, ok := w.lookup(x); ok {
		return s
	}
	if o, ok := w.override[x]; ok {
		s := w.expr(o)
		w.scopes[len(w.scopes)-1][x] = s
		return s
	}
	s := w.emit(x)
	w.scopes[len(w.scopes)-1][x] = s
	return s
}

// accRef is the accumulator of a matmul stage inside its epilogue.
type accRef struct {
	name string
	kind loops.Kind
}

func (a accRef) Kind() loops.Kind { return a.kind }

func (w *cw) def(k loops.Kind, value string) string {
	t := w.tmp()
	w.line("const %s %s = %s;", cType(k), t, value)
	return t
}

func (w *cw) emit(x loops.Expr) string {
	switch x := x.(type) {
	case *loops.Load:
		if x.Guard != nil {
			g := w.expr(x.Guard)
			t := w.tmp()
			w.line("%s %s = %s;", cType(x.Kind()), t, floatOrInt(x.Else, x.Kind()))
			w.line("if (%s) {", g)
			w.indent++
			w.push()
			w.line("%s = %s;", t, w.load(x.Buf, x.Index))
			w.pop()
			w.indent--
			w.line("}")
			return t
		}
		return w.def(x.Kind(), w.load(x.Buf, x.Index))
	case *loops.Unary:
		return w.def(x.Kind(), w.unary(x.Fn, x.X.Kind(), w.expr(x.X)))
	case *loops.Binary:
		return w.def(x.Kind(), w.binary(x.Op, x.A.Kind(), w.expr(x.A), w.expr(x.B)))
	case *loops.Compare:
		ops := map[scalar.Prim]string{scalar.Eq: "==", scalar.Ne: "!=", scalar.Lt: "<", scalar.Le: "<=", scalar.Gt: ">", scalar.Ge: ">="}
		op, ok := ops[x.Pred]
		if !ok {
			w.fail(fmt.Errorf("unknown comparison %s", x.Pred))
		}
		return w.def(loops.Bool, fmt.Sprintf("%s %s %s", w.expr(x.A), op, w.expr(x.B)))
	case *loops.Select:
		return w.def(x.Kind(), fmt.Sprintf("%s ? %s : %s", w.expr(x.C), w.expr(x.A), w.expr(x.B)))
	case *loops.Convert:
		return w.def(x.To, convert(w.expr(x.X), x.X.Kind(), x.To))
	case *loops.Round:
		return w.def(loops.F32, fromStorage(toStorage(w.expr(x.X), x.To), x.To))
	case *loops.Mix:
		return w.def(loops.I64, "kiln_mix("+w.expr(x.X)+")")
	case *loops.RankIndex:
		if w.host {
			w.fail(fmt.Errorf("a host function cannot read the rank (it lives on the device)"))
		}
		return w.def(loops.I64, fmt.Sprintf("((kiln_device_rank / %dLL) %% %dLL)", max(1, x.Stride), max(1, x.Size)))
	case *loops.Checked:
		if w.host {
			// kiln_status lives in device memory.
			w.fail(fmt.Errorf("a host function cannot check an index (its status flag lives on the device)"))
		}
		w.line("if (!(%s)) kiln_status = %d;", w.expr(x.Cond), loops.StatusIndexOutOfRange)
		return w.expr(x.X)
	case *loops.Guarded:
		c := w.expr(x.Cond)
		t := w.tmp()
		w.line("%s %s = %s;", cType(x.Kind()), t, floatOrInt(x.Else, x.Kind()))
		w.line("if (%s) {", c)
		w.indent++
		w.push()
		w.line("%s = %s;", t, w.expr(x.X))
		w.pop()
		w.indent--
		w.line("}")
		return t
	case *bindVar:
		name := fmt.Sprintf("v%d", x.Var.ID)
		w.line("const long long %s = %s;", name, w.expr(x.Value))
		w.vars[x.Var] = name
		return w.expr(x.Body)
	case *loops.Reduce:
		if w.fold[x] {
			return w.blockFold(x)
		}
		for _, inner := range loops.InvariantReduces(x) {
			w.expr(inner) // computed once, before the loop
		}
		t := w.tmp()
		w.line("%s %s = %s;", cType(x.Acc), t, identity(x.Op, x.Acc))
		w.loops(x.Vars, x.Extents, func() {
			v := w.expr(x.Body)
			w.line("%s = %s;", t, w.binary(x.Op, x.Acc, t, v))
		})
		return t
	}
	w.fail(fmt.Errorf("unknown expression %T", x))
	return "0"
}

// loops opens one for loop per variable around body (a new scope).
func (w *cw) loops(vs []*loops.Var, extents []int64, body func()) {
	for i, v := range vs {
		name := fmt.Sprintf("v%d", v.ID)
		w.vars[v] = name
		w.line("for (long long %s = 0; %s < %dLL; ++%s) {", name, name, extents[i], name)
		w.indent++
	}
	w.push()
	body()
	w.pop()
	for range vs {
		w.indent--
		w.line("}")
	}
}

func floatOrInt(v float64, k loops.Kind) string {
	switch k {
	case loops.I64:
		return strconv.FormatInt(int64(v), 10) + "LL"
	case loops.U64:
		return strconv.FormatUint(uint64(max(v, 0)), 10) + "ull"
	case loops.Bool:
		return strconv.FormatBool(v != 0)
	}
	return floatLit(v, k)
}

func identity(op scalar.Prim, k loops.Kind) string {
	if k.IsFloat() {
		switch op {
		case scalar.Max:
			return floatLit(math.Inf(-1), k)
		case scalar.Min:
			return floatLit(math.Inf(1), k)
		}
		return floatLit(0, k)
	}
	switch {
	case k == loops.Bool: // any (max) starts false, all (min) true
		return strconv.FormatBool(op == scalar.Min)
	case k == loops.U64 && op == scalar.Min:
		return "18446744073709551615ull"
	case k == loops.U64:
		return "0ull"
	case op == scalar.Max:
		return "(-9223372036854775807LL - 1)"
	case op == scalar.Min:
		return "9223372036854775807LL"
	}
	return "0LL"
}

// cudaUnary are the unary primitives with a CUDA math function (expf or
// exp, ...).
var cudaUnary = map[scalar.Prim]string{scalar.Sqrt: "sqrt", scalar.Exp: "exp", scalar.Expm1: "expm1", scalar.Log: "log",
	scalar.Log1p: "log1p", scalar.Tanh: "tanh", scalar.Erf: "erf", scalar.Floor: "floor", scalar.Ceil: "ceil",
	scalar.Round: "rint", scalar.Sin: "sin", scalar.Cos: "cos", scalar.Abs: "fabs",
	scalar.Tan: "tan", scalar.Asin: "asin", scalar.Acos: "acos", scalar.Atan: "atan", scalar.Sinh: "sinh", scalar.Cosh: "cosh", scalar.Asinh: "asinh", scalar.Acosh: "acosh", scalar.Atanh: "atanh"}

func (w *cw) unary(p scalar.Prim, k loops.Kind, x string) string {
	f := ""
	if k == loops.F32 {
		f = "f"
	}
	switch {
	case p == scalar.Neg:
		return "-" + x
	case p == scalar.Not:
		return "!" + x
	case p == scalar.Abs && k == loops.U64:
		return x
	case p == scalar.Abs && !k.IsFloat():
		return "(" + x + " < 0 ? -" + x + " : " + x + ")"
	case k.IsFloat() && cudaUnary[p] != "":
		return cudaUnary[p] + f + "(" + x + ")"
	}
	w.fail(fmt.Errorf("no %s on %s", p, k))
	return x
}

// cOps are the binary primitives that are one C operator on integers.
var cOps = map[scalar.Prim]string{scalar.Add: "+", scalar.Sub: "-", scalar.Mul: "*", scalar.Div: "/", scalar.Rem: "%",
	scalar.And: "&", scalar.Or: "|", scalar.Xor: "^"}

func (w *cw) binary(op scalar.Prim, k loops.Kind, a, b string) string {
	f := ""
	if k == loops.F32 {
		f = "f"
	}
	if k.IsFloat() {
		switch op {
		case scalar.Add:
			return a + " + " + b
		case scalar.Sub:
			return a + " - " + b
		case scalar.Mul:
			return a + " * " + b
		case scalar.Div:
			return a + " / " + b
		case scalar.Rem:
			return "fmod" + f + "(" + a + ", " + b + ")"
		case scalar.Pow:
			return "pow" + f + "(" + a + ", " + b + ")"
		case scalar.Max:
			return fmt.Sprintf("(%s != %s || %s > %s) ? %s : %s", a, a, a, b, a, b)
		case scalar.Min:
			return fmt.Sprintf("(%s != %s || %s < %s) ? %s : %s", a, a, a, b, a, b)
		}
	} else {
		if o, ok := cOps[op]; ok {
			return a + " " + o + " " + b
		}
		switch op {
		case scalar.Shr:
			return "(" + cType(k) + ")((unsigned long long)" + a + " >> (" + b + " & 63))"
		case scalar.Pow:
			if k == loops.U64 {
				return "kiln_upow(" + a + ", " + b + ")"
			}
			return "kiln_ipow(" + a + ", " + b + ")"
		case scalar.Max:
			return fmt.Sprintf("%s > %s ? %s : %s", a, b, a, b)
		case scalar.Min:
			return fmt.Sprintf("%s < %s ? %s : %s", a, b, a, b)
		}
	}
	w.fail(fmt.Errorf("no %s on %s", op, k))
	return a
}

func convert(x string, from, to loops.Kind) string {
	switch {
	case from == to:
		return x
	case to == loops.Bool:
		return x + " != 0"
	case from.IsFloat() && to == loops.I64:
		// Saturating, NaN to 0 (scalar.Convert): a plain C cast is
		// undefined out of range.
		return "kiln_f2ll(" + x + ")"
	case from.IsFloat() && to == loops.U64:
		return "kiln_f2ull(" + x + ")"
	}
	return "(" + cType(to) + ")" + x
}

// ptr returns the name of the pointer parameter for b.
func (w *cw) ptr(b *loops.Buffer) string {
	if b.Storage == loops.Const {
		return w.consts.name(b.Data)
	}
	name, ok := w.ptrs[keyOf(b)]
	if !ok {
		w.fail(fmt.Errorf("buffer %s is not an argument of the kernel", b))
	}
	return name
}

// flat is the element index of idx in b.
func (w *cw) flat(b *loops.Buffer, idx []loops.Expr) string {
	st := b.Type.Shape.Strides()
	terms := []string{}
	for i, x := range idx {
		if st[i] == 0 {
			continue
		}
		s := w.expr(x)
		if st[i] != 1 {
			s = fmt.Sprintf("%s * %dLL", s, st[i])
		}
		terms = append(terms, s)
	}
	if len(terms) == 0 {
		return "0"
	}
	return strings.Join(terms, " + ")
}

// load reads element idx of b in its compute kind.
func (w *cw) load(b *loops.Buffer, idx []loops.Expr) string {
	at := w.flat(b, idx)
	if b.Storage == loops.Const && b.Data.IsSplat() {
		at = "0"
	}
	return fromStorage(w.ptr(b)+"["+at+"]", b.Type.DType)
}

// fromStorage widens a stored element of dtype d to its compute kind.
func fromStorage(raw string, d ir.DType) string {
	switch d {
	case ir.F16:
		return "kiln_f16_to_f32(" + raw + ")"
	case ir.BF16:
		return "kiln_bf16_to_f32(" + raw + ")"
	case ir.F8E4M3, ir.F8E5M2:
		return "kiln_" + d.String() + "_to_f32(" + raw + ")"
	case ir.I32, ir.I16, ir.I8, ir.U32, ir.U16, ir.U8:
		return "(long long)" + raw
	case ir.Bool:
		return raw + " != 0"
	}
	return raw
}

// toStorage narrows a computed value for b's dtype.
func toStorage(v string, d ir.DType) string {
	switch d {
	case ir.F16:
		return "kiln_f32_to_f16(" + v + ")"
	case ir.BF16:
		return "kiln_f32_to_bf16(" + v + ")"
	case ir.F8E4M3, ir.F8E5M2:
		return "kiln_f32_to_" + d.String() + "(" + v + ")"
	case ir.I32:
		return "(int)" + v
	case ir.U32:
		return "(unsigned int)" + v
	case ir.I16:
		return "(short)" + v
	case ir.U16:
		return "(unsigned short)" + v
	case ir.I8:
		return "(signed char)" + v
	case ir.U8, ir.Bool:
		return "(unsigned char)" + v
	}
	return v
}

func (c *constTable) name(d *ir.Dense) string {
	if n, ok := c.names[d]; ok {
		return n
	}
	n := fmt.Sprintf("kiln_const%d", len(c.names))
	c.names[d] = n
	ct, _ := storageType(d.Type.DType)
	count := d.Len()
	var vals []string
	for i := 0; i < count; i++ {
		var s string
		k := loops.ComputeKind(d.Type.DType)
		switch {
		case k.IsFloat():
			s = toStorage(floatLit(d.Float(int64(i)), k), d.Type.DType)
			switch d.Type.DType {
			case ir.F16, ir.BF16:
				s = strconv.Itoa(int(f16Bits(d.Float(int64(i)), d.Type.DType)))
			case ir.F8E4M3:
				s = strconv.Itoa(int(ir.Float8E4M3Bits(d.Float(int64(i)))))
			case ir.F8E5M2:
				s = strconv.Itoa(int(ir.Float8E5M2Bits(d.Float(int64(i)))))
			}
		case k == loops.Bool:
			s = strconv.FormatInt(d.Int(int64(i)), 10)
		case d.Type.DType == ir.U64:
			s = strconv.FormatUint(uint64(d.Int(int64(i))), 10) + "ull"
		default:
			s, _ = literal(loops.Int{V: d.Int(int64(i))}) // INT64_MIN has no literal of its own
		}
		vals = append(vals, s)
	}
	c.defs = append(c.defs, fmt.Sprintf("__device__ const %s %s[%d] = {%s};", ct, n, max(count, 1), strings.Join(vals, ", ")))
	return n
}

// f16Bits is the stored bits of v in a 16-bit float dtype.
func f16Bits(v float64, d ir.DType) uint16 {
	raw := (&ir.Dense{Type: ir.Type{DType: d}, Floats: []float64{v}}).RawBytes()
	return uint16(raw[0]) | uint16(raw[1])<<8
}

// kernelSource writes the CUDA C of one stage.
func kernelSource(k *stageKernel, consts *constTable) (string, error) {
	w := &cw{vars: map[*loops.Var]string{}, ptrs: map[bufKey]string{}, consts: consts, host: k.host, override: k.override, fold: map[*loops.Reduce]bool{}}
	for _, r := range k.fold {
		w.fold[r] = true
	}
	var params []string
	for i, p := range k.ptrs {
		name := fmt.Sprintf("b%d", i)
		w.ptrs[p.key] = name
		t, err := storageType(p.buf.Type.DType)
		if err != nil {
			return "", err
		}
		q := ""
		if !p.write {
			q = "const "
		}
		restrict := "__restrict__ "
		if k.body && k.plain[p.key] {
			restrict = ""
		}
		params = append(params, fmt.Sprintf("%s%s *%s%s", q, t, restrict, name))
	}
	for _, v := range k.outer {
		name := fmt.Sprintf("v%d", v.ID)
		w.vars[v] = name
		params = append(params, "long long "+name)
	}
	w.indent = 1
	constsBefore := len(consts.defs)
	if k.host {
		w.line("for (long long kiln_i = 0; kiln_i < %dLL; ++kiln_i) {", k.threads)
		w.indent++
	}
	w.push()
	s := k.stage
	if k.tile != nil {
		w.tiled(k)
		w.pop()
		if w.err != nil {
			return "", fmt.Errorf("kernel %s: %v", k.name, w.err)
		}
		return tiledSignature(k, params, w.b.String()), nil
	}
	if !k.host {
		block := "(long long)blockIdx.x"
		if k.body {
			block = "kiln_block"
		}
		if k.fold != nil {
			// A point per block; every thread stays for the fold's barriers.
			w.line("const long long kiln_i = %s;", block)
		} else {
			w.line("const long long kiln_i = %s * blockDim.x + threadIdx.x;", block)
			w.line("if (kiln_i >= %dLL) return;", k.threads)
		}
	}
	w.unflatten(s.Vars, s.Extents, "kiln_i")
	for _, r := range k.fold {
		w.expr(r) // every thread, before anything that might branch
	}
	outKind := loops.ComputeKind(s.Out.Type.DType)
	if s.Guard != nil {
		if k.host {
			w.line("if (!(%s)) continue;", w.expr(s.Guard))
		} else {
			w.line("if (!(%s)) return;", w.expr(s.Guard))
		}
	}
	var value string
	if m := s.Matmul; m != nil {
		acc := w.tmp()
		kind := m.A.Kind()
		w.line("%s %s = %s;", cType(kind), acc, floatLit(0, kind))
		w.loops([]*loops.Var{m.K}, []int64{m.Extent}, func() {
			w.line("%s += %s * %s;", acc, w.expr(m.A), w.expr(m.B))
		})
		var v loops.Expr = accRef{name: acc, kind: kind}
		if m.Epilogue != nil {
			v = m.Epilogue(v)
		}
		value = convert(w.expr(v), v.Kind(), outKind)
	} else {
		value = convert(w.expr(s.Value), s.Value.Kind(), outKind)
	}
	idx := s.Index
	if idx == nil {
		idx = make([]loops.Expr, len(s.Vars))
		for i, v := range s.Vars {
			idx[i] = v
		}
	}
	at := w.flat(s.Out, idx)
	out := w.ptr(s.Out)
	d := s.Out.Type.DType
	if k.fold != nil {
		w.line("if (threadIdx.x != 0) return; // every thread holds the fold; one stores")
	}
	switch {
	case !s.Accumulate:
		w.line("%s[%s] = %s;", out, at, toStorage(value, d))
	case s.Index == nil || s.Matmul != nil || k.host:
		// Each thread owns its element (or one host thread runs them
		// all): a plain read-modify-write.
		old := w.tmp()
		w.line("const %s %s = %s;", cType(outKind), old, w.load(s.Out, idx))
		w.line("%s[%s] = %s;", out, at, toStorage(w.binary(scalar.Add, outKind, old, value), d))
	case d == ir.F32 || d == ir.F64:
		w.line("atomicAdd(&%s[%s], %s);", out, at, value)
	case d == ir.I64 || d == ir.U64:
		w.line("atomicAdd((unsigned long long *)&%s[%s], (unsigned long long)%s);", out, at, value)
	case d == ir.I32:
		w.line("atomicAdd(&%s[%s], (int)%s);", out, at, value)
	case d == ir.F16 || d == ir.BF16:
		w.line("kiln_atomic_add_16(&%s[%s], %s, %v);", out, at, value, d == ir.BF16)
	default:
		return "", fmt.Errorf("the CUDA backend cannot accumulate into %s", d)
	}
	w.pop()
	if k.host {
		w.indent--
		w.line("}")
		if len(w.consts.defs) > constsBefore {
			return "", fmt.Errorf("host function %s reads a constant table, which lives in device memory", k.name)
		}
	}
	if w.err != nil {
		return "", fmt.Errorf("kernel %s: %v", k.name, w.err)
	}
	if k.body {
		return fmt.Sprintf("static __device__ inline void %s_b(%s) {\n%s}\n", k.name, strings.Join(append(params, "long long kiln_block"), ", "), w.b.String()), nil
	}
	bytes, modes, ext := k.contract()
	contract := launchContract(k.threads, bytes, modes, ext)
	if k.host {
		contract = strings.Replace(contract, "kiln launch", "kiln host", 1)
		return contract + fmt.Sprintf("extern \"C\" void %s(%s) {\n%s}\n", k.name, strings.Join(params, ", "), w.b.String()), nil
	}
	return contract + fmt.Sprintf("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n%s}\n", BlockSize, k.name, strings.Join(params, ", "), w.b.String()), nil
}

// unflatten binds vars to the row-major position of flat (a C
// expression) in extents.
func (w *cw) unflatten(vars []*loops.Var, extents []int64, flat string) {
	rest := flat
	for i := len(vars) - 1; i >= 0; i-- {
		name := fmt.Sprintf("v%d", vars[i].ID)
		w.vars[vars[i]] = name
		if i == 0 {
			w.line("const long long %s = %s;", name, rest)
			continue
		}
		w.line("const long long %s = %s %% %dLL;", name, rest, extents[i])
		next := w.tmp()
		w.line("const long long %s = %s / %dLL;", next, rest, extents[i])
		rest = next
	}
}

// children are the expressions x reads directly (nil where absent),
// the kernel writer's bindVar included.
func children(x loops.Expr) []loops.Expr {
	if b, ok := x.(*bindVar); ok {
		return []loops.Expr{b.Value, b.Body}
	}
	return loops.Children(x)
}

// contract is what k's launch contract says of its parameters: the
// bytes each pointer may touch, how it is used (r, w, rw), and the
// extent of each scalar (an outer loop's index).
func (k *stageKernel) contract() (bytes, modes, ext []string) {
	for _, p := range k.ptrs {
		bytes = append(bytes, strconv.FormatInt(p.size, 10))
		modes = append(modes, map[string]string{"read": "r", "write": "w", "readwrite": "rw"}[p.mode()])
	}
	for _, e := range k.extents {
		ext = append(ext, strconv.FormatInt(e, 10))
	}
	return bytes, modes, ext
}

// launchContract is the line above a kernel that plan-check holds every
// launch to: the threads the kernel needs, and its parameters' contract.
func launchContract(threads int64, bytes, modes, ext []string) string {
	return fmt.Sprintf("// kiln launch: threads=%d bytes=%s modes=%s outer=%s\n", threads, strings.Join(bytes, ","), strings.Join(modes, ","), strings.Join(ext, ","))
}

// cooperativeContract is the launch contract of a cooperative kernel
// (merge.go): one block is enough, since its blocks loop over the work;
// it must be launched cooperatively; and phases lists its stage calls in
// order, each as PHASE:PARAM MODE.PARAM MODE... (phases apart are
// separated by a grid-wide barrier), which plan-check holds against the
// launch's accesses.
func cooperativeContract(bytes, modes, phases []string) string {
	return strings.TrimSuffix(launchContract(BlockSize, bytes, modes, nil), "\n") + " cooperative=1 phases=" + strings.Join(phases, "/") + "\n"
}

// pointerTypes are the C types of k's pointer parameters.
func (k *stageKernel) pointerTypes() ([]string, error) {
	var out []string
	for _, p := range k.ptrs {
		t, err := storageType(p.buf.Type.DType)
		if err != nil {
			return nil, err
		}
		if !p.write {
			t = "const " + t
		}
		out = append(out, t+" *")
	}
	return out, nil
}

// pointers lists the buffers a stage touches (outputs first), in a
// stable order.
func pointers(s *loops.Stage, override map[loops.Expr]loops.Expr) []*pointerArg {
	byKey := map[bufKey]*pointerArg{}
	var order []*pointerArg
	touch := func(b *loops.Buffer, write bool) {
		if b.Storage == loops.Const {
			return
		}
		k := keyOf(b)
		p := byKey[k]
		if p == nil {
			p = &pointerArg{key: k, buf: b}
			byKey[k] = p
			order = append(order, p)
		}
		p.size = max(p.size, b.Type.SizeBytes())
		if write {
			p.write = true
		} else {
			p.read = true
		}
	}
	touch(s.Out, true)
	if s.Accumulate {
		touch(s.Out, false)
	}
	seen := map[loops.Expr]bool{}
	var walk func(x loops.Expr)
	walk = func(x loops.Expr) {
		if x == nil || seen[x] {
			return
		}
		if _, lit := literal(x); lit {
			return
		}
		seen[x] = true
		if o, ok := override[x]; ok {
			walk(o)
			return
		}
		if l, ok := x.(*loops.Load); ok {
			touch(l.Buf, false)
		}
		for _, c := range children(x) {
			walk(c)
		}
	}
	for _, i := range s.Index {
		walk(i)
	}
	walk(s.Guard)
	if s.Matmul != nil {
		walk(s.Matmul.A)
		walk(s.Matmul.B)
		if s.Matmul.Epilogue != nil {
			walk(s.Matmul.Epilogue(accRef{kind: s.Matmul.A.Kind()}))
		}
	} else {
		walk(s.Value)
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].write && !order[j].write })
	return order
}
