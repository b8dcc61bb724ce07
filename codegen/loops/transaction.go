package loops

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// A run that fails an index check (a label or gather index outside its
// dimension, OpDef.Indices) must change no argument: a training step
// updates its parameters and state in place, and a step that raised must
// leave them as they were. transactional arranges that for a program
// whose kernels run in order:
//
//   - every kernel that writes an argument tests the run's status first
//     (Kernel.TestStatus); a failed check so far ends the run there;
//   - an index check at or after the first such write that an earlier
//     check proves (the same value against a bound no larger, as strict
//     about negative indices) cannot fail; one whose indices are an
//     argument (labels, token ids), or computed before the first write,
//     is made before that write as well, by a check kernel over the index
//     tensor (at the start of the run, or right after the kernel that
//     computes it);
//   - the checks left (indices a fused kernel computes, or that a kernel
//     computes only after the first write: a label with ignore_index
//     replaced by 0, recomputed for the gradient) may fail after some
//     arguments are written. Each argument written before the last of
//     them is copied once, before its first write, to a backup past the
//     planned arena, and when the run fails the backups taken so far are
//     copied back (Program.Restore, Kernel.Backups).
//
// The cost: one pass over each hoisted index tensor (a byte of workspace
// per index), a load and branch per writing kernel, and for the backups
// their bytes in the arena and two copies per failed run, one per run.
// In the usual training step the backups are a batch norm's running
// statistics, written in the forward before the loss reads its labels.
func (p *Program) transactional(store map[*ir.Value]*Buffer) error {
	first := -1
	for i, k := range p.Kernels {
		if writesArgument(k.Steps) {
			first = i
			break
		}
	}
	if first < 0 {
		return nil
	}
	producer := map[*ir.Op]int{}
	for i, k := range p.Kernels {
		producer[k.Op] = i
	}
	// A check proves a later one only when it reads every index: an op of
	// its own does; a fused kernel computes its ops only where something
	// reads them (a gather whose result is sliced reads the indices the
	// slice keeps), so its checks may cover a part.
	whole := func(k *Kernel) bool { return k.Op != nil && k.Op.Region == nil }
	var checked []indexUse // whole checks that run before the first write
	checks := false
	for _, k := range p.Kernels[:first] {
		uses := indexUses(k.Op)
		checks = checks || len(uses) > 0
		if whole(k) {
			checked = append(checked, uses...)
		}
	}
	hoisted := map[int][]indexUse{} // after kernel i (-1: at the start)
	last := -1                      // the last kernel whose check may fail after a write
	var seen []indexUse             // every whole check so far, failing or not
	for i, k := range p.Kernels[first:] {
		for _, u := range indexUses(k.Op) {
			checks = true
			switch {
			case u.value != nil && impliedBy(u, checked):
			case u.value != nil && hoistable(u.value, producer, first):
				at := -1
				if r := root(u.value); r.Def != nil {
					at = producer[r.Def]
				}
				hoisted[at] = append(hoisted[at], u)
				checked = append(checked, u) // the check kernel reads every index
			case u.value != nil && impliedBy(u, seen):
				// The same indices failed or passed a whole check earlier:
				// this one adds no failure.
			default:
				last = first + i
			}
			if whole(k) {
				seen = append(seen, u)
			}
		}
	}
	if !checks {
		return nil
	}
	var kernels []*Kernel
	for _, u := range hoisted[-1] {
		kernels = append(kernels, checkKernel(fmt.Sprintf("k%d_check_%s", len(kernels), cName(u.op.Kind)), store[u.value], u.index))
	}
	saved := map[*Buffer]bool{}
	for i, k := range p.Kernels {
		k.TestStatus = i >= first && writesArgument(k.Steps)
		if i <= last {
			for _, w := range writtenArguments(k.Steps) {
				buf := store[p.Params[w.Slot]] // the whole argument, whatever view is written
				if saved[buf] {
					continue
				}
				saved[buf] = true
				backup := &Buffer{Name: "backup." + buf.Name, Type: buf.Type, Storage: Arena, Offset: alignArena(p.ArenaBytes)}
				p.ArenaBytes = backup.Offset + buf.Type.SizeBytes()
				p.BackupBytes += buf.Type.SizeBytes()
				save := &Kernel{Name: fmt.Sprintf("k%d_backup", len(kernels))}
				sb := &builder{steps: &save.Steps}
				sb.store(backup, FromBuffer(buf).At)
				kernels = append(kernels, save)
				restore := &Kernel{Name: fmt.Sprintf("restore%d", len(p.Restore))}
				rb := &builder{steps: &restore.Steps}
				rb.store(buf, FromBuffer(backup).At)
				p.Restore = append(p.Restore, restore)
			}
		}
		k.Backups = len(p.Restore)
		kernels = append(kernels, k)
		for _, u := range hoisted[i] {
			kernels = append(kernels, checkKernel(fmt.Sprintf("k%d_check_%s", len(kernels), cName(u.op.Kind)), store[u.value], u.index))
		}
	}
	p.Kernels = kernels
	return nil
}

// alignArena rounds n up to the alignment of arena buffers.
func alignArena(n int64) int64 { return (n + TempAlignment - 1) / TempAlignment * TempAlignment }

// indexUse is an index operand of op and the value of the function it
// reads (nil when a fused kernel's region computes it).
type indexUse struct {
	op    *ir.Op
	value *ir.Value
	index ir.IndexOperand
}

// indexUses lists the index operands of a kernel's op: its own, or those
// of the ops of its region (mapped to the kernel's operands where they
// are region arguments).
func indexUses(op *ir.Op) []indexUse {
	if op == nil {
		return nil
	}
	if op.Region == nil {
		var out []indexUse
		for _, x := range ir.IndexOperands(op) {
			out = append(out, indexUse{op: op, value: op.Operands[x.Operand], index: x})
		}
		return out
	}
	outer := map[*ir.Value]*ir.Value{}
	for i, a := range op.Region.Args {
		if i < len(op.Operands) {
			outer[a] = op.Operands[i]
		}
	}
	var out []indexUse
	for _, inner := range op.Region.Body {
		for _, x := range ir.IndexOperands(inner) {
			out = append(out, indexUse{op: inner, value: outer[inner.Operands[x.Operand]], index: x})
		}
	}
	return out
}

// root is the value whose memory v views (v itself when no view made it).
func root(v *ir.Value) *ir.Value {
	for v.Def != nil && v.Def.Def() != nil && v.Def.Def().View && len(v.Def.Operands) > 0 {
		v = v.Def.Operands[0]
	}
	return v
}

// hoistable reports whether the indices v exist before the kernel first
// writes an argument: an argument, or made by a kernel before it.
func hoistable(v *ir.Value, producer map[*ir.Op]int, first int) bool {
	r := root(v)
	if r.Def == nil {
		return true
	}
	d, ok := producer[r.Def]
	return ok && d < first
}

// impliedBy reports whether a check in checks passing proves that u's
// passes: the same value, a bound no larger, and negative indices refused
// there unless u accepts them too.
func impliedBy(u indexUse, checks []indexUse) bool {
	for _, c := range checks {
		if c.value != nil && c.value == u.value && c.index.Bound <= u.index.Bound && (!c.index.Negative || u.index.Negative) {
			return true
		}
	}
	return false
}

// writtenArguments lists the parameter and state buffers steps store
// into, each once, in the order of their first store.
func writtenArguments(steps []Step) []*Buffer {
	var out []*Buffer
	seen := map[*Buffer]bool{}
	var walk func([]Step)
	walk = func(steps []Step) {
		for _, s := range steps {
			var b *Buffer
			switch s := s.(type) {
			case *Stage:
				b = s.Out
			case *Loop:
				walk(s.Body)
			case *Collective:
				b = s.Out
			}
			if b != nil && b.Storage == Param && !seen[b] {
				seen[b] = true
				out = append(out, b)
			}
		}
	}
	walk(steps)
	return out
}

// writesArgument reports whether steps store into a parameter or state
// argument.
func writesArgument(steps []Step) bool { return len(writtenArguments(steps)) > 0 }

// checkKernel checks every element of the index tensor buf against x,
// recording a failure in the run's status; it stores a flag per element
// in its workspace and nothing else.
func checkKernel(name string, buf *Buffer, x ir.IndexOperand) *Kernel {
	k := &Kernel{Name: name}
	b := &builder{steps: &k.Steps}
	flags := b.temp("ok", ir.Type{DType: ir.Bool, Shape: buf.Type.Shape.Clone()})
	index := FromBuffer(buf)
	b.store(flags, func(idx []Expr) Expr {
		j := conv(index.At(idx), I64)
		if x.Negative {
			j = sel(cmp(scalar.Lt, j, Int{0}), add(j, Int{x.Bound}), j)
		}
		return &Checked{Cond: inRange(j, x.Bound), X: BoolConst{true}}
	})
	k.Temps = b.temps
	return k
}
