package ir

import (
	"fmt"
	"strconv"
)

// UniqueName returns base, or base.N for the smallest N that makes it
// unused in f, and reserves it.
func (f *Func) UniqueName(base string) string {
	if f.names == nil {
		f.names = map[string]bool{}
		f.Walk(func(op *Op) {
			for _, r := range op.Results {
				f.names[r.Name] = true
			}
			if op.Region != nil {
				for _, a := range op.Region.Args {
					f.names[a.Name] = true
				}
			}
		})
		for _, a := range f.Args {
			f.names[a.Name] = true
		}
	}
	if f.suffix == nil {
		f.suffix = map[string]int{}
	}
	name := base
	// Suffixes continue where the last call for base stopped, so that
	// passes that try and undo many rewrites stay linear.
	for i := f.suffix[base] + 1; f.names[name] || name == ""; i++ {
		name = base + "." + strconv.Itoa(i)
		f.suffix[base] = i
	}
	f.names[name] = true
	return name
}

// NewOp builds (but does not insert) an op of the given kind, inferring
// its result types; result names are derived from base and made unique.
func (f *Func) NewOp(kind string, operands []*Value, attrs Attrs, loc Location, base string) (*Op, error) {
	d := Lookup(kind)
	if d == nil {
		return nil, fmt.Errorf("unknown op %q", kind)
	}
	in := make([]Type, len(operands))
	for i, v := range operands {
		in[i] = v.Type
	}
	types, err := d.InferTypes(in, attrs)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", kind, err)
	}
	op := &Op{Kind: kind, Operands: operands, Attrs: attrs, Loc: loc}
	if base == "" {
		base = kind
	}
	for i, t := range types {
		op.Results = append(op.Results, &Value{Name: f.UniqueName(base), Type: t, Def: op, Index: i, Offset: NoOffset})
	}
	return op, nil
}

// Walk calls fn for every op of f, including ops inside regions (a
// kernel op before its body).
func (f *Func) Walk(fn func(*Op)) { walkOps(f.Body, fn) }

func walkOps(body []*Op, fn func(*Op)) {
	for _, op := range body {
		fn(op)
		if op.Region != nil {
			walkOps(op.Region.Body, fn)
		}
	}
}

// Users maps each value of f's top-level block to the ops using it, in
// schedule order (an op using a value twice appears once).
func (f *Func) Users() map[*Value][]*Op {
	users := map[*Value][]*Op{}
	for _, op := range f.Body {
		for i, v := range op.Operands {
			dup := false
			for _, w := range op.Operands[:i] {
				dup = dup || w == v
			}
			if !dup {
				users[v] = append(users[v], op)
			}
		}
	}
	return users
}

// ReplaceUses makes every use of old in f's top-level block and results
// use new instead.
func (f *Func) ReplaceUses(old, new *Value) {
	for _, op := range f.Body {
		for i, v := range op.Operands {
			if v == old {
				op.Operands[i] = new
			}
		}
	}
	for i := range f.Results {
		if f.Results[i].Value == old {
			f.Results[i].Value = new
		}
	}
}

// IsResult reports whether v is returned by f.
func (f *Func) IsResult(v *Value) bool {
	for _, r := range f.Results {
		if r.Value == v {
			return true
		}
	}
	return false
}

// AddState appends a state argument named base (made unique) holding init
// at the start of the step; inout marks it as updated in place.
func (f *Func) AddState(base string, init *Dense, inout bool) *Value {
	v := &Value{Name: f.UniqueName(base), Type: init.Type, Index: len(f.Args), Arg: &ArgInfo{Kind: ArgState, Init: init, InOut: inout}, Offset: NoOffset}
	f.Args = append(f.Args, v)
	return v
}
