package swap

import (
	"cmp"
	"slices"

	"github.com/kiln-compiler/kiln/ir"
)

// Offloading parameters and optimizer state (ZeRO-Offload): the caller
// holds a parameter in host memory (ir.HostArg); the device reads it
// through a swap_in before the forward's first reader and another before
// the backward's, each freed after its group's last reader. When an
// optimizer update writes the parameter, its state moves to the host too,
// the gradient is copied out once made, and the update runs on the host
// (ir.OnHost), so neither the state nor the finished gradient takes
// device memory.

// paramOffload is a parameter that can move to the host, with the update
// that writes it (nil when the step has none).
type paramOffload struct {
	p      *ir.Value
	update *ir.Op
	bytes  int64 // device bytes it frees for the whole step: p and the state
	// each gives every reader a copy of its own, fetched just before it
	// (more copies and stalls, less memory), instead of grouping readers
	// and hiding the copies behind compute (offloadParam).
	each bool
}

// offloadableParams lists the parameters still on the device whose
// offload the step allows: read by ops of the top-level block, written
// by at most one update, whose state arguments nothing else reads.
func offloadableParams(f *ir.Func) []paramOffload {
	readers := map[*ir.Value]int{}
	for _, op := range f.Body {
		for _, x := range op.Operands {
			readers[x]++
		}
	}
	var out []paramOffload
	for _, a := range f.Args {
		if a.Arg.Kind != ir.ArgParam || ir.HostArg(a) || readers[a] == 0 {
			continue
		}
		po := paramOffload{p: a, bytes: a.Type.SizeBytes()}
		ok := true
		for _, op := range f.Body {
			d := op.Def()
			if d == nil || len(d.Writes) == 0 || !slices.Contains(op.Operands, a) {
				continue
			}
			if po.update != nil || op.Operands[d.Writes[0]] != a || ir.OnHost(op) {
				ok = false
				break
			}
			po.update = op
			for _, k := range d.Writes[1:] {
				s := op.Operands[k]
				if s.Arg == nil || s.Arg.Kind != ir.ArgState || readers[s] != 1 {
					ok = false
				}
				po.bytes += s.Type.SizeBytes()
			}
		}
		if ok {
			out = append(out, po)
		}
	}
	return out
}

// offloadableInputs lists the data inputs still on the device that the
// caller could hand in host memory instead: read by the step, never
// written or returned, largest first. Each moves as a parameter does,
// without an update.
func offloadableInputs(f *ir.Func) []paramOffload {
	readers := map[*ir.Value]int{}
	written := map[*ir.Value]bool{}
	for _, op := range f.Body {
		for _, x := range op.Operands {
			readers[x]++
		}
		if d := op.Def(); d != nil {
			for _, k := range d.Writes {
				written[op.Operands[k]] = true
			}
		}
	}
	var out []paramOffload
	for _, a := range f.Args {
		if a.Arg.Kind == ir.ArgData && !a.Arg.InOut && !ir.HostArg(a) && readers[a] > 0 && !written[a] && !f.IsResult(a) {
			out = append(out, paramOffload{p: a, bytes: a.Type.SizeBytes()})
		}
	}
	// The largest first: a small input (labels) moving frees little.
	slices.SortStableFunc(out, func(a, b paramOffload) int { return cmp.Compare(b.bytes, a.bytes) })
	return out
}

// hostArg marks argument a as held in host memory, for undo.
func (s *swapper) hostArg(a *ir.Value) {
	if a.Arg.Attrs == nil {
		a.Arg.Attrs = ir.Attrs{}
	}
	a.Arg.Attrs["host"] = ir.BoolAttr(true)
	s.hosted = append(s.hosted, a)
}

// offloadParam moves po to the host: the parameter's readers other than
// its update read it from swap_ins, each placed so that compute before it
// hides the copy, one for each group of readers (split at the peak at
// position peak, and where compute between readers would hide a second
// copy); the update
// reads the state in place and the gradient from the host, after the
// gradient's swap_out.
func (s *swapper) offloadParam(po paramOffload, peak int) bool {
	f, p := s.f, po.p
	// Readers share a copy unless the peak or more compute than twice
	// the copy's time lies between them: then a second copy, fetched
	// while that compute runs, frees the memory in between.
	var groups [][]*ir.Op
	secs := s.dev.CopySeconds(p.Type.SizeBytes())
	last, gap := -1, 0.0
	for i, op := range f.Body {
		if op == po.update || !slices.Contains(op.Operands, p) {
			if last >= 0 {
				gap += s.dev.OpSeconds(op)
			}
			continue
		}
		if last < 0 || po.each || last <= peak && i > peak || gap > 2*secs {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], op)
		last, gap = i, 0
	}
	type insert struct {
		before *ir.Op
		op     *ir.Op
	}
	var inserts []insert
	for _, grp := range groups {
		if len(grp) == 0 {
			continue
		}
		si, err := f.NewOp("swap_in", []*ir.Value{p}, ir.Attrs{"stream": ir.IntAttr(1)}, grp[0].Loc, p.Name+".back")
		if err != nil {
			return false
		}
		for _, op := range grp {
			for j, x := range op.Operands {
				if x == p {
					s.replaced = append(s.replaced, replacement{op, j, x})
					op.Operands[j] = si.Results[0]
				}
			}
		}
		inserts = append(inserts, insert{grp[0], si})
	}
	s.hostArg(p)
	if u := po.update; u != nil {
		for _, k := range u.Def().Writes[1:] {
			s.hostArg(u.Operands[k])
		}
		// The device operands (the gradient, the condition) go out once
		// made; the update follows the last of them.
		body := slices.DeleteFunc(slices.Clone(f.Body), func(op *ir.Op) bool { return op == u })
		at := 0
		for j, x := range u.Operands {
			if ir.InHost(x) {
				continue
			}
			if x.Arg != nil && !ir.Overwrites(u, x) {
				// An argument the step only reads here (the learning rate,
				// the step count): one host copy at the top serves every
				// host-run update.
				c := s.argCopies[x]
				if c == nil || !slices.Contains(body, c.Def) { // none yet, or undone with the attempt that made it
					so, err := f.NewOp("swap_out", []*ir.Value{x}, ir.Attrs{"stream": ir.IntAttr(1)}, ir.Location{}, x.Name+".host")
					if err != nil {
						return false
					}
					body = slices.Insert(body, 0, so)
					at++
					if s.argCopies == nil {
						s.argCopies = map[*ir.Value]*ir.Value{}
					}
					c = so.Results[0]
					s.argCopies[x] = c
				}
				s.replaced = append(s.replaced, replacement{u, j, x})
				u.Operands[j] = c
				continue
			}
			so, err := f.NewOp("swap_out", []*ir.Value{x}, ir.Attrs{"stream": ir.IntAttr(1)}, u.Loc, x.Name+".host")
			if err != nil {
				return false
			}
			s.replaced = append(s.replaced, replacement{u, j, x})
			u.Operands[j] = so.Results[0]
			pos := 0
			if x.Def != nil {
				pos = slices.Index(body, x.Def) + 1
			}
			for i, op := range body { // after every other reader, before its writer
				if slices.Contains(op.Operands, x) && !ir.Overwrites(op, x) {
					pos = max(pos, i+1)
				}
			}
			body = slices.Insert(body, pos, so)
			at = max(at, pos+1)
		}
		for _, grp := range groups { // and after every other reader of p
			for _, op := range grp {
				at = max(at, slices.Index(body, op)+1)
			}
		}
		f.Body = slices.Insert(body, at, u)
	}
	for _, in := range inserts {
		i := slices.Index(f.Body, in.before)
		// Early enough that the compute before the reader hides the copy,
		// but not before the previous swap_in of p is read.
		secs, j := s.dev.CopySeconds(p.Type.SizeBytes()), i
		readsP := func(x *ir.Value) bool { return x.Def != nil && ir.CopiesFromHost(x.Def) && x.Def.Operands[0] == p }
		for acc := 0.0; !po.each && j > 0 && acc < secs && !slices.ContainsFunc(f.Body[j-1].Operands, readsP); {
			j--
			acc += s.dev.OpSeconds(f.Body[j])
		}
		f.Body = slices.Insert(f.Body, j, in.op)
	}
	return true
}

// respread gives every reader of host argument p's copies a copy of its
// own, fetched just before it, and drops the copies it had: the last
// resort when copies shared between readers hold the peak up.
func (s *swapper) respread(p *ir.Value) bool {
	f := s.f
	isCopy := func(x *ir.Value) bool { return x.Def != nil && ir.CopiesFromHost(x.Def) && x.Def.Operands[0] == p }
	var body []*ir.Op
	changed := false
	for _, op := range f.Body {
		if ir.CopiesFromHost(op) && op.Operands[0] == p {
			changed = true
			continue
		}
		for j, x := range op.Operands {
			if !isCopy(x) {
				continue
			}
			si, err := f.NewOp("swap_in", []*ir.Value{p}, ir.Attrs{"stream": ir.IntAttr(1)}, op.Loc, p.Name+".back")
			if err != nil {
				return false
			}
			s.replaced = append(s.replaced, replacement{op, j, x})
			op.Operands[j] = si.Results[0]
			body = append(body, si)
		}
		body = append(body, op)
	}
	if changed {
		f.Body = body
	}
	return changed
}
