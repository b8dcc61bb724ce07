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
	"regexp"
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

var (
	descrRE = regexp.MustCompile(`'descr'\s*:\s*'([^']*)'`)
	orderRE = regexp.MustCompile(`'fortran_order'\s*:\s*(True|False)`)
	shapeRE = regexp.MustCompile(`'shape'\s*:\s*\(([^)]*)\)`)
)

// Read decodes a .npy file. The dtype comes from the file: <f8 f64, <f4
// f32, <f2 f16, <u2 bf16 bits, <i8 i64, <i4 i32, |i1 i8, |b1 bool.
func Read(r io.Reader) (*interp.Tensor, error) {
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
	header := string(data[off : off+hlen])
	body := data[off+hlen:]
	m := descrRE.FindStringSubmatch(header)
	if m == nil {
		return nil, fmt.Errorf(".npy header has no descr")
	}
	var dt ir.DType
	switch m[1] {
	case "<f8":
		dt = ir.F64
	case "<f4":
		dt = ir.F32
	case "<f2":
		dt = ir.F16
	case "<u2":
		dt = ir.BF16
	case "<i8":
		dt = ir.I64
	case "<i4":
		dt = ir.I32
	case "|i1", "<i1":
		dt = ir.I8
	case "|b1", "<b1":
		dt = ir.Bool
	default:
		return nil, fmt.Errorf(".npy dtype %q is not supported (want <f8, <f4, <f2, <u2 for bf16, <i8, <i4, |i1 or |b1)", m[1])
	}
	if o := orderRE.FindStringSubmatch(header); o != nil && o[1] == "True" {
		return nil, fmt.Errorf("Fortran-order .npy files are not supported")
	}
	sm := shapeRE.FindStringSubmatch(header)
	if sm == nil {
		return nil, fmt.Errorf(".npy header has no shape")
	}
	shape := ir.Shape{}
	for _, p := range strings.Split(sm[1], ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf(".npy shape %q is not valid", sm[1])
		}
		shape = append(shape, n)
	}
	t := ir.Type{DType: dt, Shape: shape}
	size, ok := t.Bytes()
	if !ok || size != int64(len(body)) {
		return nil, fmt.Errorf(".npy data has %d bytes, shape %s of %s needs %d", len(body), shape, m[1], size)
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
