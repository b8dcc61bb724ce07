package plancheck

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// libraryTypes are the storage types of GEMM operands: element bytes and
// the unit roundoff of the type (a result rounds to within it).
var libraryTypes = map[string]struct {
	bytes int64
	u     float64
	tiny  float64 // the spacing of its subnormals
}{"f32": {4, 0x1p-24, 0x1p-149}, "f16": {2, 0x1p-11, 0x1p-24}, "bf16": {2, 0x1p-8, 0x1p-133}}

// gemmMatrix is one operand of a GEMM as the call stores it: rows ×
// cols column-major with leading dimension ld, batches stride apart.
type gemmMatrix struct {
	name           string
	access         *cuda.Access
	typ            string
	rows, cols, ld int64
	stride         int64
	transposed     bool
	mode, wantMode string
}

// spans are the byte ranges of its argument's memory that the matrix
// spans over batch batches: its columns, merged where they touch.
func (m gemmMatrix) spans(batch int64) [][2]int64 {
	eb := libraryTypes[m.typ].bytes
	var out [][2]int64
	add := func(lo, hi int64) {
		if k := len(out); k > 0 && out[k-1][1] == lo {
			out[k-1][1] = hi
			return
		}
		out = append(out, [2]int64{lo, hi})
	}
	for b := int64(0); b < batch; b++ {
		for c := int64(0); c < m.cols; c++ {
			lo := m.access.Offset + (b*m.stride+c*m.ld)*eb
			add(lo, lo+m.rows*eb)
		}
	}
	return out
}

// matrices lists a GEMM node's A, B and C as stored.
func matrices(n cuda.Node) ([3]gemmMatrix, error) {
	l := n.Library
	var ms [3]gemmMatrix
	if l == nil || l.Call != cuda.GemmCall && l.Call != cuda.LtCall {
		return ms, fmt.Errorf("a library node must call %s or %s", cuda.GemmCall, cuda.LtCall)
	}
	switch {
	case l.Call == cuda.GemmCall && l.Epilogue != "":
		return ms, fmt.Errorf("%s has no epilogue (%s)", l.Call, l.Epilogue)
	case l.Call == cuda.LtCall && l.Epilogue != cuda.BiasEpilogue:
		return ms, fmt.Errorf("%s with epilogue %q: Kiln calls it with %q only", l.Call, l.Epilogue, cuda.BiasEpilogue)
	}
	want := 3
	if l.Epilogue != "" {
		want = 4
	}
	if len(n.Args) != want {
		return ms, fmt.Errorf("%s takes %d pointers (A, B, C, and a bias with its epilogue), not %d", l.Call, want, len(n.Args))
	}
	for _, a := range n.Args {
		if a.Pointer == nil {
			return ms, fmt.Errorf("%s takes pointers only", l.Call)
		}
	}
	stored := func(trans string, rows, cols int64) (int64, int64, bool, error) {
		switch trans {
		case "N":
			return rows, cols, false, nil
		case "T":
			return cols, rows, true, nil
		}
		return 0, 0, false, fmt.Errorf("op %q is neither N nor T", trans)
	}
	ar, ac, at, err := stored(l.TransA, l.M, l.K)
	if err != nil {
		return ms, err
	}
	br, bc, bt, err := stored(l.TransB, l.K, l.N)
	if err != nil {
		return ms, err
	}
	cMode := "write"
	if l.Beta != 0 {
		cMode = "readwrite"
	}
	ms[0] = gemmMatrix{name: "A", access: n.Args[0].Pointer, typ: l.AType, rows: ar, cols: ac, ld: l.LDA, stride: l.StrideA, transposed: at, wantMode: "read"}
	ms[1] = gemmMatrix{name: "B", access: n.Args[1].Pointer, typ: l.BType, rows: br, cols: bc, ld: l.LDB, stride: l.StrideB, transposed: bt, wantMode: "read"}
	ms[2] = gemmMatrix{name: "C", access: n.Args[2].Pointer, typ: l.CType, rows: l.M, cols: l.N, ld: l.LDC, stride: l.StrideC, wantMode: cMode}
	return ms, nil
}

// libraryNode checks a GEMM node as cuBLAS would take it (on stream 0,
// where the runtime's handle runs), and that every
// byte it touches lies in the ranges its arguments declare: m, n, k,
// the leading dimensions and the batch count positive ints, each leading
// dimension at least its matrix's rows, strides not negative, batches of
// C apart, the types ones the call multiplies (A and B alike; C as they
// are, or f32), and the arguments' modes what alpha and beta make them.
func libraryNode(i int, n cuda.Node) error {
	ms, err := matrices(n)
	if err != nil {
		return fmt.Errorf("node %d: %v", i, err)
	}
	if n.Stream != 0 {
		return fmt.Errorf("node %d: a library call on stream %d (the runtime's cuBLAS handle runs on stream 0)", i, n.Stream)
	}
	l := n.Library
	for _, v := range []int64{l.M, l.N, l.K, l.LDA, l.LDB, l.LDC, l.Batch} {
		if v < 1 || v > math.MaxInt32 {
			return fmt.Errorf("node %d: %s with m=%d n=%d k=%d lda=%d ldb=%d ldc=%d batch=%d: each must be a positive int", i, l.Call, l.M, l.N, l.K, l.LDA, l.LDB, l.LDC, l.Batch)
		}
	}
	if l.AType != l.BType || (l.CType != l.AType && l.CType != "f32") {
		return fmt.Errorf("node %d: %s multiplies %s by %s into %s, which it does not do", i, l.Call, l.AType, l.BType, l.CType)
	}
	if l.Alpha != 1 || (l.Beta != 0 && l.Beta != 1) {
		return fmt.Errorf("node %d: alpha %g and beta %g (the runtime passes 1 and 0 or 1)", i, l.Alpha, l.Beta)
	}
	for _, m := range ms {
		t, ok := libraryTypes[m.typ]
		if !ok {
			return fmt.Errorf("node %d: %s of type %q", i, m.name, m.typ)
		}
		if m.ld < m.rows {
			return fmt.Errorf("node %d: %s has %d rows but leading dimension %d", i, m.name, m.rows, m.ld)
		}
		if m.stride < 0 {
			return fmt.Errorf("node %d: %s's batch stride %d is negative", i, m.name, m.stride)
		}
		if m.access.Mode != m.wantMode {
			return fmt.Errorf("node %d: %s's access is %q, but the call's is %q", i, m.name, m.access.Mode, m.wantMode)
		}
		last := (l.Batch-1)*m.stride + (m.cols-1)*m.ld + m.rows // elements up to the last one touched
		if last*t.bytes > m.access.SizeBytes {
			return fmt.Errorf("node %d: %s touches %d bytes from its pointer, but its argument holds %d", i, m.name, last*t.bytes, m.access.SizeBytes)
		}
	}
	if c := ms[2]; l.Batch > 1 && c.stride < (c.cols-1)*c.ld+c.rows {
		return fmt.Errorf("node %d: batches of C, %d elements apart, overlap (each spans %d)", i, c.stride, (c.cols-1)*c.ld+c.rows)
	}
	if l.Epilogue != "" {
		// The bias epilogue: one f32 per row of C, read, for one
		// product that overwrites C.
		bias := n.Args[3].Pointer
		if l.Batch != 1 || l.Beta != 0 || l.CType != "f32" {
			return fmt.Errorf("node %d: a bias epilogue on a batch of %d with beta %g into %s (Kiln fuses it into one f32 product that overwrites C)", i, l.Batch, l.Beta, l.CType)
		}
		if bias.Mode != "read" {
			return fmt.Errorf("node %d: the bias's access is %q, but the call reads it", i, bias.Mode)
		}
		if bias.Offset%cuda.BiasAlignment != 0 {
			return fmt.Errorf("node %d: the bias at offset %d is not %d-byte aligned, which cuBLASLt's bias loads may need", i, bias.Offset, cuda.BiasAlignment)
		}
		if l.M*4 > bias.SizeBytes {
			return fmt.Errorf("node %d: the bias is read for %d rows (%d bytes), but its argument holds %d", i, l.M, l.M*4, bias.SizeBytes)
		}
		if c := ms[2].access; c.Space == bias.Space && c.Slot == bias.Slot && c.Offset < bias.Offset+bias.SizeBytes && bias.Offset < c.Offset+c.SizeBytes {
			return fmt.Errorf("node %d: the bias [%d, %d) overlaps C [%d, %d), which the call writes while it reads the bias", i, bias.Offset, bias.Offset+bias.SizeBytes, c.Offset, c.Offset+c.SizeBytes)
		}
	}
	return nil
}

// product is the shape of a matrix product an op's lowering computes: an
// M × N result of sums of K terms (a Matmul stage of codegen/loops).
type product struct{ m, n, k int64 }

// products lowers f as the CUDA backend does (codegen/loops, implicit
// GEMMs) and lists the matrix products of each op, by schedule position:
// the shapes a library call of that op may compute. They come from the
// ops' loop programs, which the LLVM backend's tests check against the
// interpreter, not from the plan's GEMM mapping that replay checks.
func products(f *ir.Func) (map[int][]product, error) {
	prog, err := loops.LowerWith(f, cuda.LoopOptions)
	if err != nil {
		return nil, fmt.Errorf("the module's loop programs, to check its library calls: %v", err)
	}
	at := map[*ir.Op]int{}
	for i, op := range f.Body {
		at[op] = i
	}
	out := map[int][]product{}
	var walk func(op int, steps []loops.Step)
	walk = func(op int, steps []loops.Step) {
		for _, st := range steps {
			switch st := st.(type) {
			case *loops.Loop:
				walk(op, st.Body)
			case *loops.Stage:
				if st.Matmul != nil && len(st.Extents) == 2 {
					out[op] = append(out[op], product{st.Extents[0], st.Extents[1], st.Matmul.Extent})
				}
			}
		}
	}
	for _, k := range prog.Kernels {
		if i, ok := at[k.Op]; ok {
			walk(i, k.Steps)
		}
	}
	return out, nil
}

// productOf checks that library node i computes one of the products of
// its op, ps: the same number of terms per sum, and the same matrix (in
// either orientation, cuBLAS's column-major terms swapping rows and
// columns). A call summing fewer terms, or writing fewer rows or columns,
// than its op's product is an error even where the replay cannot
// recompute it (its operand a kernel's temporary).
func productOf(i int, n cuda.Node, op *ir.Op, ps []product) error {
	l := n.Library
	for _, p := range ps {
		if l.K == p.k && (l.M == p.m && l.N == p.n || l.M == p.n && l.N == p.m) {
			return nil
		}
	}
	var want []string
	for _, p := range ps {
		want = append(want, fmt.Sprintf("%d × %d by %d terms", p.m, p.n, p.k))
	}
	if len(want) == 0 {
		return fmt.Errorf("node %d: a library call for op %d (%s), which computes no matrix product", i, n.Op, op.Kind)
	}
	return fmt.Errorf("node %d: %s computes %d × %d by %d terms, where op %d (%s) computes %s", i, l.Call, l.M, l.N, l.K, n.Op, op.Kind, strings.Join(want, " or "))
}

// element reads element e of a matrix stored as typ at byte offset off
// of raw.
func element(raw []byte, off int64, typ string) float64 {
	switch typ {
	case "f16":
		return ir.Float16FromBits(binary.LittleEndian.Uint16(raw[off:]))
	case "bf16":
		return ir.BFloat16FromBits(binary.LittleEndian.Uint16(raw[off:]))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[off:])))
}

// checkGemm replays GEMM node i, the last node of op, on the plan's
// memory and compares what it computes with the interpreter's result of
// op, out: where A and B hold operands of op (not a kernel's temporary,
// which the replay does not compute), C a result, and beta is 0 (the
// call computes the result alone, not an epilogue's or an accumulation's
// input). Each element is a sum of K products in f64 (exact products of
// the stored values), rounded to C's type: it may differ from the
// interpreter's, summed in another order, by the rounding of C's type
// (relative, or one subnormal step) and K·2^-52 of the sum of the
// products' magnitudes. A bias epilogue adds bias[row] to the sum, and
// beta 1 C's element (when C holds an operand of the op, which is the
// call's alone): one more term; the interpreter may round the product to
// C's type before adding it, so the bound also has the rounding of the
// product.
func (rr *rankReplay) checkGemm(i int, n cuda.Node, op *ir.Op, out []*interp.Tensor) error {
	l := n.Library
	if l.Beta != 0 && (l.Beta != 1 || !rr.onlyNodeOfOp(i)) {
		return nil
	}
	holds := func(a *cuda.Access, vals []*ir.Value) *ir.Value {
		for _, name := range rr.p.Buffers[a.Buffer].Values {
			for _, v := range vals {
				if v.Name == name {
					return v
				}
			}
		}
		return nil
	}
	ms, err := matrices(n)
	if err != nil {
		return err
	}
	if holds(ms[0].access, op.Operands) == nil || holds(ms[1].access, op.Operands) == nil || l.Beta != 0 && holds(ms[2].access, op.Operands) == nil {
		return nil
	}
	res := -1
	for j, r := range op.Results {
		if holds(ms[2].access, []*ir.Value{r}) != nil {
			res = j
		}
	}
	if res < 0 {
		return nil
	}
	result := op.Results[res]
	_, roff, err := rr.valueAt(result)
	if err != nil {
		return err
	}
	// The call is the op's result: it writes every byte of it (a call
	// that accumulates, beta 1, leaves an unwritten element holding the
	// old sum, which no owner tells apart).
	covered := roff
	for _, sp := range ms[2].spans(l.Batch) {
		if sp[0] <= covered && sp[1] > covered {
			covered = sp[1]
		}
	}
	if covered < roff+result.Type.SizeBytes() {
		return fmt.Errorf("%snode %d (%s) writes C as %d × %d by %d terms, which leaves bytes of %s from %d on unwritten", rr.name, i, describe(rr.p, n), l.M, l.N, l.K, result.Ref(), covered-roff)
	}
	want, err := ir.DenseFromRaw(result.Type, out[res].ToDense().RawBytes())
	if err != nil {
		return err
	}
	wantRaw := want.RawBytes()
	raw := func(a *cuda.Access) []byte { return rr.mem.bytes[spaceKey(a.Space, a.Slot)] }
	at := func(m gemmMatrix, b, r, c int64) float64 {
		t := libraryTypes[m.typ]
		if m.transposed {
			r, c = c, r
		}
		return element(raw(m.access), m.access.Offset+(b*m.stride+r+c*m.ld)*t.bytes, m.typ)
	}
	ct := libraryTypes[l.CType]
	for b := int64(0); b < l.Batch; b++ {
		for j := int64(0); j < l.N; j++ {
			for r := int64(0); r < l.M; r++ {
				sum, mag := 0.0, 0.0
				for k := int64(0); k < l.K; k++ {
					p := at(ms[0], b, r, k) * at(ms[1], b, k, j)
					sum += p
					mag += math.Abs(p)
				}
				terms, product, tiny := float64(l.K), 0.0, ct.tiny
				byteAt := ms[2].access.Offset + (b*l.StrideC+r+j*l.LDC)*ct.bytes - roff
				var add []float64 // the bias, or C's operand
				if l.Epilogue == cuda.BiasEpilogue {
					bias := n.Args[3].Pointer
					add = append(add, element(raw(bias), bias.Offset+r*4, "f32"))
				}
				if l.Beta == 1 {
					add = append(add, element(raw(ms[2].access), byteAt+roff, l.CType))
				}
				for _, x := range add {
					product, terms, tiny = math.Abs(sum), terms+1, 2*ct.tiny
					sum += x
					mag += math.Abs(x)
				}
				if byteAt < 0 || byteAt+ct.bytes > int64(len(wantRaw)) {
					return fmt.Errorf("%snode %d (%s) writes element (%d, %d) of batch %d outside %s", rr.name, i, describe(rr.p, n), r, j, b, result.Ref())
				}
				w := element(wantRaw, byteAt, l.CType)
				if math.IsNaN(w) && math.IsNaN(sum) {
					continue
				}
				if d := math.Abs(sum - w); !(d <= ct.u*(math.Abs(w)+product)+tiny+terms*0x1p-52*mag) {
					return fmt.Errorf("%snode %d (%s) computes %g at element (%d, %d) of batch %d of %s, where the interpreter has %g", rr.name, i, describe(rr.p, n), sum, r, j, b, result.Ref(), w)
				}
			}
		}
	}
	rr.gemmsChecked++
	return nil
}

// onlyNodeOfOp reports whether node i is the one node its op issues
// (events aside): then the plan's memory holds the op's operands, as
// nothing of the op has written it yet.
func (rr *rankReplay) onlyNodeOfOp(i int) bool {
	op := rr.p.Nodes[i].Op
	for j, n := range rr.p.Nodes {
		if j != i && n.Op == op && n.Kind != "event_record" && n.Kind != "event_wait" {
			return false
		}
	}
	return true
}
