package ir

import (
	"encoding/hex"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// denseListLimit is the largest dense constant printed as a list of
// numbers; larger ones print as little-endian hex.
const denseListLimit = 16

// elidable matches a large dense constant as the text format prints it
// (little-endian hex); the type part never holds '>' or ':'.
var elidable = regexp.MustCompile(`dense<([^:>]*): 0x[0-9a-f]+>`)

// ElideConstants shortens every hex-printed dense constant of printed IR
// (more than 16 elements) to its type and size, for IR meant for people
// (dumps between passes); the result no longer parses.
func ElideConstants(text string) string {
	return elidable.ReplaceAllStringFunc(text, func(m string) string {
		sub := elidable.FindStringSubmatch(m)
		hexLen := len(m) - len("dense<") - len(sub[1]) - len(": 0x>")
		return "dense<" + sub[1] + ": 0x… " + strconv.Itoa(hexLen/2) + " bytes elided (--print-constants shows them)>"
	})
}

// String prints the module in the canonical text format.
func (m *Module) String() string {
	var b strings.Builder
	for i, f := range m.Funcs {
		if i > 0 {
			b.WriteByte('\n')
		}
		printFunc(&b, f)
	}
	return b.String()
}

// String prints the function in the canonical text format.
func (f *Func) String() string {
	var b strings.Builder
	printFunc(&b, f)
	return b.String()
}

func printFunc(b *strings.Builder, f *Func) {
	b.WriteString("func @")
	b.WriteString(QuoteName(f.Name))
	b.WriteByte('(')
	for i, a := range f.Args {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(a.Ref())
		b.WriteString(": ")
		b.WriteString(a.Type.String())
		printArgAttrs(b, a.Arg)
	}
	b.WriteString(") -> (")
	for i, r := range f.Results {
		if i > 0 {
			b.WriteString(", ")
		}
		if r.Name != "" {
			b.WriteString(QuoteKey(r.Name))
			b.WriteString(": ")
		}
		b.WriteString(r.Value.Type.String())
		if len(r.Attrs) > 0 {
			b.WriteByte(' ')
			printAttrDict(b, r.Attrs)
		}
	}
	b.WriteByte(')')
	if len(f.Attrs) > 0 {
		b.WriteString(" attributes ")
		printAttrDict(b, f.Attrs)
	}
	b.WriteString(" {\n")
	printBody(b, f.Body, "  ")
	b.WriteString("  return")
	for i, r := range f.Results {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte(' ')
		b.WriteString(r.Value.Ref())
	}
	b.WriteString("\n}\n")
}

func printArgAttrs(b *strings.Builder, a *ArgInfo) {
	var parts []string
	if a.Kind != ArgData {
		parts = append(parts, a.Kind.String())
	}
	if a.InOut {
		parts = append(parts, "inout")
	}
	if a.Init != nil {
		parts = append(parts, "init = "+DenseAttr(a.Init).String())
	}
	for _, k := range a.Attrs.Keys() {
		parts = append(parts, QuoteKey(k)+" = "+a.Attrs[k].String())
	}
	if len(parts) > 0 {
		b.WriteString(" {")
		b.WriteString(strings.Join(parts, ", "))
		b.WriteByte('}')
	}
}

func printBody(b *strings.Builder, body []*Op, indent string) {
	for _, op := range body {
		b.WriteString(indent)
		PrintOp(b, op, indent)
		b.WriteByte('\n')
	}
}

// PrintOp writes one op (without indentation before it or a newline after
// it); indent is used for the lines of its region.
func PrintOp(b *strings.Builder, op *Op, indent string) {
	for i, r := range op.Results {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.Ref())
	}
	if len(op.Results) > 0 {
		b.WriteString(" = ")
	}
	b.WriteString(op.Kind)
	b.WriteByte('(')
	for i, v := range op.Operands {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v.Ref())
	}
	b.WriteByte(')')
	if len(op.Attrs) > 0 {
		b.WriteByte(' ')
		printAttrDict(b, op.Attrs)
	}
	if len(op.Results) > 0 {
		b.WriteString(" : ")
		for i, r := range op.Results {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(r.Type.String())
			if r.Offset != NoOffset {
				b.WriteString(" at ")
				b.WriteString(strconv.FormatInt(r.Offset, 10))
			}
		}
	}
	if !op.Loc.IsUnknown() {
		b.WriteString(" loc(")
		b.WriteString(op.Loc.String())
		b.WriteByte(')')
	}
	if r := op.Region; r != nil {
		b.WriteString(" region(")
		for i, a := range r.Args {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(a.Ref())
			b.WriteString(": ")
			b.WriteString(a.Type.String())
		}
		b.WriteString(") {\n")
		printBody(b, r.Body, indent+"  ")
		b.WriteString(indent + "  yield")
		for i, v := range r.Yield {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteByte(' ')
			b.WriteString(v.Ref())
		}
		b.WriteString("\n" + indent + "}")
	}
}

func printAttrDict(b *strings.Builder, as Attrs) {
	b.WriteByte('{')
	for i, k := range as.Keys() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(QuoteKey(k))
		b.WriteString(" = ")
		b.WriteString(as[k].String())
	}
	b.WriteByte('}')
}

// String prints the attribute value in the text format.
func (a Attr) String() string {
	switch a.Kind {
	case AttrInt:
		return strconv.FormatInt(a.Int, 10)
	case AttrFloat:
		return FormatFloat(a.Float)
	case AttrString:
		return strconv.Quote(a.Str)
	case AttrBool:
		return strconv.FormatBool(a.Bool)
	case AttrType:
		return a.DType.String()
	case AttrList:
		parts := make([]string, len(a.List))
		for i, e := range a.List {
			parts[i] = e.String()
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case AttrDense:
		return formatDense(a.Dense)
	}
	return "<invalid>"
}

// FormatFloat prints f so that it reads back as the same float64 and
// always looks like a float (1.0, not 1).
func FormatFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}

func formatDense(d *Dense) string {
	var b strings.Builder
	b.WriteString("dense<")
	b.WriteString(d.Type.String())
	b.WriteString(": ")
	switch {
	case d.Len() > 0 && (d.Type.NumElements() > 1 || d.Type.Rank() == 0) && d.AllEqual():
		b.WriteString(denseElem(d, 0))
	case d.Len() > denseListLimit:
		b.WriteString("0x")
		b.WriteString(hex.EncodeToString(d.RawBytes()))
	default:
		b.WriteByte('[')
		for i := 0; i < d.Len(); i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(denseElem(d, i))
		}
		b.WriteByte(']')
	}
	b.WriteByte('>')
	return b.String()
}

func denseElem(d *Dense, i int) string {
	switch {
	case d.Type.DType.IsFloat():
		return FormatFloat(d.Floats[i])
	case d.Type.DType == Bool:
		return strconv.FormatBool(d.Ints[i] != 0)
	case d.Type.DType == U64:
		return strconv.FormatUint(uint64(d.Ints[i]), 10)
	}
	return strconv.FormatInt(d.Ints[i], 10)
}
