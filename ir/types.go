package ir

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// DType is the element type of a tensor.
type DType uint8

// The element types Kiln knows.
const (
	Invalid DType = iota
	F64
	F32
	F16
	BF16
	F8E4M3
	F8E5M2
	I64
	I32
	I8
	Bool
	// Integer types that ONNX graph inputs and buffers have (a uint8
	// mask, int16 audio). Every backend computes integers in 64 bits and
	// narrows to the storage type when it stores (WrapInt), which is
	// exact for these: their values are int64 values.
	U8
	I16
	U16
	U32
	// U64 keeps its 64 bits in the same storage as I64; every operation
	// whose meaning differs for unsigned values (division, remainder,
	// comparison, max and min, conversion to and from floats) computes
	// unsigned (scalar.Uint).
	U64
)

var dtypeNames = [...]string{
	Invalid: "invalid", F64: "f64", F32: "f32", F16: "f16", BF16: "bf16",
	F8E4M3: "f8e4m3", F8E5M2: "f8e5m2", I64: "i64", I32: "i32", I8: "i8", Bool: "bool",
	U8: "u8", I16: "i16", U16: "u16", U32: "u32", U64: "u64",
}

var dtypeSizes = [...]int64{
	Invalid: 0, F64: 8, F32: 4, F16: 2, BF16: 2, F8E4M3: 1, F8E5M2: 1, I64: 8, I32: 4, I8: 1, Bool: 1,
	U8: 1, I16: 2, U16: 2, U32: 4, U64: 8,
}

// String returns the text-format spelling of d.
func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// Size is the size of one element in bytes.
func (d DType) Size() int64 {
	if int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d >= F64 && d <= F8E5M2 }

// IsInt reports whether d is an integer type (not bool).
func (d DType) IsInt() bool { return d >= I64 && d <= I8 || d >= U8 && d <= U64 }

// IsUnsigned reports whether d is an unsigned integer type.
func (d DType) IsUnsigned() bool { return d == U8 || d == U16 || d == U32 || d == U64 }

// WrapInt is v stored in d: the low bits of v, read as d reads them
// (two's complement for signed types), as a C cast does; bool is 0 or 1.
// Other dtypes return v (a u64 keeps v's 64 bits: its value is uint64(v)).
func (d DType) WrapInt(v int64) int64 {
	switch d {
	case I32:
		return int64(int32(v))
	case I16:
		return int64(int16(v))
	case I8:
		return int64(int8(v))
	case U32:
		return int64(uint32(v))
	case U16:
		return int64(uint16(v))
	case U8:
		return int64(uint8(v))
	case Bool:
		if v != 0 {
			return 1
		}
		return 0
	}
	return v
}

// ParseDType parses a dtype name such as "f32".
func ParseDType(s string) (DType, bool) {
	for i, n := range dtypeNames {
		if i != int(Invalid) && n == s {
			return DType(i), true
		}
	}
	return Invalid, false
}

// DTypeNames lists every valid dtype name, for error messages.
func DTypeNames() string { return strings.Join(dtypeNames[1:], ", ") }

// Shape is a static tensor shape; rank 0 is a scalar.
type Shape []int64

// NumElements is the product of the dimensions; ok is false on overflow
// of int64 or a negative dimension.
func (s Shape) NumElements() (n int64, ok bool) {
	n = 1
	for _, d := range s {
		if d < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		n = int64(lo)
	}
	return n, true
}

// Equal reports whether s and t have the same dimensions.
func (s Shape) Equal(t Shape) bool {
	if len(s) != len(t) {
		return false
	}
	for i := range s {
		if s[i] != t[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy of s.
func (s Shape) Clone() Shape { return append(Shape{}, s...) }

// Strides returns the row-major element strides of s.
func (s Shape) Strides() []int64 {
	st := make([]int64, len(s))
	acc := int64(1)
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= s[i]
	}
	return st
}

// String prints s as "[2,3]".
func (s Shape) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(d, 10))
	}
	b.WriteByte(']')
	return b.String()
}

// Type is a tensor type: a dtype and a static shape.
type Type struct {
	DType DType
	Shape Shape
}

// TensorOf is shorthand for Type{d, shape}.
func TensorOf(d DType, shape ...int64) Type { return Type{DType: d, Shape: Shape(shape)} }

// String prints t as "f32[2,3]".
func (t Type) String() string { return t.DType.String() + t.Shape.String() }

// Equal reports whether t and u are the same type.
func (t Type) Equal(u Type) bool { return t.DType == u.DType && t.Shape.Equal(u.Shape) }

// Rank is the number of dimensions.
func (t Type) Rank() int { return len(t.Shape) }

// NumElements is the number of elements; it is 0 when the count overflows
// (the verifier rejects such types).
func (t Type) NumElements() int64 {
	n, ok := t.Shape.NumElements()
	if !ok {
		return 0
	}
	return n
}

// Bytes is the size of a tensor of type t; ok is false when it overflows
// int64 or a dimension is negative.
func (t Type) Bytes() (n int64, ok bool) {
	e, ok := t.Shape.NumElements()
	if !ok {
		return 0, false
	}
	sz := t.DType.Size()
	if sz != 0 && e > math.MaxInt64/sz {
		return 0, false
	}
	return e * sz, true
}

// SizeBytes is Bytes for a type already verified not to overflow.
func (t Type) SizeBytes() int64 {
	n, _ := t.Bytes()
	return n
}
