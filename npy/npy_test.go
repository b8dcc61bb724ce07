package npy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

func TestRoundTripEveryDType(t *testing.T) {
	for _, d := range []ir.DType{ir.F64, ir.F32, ir.F16, ir.BF16, ir.I64, ir.I32, ir.I16, ir.I8, ir.U32, ir.U16, ir.U8, ir.Bool} {
		ty := ir.TensorOf(d, 2, 3)
		var x *interp.Tensor
		if d.IsFloat() {
			x = interp.FromFloats(ty, []float64{0.5, -1.25, 3, 1e-3, 65504 / 2, -0.0})
		} else if d == ir.Bool {
			x = interp.FromInts(ty, []int64{1, 0, 1, 1, 0, 0})
		} else if d.IsUnsigned() {
			x = interp.FromInts(ty, []int64{1, 255, 3, 100, 200, 0})
		} else {
			x = interp.FromInts(ty, []int64{1, -2, 3, 100, -100, 0})
		}
		var b bytes.Buffer
		require.NoError(t, Write(&b, x), d.String())
		require.Zero(t, (b.Len()-len(x.ToDense().RawBytes()))%64, "header padded to 64 bytes")
		y, err := ReadAs(bytes.NewReader(b.Bytes()), d) // <u2 holds u16 or bf16 bits
		require.NoError(t, err, d.String())
		require.Equal(t, x.Type, y.Type, d.String())
		require.Equal(t, x.F, y.F, d.String())
		require.Equal(t, x.I, y.I, d.String())
	}
	// A scalar, and a header NumPy writes for shape (3,).
	var b bytes.Buffer
	require.NoError(t, Write(&b, interp.FromFloats(ir.TensorOf(ir.F32), []float64{7})))
	require.Contains(t, b.String(), "'shape': ()")
	b.Reset()
	require.NoError(t, Write(&b, interp.FromFloats(ir.TensorOf(ir.F32, 3), []float64{1, 2, 3})))
	require.Contains(t, b.String(), "'shape': (3,)")
}

func TestMalformedFiles(t *testing.T) {
	for _, data := range []string{"", "not numpy", "\x93NUMPY\x01\x00\xff\x00{}", "\x93NUMPY\x01\x00\x30\x00{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }"} {
		_, err := Read(bytes.NewReader([]byte(data)))
		require.Error(t, err, "%q", data)
	}
	hdr := "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"
	short := "\x93NUMPY\x01\x00" + string(rune(len(hdr))) + "\x00" + hdr + "abcd"
	_, err := Read(bytes.NewReader([]byte(short)))
	require.ErrorContains(t, err, "needs 16")
}

// TestHeaderIsAPythonLiteral: the header dictionary is parsed, not
// matched: duplicate keys, a missing key, an unknown key, a malformed
// shape or a shape that is an int are errors.
func TestHeaderIsAPythonLiteral(t *testing.T) {
	body := func(h string) []byte {
		total := 10 + len(h) + 1
		h += strings.Repeat(" ", (64-total%64)%64) + "\n"
		b := append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), byte(len(h)>>8))
		return append(append(b, h...), make([]byte, 16)...)
	}
	ok := "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"
	x, err := Read(bytes.NewReader(body(ok)))
	require.NoError(t, err)
	require.Equal(t, "f32[4]", x.Type.String())
	for h, want := range map[string]string{
		"{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (4,), }": "appears twice",
		"{'descr': '<f4', 'shape': (4,), }":                                         "no fortran_order",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (4,,,16), }":             "shape entry",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (4), }":                  "not a tuple",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}":           "unknown key",
		"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,), }":                 "True or False",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (4,) } extra":            "text after",
	} {
		_, err := Read(bytes.NewReader(body(h)))
		require.ErrorContains(t, err, want, h)
	}
}

// TestFP8RoundTrip: fp8 tensors are written as |u1 raw bits and read back
// into an fp8 tensor (they could not be read before); read without a
// wanted dtype, the file is numpy's uint8 array of those bits. So is bf16
// with <u2.
func TestFP8RoundTrip(t *testing.T) {
	for _, d := range []ir.DType{ir.F8E4M3, ir.F8E5M2} {
		x := interp.FromFloats(ir.TensorOf(d, 4), []float64{1, -2, 0.5, 448})
		var b bytes.Buffer
		require.NoError(t, Write(&b, x))
		y, err := ReadAs(bytes.NewReader(b.Bytes()), d)
		require.NoError(t, err)
		require.Equal(t, x.F, y.F)
		raw, err := Read(bytes.NewReader(b.Bytes()))
		require.NoError(t, err)
		require.Equal(t, ir.U8, raw.Type.DType)
		for i := range x.F {
			bits := ir.Float8E4M3Bits(x.F[i])
			if d == ir.F8E5M2 {
				bits = ir.Float8E5M2Bits(x.F[i])
			}
			require.Equal(t, int64(bits), raw.I[i])
		}
	}
	x := interp.FromFloats(ir.TensorOf(ir.BF16, 2), []float64{1, -2.5})
	var b bytes.Buffer
	require.NoError(t, Write(&b, x))
	raw, err := Read(bytes.NewReader(b.Bytes()))
	require.NoError(t, err)
	require.Equal(t, []int64{int64(ir.BFloat16Bits(1)), int64(ir.BFloat16Bits(-2.5))}, raw.I)
}

// FuzzRead: no file makes Read panic or allocate more than the file
// holds, and what it reads writes back to a file that reads the same.
func FuzzRead(f *testing.F) {
	for _, d := range []ir.DType{ir.F32, ir.I64, ir.Bool, ir.BF16} {
		var b bytes.Buffer
		x := interp.New(ir.TensorOf(d, 2, 3))
		if err := Write(&b, x); err != nil {
			f.Fatal(err)
		}
		f.Add(b.Bytes())
	}
	f.Add([]byte("\x93NUMPY\x01\x00\x46\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 0), }\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := Read(bytes.NewReader(data))
		if err != nil {
			return
		}
		if n, _ := x.Type.Bytes(); n > int64(len(data)) {
			t.Fatalf("read %s from %d bytes", x.Type, len(data))
		}
		var b bytes.Buffer
		if err := Write(&b, x); err != nil {
			t.Fatalf("cannot write back %s: %v", x.Type, err)
		}
		y, err := Read(&b)
		if err != nil {
			t.Fatalf("written file does not read: %v", err)
		}
		if !y.Type.Equal(x.Type) || y.Len() != x.Len() {
			t.Fatalf("round trip changed %s to %s", x.Type, y.Type)
		}
		for i := 0; i < x.Len(); i++ {
			a, c := x.At(i), y.At(i)
			if a != c && !(a != a && c != c) {
				t.Fatalf("element %d: %v became %v", i, a, c)
			}
		}
	})
}
