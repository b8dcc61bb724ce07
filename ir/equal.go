package ir

import "fmt"

// Diff compares two modules structurally (names, types, attributes,
// locations, offsets, op order and operand wiring) and describes the first
// difference, or returns "" when they are equal. Source positions are not
// compared.
func Diff(a, b *Module) string {
	if len(a.Funcs) != len(b.Funcs) {
		return fmt.Sprintf("%d functions vs %d", len(a.Funcs), len(b.Funcs))
	}
	for i := range a.Funcs {
		if d := diffFunc(a.Funcs[i], b.Funcs[i]); d != "" {
			return "@" + a.Funcs[i].Name + ": " + d
		}
	}
	return ""
}

func diffFunc(f, g *Func) string {
	if f.Name != g.Name {
		return fmt.Sprintf("name %q vs %q", f.Name, g.Name)
	}
	if !f.Attrs.Equal(g.Attrs) {
		return "function attributes differ"
	}
	if len(f.Args) != len(g.Args) {
		return "argument counts differ"
	}
	pair := map[*Value]*Value{}
	for i, a := range f.Args {
		b := g.Args[i]
		if d := diffValue(a, b); d != "" {
			return d
		}
		if a.Arg.Kind != b.Arg.Kind || a.Arg.InOut != b.Arg.InOut || !a.Arg.Init.Equal(b.Arg.Init) || !a.Arg.Attrs.Equal(b.Arg.Attrs) {
			return "argument " + a.Ref() + " info differs"
		}
		pair[a] = b
	}
	if d := diffBody(f.Body, g.Body, pair); d != "" {
		return d
	}
	if len(f.Results) != len(g.Results) {
		return "result counts differ"
	}
	for i, r := range f.Results {
		if r.Name != g.Results[i].Name || pair[r.Value] != g.Results[i].Value {
			return fmt.Sprintf("result %d differs", i)
		}
	}
	return ""
}

func diffValue(a, b *Value) string {
	if a.Name != b.Name || !a.Type.Equal(b.Type) || a.Offset != b.Offset || a.Index != b.Index {
		return fmt.Sprintf("value %s: %s at %d vs %s: %s at %d", a.Ref(), a.Type, a.Offset, b.Ref(), b.Type, b.Offset)
	}
	return ""
}

func diffBody(x, y []*Op, pair map[*Value]*Value) string {
	if len(x) != len(y) {
		return fmt.Sprintf("%d ops vs %d", len(x), len(y))
	}
	for i, o := range x {
		p := y[i]
		if o.Kind != p.Kind || !o.Attrs.Equal(p.Attrs) || !o.Loc.Equal(p.Loc) || len(o.Operands) != len(p.Operands) || len(o.Results) != len(p.Results) {
			return fmt.Sprintf("op %d (%s vs %s) differs", i, o.Kind, p.Kind)
		}
		for j, v := range o.Operands {
			if pair[v] != p.Operands[j] {
				return fmt.Sprintf("op %d (%s) operand %d differs", i, o.Kind, j)
			}
		}
		if (o.Region == nil) != (p.Region == nil) {
			return fmt.Sprintf("op %d (%s): region presence differs", i, o.Kind)
		}
		if o.Region != nil {
			inner := map[*Value]*Value{}
			if len(o.Region.Args) != len(p.Region.Args) {
				return fmt.Sprintf("op %d: region argument counts differ", i)
			}
			for j, a := range o.Region.Args {
				if d := diffValue(a, p.Region.Args[j]); d != "" {
					return d
				}
				inner[a] = p.Region.Args[j]
			}
			if d := diffBody(o.Region.Body, p.Region.Body, inner); d != "" {
				return "region: " + d
			}
			if len(o.Region.Yield) != len(p.Region.Yield) {
				return "region yields differ"
			}
			for j, v := range o.Region.Yield {
				if inner[v] != p.Region.Yield[j] {
					return "region yields differ"
				}
			}
		}
		for j, r := range o.Results {
			if d := diffValue(r, p.Results[j]); d != "" {
				return d
			}
			pair[r] = p.Results[j]
		}
	}
	return ""
}
