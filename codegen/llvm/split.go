package llvm

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	llir "github.com/llir/llvm/ir"
	"github.com/llir/llvm/ir/constant"
	"github.com/llir/llvm/ir/enum"
)

// partBytes is the least LLVM IR text worth a module of its own: below
// it, starting another clang costs more than it saves.
const partBytes = 128 << 10

// splitModule prints m as up to opt.Parts modules (0: one per core, each
// of at least partBytes of text) that clang compiles separately
// (in parallel) and the linker joins into the program moduleText(m)
// prints. A unit is a function with noinline (a kernel, which the entry
// point calls) or the entry point, with the functions emitted after it
// up to the next one (its parallel bodies, the helpers it first used);
// parts are runs of units of about equal text. Across parts:
//   - a noinline, weak or external function is defined in its own part
//     and declared in the others (an internal one becomes hidden: not
//     exported from the library);
//   - any other internal function (an inlinable helper, a parallel body)
//     is copied into each part that uses it, so that clang inlines it as
//     before;
//   - a constant global is copied into each part that uses it; a mutable
//     one is defined in the first part that uses it (hidden) and declared
//     in the others.
//
// A module with metadata, attribute groups or quoted names, or of one
// part, prints whole (moduleText).
func splitModule(m *llir.Module, opt Options) []string {
	n := opt.Parts
	if n == 0 {
		n = runtime.NumCPU()
	}
	if n < 2 || len(m.AttrGroupDefs)+len(m.NamedMetadataDefs)+len(m.MetadataDefs)+len(m.UseListOrders)+len(m.UseListOrderBBs)+len(m.Aliases)+len(m.IFuncs)+len(m.ComdatDefs) > 0 {
		return []string{moduleText(m)}
	}
	if err := m.AssignGlobalIDs(); err != nil {
		panic(fmt.Errorf("llvm: global IDs: %v", err))
	}
	funcs := map[string]*llir.Func{}
	var defined []*llir.Func
	for _, f := range m.Funcs {
		if !plainName(f.Name()) {
			return []string{moduleText(m)}
		}
		funcs[f.Name()] = f
		if len(f.Blocks) > 0 {
			defined = append(defined, f)
		}
	}
	globals := map[string]*llir.Global{}
	for _, g := range m.Globals {
		switch g.Init.(type) {
		case nil, *constant.CharArray, *constant.ZeroInitializer, *constant.Int, *constant.Float:
		default:
			return []string{moduleText(m)} // it might refer to another global
		}
		if !plainName(g.Name()) {
			return []string{moduleText(m)}
		}
		globals[g.Name()] = g
	}
	texts := printFuncs(defined)

	// Units, then parts of about equal text.
	var units [][]int
	for i, f := range defined {
		if len(units) == 0 || separate(f) {
			units = append(units, nil)
		}
		units[len(units)-1] = append(units[len(units)-1], i)
	}
	total := 0
	for _, t := range texts {
		total += len(t)
	}
	if opt.Parts == 0 {
		n = min(n, total/partBytes)
	}
	n = min(n, len(units))
	if n < 2 {
		return []string{moduleText(m)}
	}
	part := make([]int, len(defined)) // part of each defined function
	p, acc, inPart := 0, 0, 0
	for u, fs := range units {
		// A new part once this one has its share of the text, or when
		// every unit left needs a part of its own.
		if inPart > 0 && (acc >= (p+1)*total/n || len(units)-u <= n-1-p) {
			p, inPart = p+1, 0
		}
		for _, i := range fs {
			part[i] = p
			acc += len(texts[i])
		}
		inPart++
	}
	n = p + 1
	index := map[*llir.Func]int{}
	for i, f := range defined {
		index[f] = i
	}
	refs := make([][]string, len(defined))
	for i, t := range texts {
		refs[i] = globalRefs(t)
	}

	// What each part holds: its own functions, copies of the inlinable
	// helpers it uses (with theirs), declarations of the rest.
	type content struct {
		funcs    []int // defined functions printed in full, in module order
		declared map[string]bool
		globals  map[string]bool
	}
	parts := make([]content, n)
	exported := map[*llir.Func]bool{} // used from another part and declared there
	for q := range parts {
		c := &parts[q]
		c.declared, c.globals = map[string]bool{}, map[string]bool{}
		in := make([]bool, len(defined))
		var work []int
		for i := range defined {
			if part[i] == q {
				in[i] = true
				work = append(work, i)
			}
		}
		for len(work) > 0 {
			i := work[0]
			work = work[1:]
			for _, name := range refs[i] {
				if g := globals[name]; g != nil {
					c.globals[name] = true
					continue
				}
				f := funcs[name]
				if f == nil || len(f.Blocks) == 0 {
					continue
				}
				j := index[f]
				if in[j] {
					continue
				}
				if copied(f) {
					in[j] = true
					work = append(work, j)
					continue
				}
				c.declared[name] = true
				exported[f] = true
			}
		}
		for i := range defined {
			if in[i] {
				c.funcs = append(c.funcs, i)
			}
		}
	}
	// A function used from another part leaves internal linkage for
	// hidden visibility, and prints again.
	for f := range exported {
		if f.Linkage == enum.LinkageInternal || f.Linkage == enum.LinkagePrivate {
			f.Linkage, f.Visibility = enum.LinkageNone, enum.VisibilityHidden
			texts[index[f]] = f.LLString()
		}
	}
	// A mutable global used by several parts: defined, hidden, in the
	// first.
	owner := map[string]int{}
	for q := range parts {
		for name := range parts[q].globals {
			g := globals[name]
			if g.Immutable || g.Init == nil {
				continue
			}
			if _, ok := owner[name]; !ok {
				owner[name] = q
			} else if g.Linkage == enum.LinkageInternal || g.Linkage == enum.LinkagePrivate {
				g.Linkage, g.Visibility = enum.LinkageNone, enum.VisibilityHidden
			}
		}
	}

	header := moduleHeader(m)
	out := make([]string, n)
	for q, c := range parts {
		var b strings.Builder
		b.WriteString(header)
		for _, g := range m.Globals {
			if !c.globals[g.Name()] {
				continue
			}
			if o, ok := owner[g.Name()]; ok && o != q {
				d := llir.NewGlobal(g.Name(), g.ContentType)
				d.Linkage, d.Visibility, d.Align = enum.LinkageExternal, g.Visibility, g.Align
				b.WriteString(d.LLString())
			} else {
				b.WriteString(g.LLString())
			}
			b.WriteByte('\n')
		}
		for _, f := range m.Funcs {
			switch {
			case len(f.Blocks) == 0:
				b.WriteString("\n" + f.LLString() + "\n")
			case c.declared[f.Name()]:
				b.WriteString("\n" + declaration(f) + "\n")
			}
		}
		for _, i := range c.funcs {
			b.WriteString("\n" + texts[i] + "\n")
		}
		out[q] = b.String()
	}
	return out
}

// separate reports whether f starts a unit of its own: a kernel (noinline)
// or an exported function that is not weak (the entry point).
func separate(f *llir.Func) bool {
	return slices.Contains(f.FuncAttrs, llir.FuncAttribute(enum.FuncAttrNoInline)) ||
		(f.Linkage == enum.LinkageNone || f.Linkage == enum.LinkageExternal)
}

// copied reports whether a part that uses f, defined in another part,
// takes a copy of it: an internal function clang may inline.
func copied(f *llir.Func) bool {
	return (f.Linkage == enum.LinkageInternal || f.Linkage == enum.LinkagePrivate) &&
		!slices.Contains(f.FuncAttrs, llir.FuncAttribute(enum.FuncAttrNoInline))
}

// declaration is f's declare line, with the visibility a definition
// elsewhere in the program gives it.
func declaration(f *llir.Func) string {
	var b strings.Builder
	b.WriteString("declare")
	if f.Visibility != enum.VisibilityNone {
		fmt.Fprintf(&b, " %s", f.Visibility)
	}
	fmt.Fprintf(&b, " %s %s(", f.Sig.RetType.LLString(), f.Ident())
	for i, p := range f.Params {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(p.Typ.LLString())
	}
	if f.Sig.Variadic {
		if len(f.Params) > 0 {
			b.WriteString(", ")
		}
		b.WriteString("...")
	}
	b.WriteString(")")
	return b.String()
}

// moduleHeader is what m prints before its globals: source file name,
// data layout, triple, type definitions.
func moduleHeader(m *llir.Module) string {
	funcs, globals := m.Funcs, m.Globals
	m.Funcs, m.Globals = nil, nil
	defer func() { m.Funcs, m.Globals = funcs, globals }()
	var b strings.Builder
	m.WriteTo(&b)
	return b.String()
}

// plainName reports whether name prints unquoted after @.
func plainName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !isIdentByte(r) {
			return false
		}
	}
	return true
}

func isIdentByte(r rune) bool {
	return r == '_' || r == '.' || r == '$' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// globalRefs is the names after @ in a function's text (each once): the
// functions and globals it uses, and possibly a few that only look like
// one, which cost an unneeded declaration at most.
func globalRefs(text string) []string {
	seen := map[string]bool{}
	var out []string
	for i := strings.IndexByte(text, '@'); i >= 0; {
		j := i + 1
		for j < len(text) && isIdentByte(rune(text[j])) {
			j++
		}
		if name := text[i+1 : j]; name != "" && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
		k := strings.IndexByte(text[j:], '@')
		if k < 0 {
			break
		}
		i = j + k
	}
	return out
}
