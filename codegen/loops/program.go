package loops

import (
	"fmt"
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
}

// Lower turns f, whose values carry arena offsets (the assign pass), into
// a program. Errors name the op that cannot be compiled.
func Lower(f *ir.Func) (*Program, error) {
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
		k, err := lowerOp(op, in, outs, fmt.Sprintf("k%d_%s", len(p.Kernels), cName(op.Kind)))
		if err != nil {
			return nil, fmt.Errorf("%s: %v", describe(op), err)
		}
		p.Kernels = append(p.Kernels, k)
	}
	for _, r := range f.Results {
		p.Results = append(p.Results, store[r.Value])
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

func lowerOp(op *ir.Op, in []Tensor, outs []*Buffer, name string) (*Kernel, error) {
	k := &Kernel{Name: name, Op: op}
	b := &builder{steps: &k.Steps}
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
