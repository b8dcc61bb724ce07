package ir

// Clone returns a deep copy of f: new values, ops, regions and attribute
// maps, with the same names, types, locations and schedule. Initial
// values of arguments (Dense data) are shared: they are never modified
// in place.
func (f *Func) Clone() *Func {
	m := make(map[*Value]*Value, len(f.Args)+len(f.Body))
	g := &Func{Name: f.Name, Attrs: f.Attrs.Clone(), Pos: f.Pos}
	for _, a := range f.Args {
		na := copyValue(a, nil)
		info := *a.Arg
		info.Attrs = a.Arg.Attrs.Clone()
		na.Arg = &info
		m[a] = na
		g.Args = append(g.Args, na)
	}
	g.Body = cloneOps(f.Body, m, keepName)
	for _, r := range f.Results {
		g.Results = append(g.Results, Result{Name: r.Name, Value: m[r.Value], Attrs: r.Attrs.Clone()})
	}
	return g
}

// CloneRenamed copies r deeply, naming each value of the copy
// rename(its original name).
func (r *Region) CloneRenamed(rename func(string) string) *Region {
	m := map[*Value]*Value{}
	out := &Region{}
	for _, a := range r.Args {
		na := copyValue(a, nil)
		na.Name = rename(a.Name)
		m[a] = na
		out.Args = append(out.Args, na)
	}
	out.Body = cloneOps(r.Body, m, rename)
	for _, y := range r.Yield {
		out.Yield = append(out.Yield, m[y])
	}
	return out
}

func keepName(name string) string { return name }

// cloneOps copies ops, reading operands through m (values defined
// outside the list and not in m stay shared) and adding their results
// to m.
func cloneOps(ops []*Op, m map[*Value]*Value, rename func(string) string) []*Op {
	out := make([]*Op, 0, len(ops))
	for _, op := range ops {
		c := &Op{Kind: op.Kind, Operands: make([]*Value, len(op.Operands)), Attrs: op.Attrs.Clone(), Loc: op.Loc, Pos: op.Pos}
		for i, u := range op.Operands {
			if n, ok := m[u]; ok {
				c.Operands[i] = n
			} else {
				c.Operands[i] = u
			}
		}
		for _, r := range op.Results {
			nr := copyValue(r, c)
			nr.Name = rename(r.Name)
			m[r] = nr
			c.Results = append(c.Results, nr)
		}
		if op.Region != nil {
			c.Region = op.Region.CloneRenamed(rename)
		}
		out = append(out, c)
	}
	return out
}

func copyValue(v *Value, def *Op) *Value {
	t := v.Type
	t.Shape = t.Shape.Clone()
	return &Value{Name: v.Name, Type: t, Def: def, Index: v.Index, Offset: v.Offset}
}
