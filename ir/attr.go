package ir

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
)

// AttrKind says which field of an Attr holds its value.
type AttrKind uint8

// The attribute kinds.
const (
	AttrInt AttrKind = iota + 1
	AttrFloat
	AttrString
	AttrBool
	AttrList
	AttrDense
	AttrType
)

func (k AttrKind) String() string {
	switch k {
	case AttrInt:
		return "int"
	case AttrFloat:
		return "float"
	case AttrString:
		return "string"
	case AttrBool:
		return "bool"
	case AttrList:
		return "list"
	case AttrDense:
		return "dense tensor"
	case AttrType:
		return "dtype"
	}
	return "unknown"
}

// Attr is one attribute value. Exactly the field named by Kind is set.
type Attr struct {
	Kind  AttrKind
	Int   int64
	Float float64
	Str   string
	Bool  bool
	List  []Attr
	Dense *Dense
	DType DType
}

// IntAttr, FloatAttr, ... build attribute values.
func IntAttr(v int64) Attr     { return Attr{Kind: AttrInt, Int: v} }
func FloatAttr(v float64) Attr { return Attr{Kind: AttrFloat, Float: v} }
func StringAttr(v string) Attr { return Attr{Kind: AttrString, Str: v} }
func BoolAttr(v bool) Attr     { return Attr{Kind: AttrBool, Bool: v} }
func DenseAttr(d *Dense) Attr  { return Attr{Kind: AttrDense, Dense: d} }
func TypeAttr(d DType) Attr    { return Attr{Kind: AttrType, DType: d} }

// IntsAttr builds a list of ints.
func IntsAttr(vs ...int64) Attr {
	l := make([]Attr, len(vs))
	for i, v := range vs {
		l[i] = IntAttr(v)
	}
	return Attr{Kind: AttrList, List: l}
}

// Ints returns the elements of an int list; ok is false if a is not one.
func (a Attr) Ints() ([]int64, bool) {
	if a.Kind != AttrList {
		return nil, false
	}
	out := make([]int64, len(a.List))
	for i, e := range a.List {
		if e.Kind != AttrInt {
			return nil, false
		}
		out[i] = e.Int
	}
	return out, true
}

// Equal reports deep equality.
func (a Attr) Equal(b Attr) bool {
	if a.Kind != b.Kind {
		return false
	}
	switch a.Kind {
	case AttrInt:
		return a.Int == b.Int
	case AttrFloat:
		return math.Float64bits(a.Float) == math.Float64bits(b.Float) || a.Float == b.Float
	case AttrString:
		return a.Str == b.Str
	case AttrBool:
		return a.Bool == b.Bool
	case AttrType:
		return a.DType == b.DType
	case AttrDense:
		return a.Dense.Equal(b.Dense)
	case AttrList:
		if len(a.List) != len(b.List) {
			return false
		}
		for i := range a.List {
			if !a.List[i].Equal(b.List[i]) {
				return false
			}
		}
		return true
	}
	return false
}

// Attrs is a set of named attributes. Printing sorts the names.
type Attrs map[string]Attr

// Keys returns the attribute names in sorted order.
func (as Attrs) Keys() []string {
	ks := make([]string, 0, len(as))
	for k := range as {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Clone returns a shallow copy (attribute values are immutable by convention).
func (as Attrs) Clone() Attrs {
	out := make(Attrs, len(as))
	for k, v := range as {
		out[k] = v
	}
	return out
}

// Equal reports whether both sets hold the same attributes.
func (as Attrs) Equal(bs Attrs) bool {
	if len(as) != len(bs) {
		return false
	}
	for k, v := range as {
		w, ok := bs[k]
		if !ok || !v.Equal(w) {
			return false
		}
	}
	return true
}

// Int returns the int attribute name, or def when it is absent.
func (as Attrs) Int(name string, def int64) int64 {
	if a, ok := as[name]; ok && a.Kind == AttrInt {
		return a.Int
	}
	return def
}

// Float returns the float attribute name (an int is accepted), or def.
func (as Attrs) Float(name string, def float64) float64 {
	if a, ok := as[name]; ok {
		switch a.Kind {
		case AttrFloat:
			return a.Float
		case AttrInt:
			return float64(a.Int)
		}
	}
	return def
}

// String returns the string attribute name, or def.
func (as Attrs) String(name string, def string) string {
	if a, ok := as[name]; ok && a.Kind == AttrString {
		return a.Str
	}
	return def
}

// Bool returns the bool attribute name, or def.
func (as Attrs) Bool(name string, def bool) bool {
	if a, ok := as[name]; ok && a.Kind == AttrBool {
		return a.Bool
	}
	return def
}

// Ints returns the int-list attribute name, or def.
func (as Attrs) Ints(name string, def []int64) []int64 {
	if a, ok := as[name]; ok {
		if v, ok := a.Ints(); ok {
			return v
		}
	}
	return def
}

// Dense is a constant tensor. Floating values are held as float64 and
// integer and bool values as int64, whatever the dtype; a Dense with one
// element and a larger shape is a splat (every element has that value).
type Dense struct {
	Type   Type
	Floats []float64 // float dtypes
	Ints   []int64   // integer and bool dtypes
}

// IsSplat reports whether d stores one value for a larger shape.
func (d *Dense) IsSplat() bool {
	n := d.Type.NumElements()
	return n != 1 && d.Len() == 1
}

// Len is the number of stored values.
func (d *Dense) Len() int {
	if d.Type.DType.IsFloat() {
		return len(d.Floats)
	}
	return len(d.Ints)
}

// Float returns element i as a float64 (splats repeat their value).
func (d *Dense) Float(i int64) float64 {
	if d.IsSplat() {
		i = 0
	}
	switch {
	case d.Type.DType.IsFloat():
		return d.Floats[i]
	case d.Type.DType == U64:
		return float64(uint64(d.Ints[i]))
	}
	return float64(d.Ints[i])
}

// Int returns element i as an int64 (splats repeat their value).
func (d *Dense) Int(i int64) int64 {
	if d.IsSplat() {
		i = 0
	}
	if d.Type.DType.IsFloat() {
		return int64(d.Floats[i])
	}
	return d.Ints[i]
}

// Validate checks that the stored values match the type.
func (d *Dense) Validate() error {
	n, ok := d.Type.Shape.NumElements()
	if !ok {
		return fmt.Errorf("dense constant of type %s has too many elements", d.Type)
	}
	l := int64(d.Len())
	if d.Type.DType.IsFloat() && len(d.Ints) != 0 || !d.Type.DType.IsFloat() && len(d.Floats) != 0 {
		return fmt.Errorf("dense constant of type %s holds values of the wrong kind", d.Type)
	}
	if l != n && !(l == 1 && n > 1) {
		return fmt.Errorf("dense constant of type %s has %d values, want %d", d.Type, l, n)
	}
	return nil
}

// Equal reports whether d and e are the same constant: the same type and
// the same elements (bitwise for floats), whether stored as a splat or not.
func (d *Dense) Equal(e *Dense) bool {
	if d == nil || e == nil {
		return d == e
	}
	if !d.Type.Equal(e.Type) || d.Validate() != nil || e.Validate() != nil {
		return false
	}
	n := d.Type.NumElements()
	for i := int64(0); i < n; i++ {
		if d.Type.DType.IsFloat() {
			if math.Float64bits(d.Float(i)) != math.Float64bits(e.Float(i)) {
				return false
			}
		} else if d.Int(i) != e.Int(i) {
			return false
		}
	}
	return true
}

// AllEqual reports whether every stored element has the same value (bitwise
// for floats), so that the constant can be written as a splat.
func (d *Dense) AllEqual() bool {
	for i := 1; i < d.Len(); i++ {
		if d.Type.DType.IsFloat() {
			if math.Float64bits(d.Floats[i]) != math.Float64bits(d.Floats[0]) {
				return false
			}
		} else if d.Ints[i] != d.Ints[0] {
			return false
		}
	}
	return d.Len() > 0
}

// RawBytes encodes every element little-endian in the tensor's dtype,
// as ONNX raw_data and the text format's hex form do; a splat gives all
// of its elements.
func (d *Dense) RawBytes() []byte {
	n := int64(d.Len())
	if d.IsSplat() {
		n = d.Type.NumElements()
	}
	return d.rawBytes(n)
}

// StoredBytes encodes the stored elements as RawBytes does: a splat's
// one value, once.
func (d *Dense) StoredBytes() []byte { return d.rawBytes(int64(d.Len())) }

// rawBytes encodes the first n elements.
func (d *Dense) rawBytes(n int64) []byte {
	sz := d.Type.DType.Size()
	out := make([]byte, n*sz)
	for i := int64(0); i < n; i++ {
		b := out[i*sz:]
		switch d.Type.DType {
		case F64:
			binary.LittleEndian.PutUint64(b, math.Float64bits(d.Float(i)))
		case F32:
			binary.LittleEndian.PutUint32(b, math.Float32bits(float32(d.Float(i))))
		case F16:
			binary.LittleEndian.PutUint16(b, Float16Bits(d.Float(i)))
		case BF16:
			binary.LittleEndian.PutUint16(b, BFloat16Bits(d.Float(i)))
		case F8E4M3:
			b[0] = Float8E4M3Bits(d.Float(i))
		case F8E5M2:
			b[0] = Float8E5M2Bits(d.Float(i))
		case I64, U64:
			binary.LittleEndian.PutUint64(b, uint64(d.Int(i)))
		case I32, U32:
			binary.LittleEndian.PutUint32(b, uint32(d.Int(i)))
		case I16, U16:
			binary.LittleEndian.PutUint16(b, uint16(d.Int(i)))
		case I8, U8, Bool:
			b[0] = byte(d.Int(i))
		}
	}
	return out
}

// DenseFromRaw decodes little-endian bytes of type t (the inverse of
// RawBytes). The length must be a whole number of elements.
func DenseFromRaw(t Type, raw []byte) (*Dense, error) {
	sz := t.DType.Size()
	if sz == 0 || int64(len(raw))%sz != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of %s elements", len(raw), t.DType)
	}
	n := int64(len(raw)) / sz
	d := &Dense{Type: t}
	if t.DType.IsFloat() {
		d.Floats = make([]float64, n)
	} else {
		d.Ints = make([]int64, n)
	}
	for i := int64(0); i < n; i++ {
		b := raw[i*sz:]
		switch t.DType {
		case F64:
			d.Floats[i] = math.Float64frombits(binary.LittleEndian.Uint64(b))
		case F32:
			d.Floats[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
		case F16:
			d.Floats[i] = Float16FromBits(binary.LittleEndian.Uint16(b))
		case BF16:
			d.Floats[i] = BFloat16FromBits(binary.LittleEndian.Uint16(b))
		case F8E4M3:
			d.Floats[i] = Float8E4M3FromBits(b[0])
		case F8E5M2:
			d.Floats[i] = Float8E5M2FromBits(b[0])
		case I64, U64:
			d.Ints[i] = int64(binary.LittleEndian.Uint64(b))
		case I32:
			d.Ints[i] = int64(int32(binary.LittleEndian.Uint32(b)))
		case I8:
			d.Ints[i] = int64(int8(b[0]))
		case U32:
			d.Ints[i] = int64(binary.LittleEndian.Uint32(b))
		case I16:
			d.Ints[i] = int64(int16(binary.LittleEndian.Uint16(b)))
		case U16:
			d.Ints[i] = int64(binary.LittleEndian.Uint16(b))
		case U8:
			d.Ints[i] = int64(b[0])
		case Bool:
			if b[0] != 0 {
				d.Ints[i] = 1
			}
		}
	}
	return d, d.Validate()
}
