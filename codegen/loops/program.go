package loops

import (
	"fmt"

	"github.com/kiln-compiler/kiln/alloc"
	"github.com/kiln-compiler/kiln/passes/assign"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
)

// Program is a function lowered to kernels over one arena.
type Program struct {
	Func       *ir.Func
	Params     []*ir.Value // param and state arguments: the entry point's params[i]
	Inputs     []*ir.Value // data arguments: inputs[i]
	Results    []*Buffer   // where each result lives when the entry point returns
	Kernels    []*Kernel
	ArenaBytes int64
	HostBytes  int64 // the host arena of swapped-out tensors
	// Restore[j] copies back the argument of the run's j-th backup (a
	// copy past the planned arena, BackupBytes in all, in ArenaBytes),
	// taken before the argument's first write: when an index check fails,
	// a backend runs the restores of the backups taken so far, the last
	// first (Options.Transactional).
	Restore     []*Kernel
	BackupBytes int64
}

// Lower turns f, whose values carry arena offsets (the assign pass), into
// a program. Errors name the op that cannot be compiled.
func Lower(f *ir.Func) (*Program, error) { return LowerWith(f, Options{}) }

// Options are what a backend tells the lowering about itself.
type Options struct {
	// Im2colBytes, when not 0, bounds the im2col a convolution stores
	// for a product over several images (convImages): a backend whose
	// products run well only when wide (the LLVM microkernel: panels of
	// 128 columns, split among threads) spends that workspace on them.
	// 0 keeps one product per image unless the whole batch's im2col fits
	// im2colBytes.
	Im2colBytes int64
	// TransposeNarrowWeightGrads: a weight gradient over several images
	// with under 32 output channels per group and 32 or more taps is
	// computed as dwᵀ = col · DYᵀ, its im2col stored along output
	// positions (contiguous reads of the input), not tap by tap: on the
	// LLVM backend the product is then a few MFLOP and the scattered
	// reads of the tap-by-tap im2col cost more than it.
	TransposeNarrowWeightGrads bool
	// ConvPanels: a convolution of f32 (or narrower) values with 4 or
	// more output channels per group, reading its columns at stride 1
	// (or 2 from an f32 buffer), and the input gradient of a stride-1
	// one, multiply over the whole batch, their B the input read under
	// the kernel taps (Matmul.Taps) rather than an im2col stored first:
	// the LLVM microkernel packs B's panels from the input's rows, the
	// im2col's extra pass over memory saved.
	ConvPanels bool
	// ImplicitGemm: every convolution, its input gradient and its weight
	// gradient is one product per group over the whole batch whose
	// operands read the input, the kernel and dy under the taps
	// (implicitConv): no im2col or col2im stored, no loop over images.
	// A pointwise one of one group is a product per image whose operands
	// are plain loads, which a backend may hand to a strided-batched GEMM.
	ImplicitGemm bool
	// Transactional: a run that fails an index check changes no argument
	// (transaction.go): writing kernels test the status first, and index
	// checks after the first write are proved or hoisted before it.
	Transactional bool
}

// LowerWith is Lower for a backend that says what it can do in opts.
func LowerWith(f *ir.Func, opts Options) (*Program, error) {
	p := &Program{Func: f}
	store := map[*ir.Value]*Buffer{}
	for _, a := range f.Args {
		b := &Buffer{Name: a.Name, Type: a.Type}
		if a.Arg != nil && (a.Arg.Kind == ir.ArgParam || a.Arg.Kind == ir.ArgState) {
			b.Storage, b.Slot = Param, len(p.Params)
			p.Params = append(p.Params, a)
		} else {
			b.Storage, b.Slot = Input, len(p.Inputs)
			p.Inputs = append(p.Inputs, a)
		}
		store[a] = b
	}
	for _, op := range f.Body {
		d := op.Def()
		if d != nil && d.View && len(op.Results) == 1 {
			store[op.Results[0]] = alias(store[op.Operands[0]], op.Results[0].Type.Shape)
			continue
		}
		var outs []*Buffer
		for _, r := range op.Results {
			if r.Offset == ir.NoOffset {
				return nil, fmt.Errorf("%s: %s has no arena offset (run the assign pass first)", describe(op), r.Ref())
			}
			b := &Buffer{Name: r.Name, Type: r.Type, Storage: Arena, Offset: r.Offset}
			store[r] = b
			outs = append(outs, b)
			if ir.HostResult(r) {
				b.Storage = Host
				p.HostBytes = max(p.HostBytes, r.Offset+r.Type.SizeBytes())
				continue
			}
			p.ArenaBytes = max(p.ArenaBytes, r.Offset+r.Type.SizeBytes())
		}
		in := make([]Tensor, len(op.Operands))
		for i, x := range op.Operands {
			in[i] = FromBuffer(store[x])
		}
		k, err := lowerOp(op, in, outs, opts, fmt.Sprintf("k%d_%s", len(p.Kernels), cName(op.Kind)))
		if err != nil {
			return nil, fmt.Errorf("%s: %v", describe(op), err)
		}
		p.Kernels = append(p.Kernels, k)
	}
	for _, r := range f.Results {
		p.Results = append(p.Results, store[r.Value])
	}
	if opts.Transactional {
		if err := p.transactional(store); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func describe(op *ir.Op) string {
	s := "op " + op.Kind
	if len(op.Results) > 0 {
		s += " (" + op.Results[0].Ref() + ")"
	}
	if !op.Loc.IsUnknown() {
		s += " at " + op.Loc.String()
	}
	return s
}

// cName keeps the characters of s that C identifiers allow.
func cName(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// CName is the C identifier Kiln derives from a name.
func CName(s string) string { return cName(s) }

// commentEscaper breaks the sequences that could end a C comment or start
// one, and trigraphs.
var commentEscaper = strings.NewReplacer("*/", `*\/`, "/*", `/\*`, "?", `\x3f`)

// CComment is a name as it may appear inside a C or CUDA comment: quoted,
// in printable ASCII (escapes for the rest), with no newline, no comment
// delimiter and no trigraph, so that no name can end the comment or add
// a line of code.
func CComment(s string) string { return commentEscaper.Replace(strconv.QuoteToASCII(s)) }

// TempAlignment is the alignment of each kernel temporary in the device
// workspace of a launch plan (and of the workspace after the arena).
const TempAlignment = alloc.WorkspaceAlignment

// TempOffsets lays out k's temporaries one after another from 0, each at
// a multiple of TempAlignment, and returns their offsets and the bytes
// they span.
func (k *Kernel) TempOffsets() ([]int64, int64) {
	offs := make([]int64, len(k.Temps))
	off := int64(0)
	for i, t := range k.Temps {
		offs[i] = off
		off = (off + t.Type.SizeBytes() + TempAlignment - 1) / TempAlignment * TempAlignment
	}
	return offs, off
}

// WorkspaceBytes is the device workspace a launch plan puts after the
// arena: the most that one kernel's temporaries span (kernels run one at
// a time).
func (p *Program) WorkspaceBytes() int64 {
	ws := int64(0)
	for _, k := range p.Kernels {
		_, n := k.TempOffsets()
		ws = max(ws, n)
	}
	return ws
}

func lowerOp(op *ir.Op, in []Tensor, outs []*Buffer, opts Options, name string) (*Kernel, error) {
	k := &Kernel{Name: name, Op: op}
	b := &builder{steps: &k.Steps, opts: opts}
	var err error
	if op.Region != nil {
		err = lowerRegion(b, op.Region, in, outs)
	} else {
		err = lowerOne(b, op, in, outs)
	}
	k.Temps = b.temps
	return k, err
}

func lowerOne(b *builder, op *ir.Op, in []Tensor, outs []*Buffer) error {
	if r := elementRules[op.Kind]; r != nil {
		acc, err := r(op, in, resultTypes(op))
		if err != nil {
			return err
		}
		for i, out := range outs {
			b.store(out, acc[i])
		}
		return nil
	}
	if r := stageRules[op.Kind]; r != nil {
		return r(b, op, in, outs)
	}
	return errUnsupported(op)
}

func resultTypes(op *ir.Op) []ir.Type {
	t := make([]ir.Type, len(op.Results))
	for i, r := range op.Results {
		t[i] = r.Type
	}
	return t
}

// lowerRegion lowers a fused kernel's body: ops with element rules are
// computed where they are read (memoised per index when read more than
// once), the others write workspace or the kernel's outputs.
func lowerRegion(b *builder, r *ir.Region, in []Tensor, outs []*Buffer) error {
	env := map[*ir.Value]Tensor{}
	for i, a := range r.Args {
		env[a] = in[i]
	}
	yieldAt := map[*ir.Value]int{}
	for i, y := range r.Yield {
		if _, ok := yieldAt[y]; !ok {
			yieldAt[y] = i
		}
	}
	uses := map[*ir.Value]int{}
	for _, op := range r.Body {
		for _, x := range op.Operands {
			uses[x]++
		}
	}
	into := writeThrough(r, yieldAt)
	written := map[int]bool{}
	for _, op := range r.Body {
		opIn := make([]Tensor, len(op.Operands))
		for i, x := range op.Operands {
			opIn[i] = env[x]
		}
		if rule := elementRules[op.Kind]; rule != nil {
			acc, err := rule(op, opIn, resultTypes(op))
			if err != nil {
				return fmt.Errorf("%s: %v", describe(op), err)
			}
			for i, v := range op.Results {
				if j, ok := yieldAt[v]; ok {
					b.store(outs[j], acc[i])
					written[j] = true
					env[v] = FromBuffer(outs[j])
					continue
				}
				a := acc[i]
				if narrow(v.Type.DType) {
					x, d := a, v.Type.DType
					a = func(idx []Expr) Expr { return &Round{To: d, X: x(idx)} }
				} else if v.Type.DType.IsFloat() && v.Type.DType != ir.F32 && v.Type.DType != ir.F64 {
					return fmt.Errorf("%s: a fused kernel cannot keep %s %s at its precision", describe(op), v.Type.DType, v.Ref())
				}
				if uses[v] > 1 {
					a = memo(a)
				}
				env[v] = Tensor{Type: v.Type, At: a}
			}
			continue
		}
		if stageRules[op.Kind] == nil {
			return fmt.Errorf("%s: %v", describe(op), errUnsupported(op))
		}
		bufs := make([]*Buffer, len(op.Results))
		for i, v := range op.Results {
			if j, ok := yieldAt[v]; ok {
				bufs[i] = outs[j]
				written[j] = true
			} else if j, ok := into[v]; ok {
				bufs[i] = outs[j] // the chain after it rewrites each element in place
			} else {
				bufs[i] = b.temp("t", v.Type)
			}
		}
		if err := stageRules[op.Kind](b, op, opIn, bufs); err != nil {
			return fmt.Errorf("%s: %v", describe(op), err)
		}
		for i, v := range op.Results {
			env[v] = FromBuffer(bufs[i])
		}
	}
	for j, y := range r.Yield {
		if !written[j] {
			b.store(outs[j], env[y].At)
		}
	}
	return nil
}

// narrow reports whether d is a float dtype that computes in F32 and
// stores fewer bits (Round rounds to it).
func narrow(d ir.DType) bool {
	return d == ir.F16 || d == ir.BF16 || d == ir.F8E4M3 || d == ir.F8E5M2
}

// writeThrough finds the results of a region's stage ops (a matmul, a
// convolution, a normalisation) read only by a chain of elementwise ops
// (or normalisations that overwrite their input, see overwritesInPlace),
// one user each, that ends in a yielded value of the same type: such a
// result, and the normalisations' results along the chain, are written
// into that output buffer instead of workspace, each step rewriting every
// element in place (it reads an element only where it writes it).
// Without this a fused producer and its epilogue kept full-size
// temporaries outside the plan. It maps each such result to its output's
// index.
func writeThrough(r *ir.Region, yieldAt map[*ir.Value]int) map[*ir.Value]int {
	users := map[*ir.Value][]*ir.Op{}
	for _, op := range r.Body {
		for _, x := range op.Operands {
			users[x] = append(users[x], op)
		}
	}
	for _, y := range r.Yield {
		users[y] = append(users[y], nil) // read after the kernel
	}
	out := map[*ir.Value]int{}
	claimed := map[int]bool{}
	for _, op := range r.Body {
		if elementRules[op.Kind] != nil {
			continue
		}
		for _, v := range op.Results {
			if _, ok := yieldAt[v]; ok {
				continue
			}
			if _, ok := out[v]; ok {
				continue
			}
			// Follow the chain of single users that keep v's place.
			members := []*ir.Value{v}
			for cur := v; len(users[cur]) == 1; {
				u := users[cur][0]
				if u == nil || !samePlace(u, cur) {
					break
				}
				cur = u.Results[0]
				if elementRules[u.Kind] == nil {
					members = append(members, cur)
				}
				if j, ok := yieldAt[cur]; ok {
					if !claimed[j] && cur.Type.Equal(v.Type) {
						claimed[j] = true
						for _, m := range members {
							out[m] = j
						}
					}
					break
				}
			}
		}
	}
	return out
}

// overwritesInPlace are the stage ops whose lowering reads all of operand
// 0 (for statistics) before it writes result 0, and then writes each
// element of result 0 from the same element of operand 0: result 0 may
// share operand 0's buffer.
var overwritesInPlace = map[string]bool{"batch_norm_train": true, "layer_norm": true, "softmax": true, "log_softmax": true}

// samePlace reports whether op reads x only at the index where it writes
// its result 0, which has x's type: an elementwise or broadcasting op with
// one result, or an op of overwritesInPlace reading x as operand 0 only.
func samePlace(op *ir.Op, x *ir.Value) bool {
	d := op.Def()
	if d == nil || !op.Results[0].Type.Equal(x.Type) {
		return false
	}
	if overwritesInPlace[op.Kind] {
		for _, o := range op.Operands[1:] {
			if o == x {
				return false
			}
		}
		return op.Operands[0] == x
	}
	return elementRules[op.Kind] != nil && len(op.Results) == 1 && (d.Fusion == ir.Elementwise || d.Fusion == ir.Broadcast)
}

// memo returns the same expression for the same index, so that a value
// read several times in one expression is computed once.
func memo(a accessor) accessor {
	seen := map[string]Expr{}
	return func(idx []Expr) Expr {
		var key strings.Builder
		for _, x := range idx {
			switch x := x.(type) {
			case *Var:
				fmt.Fprintf(&key, "v%d,", x.ID)
			case Int:
				fmt.Fprintf(&key, "%d,", x.V)
			default:
				fmt.Fprintf(&key, "%p,", x)
			}
		}
		if e, ok := seen[key.String()]; ok {
			return e
		}
		e := a(idx)
		seen[key.String()] = e
		return e
	}
}

// Workspace is the workspace f's kernels need (Program.WorkspaceBytes),
// lowered with the default assignment when f has none: what a pass that
// bounds device memory counts beside the arena (passes.Context.Workspace).
func Workspace(f *ir.Func) (int64, error) {
	g := f.Clone()
	if _, ok := g.Attrs["arena"]; !ok {
		if _, err := assign.Assign(g, "best", alloc.DefaultAlignment, 0); err != nil {
			return 0, err
		}
	}
	p, err := Lower(g)
	if err != nil {
		return 0, fmt.Errorf("@%s: %v", f.Name, err)
	}
	return p.WorkspaceBytes(), nil
}
