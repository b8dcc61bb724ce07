package onnx

import (
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// The subset of onnx.proto that Kiln reads.

type model struct {
	IRVersion    int64
	ProducerName string
	Opsets       []opset
	Graph        *graph
}

type opset struct {
	Domain  string
	Version int64
}

type graph struct {
	Name        string
	Nodes       []*node
	Initializer []*tensor
	Inputs      []*valueInfo
	Outputs     []*valueInfo
	ValueInfo   []*valueInfo // declared types of intermediate values
}

type node struct {
	Inputs  []string
	Outputs []string
	Name    string
	OpType  string
	Domain  string
	Attrs   []*attribute
}

type attribute struct {
	Name    string
	Type    int64
	F       float32
	I       int64
	S       []byte
	T       *tensor
	G       *graph // a subgraph (If's branches)
	Floats  []float32
	Ints    []int64
	Strings [][]byte
	HasF    bool
	HasI    bool
}

type tensor struct {
	Dims         []int64
	DataType     int64
	FloatData    []float32
	Int32Data    []int32
	Int64Data    []int64
	DoubleData   []float64
	Uint64Data   []uint64
	Name         string
	RawData      []byte
	HasRaw       bool
	External     map[string]string
	DataLocation int64
}

type valueInfo struct {
	Name     string
	ElemType int64
	Dims     []int64
	DimNames []string // symbolic dimensions ("" where the dimension is a number)
	DimSet   []bool   // whether dim_value is given (a negative one is invalid)
	HasShape bool
}

var errTruncated = errors.New("truncated or malformed protobuf")

// fields walks the fields of one message, calling fn with each field's
// number, wire type and raw value bytes (for varints, the value in v).
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		var v uint64
		var data []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			v = uint64(x)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			data, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		if err := fn(num, typ, v, data); err != nil {
			return err
		}
	}
	return nil
}

// packed decodes a repeated scalar field that may be packed (bytes) or not.
func packedVarints(typ protowire.Type, v uint64, data []byte, out *[]uint64) error {
	if typ == protowire.VarintType {
		*out = append(*out, v)
		return nil
	}
	if typ != protowire.BytesType {
		return errTruncated
	}
	for len(data) > 0 {
		x, n := protowire.ConsumeVarint(data)
		if n < 0 {
			return errTruncated
		}
		*out = append(*out, x)
		data = data[n:]
	}
	return nil
}

func packedFixed32(typ protowire.Type, v uint64, data []byte, out *[]uint32) error {
	if typ == protowire.Fixed32Type {
		*out = append(*out, uint32(v))
		return nil
	}
	if typ != protowire.BytesType || len(data)%4 != 0 {
		return errTruncated
	}
	for len(data) > 0 {
		x, _ := protowire.ConsumeFixed32(data)
		*out = append(*out, x)
		data = data[4:]
	}
	return nil
}

func packedFixed64(typ protowire.Type, v uint64, data []byte, out *[]uint64) error {
	if typ == protowire.Fixed64Type {
		*out = append(*out, v)
		return nil
	}
	if typ != protowire.BytesType || len(data)%8 != 0 {
		return errTruncated
	}
	for len(data) > 0 {
		x, _ := protowire.ConsumeFixed64(data)
		*out = append(*out, x)
		data = data[8:]
	}
	return nil
}

func parseModel(b []byte) (*model, error) {
	m := &model{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		switch num {
		case 1:
			m.IRVersion = int64(v)
		case 2:
			m.ProducerName = string(data)
		case 8:
			var o opset
			err := fields(data, func(num protowire.Number, _ protowire.Type, v uint64, data []byte) error {
				switch num {
				case 1:
					o.Domain = string(data)
				case 2:
					o.Version = int64(v)
				}
				return nil
			})
			m.Opsets = append(m.Opsets, o)
			return err
		case 7:
			if typ != protowire.BytesType {
				return errTruncated
			}
			g, err := parseGraph(data, 0)
			m.Graph = g
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if m.Graph == nil {
		return nil, fmt.Errorf("the model has no graph")
	}
	return m, nil
}

// maxSubgraphDepth bounds graphs nested in node attributes (If branches).
const maxSubgraphDepth = 32

func parseGraph(b []byte, depth int) (*graph, error) {
	if depth > maxSubgraphDepth {
		return nil, fmt.Errorf("subgraphs are nested more than %d deep", maxSubgraphDepth)
	}
	g := &graph{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		if typ != protowire.BytesType && (num == 1 || num == 2 || num == 5 || num == 11 || num == 12 || num == 13) {
			return errTruncated
		}
		switch num {
		case 1:
			n, err := parseNode(data, depth)
			g.Nodes = append(g.Nodes, n)
			return err
		case 2:
			g.Name = string(data)
		case 5:
			t, err := parseTensor(data)
			g.Initializer = append(g.Initializer, t)
			return err
		case 11, 12, 13:
			vi, err := parseValueInfo(data)
			switch num {
			case 11:
				g.Inputs = append(g.Inputs, vi)
			case 12:
				g.Outputs = append(g.Outputs, vi)
			default:
				g.ValueInfo = append(g.ValueInfo, vi)
			}
			return err
		}
		return nil
	})
	return g, err
}

func parseNode(b []byte, depth int) (*node, error) {
	n := &node{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		switch num {
		case 1:
			n.Inputs = append(n.Inputs, string(data))
		case 2:
			n.Outputs = append(n.Outputs, string(data))
		case 3:
			n.Name = string(data)
		case 4:
			n.OpType = string(data)
		case 7:
			n.Domain = string(data)
		case 5:
			if typ != protowire.BytesType {
				return errTruncated
			}
			a, err := parseAttribute(data, depth)
			n.Attrs = append(n.Attrs, a)
			return err
		}
		return nil
	})
	return n, err
}

func parseAttribute(b []byte, depth int) (*attribute, error) {
	a := &attribute{}
	var floats []uint32
	var ints []uint64
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		switch num {
		case 1:
			a.Name = string(data)
		case 20:
			a.Type = int64(v)
		case 2:
			a.F, a.HasF = math.Float32frombits(uint32(v)), true
		case 3:
			a.I, a.HasI = int64(v), true
		case 4:
			a.S = data
		case 5:
			if typ != protowire.BytesType {
				return errTruncated
			}
			t, err := parseTensor(data)
			a.T = t
			return err
		case 6:
			if typ != protowire.BytesType {
				return errTruncated
			}
			g, err := parseGraph(data, depth+1)
			a.G = g
			return err
		case 7:
			return packedFixed32(typ, v, data, &floats)
		case 8:
			return packedVarints(typ, v, data, &ints)
		case 9:
			a.Strings = append(a.Strings, data)
		}
		return nil
	})
	for _, f := range floats {
		a.Floats = append(a.Floats, math.Float32frombits(f))
	}
	for _, i := range ints {
		a.Ints = append(a.Ints, int64(i))
	}
	return a, err
}

func parseTensor(b []byte) (*tensor, error) {
	t := &tensor{}
	var dims, i32, i64, u64 []uint64
	var f32 []uint32
	var f64 []uint64
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		switch num {
		case 1:
			return packedVarints(typ, v, data, &dims)
		case 2:
			t.DataType = int64(v)
		case 4:
			return packedFixed32(typ, v, data, &f32)
		case 5:
			return packedVarints(typ, v, data, &i32)
		case 7:
			return packedVarints(typ, v, data, &i64)
		case 8:
			t.Name = string(data)
		case 9:
			t.RawData, t.HasRaw = data, true
		case 10:
			return packedFixed64(typ, v, data, &f64)
		case 11:
			return packedVarints(typ, v, data, &u64)
		case 13:
			var key, val string
			err := fields(data, func(num protowire.Number, _ protowire.Type, _ uint64, data []byte) error {
				if num == 1 {
					key = string(data)
				} else if num == 2 {
					val = string(data)
				}
				return nil
			})
			if t.External == nil {
				t.External = map[string]string{}
			}
			t.External[key] = val
			return err
		case 14:
			t.DataLocation = int64(v)
		}
		return nil
	})
	for _, d := range dims {
		t.Dims = append(t.Dims, int64(d))
	}
	for _, x := range f32 {
		t.FloatData = append(t.FloatData, math.Float32frombits(x))
	}
	for _, x := range i32 {
		t.Int32Data = append(t.Int32Data, int32(x))
	}
	for _, x := range i64 {
		t.Int64Data = append(t.Int64Data, int64(x))
	}
	for _, x := range f64 {
		t.DoubleData = append(t.DoubleData, math.Float64frombits(x))
	}
	t.Uint64Data = u64
	return t, err
}

func parseValueInfo(b []byte) (*valueInfo, error) {
	vi := &valueInfo{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		switch num {
		case 1:
			vi.Name = string(data)
		case 2: // TypeProto
			return fields(data, func(num protowire.Number, _ protowire.Type, _ uint64, data []byte) error {
				if num != 1 { // tensor_type
					return nil
				}
				return fields(data, func(num protowire.Number, _ protowire.Type, v uint64, data []byte) error {
					switch num {
					case 1:
						vi.ElemType = int64(v)
					case 2: // TensorShapeProto
						vi.HasShape = true
						return fields(data, func(num protowire.Number, _ protowire.Type, _ uint64, data []byte) error {
							if num != 1 {
								return nil
							}
							dim, name, set := int64(-1), "", false
							err := fields(data, func(num protowire.Number, _ protowire.Type, v uint64, data []byte) error {
								if num == 1 {
									dim, set = int64(v), true
								} else if num == 2 {
									name = string(data)
								}
								return nil
							})
							vi.Dims = append(vi.Dims, dim)
							vi.DimNames = append(vi.DimNames, name)
							vi.DimSet = append(vi.DimSet, set)
							return err
						})
					}
					return nil
				})
			})
		}
		return nil
	})
	return vi, err
}
