package onnx

import (
	"github.com/kiln-compiler/kiln/ir"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// A tiny ONNX writer for tests: enough to build graphs by hand.

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendMsg(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

func appendVarint(b []byte, num protowire.Number, v int64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

type tNode struct {
	op      string
	name    string
	inputs  []string
	outputs []string
	ints    map[string][]int64
	floats  map[string]float32
	tensor  []byte // a "value" tensor attribute
	strs    map[string]string
	domain  string
	// floatLists are FLOATS attributes.
	floatLists map[string][]float32
}

func encTensorF32(name string, dims []int64, vals []float32) []byte {
	var b []byte
	for _, d := range dims {
		b = appendVarint(b, 1, d)
	}
	b = appendVarint(b, 2, 1)
	b = appendString(b, 8, name)
	raw := make([]byte, 0, 4*len(vals))
	for _, v := range vals {
		raw = protowire.AppendFixed32(raw, math.Float32bits(v))
	}
	return appendMsg(b, 9, raw)
}

func encTensorI64(name string, dims []int64, vals []int64) []byte {
	var b []byte
	for _, d := range dims {
		b = appendVarint(b, 1, d)
	}
	b = appendVarint(b, 2, 7)
	b = appendString(b, 8, name)
	var packed []byte
	for _, v := range vals {
		packed = protowire.AppendVarint(packed, uint64(v))
	}
	return appendMsg(b, 7, packed)
}

func encNode(n tNode) []byte {
	var b []byte
	for _, in := range n.inputs {
		b = appendString(b, 1, in)
	}
	for _, out := range n.outputs {
		b = appendString(b, 2, out)
	}
	b = appendString(b, 3, n.name)
	b = appendString(b, 4, n.op)
	if n.domain != "" {
		b = appendString(b, 7, n.domain)
	}
	for name, ints := range n.ints {
		var a []byte
		a = appendString(a, 1, name)
		if len(ints) == 1 && name != "perm" && name != "kernel_shape" && name != "pads" && name != "strides" && name != "shape" && name != "axes" {
			a = appendVarint(a, 3, ints[0])
			a = appendVarint(a, 20, 2)
		} else {
			for _, v := range ints {
				a = appendVarint(a, 8, v)
			}
			a = appendVarint(a, 20, 7)
		}
		b = appendMsg(b, 5, a)
	}
	for name, f := range n.floats {
		var a []byte
		a = appendString(a, 1, name)
		a = protowire.AppendTag(a, 2, protowire.Fixed32Type)
		a = protowire.AppendFixed32(a, math.Float32bits(f))
		a = appendVarint(a, 20, 1)
		b = appendMsg(b, 5, a)
	}
	for name, fs := range n.floatLists {
		var a []byte
		a = appendString(a, 1, name)
		for _, f := range fs {
			a = protowire.AppendTag(a, 7, protowire.Fixed32Type)
			a = protowire.AppendFixed32(a, math.Float32bits(f))
		}
		a = appendVarint(a, 20, 6)
		b = appendMsg(b, 5, a)
	}
	for name, v := range n.strs {
		var a []byte
		a = appendString(a, 1, name)
		a = appendString(a, 4, v)
		a = appendVarint(a, 20, 3)
		b = appendMsg(b, 5, a)
	}
	if n.tensor != nil {
		var a []byte
		a = appendString(a, 1, "value")
		a = appendMsg(a, 5, n.tensor)
		a = appendVarint(a, 20, 4)
		b = appendMsg(b, 5, a)
	}
	return b
}

func encValueInfo(name string, elem int64, dims []int64) []byte {
	var shape []byte
	for _, d := range dims {
		if d == -1 {
			shape = appendMsg(shape, 1, nil) // unknown: neither a size nor a name
			continue
		}
		shape = appendMsg(shape, 1, appendVarint(nil, 1, d)) // d < -1: an invalid negative size
	}
	tt := appendVarint(nil, 1, elem)
	tt = appendMsg(tt, 2, shape)
	return appendMsg(appendString(nil, 1, name), 2, appendMsg(nil, 1, tt))
}

type tGraph struct {
	nodes   []tNode
	inits   [][]byte
	inputs  [][]byte
	outputs [][]byte
	opset   int64
	info    [][]byte         // value_info
	domains map[string]int64 // other opset imports
}

func encModel(g tGraph) []byte {
	var gb []byte
	for _, n := range g.nodes {
		gb = appendMsg(gb, 1, encNode(n))
	}
	gb = appendString(gb, 2, "test_graph")
	for _, t := range g.inits {
		gb = appendMsg(gb, 5, t)
	}
	for _, in := range g.inputs {
		gb = appendMsg(gb, 11, in)
	}
	for _, out := range g.outputs {
		gb = appendMsg(gb, 12, out)
	}
	for _, vi := range g.info {
		gb = appendMsg(gb, 13, vi)
	}
	var m []byte
	m = appendVarint(m, 1, 8)
	op := g.opset
	if op == 0 {
		op = 17
	}
	m = appendMsg(m, 8, appendVarint(appendString(nil, 1, ""), 2, op))
	for d, v := range g.domains {
		m = appendMsg(m, 8, appendVarint(appendString(nil, 1, d), 2, v))
	}
	m = appendMsg(m, 7, gb)
	return m
}

// encTensorRaw is a TensorProto of ONNX data type dt holding the raw
// little-endian bytes of d.
func encTensorRaw(name string, dt int64, d *ir.Dense) []byte {
	var b []byte
	for _, n := range d.Type.Shape {
		b = appendVarint(b, 1, n)
	}
	b = appendVarint(b, 2, dt)
	b = appendString(b, 8, name)
	return appendMsg(b, 9, d.RawBytes())
}
