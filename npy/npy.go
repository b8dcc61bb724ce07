// Package npy reads and writes NumPy .npy files (format version 1.0,
// little-endian, C order) holding Kiln tensors. f64, f32, f16, i64, i32,
// i8 and bool map to NumPy's <f8, <f4, <f2, <i8, <i4, |i1 and |b1. NumPy
// has no bfloat16: a bf16 tensor is written as <u2 holding the raw bf16
// bits (the upper half of the f32 pattern), and reading <u2 into a bf16
// argument decodes those bits. fp8 tensors are written as |u1 raw bits.
package npy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

var magic = []byte("\x93NUMPY")

// Descr is the .npy descr string of a dtype (bf16: its bits as <u2).
func Descr(d ir.DType) (string, error) {
	switch d {
	case ir.F64:
		return "<f8", nil
	case ir.F32:
		return "<f4", nil
	case ir.F16:
		return "<f2", nil
	case ir.BF16:
		return "<u2", nil
	case ir.F8E4M3, ir.F8E5M2:
		return "|u1", nil
	case ir.I64:
		return "<i8", nil
	case ir.I32:
		return "<i4", nil
	case ir.I8:
		return "|i1", nil
	case ir.U8:
		return "|u1", nil
	case ir.I16:
		return "<i2", nil
	case ir.U16:
		return "<u2", nil
	case ir.U32:
		return "<u4", nil
	case ir.U64:
		return "<u8", nil
	case ir.Bool:
		return "|b1", nil
	}
	return "", fmt.Errorf("dtype %s has no .npy form", d)
}

// Write encodes t as a .npy file.
func Write(w io.Writer, t *interp.Tensor) error {
	ds, err := Descr(t.Type.DType)
	if err != nil {
		return err
	}
	shape := make([]string, len(t.Type.Shape))
	for i, d := range t.Type.Shape {
		shape[i] = strconv.FormatInt(d, 10)
	}
	st := strings.Join(shape, ", ")
	if len(shape) == 1 {
		st += ","
	}
	header := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", ds, st)
	// Pad so that magic + version + length + header + newline is a multiple of 64.
	total := len(magic) + 2 + 2 + len(header) + 1
	header += strings.Repeat(" ", (64-total%64)%64) + "\n"
	var b bytes.Buffer
	b.Write(magic)
	b.Write([]byte{1, 0})
	binary.Write(&b, binary.LittleEndian, uint16(len(header)))
	b.WriteString(header)
	d := &ir.Dense{Type: t.Type, Floats: t.F, Ints: t.I}
	if len(t.F) == 0 && len(t.I) == 0 {
		d = &ir.Dense{Type: t.Type}
	}
	raw := d.RawBytes()
	if t.Type.DType == ir.Bool {
		for i := range raw {
			if raw[i] != 0 {
				raw[i] = 1
			}
		}
	}
	b.Write(raw)
	_, err = w.Write(b.Bytes())
	return err
}

// Read decodes a .npy file. The dtype comes from the file: <f8 f64, <f4
// f32, <f2 f16, <i8 i64, <i4 i32, <i2 i16, |i1 i8, <u4 u32, <u2 u16, |u1
// u8, |b1 bool.
func Read(r io.Reader) (*interp.Tensor, error) { return ReadAs(r, ir.Invalid) }

// ReadAs is Read for a tensor expected to have dtype want: |u1 also holds
// raw fp8 bits and <u2 bf16 bits, which only the dtype wanted tells apart.
func ReadAs(r io.Reader, want ir.DType) (*interp.Tensor, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if len(data) < 10 || !bytes.Equal(data[:6], magic) {
		return nil, fmt.Errorf("not a .npy file")
	}
	var hlen, off int
	switch data[6] {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(data[8:10])), 10
	case 2, 3:
		if len(data) < 12 {
			return nil, fmt.Errorf("truncated .npy header")
		}
		hlen, off = int(binary.LittleEndian.Uint32(data[8:12])), 12
	default:
		return nil, fmt.Errorf(".npy version %d.%d is not supported", data[6], data[7])
	}
	if off+hlen > len(data) {
		return nil, fmt.Errorf("truncated .npy header")
	}
	h, err := parseHeader(string(data[off : off+hlen]))
	if err != nil {
		return nil, fmt.Errorf(".npy header: %v", err)
	}
	body := data[off+hlen:]
	var dt ir.DType
	switch h.descr {
	case "<f8":
		dt = ir.F64
	case "<f4":
		dt = ir.F32
	case "<f2":
		dt = ir.F16
	case "<u2":
		dt = ir.U16
		if want == ir.BF16 {
			dt = ir.BF16 // bf16 bits: numpy has no bf16
		}
	case "<i2":
		dt = ir.I16
	case "<u4":
		dt = ir.U32
	case "<u8":
		dt = ir.U64
	case "<i8":
		dt = ir.I64
	case "<i4":
		dt = ir.I32
	case "|i1", "<i1":
		dt = ir.I8
	case "|b1", "<b1":
		dt = ir.Bool
	case "|u1", "<u1":
		dt = ir.U8
		if want == ir.F8E4M3 || want == ir.F8E5M2 {
			dt = want // fp8 bits: numpy has no fp8
		}
	default:
		return nil, fmt.Errorf(".npy dtype %q is not supported (want <f8, <f4, <f2, <i8, <i4, <i2, |i1, <u8, <u4, <u2 (also bf16 bits), |u1 (also fp8 bits) or |b1)", h.descr)
	}
	if h.fortran {
		return nil, fmt.Errorf("Fortran-order .npy files are not supported")
	}
	t := ir.Type{DType: dt, Shape: h.shape}
	size, ok := t.Bytes()
	if !ok || size != int64(len(body)) {
		return nil, fmt.Errorf(".npy data has %d bytes, shape %s of %s needs %d", len(body), h.shape, h.descr, size)
	}
	d, err := ir.DenseFromRaw(t, body)
	if err != nil {
		return nil, err
	}
	x := interp.New(t)
	copy(x.F, d.Floats)
	copy(x.I, d.Ints)
	return x, nil
}

// header is a parsed .npy header dictionary.
type header struct {
	descr   string
	fortran bool
	shape   ir.Shape
}

// parseHeader reads the header as the Python literal it is: a dict with
// exactly the keys descr (a string), fortran_order (True or False) and
// shape (a tuple of non-negative ints), each once, trailing commas
// allowed, padded with spaces and a newline.
func parseHeader(s string) (header, error) {
	var h header
	p := &literal{s: s}
	p.space()
	if !p.eat('{') {
		return h, fmt.Errorf("not a dict")
	}
	seen := map[string]bool{}
	for {
		p.space()
		if p.eat('}') {
			break
		}
		key, err := p.str()
		if err != nil {
			return h, err
		}
		if seen[key] {
			return h, fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		p.space()
		if !p.eat(':') {
			return h, fmt.Errorf("want ':' after %q", key)
		}
		p.space()
		switch key {
		case "descr":
			if h.descr, err = p.str(); err != nil {
				return h, err
			}
		case "fortran_order":
			switch {
			case p.word("True"):
				h.fortran = true
			case p.word("False"):
			default:
				return h, fmt.Errorf("fortran_order must be True or False")
			}
		case "shape":
			if h.shape, err = p.tuple(); err != nil {
				return h, err
			}
		default:
			return h, fmt.Errorf("unknown key %q", key)
		}
		p.space()
		if p.eat('}') {
			break
		}
		if !p.eat(',') {
			return h, fmt.Errorf("want ',' or '}' after the value of %q", key)
		}
	}
	p.space()
	if p.i != len(s) {
		return h, fmt.Errorf("text after the dict")
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if !seen[k] {
			return h, fmt.Errorf("no %s", k)
		}
	}
	return h, nil
}

// literal scans a Python literal.
type literal struct {
	s string
	i int
}

func (p *literal) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\n' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *literal) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *literal) word(w string) bool {
	if strings.HasPrefix(p.s[p.i:], w) {
		p.i += len(w)
		return true
	}
	return false
}

// str reads a quoted string without escapes (all a header holds).
func (p *literal) str() (string, error) {
	if p.i >= len(p.s) || p.s[p.i] != '\'' && p.s[p.i] != '"' {
		return "", fmt.Errorf("want a quoted string at byte %d", p.i)
	}
	q := p.s[p.i]
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", fmt.Errorf("unterminated string")
	}
	v := p.s[p.i+1 : p.i+1+end]
	if strings.ContainsAny(v, "\\\n") {
		return "", fmt.Errorf("string %q has escapes", v)
	}
	p.i += end + 2
	return v, nil
}

// tuple reads (), (n,) or (n, m, ...) of non-negative ints.
func (p *literal) tuple() (ir.Shape, error) {
	if !p.eat('(') {
		return nil, fmt.Errorf("shape must be a tuple")
	}
	shape := ir.Shape{}
	for {
		p.space()
		if p.eat(')') {
			if len(shape) == 1 && !strings.HasSuffix(strings.TrimSpace(p.s[:p.i-1]), ",") {
				return nil, fmt.Errorf("shape (%d) is an int, not a tuple (write (%d,))", shape[0], shape[0])
			}
			return shape, nil
		}
		j := p.i
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		n, err := strconv.ParseInt(p.s[j:p.i], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("shape entry at byte %d is not a non-negative int", j)
		}
		shape = append(shape, n)
		p.space()
		if p.eat(')') {
			if len(shape) == 1 {
				return nil, fmt.Errorf("shape (%d) is an int, not a tuple (write (%d,))", n, n)
			}
			return shape, nil
		}
		if !p.eat(',') {
			return nil, fmt.Errorf("want ',' or ')' in the shape at byte %d", p.i)
		}
	}
}
