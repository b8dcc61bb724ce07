package parser

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/alecthomas/participle/v2"
	"github.com/alecthomas/participle/v2/lexer"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
)

// maxErrors bounds the diagnostics of one parse.
const maxErrors = 20

// Parse reads a module from src; filename is used in positions. On
// failure the error is a diag.List with every problem found, and the
// module holds the functions that did parse (so that a caller can verify
// them too and report all errors at once).
func Parse(filename, src string) (*ir.Module, error) {
	if d := checkNesting(filename, src); d != nil {
		return &ir.Module{}, diag.List{*d}
	}
	var errs diag.List
	m := &ir.Module{}
	text := src
	for {
		ast, err := kirParser.ParseString(filename, text)
		if err == nil {
			for _, f := range ast.Funcs {
				fn, ferrs := lowerFunc(filename, f)
				errs = append(errs, ferrs...)
				if fn != nil {
					m.Funcs = append(m.Funcs, fn)
				}
			}
			break
		}
		d := syntaxDiag(filename, err)
		d.Msg = strings.TrimPrefix(d.Msg, "lexer: ")
		errs = append(errs, d)
		// Lower the functions that parsed before the error by reparsing
		// the text up to the start of the failing function.
		start := funcStartBefore(text, d.Line)
		if start > 0 {
			if head, herr := kirParser.ParseString(filename, text[:start]); herr == nil {
				for _, f := range head.Funcs {
					fn, ferrs := lowerFunc(filename, f)
					errs = append(errs, ferrs...)
					if fn != nil {
						m.Funcs = append(m.Funcs, fn)
					}
				}
			}
		}
		next := nextFuncLine(text, d.Line)
		if next < 0 || len(errs) >= maxErrors {
			break
		}
		text = blankBefore(text, next)
	}
	if len(errs) > 0 {
		return m, errs.Sort()
	}
	return m, nil
}

func syntaxDiag(filename string, err error) diag.Diagnostic {
	var perr participle.Error
	if errors.As(err, &perr) {
		p := perr.Position()
		return diag.Diagnostic{File: filename, Line: max(p.Line, 1), Col: max(p.Column, 1), Msg: friendly(perr.Message())}
	}
	return diag.Diagnostic{File: filename, Line: 1, Col: 1, Msg: err.Error()}
}

// friendly rewrites participle's messages into the words a user sees:
// token names become descriptions, and a list of expected grammar
// alternatives becomes the literal tokens it starts with.
func friendly(msg string) string {
	msg = strings.TrimPrefix(msg, "lexer: ")
	if i := strings.Index(msg, " (expected "); i >= 0 {
		want := msg[i+len(" (expected ") : len(msg)-1]
		msg = msg[:i]
		// The alternatives of the longest failed match can include the
		// token that was found (it fits there, but not what follows it):
		// naming it as expected would contradict the message.
		found := ""
		if rest, ok := strings.CutPrefix(msg, "unexpected token "); ok {
			found = rest
		}
		if lits := expectedLiterals(want, found); lits != "" {
			msg += "; expected " + lits
		}
	}
	msg = strings.Replace(msg, `unexpected token "<EOF>"`, "unexpected end of file", 1)
	if rest, ok := strings.CutPrefix(msg, "invalid input text "); ok {
		if r, err := strconv.Unquote(strings.SplitN(rest, "...", 2)[0] + `"`); err == nil && r != "" {
			return fmt.Sprintf("unexpected character %q", []rune(r)[0])
		}
		if r, err := strconv.Unquote(rest); err == nil && r != "" {
			return fmt.Sprintf("unexpected character %q", []rune(r)[0])
		}
	}
	r := strings.NewReplacer(
		"<valueref>", "a value (%name)",
		"<funcref>", "a function name (@name)",
		"<ident>", "a name",
		"<int>", "an integer",
		"<float>", "a number",
		"<string>", "a string",
		"<arrow>", "\"->\"",
		"<hex>", "hex digits",
		"<EOF>", "end of file",
	)
	return r.Replace(msg)
}

// expectedLiterals lists the quoted tokens and token classes of an
// expected-grammar string, as "a", "b" or "c", leaving out found.
func expectedLiterals(want, found string) string {
	var out []string
	seen := map[string]bool{found: true}
	for _, m := range literalRE.FindAllString(want, -1) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	switch len(out) {
	case 0:
		return ""
	case 1:
		return out[0]
	}
	return strings.Join(out[:len(out)-1], ", ") + " or " + out[len(out)-1]
}

var literalRE = regexp.MustCompile(`"[^"]*"|<[a-z]+>`)

// lineStarts returns the byte offset of each line's start.
func lineStarts(text string) []int {
	starts := []int{0}
	for i := 0; i < len(text); i++ {
		if text[i] == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}

func isFuncLine(text string, start int) bool {
	return strings.HasPrefix(text[start:], "func ") || strings.HasPrefix(text[start:], "func@")
}

// nextFuncLine returns the offset of the first line after line that
// starts a function, or -1.
func nextFuncLine(text string, line int) int {
	starts := lineStarts(text)
	for l := line; l < len(starts); l++ { // starts[l] is the start of line l+1
		if isFuncLine(text, starts[l]) {
			return starts[l]
		}
	}
	return -1
}

// funcStartBefore returns the offset of the last function start at or
// before line, or 0.
func funcStartBefore(text string, line int) int {
	starts := lineStarts(text)
	for l := min(line, len(starts)) - 1; l >= 0; l-- {
		if isFuncLine(text, starts[l]) {
			return starts[l]
		}
	}
	return 0
}

// blankBefore replaces everything before off with spaces, keeping the
// newlines, so positions in the rest stay exact.
func blankBefore(text string, off int) string {
	b := []byte(text)
	for i := 0; i < off; i++ {
		if b[i] != '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

type lowerer struct {
	file  string
	f     *ir.Func
	errs  diag.List
	later map[string]bool // names defined somewhere in the function
}

func (l *lowerer) errorf(p lexer.Position, format string, args ...any) {
	l.errs = append(l.errs, diag.Diagnostic{File: l.file, Line: p.Line, Col: p.Column, Msg: fmt.Sprintf(format, args...)})
}

func pos(file string, p lexer.Position) ir.Pos {
	return ir.Pos{File: file, Line: p.Line, Col: p.Column}
}

func lowerFunc(file string, fa *funcAST) (*ir.Func, diag.List) {
	l := &lowerer{file: file, later: map[string]bool{}}
	f := &ir.Func{Name: unquoteSigil(fa.Name), Pos: pos(file, fa.Pos)}
	l.f = f
	collectNames(fa.Body, l.later)
	scope := map[string]*ir.Value{}
	for i, a := range fa.Args {
		v := &ir.Value{Name: unquoteSigil(a.Name), Type: l.lowerType(a.Type), Index: i, Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
		l.lowerArgAttrs(v, a)
		l.define(scope, v, a.Pos)
		f.Args = append(f.Args, v)
	}
	if fa.Attrs != nil {
		f.Attrs = l.lowerAttrs(fa.Attrs)
	}
	f.Body = l.lowerBody(fa.Body, scope)
	bodyClean := len(l.errs) == 0
	if len(fa.Return.Values) != len(fa.Results) {
		l.errorf(fa.Return.Pos, "return has %s, but @%s declares %s", plural(len(fa.Return.Values), "value"), f.Name, plural(len(fa.Results), "result"))
	}
	for i, r := range fa.Return.Values {
		v := l.use(scope, r)
		if v == nil || i >= len(fa.Results) {
			continue
		}
		res := ir.Result{Value: v}
		if n := fa.Results[i].Name; n != nil {
			res.Name = unquoteName(*n)
		}
		if d := fa.Results[i].Attrs; d != nil {
			res.Attrs = l.lowerAttrs(d)
		}
		if t := l.lowerType(fa.Results[i].Type); t.DType != ir.Invalid && v.Type.DType != ir.Invalid && !t.Equal(v.Type) {
			l.errorf(r.Pos, "returned value %s has type %s, but result %d is declared %s", r.Name, v.Type, i, t)
		}
		f.Results = append(f.Results, res)
	}
	if len(l.errs) > 0 {
		if bodyClean {
			// Only the return is wrong: the body is whole, so the
			// verifier's findings in it come first, in source order
			// (a wrong type on line 2 is the cause of one on return).
			if err := ir.Verify(&ir.Module{Funcs: []*ir.Func{f}}); err != nil {
				if list, ok := err.(diag.List); ok {
					l.errs = append(list, l.errs...)
					sort.SliceStable(l.errs, func(i, j int) bool {
						a, b := l.errs[i], l.errs[j]
						return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
					})
				}
			}
		}
		return nil, l.errs
	}
	return f, nil
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func collectNames(body []*opAST, names map[string]bool) {
	for _, op := range body {
		for _, r := range op.Results {
			names[unquoteSigil(r.Name)] = true
		}
		if op.Region != nil {
			collectNames(op.Region.Body, names)
		}
	}
}

func (l *lowerer) define(scope map[string]*ir.Value, v *ir.Value, p lexer.Position) {
	if _, dup := scope[v.Name]; dup {
		l.errorf(p, "value %s is defined twice", v.Ref())
		return
	}
	scope[v.Name] = v
}

func (l *lowerer) use(scope map[string]*ir.Value, r *refAST) *ir.Value {
	name := unquoteSigil(r.Name)
	if v, ok := scope[name]; ok {
		return v
	}
	if l.later[name] {
		l.errorf(r.Pos, "value %s is used before it is defined", r.Name)
	} else {
		l.errorf(r.Pos, "use of undefined value %s", r.Name)
	}
	return nil
}

func (l *lowerer) lowerBody(body []*opAST, scope map[string]*ir.Value) []*ir.Op {
	var out []*ir.Op
	for _, oa := range body {
		op := &ir.Op{Kind: oa.Kind, Pos: pos(l.file, oa.Pos)}
		ok := true
		for _, r := range oa.Operands {
			v := l.use(scope, r)
			ok = ok && v != nil
			op.Operands = append(op.Operands, v)
		}
		if oa.Attrs != nil {
			op.Attrs = l.lowerAttrs(oa.Attrs)
		}
		if oa.Loc != nil {
			op.Loc = l.lowerLoc(oa.Loc)
		}
		if len(oa.Types) != len(oa.Results) {
			l.errorf(oa.Pos, "%s defines %d values but lists %d types", oa.Kind, len(oa.Results), len(oa.Types))
			ok = false
		}
		if oa.Region != nil {
			op.Region = l.lowerRegion(oa.Region)
		}
		for i, r := range oa.Results {
			v := &ir.Value{Name: unquoteSigil(r.Name), Def: op, Index: i, Offset: ir.NoOffset}
			if i < len(oa.Types) {
				v.Type = l.lowerType(oa.Types[i].Type)
				if o := oa.Types[i].Offset; o != nil {
					v.Offset = l.parseInt(*o, oa.Types[i].Type.Pos)
					if v.Offset < 0 {
						l.errorf(oa.Types[i].Type.Pos, "offset of %s must not be negative", r.Name)
					}
				}
			}
			op.Results = append(op.Results, v)
			l.define(scope, v, r.Pos)
		}
		if ok {
			out = append(out, op)
		}
	}
	return out
}

func (l *lowerer) lowerRegion(ra *regionAST) *ir.Region {
	inner := map[string]*ir.Value{}
	r := &ir.Region{}
	for i, p := range ra.Args {
		v := &ir.Value{Name: unquoteSigil(p.Name), Type: l.lowerType(p.Type), Index: i, Offset: ir.NoOffset}
		l.define(inner, v, p.Pos)
		r.Args = append(r.Args, v)
	}
	r.Body = l.lowerBody(ra.Body, inner)
	for _, y := range ra.Yield.Values {
		if v := l.use(inner, y); v != nil {
			r.Yield = append(r.Yield, v)
		}
	}
	return r
}

func (l *lowerer) lowerType(t *typeAST) ir.Type {
	d, ok := ir.ParseDType(t.DType)
	if !ok {
		l.errorf(t.Pos, "unknown dtype %q (want one of %s)", t.DType, ir.DTypeNames())
	}
	shape := ir.Shape{}
	for _, s := range t.Dims {
		n := l.parseInt(s, t.Pos)
		if n < 0 {
			l.errorf(t.Pos, "dimension %d must not be negative", n)
		}
		shape = append(shape, n)
	}
	return ir.Type{DType: d, Shape: shape}
}

func (l *lowerer) parseInt(s string, p lexer.Position) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		l.errorf(p, "integer %s is out of range", s)
	}
	return n
}

func (l *lowerer) lowerArgAttrs(v *ir.Value, a *argAST) {
	for _, at := range a.Attrs {
		key := unquoteName(at.Key)
		switch {
		case at.Value == nil && key == "inout":
			v.Arg.InOut = true
		case at.Value == nil && (key == "param" || key == "state"):
			if v.Arg.Kind != ir.ArgData {
				l.errorf(at.Pos, "argument %s is already %s", a.Name, v.Arg.Kind)
			}
			v.Arg.Kind = ir.ArgParam
			if key == "state" {
				v.Arg.Kind = ir.ArgState
			}
		case at.Value == nil:
			l.errorf(at.Pos, "argument attribute %q needs a value (only param, state and inout stand alone)", key)
		case key == "init":
			val := l.lowerValue(at.Value)
			if val.Kind != ir.AttrDense {
				l.errorf(at.Value.Pos, "init must be a dense constant")
				continue
			}
			v.Arg.Init = val.Dense
		default:
			if v.Arg.Attrs == nil {
				v.Arg.Attrs = ir.Attrs{}
			}
			v.Arg.Attrs[key] = l.lowerValue(at.Value)
		}
	}
}

func (l *lowerer) lowerAttrs(d *attrDictAST) ir.Attrs {
	out := ir.Attrs{}
	for _, e := range d.Entries {
		key := unquoteName(e.Key)
		if _, dup := out[key]; dup {
			l.errorf(e.Pos, "attribute %q is given twice", key)
		}
		out[key] = l.lowerValue(e.Value)
	}
	return out
}

func (l *lowerer) lowerValue(v *valueAST) ir.Attr {
	switch {
	case v.Float != nil:
		f := parseFloat(*v.Float)
		if math.IsInf(f, 0) && !strings.Contains(*v.Float, "inf") {
			l.errorf(v.Pos, "the number %s is beyond the range of f64 (write inf or -inf for an infinity)", clip(*v.Float))
		}
		return ir.FloatAttr(f)
	case v.Int != nil:
		return ir.IntAttr(l.parseInt(*v.Int, v.Pos))
	case v.Str != nil:
		return ir.StringAttr(unquoteName(*v.Str))
	case v.Bool != nil:
		return ir.BoolAttr(*v.Bool == "true")
	case v.List != nil:
		out := ir.Attr{Kind: ir.AttrList, List: []ir.Attr{}}
		for _, e := range v.List.Elems {
			out.List = append(out.List, l.lowerValue(e))
		}
		return out
	case v.Dense != nil:
		return ir.DenseAttr(l.lowerDense(v.Dense, v.Pos))
	case v.DType != nil:
		d, ok := ir.ParseDType(*v.DType)
		if !ok {
			l.errorf(v.Pos, "unknown attribute value %q (a dtype, number, string, bool, list or dense constant)", *v.DType)
		}
		return ir.TypeAttr(d)
	}
	return ir.Attr{}
}

func parseFloat(s string) float64 {
	switch strings.TrimPrefix(s, "+") {
	case "inf":
		return math.Inf(1)
	case "-inf":
		return math.Inf(-1)
	case "nan", "-nan":
		return math.NaN()
	}
	f, _ := strconv.ParseFloat(s, 64) // the lexer admits only valid floats; overflow gives ±Inf
	return f
}

func (l *lowerer) lowerDense(da *denseAST, p lexer.Position) *ir.Dense {
	t := l.lowerType(da.Type)
	if t.DType == ir.Invalid {
		return &ir.Dense{Type: t}
	}
	if da.Hex != nil {
		raw, err := hex.DecodeString(strings.TrimPrefix(*da.Hex, "0x"))
		if err != nil {
			l.errorf(p, "dense hex data: %v", err)
			return &ir.Dense{Type: t}
		}
		d, err := ir.DenseFromRaw(t, raw)
		if err != nil {
			l.errorf(p, "dense constant: %v", err)
		}
		return d
	}
	var elems []*valueAST
	if da.List != nil {
		elems = da.List.Elems
	} else {
		elems = []*valueAST{da.Splat}
	}
	d := &ir.Dense{Type: t}
	for _, e := range elems {
		if t.DType == ir.U64 && e.Int != nil {
			// A u64 element may pass the int64 range.
			u, err := strconv.ParseUint(strings.TrimPrefix(*e.Int, "+"), 10, 64)
			if err != nil {
				l.errorf(e.Pos, "integer %s is out of the range of u64", *e.Int)
			}
			d.Ints = append(d.Ints, int64(u))
			continue
		}
		a := l.lowerValue(e)
		var f float64
		switch a.Kind {
		case ir.AttrFloat:
			f = a.Float
		case ir.AttrInt:
			f = float64(a.Int)
		case ir.AttrBool:
			if a.Bool {
				f = 1
			}
		default:
			l.errorf(e.Pos, "dense elements must be numbers or bools")
			continue
		}
		if t.DType.IsFloat() {
			r := ir.RoundTo(t.DType, f)
			if math.IsInf(r, 0) && !math.IsInf(f, 0) {
				l.errorf(e.Pos, "%s is beyond the range of %s (write inf or -inf for an infinity)", ir.FormatFloat(f), t.DType)
			}
			d.Floats = append(d.Floats, r)
		} else if a.Kind == ir.AttrFloat {
			l.errorf(e.Pos, "%s constant holds a non-integer %s", t.DType, ir.FormatFloat(f))
		} else if a.Kind == ir.AttrInt {
			d.Ints = append(d.Ints, a.Int)
		} else {
			d.Ints = append(d.Ints, int64(f)) // a bool: 0 or 1
		}
	}
	if err := d.Validate(); err != nil {
		l.errorf(p, "%v", err)
	}
	return d
}

func (l *lowerer) lowerLoc(la *locAST) ir.Location {
	if la.Fused != nil || la.File == nil {
		var parts []ir.Location
		for _, f := range la.Fused {
			parts = append(parts, l.lowerLoc(f))
		}
		return ir.Location{Fused: parts}
	}
	loc := ir.Location{}
	first := unquoteName(*la.File)
	switch {
	case la.Line != nil:
		loc.File = first
		loc.Line = int(l.parseInt(*la.Line, la.Pos))
		loc.Col = int(l.parseInt(*la.Col, la.Pos))
	case la.Name != nil:
		loc.File = first
		loc.Name = unquoteName(*la.Name)
	default:
		loc.Name = first
	}
	return loc
}

// unquoteSigil strips the % or @ sigil and unquotes a quoted name.
func unquoteSigil(s string) string { return unquoteName(s[1:]) }

func unquoteName(s string) string {
	if strings.HasPrefix(s, `"`) {
		// Bytes that are not UTF-8 stand for themselves (strconv.Unquote
		// would make each one U+FFFD, and two names one).
		s = escapeInvalid(s)
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
		return s[1 : len(s)-1]
	}
	return s
}

// escapeInvalid writes each byte of s that is not UTF-8 as a \xNN escape.
func escapeInvalid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, "\\x%02x", s[i])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// clip shortens a literal for a message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}

// MaxNesting is how deep brackets ([ ( {) may nest in a .kir file: far
// more than any real module (attribute lists, fused locations, regions)
// needs, and low enough that parsing stays fast and its recursion small.
const MaxNesting = 1000

// checkNesting reports the first bracket nested deeper than MaxNesting,
// outside strings and comments.
func checkNesting(filename, src string) *diag.Diagnostic {
	depth, line, col := 0, 1, 0
	for i := 0; i < len(src); i++ {
		c := src[i]
		col++
		switch c {
		case '\n':
			line, col = line+1, 0
		case '"':
			for i++; i < len(src) && src[i] != '"' && src[i] != '\n'; i++ {
				col++
				if src[i] == '\\' {
					i++
					col++
				}
			}
			col++
			if i < len(src) && src[i] == '\n' {
				line, col = line+1, 0
			}
		case '/':
			if i+1 < len(src) && src[i+1] == '/' {
				for i < len(src) && src[i] != '\n' {
					i++
				}
				line, col = line+1, 0
			}
		case '[', '(', '{':
			depth++
			if depth > MaxNesting {
				return &diag.Diagnostic{File: filename, Line: line, Col: col, Msg: fmt.Sprintf("brackets nested deeper than %d", MaxNesting)}
			}
		case ']', ')', '}':
			depth--
		}
	}
	return nil
}
