package onnx

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// The default-domain opsets Kiln reads; each op is read with the
// semantics of the model's opset (see opsetOf in convert.go).
const (
	minOpset = 6
	maxOpset = 28
)

// Options control an import.
type Options struct {
	// Name is the model's file name, used in locations and messages.
	Name string
	// Dir is where external tensor data files are looked up.
	Dir string
	// DataInputs names the graph inputs that are data; default: the first.
	DataInputs []string
	// Batch, when positive, replaces the first dimension of every data input.
	Batch int64
	// Trainable, when not nil, names the float initializers and inputs
	// that are parameters; the others are state (read, not trained: a
	// loss's class weights, a buffer). Nil: every one is a parameter.
	Trainable []string
	// Groups gives parameters their optimizer parameter group (the
	// argument attribute group; absent: group 0).
	Groups map[string]int64
	// RunningVar is how a training-mode BatchNormalization updates its
	// running variance: "unbiased" (PyTorch's nn.BatchNorm), "population"
	// (the ONNX spec's BatchNormalization-15), or "" for the model's
	// producer's: unbiased when producer_name is "pytorch", the spec's
	// otherwise.
	RunningVar string
	// Eval reads a graph exported in training mode as its module's eval
	// mode (PyTorch's module.eval()): batch norms normalise with their
	// running statistics, which they leave as they are, and dropout
	// passes its input through. The parameters keep their names, where an
	// export in eval mode folds batch norms into convolutions.
	Eval bool
	// Value, when not nil, gives the value of a graph input, or nil when
	// it is not known. The import asks for one, and specialises the graph
	// to it (a constant, no longer an argument), only where a node needs
	// it at import time: a Reduce's axes, a Resize's sizes, a Tile's
	// repeats given as graph inputs.
	Value func(name string) (*interp.Tensor, error)
}

// NeedsValueError is an import refused because a node needs, at import
// time, a value computed from graph inputs whose values were not given.
type NeedsValueError struct {
	Inputs []string // the graph inputs it depends on, in graph order
	msg    string
}

func (e *NeedsValueError) Error() string { return e.msg }

// ImportFile reads an .onnx file.
func ImportFile(path string, opt Options) (*ir.Module, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if opt.Name == "" {
		opt.Name = filepath.Base(path)
	}
	if opt.Dir == "" {
		opt.Dir = filepath.Dir(path)
	}
	return Import(data, opt)
}

// Import converts a serialized ModelProto into a module with one function
// named after the graph.
func Import(data []byte, opt Options) (*ir.Module, error) {
	if opt.Name == "" {
		opt.Name = "model.onnx"
	}
	m, err := parseModel(data)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot decode the model: %v", opt.Name, err)
	}
	version := int64(-1)
	for _, o := range m.Opsets {
		switch o.Domain {
		case "", "ai.onnx":
			version = o.Version
		case previewTraining:
			if o.Version != 1 {
				return nil, fmt.Errorf("%s: operator domain %q version %d is not supported (Kiln reads version 1)", opt.Name, o.Domain, o.Version)
			}
		case "ai.onnx.ml", "ai.onnx.training", "com.microsoft":
			// Imported domains a model may declare without using; a node
			// in one is reported by checkSupported.
		default:
			return nil, fmt.Errorf("%s: operator domain %q (version %d) is not supported; Kiln reads the default ONNX domain", opt.Name, o.Domain, o.Version)
		}
	}
	if version == -1 && !usesDefaultDomain(m.Graph) {
		// A graph of training-domain operators alone needs no default
		// opset; read it as at the newest.
		version = maxOpset
	}
	if version >= 1 && version < minOpset {
		// Below opset 6, only graphs of operators whose definition did
		// not change before opset 6: they read as at opset 6.
		for _, n := range m.Graph.Nodes {
			if !sameSinceOpset1[n.OpType] || n.Domain != "" && n.Domain != "ai.onnx" {
				return nil, fmt.Errorf("%s: default-domain opset %d is not supported (Kiln reads opsets %d to %d, and below %d graphs of operators unchanged since opset 1; node %q is %s)", opt.Name, version, minOpset, maxOpset, minOpset, n.Name, n.OpType)
			}
		}
	} else if version < minOpset || version > maxOpset {
		return nil, fmt.Errorf("%s: default-domain opset %d is not supported (Kiln reads opsets %d to %d)", opt.Name, version, minOpset, maxOpset)
	}
	if err := checkSupported(m.Graph, opt.Name); err != nil {
		return nil, err
	}
	for _, n := range m.Graph.Nodes {
		if first, ok := introduced[n.OpType]; ok && version < first {
			return nil, fmt.Errorf("%s: node %q (%s): %s was added to ONNX in opset %d, and the model declares opset %d", opt.Name, n.Name, n.OpType, n.OpType, first, version)
		}
	}
	unbiased := m.ProducerName == "pytorch"
	switch opt.RunningVar {
	case "":
	case "unbiased", "population":
		unbiased = opt.RunningVar == "unbiased"
	default:
		return nil, fmt.Errorf("%s: the running variance update is unbiased or population, not %q", opt.Name, opt.RunningVar)
	}
	bound := map[string]*interp.Tensor{}
	var im *importer
	var f *ir.Func
	for {
		im = &importer{opt: opt, opset: version, producer: map[string]*node{}, vals: map[string]entry{}, consts: map[*interp.Tensor]*ir.Value{}, bound: bound, inputOf: map[*ir.Value]string{}, unbiased: unbiased}
		f, err = im.run(m.Graph)
		var need *NeedsValueError
		if !errors.As(err, &need) {
			break
		}
		more := false
		for _, name := range need.Inputs {
			if opt.Value == nil || bound[name] != nil {
				continue
			}
			x, verr := opt.Value(name)
			if verr != nil {
				return nil, verr
			}
			if x != nil {
				bound[name], more = x, true
			}
		}
		if !more {
			break
		}
	}
	if err != nil {
		if im.declaredBatch > 0 && im.declaredBatch != opt.Batch {
			// Shape arithmetic that the exporter kept as ops is re-derived
			// for the new batch; numbers it baked in cannot be.
			return nil, fmt.Errorf("%w (the model was exported with a fixed batch of %d, and the exporter baked shapes computed from it into constants; export with dynamic_axes={'<input>': {0: 'batch'}} to change the batch)", err, im.declaredBatch)
		}
		return nil, err
	}
	return &ir.Module{Funcs: []*ir.Func{f}}, nil
}

// sameSinceOpset1 are the operators whose version 1 is their definition
// through opset 6 (the operator changelog: no version 2 to 6), so that a
// graph of them at opsets 1 to 5 reads as at opset 6.
var sameSinceOpset1 = map[string]bool{
	"GlobalAveragePool": true, "GlobalMaxPool": true, "Not": true, "Softplus": true, "Softsign": true,
	"Identity": true, "Shape": true, "Size": true, "Transpose": true, "Softmax": true, "LogSoftmax": true,
	"Hardmax": true, "Squeeze": true, "Unsqueeze": true, "Flatten": true, "LRN": true, "MatMul": true,
	"ArgMax": true, "ArgMin": true, "ReduceSum": true, "ReduceMean": true, "ReduceMax": true, "ReduceMin": true,
	"ReduceProd": true, "ReduceL1": true, "ReduceL2": true, "ReduceLogSum": true, "ReduceLogSumExp": true,
	"ReduceSumSquare": true, "Gather": true, "Slice": true,
}

// introduced is the opset that added each operator Kiln reads after
// opset 6 (the ONNX operator changelog); a node of an older model that
// uses one is invalid.
var introduced = map[string]int64{
	"Expand": 8, "Where": 9, "Erf": 9, "Shrink": 9, "OneHot": 9, "Sign": 9, "Mod": 10, "Resize": 10,
	"Range": 11, "CumSum": 11, "GatherElements": 11, "ScatterElements": 11, "GatherND": 11, "ScatterND": 11, "Round": 11, "Einsum": 12, "Celu": 12, "GreaterOrEqual": 12,
	"LessOrEqual": 12, "SoftmaxCrossEntropyLoss": 12, "NegativeLogLikelihoodLoss": 12, "Trilu": 14, "HardSwish": 14,
	"LayerNormalization": 17, "Mish": 18, "GroupNormalization": 18, "Gelu": 20,
}

// unreadable names the operators whose results Kiln cannot represent.
var unreadable = map[string]string{
	"NonZero": "its result's shape depends on the data", "Unique": "its result's shape depends on the data",
	"NonMaxSuppression": "its result's shape depends on the data",
	"StringNormalizer":  "it works on strings", "RegexFullMatch": "it works on strings", "StringConcat": "it works on strings",
	"StringSplit":       "it works on strings",
	"SequenceConstruct": "it works on sequences", "SequenceAt": "it works on sequences", "SequenceEmpty": "it works on sequences",
	"SequenceInsert": "it works on sequences", "SequenceErase": "it works on sequences", "SequenceLength": "it works on sequences",
	"SplitToSequence": "it works on sequences", "ConcatFromSequence": "it works on sequences",
	"SequenceMap": "it works on sequences", "Optional": "it works on optional values",
	"OptionalGetElement": "it works on optional values", "OptionalHasElement": "it works on optional values",
	"Scan": "it runs a subgraph over a sequence axis (control flow), which Kiln does not unroll",
	"Loop": "its trip count and results' shapes are known only at run time",
}

// checkSupported lists every op type Kiln cannot import, with counts.
func checkSupported(g *graph, name string) error {
	bad := map[string]int{}
	for _, n := range g.Nodes {
		if why, ok := unreadable[n.OpType]; ok && (n.Domain == "" || n.Domain == "ai.onnx") {
			nm := n.Name
			if nm == "" {
				nm = n.OpType
			}
			return fmt.Errorf("%s: node %q (%s): %s; Kiln plans static shapes and tensors of numbers", name, nm, n.OpType, why)
		}
		key := opKey(n)
		if converters[key] != nil {
			continue
		}
		bad[key]++
	}
	if len(bad) == 0 {
		return nil
	}
	keys := make([]string, 0, len(bad))
	for k := range bad {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s (%d)", k, bad[k])
	}
	return fmt.Errorf("%s: unsupported ONNX ops: %s", name, strings.Join(parts, ", "))
}

// entry is an ONNX value during import: a runtime value, or a constant
// known at import time (shape arithmetic), or neither (a missing optional
// input).
type entry struct {
	v *ir.Value
	k *interp.Tensor
}

func (e entry) typ() ir.Type {
	if e.v != nil {
		return e.v.Type
	}
	return e.k.Type
}

// frozen reports whether Options.Trainable leaves name out.
func (im *importer) frozen(name string) bool {
	return im.opt.Trainable != nil && !slices.Contains(im.opt.Trainable, name)
}

func (e entry) missing() bool { return e.v == nil && e.k == nil }

type importer struct {
	opt      Options
	opset    int64
	producer map[string]*node // the node computing each value
	// declaredBatch is the first dimension the first data input was
	// exported with (-1: symbolic), which --batch replaces.
	declaredBatch int64
	f             *ir.Func
	vals          map[string]entry
	consts        map[*interp.Tensor]*ir.Value
	n             *node
	seeds         int64
	bound         map[string]*interp.Tensor // graph inputs specialised to their Options.Value
	inputOf       map[*ir.Value]string      // the graph input each non-initializer argument is
	readAsConst   map[*ir.Value]*node       // float initializers a node read as constants (initializerConst), and the first such node
	unbiased      bool                      // training batch norm's running variance: unbiased (PyTorch) or population (ONNX)
	// accumulating marks the ops emitted while it is set as steps of a
	// reduction or scan written out as elementwise ops (ir.AttrAccumulator).
	accumulating bool
	// quantized maps the integer output of a QuantizeLinear (8 or 16
	// bits) to the same values as floats, which a DequantizeLinear of it
	// reads instead: the fake quantiser stays a float chain that the
	// gradient can pass through (autodiff's ste approximation).
	quantized map[string]entry
}

// checkArity holds a node to its operator's input count, with its
// required inputs present.
func (im *importer) checkArity(in []entry) error {
	a, ok := arity[opKey(im.n)]
	if l, old := legacyArity[im.n.OpType]; old && im.opset < l.before {
		a = l.arity
	}
	if !ok {
		return im.errorf("internal error: no arity for %s", im.n.OpType)
	}
	if len(in) < a[0] || len(in) > a[1] {
		switch {
		case a[0] == a[1]:
			return im.errorf("takes %d inputs, the node has %d", a[0], len(in))
		case a[1] == many:
			return im.errorf("takes at least %d inputs, the node has %d", a[0], len(in))
		}
		return im.errorf("takes %d to %d inputs, the node has %d", a[0], a[1], len(in))
	}
	for j := 0; j < a[0]; j++ {
		if in[j].missing() {
			return im.errorf("input %d is required, but the node leaves it empty", j)
		}
	}
	return nil
}

func (im *importer) errorf(format string, args ...any) error {
	return fmt.Errorf("%s: node %s (%s): %s", im.opt.Name, strconv.Quote(im.n.Name), im.n.OpType, fmt.Sprintf(format, args...))
}

func dtypeOf(t int64) (ir.DType, bool) {
	switch t {
	case 1:
		return ir.F32, true
	case 2:
		return ir.U8, true
	case 3:
		return ir.I8, true
	case 4:
		return ir.U16, true
	case 5:
		return ir.I16, true
	case 12:
		return ir.U32, true
	case 13:
		return ir.U64, true
	case 6:
		return ir.I32, true
	case 7:
		return ir.I64, true
	case 9:
		return ir.Bool, true
	case 10:
		return ir.F16, true
	case 11:
		return ir.F64, true
	case 16:
		return ir.BF16, true
	case 17:
		return ir.F8E4M3, true
	case 19:
		return ir.F8E5M2, true
	}
	return ir.Invalid, false
}

// externalData reads a tensor's bytes from an external data file: a
// relative location that resolves, symbolic links followed, inside the
// model's folder, with an offset and length (default: the tensor's size)
// that are integers within the file.
func (im *importer) externalData(name string, ext map[string]string, size int64) ([]byte, error) {
	loc := ext["location"]
	if loc == "" || filepath.IsAbs(loc) {
		return nil, fmt.Errorf("tensor %q has an invalid external data location %q", name, loc)
	}
	dir, err := filepath.EvalSymlinks(im.opt.Dir)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: external data: %v", name, err)
	}
	path, err := filepath.EvalSymlinks(filepath.Join(dir, loc))
	if err != nil {
		return nil, fmt.Errorf("tensor %q: external data: %v", name, err)
	}
	if rel, err := filepath.Rel(dir, path); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("tensor %q: external data location %q resolves outside the model's folder", name, loc)
	}
	num := func(key string, def int64) (int64, error) {
		v, ok := ext[key]
		if !ok {
			return def, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("tensor %q: external data %s %q is not a non-negative integer", name, key, v)
		}
		return n, nil
	}
	off, err := num("offset", 0)
	if err != nil {
		return nil, err
	}
	length, err := num("length", size)
	if err != nil {
		return nil, err
	}
	if length != size {
		return nil, fmt.Errorf("tensor %q: external data length %d, but the tensor has %d bytes", name, length, size)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: external data: %v", name, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("tensor %q: external data %s is not a regular file", name, loc)
	}
	if off > st.Size() || length > st.Size()-off {
		return nil, fmt.Errorf("tensor %q: external data range [%d, %d+%d) is outside %s (%d bytes)", name, off, off, length, loc, st.Size())
	}
	raw := make([]byte, length)
	if _, err := fh.ReadAt(raw, off); err != nil {
		return nil, fmt.Errorf("tensor %q: external data: %v", name, err)
	}
	return raw, nil
}

// decodeTensor reads a TensorProto's values (raw, typed or external).
func (im *importer) decodeTensor(t *tensor) (*interp.Tensor, error) {
	dt, ok := dtypeOf(t.DataType)
	if !ok {
		return nil, fmt.Errorf("tensor %q is %s: %s", t.Name, onnxTypeName(t.DataType), unreadableType(t.DataType))
	}
	for _, d := range t.Dims {
		if d < 0 {
			return nil, fmt.Errorf("tensor %q has a negative dimension", t.Name)
		}
	}
	ty := ir.Type{DType: dt, Shape: ir.Shape(t.Dims)}
	n, ok := ty.Shape.NumElements()
	size, ok2 := ty.Bytes()
	if !ok || !ok2 {
		return nil, fmt.Errorf("tensor %q of shape %v is too large", t.Name, t.Dims)
	}
	raw := t.RawData
	if t.DataLocation == 1 {
		var err error
		if raw, err = im.externalData(t.Name, t.External, size); err != nil {
			return nil, err
		}
	} else if !t.HasRaw {
		// Typed fields.
		var d ir.Dense
		d.Type = ty
		switch dt {
		case ir.F32:
			for _, v := range t.FloatData {
				d.Floats = append(d.Floats, float64(v))
			}
		case ir.F64:
			d.Floats = t.DoubleData
		case ir.I64:
			d.Ints = t.Int64Data
		case ir.I32, ir.I16, ir.I8, ir.U16, ir.U8, ir.Bool:
			for _, v := range t.Int32Data {
				d.Ints = append(d.Ints, dt.WrapInt(int64(v)))
			}
		case ir.U32, ir.U64:
			for _, v := range t.Uint64Data {
				d.Ints = append(d.Ints, dt.WrapInt(int64(v)))
			}
		case ir.F16, ir.BF16, ir.F8E4M3, ir.F8E5M2:
			bits := make([]byte, 0, len(t.Int32Data)*2)
			for _, v := range t.Int32Data {
				if dt.Size() == 2 {
					bits = append(bits, byte(v), byte(v>>8))
				} else {
					bits = append(bits, byte(v))
				}
			}
			dd, err := ir.DenseFromRaw(ty, bits)
			if err != nil {
				return nil, fmt.Errorf("tensor %q: %v", t.Name, err)
			}
			d = *dd
		}
		if int64(d.Len()) != n {
			return nil, fmt.Errorf("tensor %q has %d values for shape %v", t.Name, d.Len(), t.Dims)
		}
		return interp.FromDense(&d), nil
	}
	if int64(len(raw)) != size {
		return nil, fmt.Errorf("tensor %q has %d bytes of data, shape %v of %s needs %d", t.Name, len(raw), t.Dims, dt, size)
	}
	d, err := ir.DenseFromRaw(ty, raw)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %v", t.Name, err)
	}
	return interp.FromDense(d), nil
}

func (im *importer) run(g *graph) (*ir.Func, error) {
	name := g.Name
	if name == "" {
		name = "main"
	}
	im.f = &ir.Func{Name: name}
	inits := map[string]*tensor{}
	for _, t := range g.Initializer {
		if inits[t.Name] != nil {
			return nil, fmt.Errorf("%s: initializer %q is given twice", im.opt.Name, t.Name)
		}
		inits[t.Name] = t
	}
	declared := map[string]bool{}
	for _, vi := range append(append(append([]*valueInfo{}, g.Inputs...), g.Outputs...), g.ValueInfo...) {
		for i, d := range vi.Dims {
			if d < 0 && vi.DimNames[i] == "" && vi.DimSet[i] {
				return nil, fmt.Errorf("%s: value %q declares dimension %d as %d; a dimension is a size of 0 or more, or a symbolic name", im.opt.Name, vi.Name, i, d)
			}
		}
	}
	for _, vi := range g.Inputs {
		if declared[vi.Name] {
			return nil, fmt.Errorf("%s: graph input %q is declared twice; an ONNX value has one definition", im.opt.Name, vi.Name)
		}
		declared[vi.Name] = true
	}
	// Inputs that are not initializers, in order.
	var inputs []*valueInfo
	for _, vi := range g.Inputs {
		if inits[vi.Name] == nil {
			inputs = append(inputs, vi)
		}
	}
	data := map[string]bool{}
	if len(im.opt.DataInputs) > 0 {
		for _, d := range im.opt.DataInputs {
			found := false
			for _, vi := range inputs {
				found = found || vi.Name == d
			}
			if !found {
				return nil, fmt.Errorf("%s: --data-inputs names %q, which is not a graph input", im.opt.Name, d)
			}
			data[d] = true
		}
	} else if len(inputs) > 0 {
		data[inputs[0].Name] = true
	}
	state := stateInputs(g)
	for _, vi := range inputs {
		dt, ok := dtypeOf(vi.ElemType)
		if !ok {
			return nil, fmt.Errorf("%s: input %q is %s: %s", im.opt.Name, vi.Name, onnxTypeName(vi.ElemType), unreadableType(vi.ElemType))
		}
		shape := ir.Shape{}
		for i, d := range vi.Dims {
			if d < 0 {
				if i == 0 && im.opt.Batch > 0 && data[vi.Name] {
					d = im.opt.Batch
				} else {
					return nil, fmt.Errorf("%s: input %q has a symbolic dimension %q; Kiln needs static shapes (re-export with fixed sizes, or --batch for the first)", im.opt.Name, vi.Name, vi.DimNames[i])
				}
			}
			shape = append(shape, d)
		}
		if !vi.HasShape {
			return nil, fmt.Errorf("%s: input %q has no shape", im.opt.Name, vi.Name)
		}
		if im.opt.Batch > 0 && data[vi.Name] && len(shape) > 0 {
			if im.declaredBatch == 0 {
				im.declaredBatch = -1
				if vi.DimNames[0] == "" {
					im.declaredBatch = vi.Dims[0]
				}
			}
			shape[0] = im.opt.Batch
		}
		if x := im.bound[vi.Name]; x != nil {
			x = bitsAs(x, dt)
			if x.Type.DType != dt || !x.Type.Shape.Equal(shape) {
				return nil, fmt.Errorf("%s: input %q is %s, but the value given for it is %s", im.opt.Name, vi.Name, ir.Type{DType: dt, Shape: shape}, x.Type)
			}
			im.vals[vi.Name] = entry{k: x}
			continue
		}
		kind := ir.ArgParam
		switch {
		case data[vi.Name]:
			kind = ir.ArgData
		case state[vi.Name] || im.frozen(vi.Name):
			kind = ir.ArgState
		}
		im.addArg(vi.Name, ir.Type{DType: dt, Shape: shape}, kind, nil)
		im.inputOf[im.vals[vi.Name].v] = vi.Name
	}
	for _, t := range g.Initializer {
		im.n = &node{Name: t.Name, OpType: "initializer"}
		x, err := im.decodeTensor(t)
		if err != nil {
			return nil, fmt.Errorf("%s: initializer: %v", im.opt.Name, err)
		}
		if !x.Type.DType.IsFloat() {
			im.vals[t.Name] = entry{k: x} // integer initializers are constants (shapes, indices)
			continue
		}
		kind := ir.ArgParam
		if state[t.Name] || im.frozen(t.Name) {
			kind = ir.ArgState
		}
		im.addArg(t.Name, x.Type, kind, x.ToDense())
	}
	if err := im.runNodes(g.Nodes); err != nil {
		return nil, err
	}
	listed := map[string]bool{}
	for _, vi := range g.Outputs {
		if listed[vi.Name] {
			return nil, fmt.Errorf("%s: graph output %q is listed twice", im.opt.Name, vi.Name)
		}
		listed[vi.Name] = true
		e, ok := im.vals[vi.Name]
		if !ok {
			return nil, fmt.Errorf("%s: graph output %q is never computed", im.opt.Name, vi.Name)
		}
		v := e.v
		if v == nil {
			v = im.materialize(e.k)
		}
		im.f.Results = append(im.f.Results, ir.Result{Name: vi.Name, Value: v})
	}
	if err := im.dropConstInitializers(); err != nil {
		return nil, err
	}
	for _, vi := range append(append([]*valueInfo{}, g.Outputs...), g.ValueInfo...) {
		if err := im.checkDeclared(vi); err != nil {
			return nil, err
		}
	}
	return im.f, nil
}

// checkDeclared compares the shape and element type a model declares for
// a value with the ones Kiln computed: a mismatch means Kiln read the
// model differently from its exporter, and is an error naming the node
// that computes the value. Symbolic dimensions match the batch given by
// --batch when it replaced them, and anything otherwise.
func (im *importer) checkDeclared(vi *valueInfo) error {
	e, ok := im.vals[vi.Name]
	if !ok || e.missing() {
		return nil // a value_info for a value no node computes is ignored
	}
	t := e.typ()
	where := fmt.Sprintf("%s: value %q", im.opt.Name, vi.Name)
	if n := im.producer[vi.Name]; n != nil {
		where = fmt.Sprintf("%s: node %s (%s), output %q", im.opt.Name, strconv.Quote(n.Name), n.OpType, vi.Name)
	}
	if dt, ok := dtypeOf(vi.ElemType); ok && vi.ElemType != 0 && dt != t.DType {
		return fmt.Errorf("%s: the model declares element type %s, Kiln computes %s", where, dt, t.DType)
	}
	if !vi.HasShape {
		return nil
	}
	if len(vi.Dims) != t.Rank() {
		return fmt.Errorf("%s: the model declares shape %s, Kiln computes %s", where, declaredShape(vi), t.Shape)
	}
	for i, d := range vi.Dims {
		if im.opt.Batch > 0 && d == im.declaredBatch {
			continue // --batch replaced the batch the model was exported with
		}
		if d >= 0 && vi.DimNames[i] == "" && d != t.Shape[i] {
			return fmt.Errorf("%s: the model declares shape %s, Kiln computes %s", where, declaredShape(vi), t.Shape)
		}
	}
	return nil
}

func declaredShape(vi *valueInfo) string {
	parts := make([]string, len(vi.Dims))
	for i, d := range vi.Dims {
		switch {
		case vi.DimNames[i] != "":
			parts[i] = vi.DimNames[i]
		case d < 0:
			parts[i] = "?"
		default:
			parts[i] = strconv.FormatInt(d, 10)
		}
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// runNodes converts nodes in order.
func (im *importer) runNodes(nodes []*node) error {
	for i, n := range nodes {
		im.n = n
		if n.Name == "" {
			n.Name = fmt.Sprintf("%s_%d", n.OpType, i)
		}
		convert := converters[opKey(n)]
		if convert == nil {
			return im.errorf("unsupported ONNX op (domain %q)", n.Domain) // inside a subgraph
		}
		in := make([]entry, len(n.Inputs))
		for j, name := range n.Inputs {
			if name == "" {
				continue
			}
			e, ok := im.vals[name]
			if !ok {
				return im.errorf("input %q is not defined before this node", name)
			}
			in[j] = e
		}
		if err := im.checkArity(in); err != nil {
			return err
		}
		outs, err := convert(im, n, in)
		if err != nil {
			return err
		}
		for j, name := range n.Outputs {
			if name == "" || j >= len(outs) {
				continue
			}
			if _, dup := im.vals[name]; dup {
				by := "a graph input or initializer"
				if p := im.producer[name]; p != nil {
					by = fmt.Sprintf("node %s (%s)", strconv.Quote(p.Name), p.OpType)
				}
				return im.errorf("output %q is already defined by %s; an ONNX value has one definition", name, by)
			}
			im.vals[name] = outs[j]
			im.producer[name] = n
		}
	}
	return nil
}

func (im *importer) addArg(name string, t ir.Type, kind ir.ArgKind, init *ir.Dense) {
	v := &ir.Value{Name: im.f.UniqueName(name), Type: t, Index: len(im.f.Args), Arg: &ir.ArgInfo{Kind: kind, Init: init}, Offset: ir.NoOffset}
	if k := im.opt.Groups[name]; k != 0 && kind == ir.ArgParam {
		v.Arg.Attrs = ir.Attrs{"group": ir.IntAttr(k)}
	}
	im.f.Args = append(im.f.Args, v)
	im.vals[name] = entry{v: v}
}

// stateInputs finds inputs used only as batch-norm mean or variance.
func stateInputs(g *graph) map[string]bool {
	asStat, other := map[string]bool{}, map[string]bool{}
	for _, n := range g.Nodes {
		for j, in := range n.Inputs {
			if n.OpType == "BatchNormalization" && (j == 3 || j == 4) {
				asStat[in] = true
			} else {
				other[in] = true
			}
		}
	}
	out := map[string]bool{}
	for n := range asStat {
		if !other[n] {
			out[n] = true
		}
	}
	return out
}

// loc is the location of the current node.
func (im *importer) loc() ir.Location { return ir.Location{File: im.opt.Name, Name: im.n.Name} }

// materialize turns a constant into a constant op (once per constant).
func (im *importer) materialize(k *interp.Tensor) *ir.Value {
	if v, ok := im.consts[k]; ok {
		return v
	}
	base := "const"
	if im.n != nil && len(im.n.Outputs) > 0 && im.n.Outputs[0] != "" {
		base = im.n.Outputs[0] + ".const"
	}
	op, err := im.f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(k.ToDense())}, im.loc(), base)
	if err != nil {
		panic(err) // a constant's type is always valid
	}
	im.f.Body = append(im.f.Body, op)
	im.consts[k] = op.Results[0]
	return op.Results[0]
}

// foldLimit is the largest result (in elements) folded at import time.
const foldLimit = 1 << 22

// emit creates an op of kind from operand entries. When every operand is a
// constant the op is evaluated at import time (shape arithmetic folds).
// Result names come from the node's outputs.
func (im *importer) emit(kind string, in []entry, attrs ir.Attrs) ([]entry, error) {
	allConst := true
	for _, e := range in {
		allConst = allConst && e.k != nil
	}
	d := ir.Lookup(kind)
	if allConst && len(in) > 0 && d != nil && !d.Impure && kind != "dropout" {
		types := make([]ir.Type, len(in))
		tmp := make([]*ir.Value, len(in))
		vals := make([]*interp.Tensor, len(in))
		for i, e := range in {
			types[i] = e.k.Type
			tmp[i] = &ir.Value{Name: "t" + strconv.Itoa(i), Type: e.k.Type, Offset: ir.NoOffset}
			vals[i] = e.k
		}
		out, err := d.InferTypes(types, attrs)
		if err != nil {
			return nil, im.errorf("%v", err)
		}
		elems := int64(0)
		for _, t := range out {
			elems += t.NumElements()
		}
		if elems <= foldLimit { // a larger result is emitted as an op instead
			return im.fold(kind, tmp, vals, out, attrs)
		}
	}
	operands := make([]*ir.Value, len(in))
	for i, e := range in {
		if e.v != nil {
			operands[i] = e.v
		} else {
			operands[i] = im.materialize(e.k)
		}
	}
	base := kind
	if len(im.n.Outputs) > 0 && im.n.Outputs[0] != "" {
		base = im.n.Outputs[0]
	}
	if im.accumulating {
		attrs = attrs.Clone()
		attrs[ir.AttrAccumulator] = ir.BoolAttr(true)
	}
	op, err := im.f.NewOp(kind, operands, attrs, im.loc(), base)
	if err != nil {
		return nil, im.errorf("%v", err)
	}
	for i, r := range op.Results {
		if i < len(im.n.Outputs) && im.n.Outputs[i] != "" && i > 0 {
			r.Name = im.f.UniqueName(im.n.Outputs[i])
		}
	}
	im.f.Body = append(im.f.Body, op)
	outs := make([]entry, len(op.Results))
	for i, r := range op.Results {
		outs[i] = entry{v: r}
	}
	return outs, nil
}

// fold evaluates an op on constant operands at import time.
func (im *importer) fold(kind string, tmp []*ir.Value, vals []*interp.Tensor, out []ir.Type, attrs ir.Attrs) ([]entry, error) {
	if kind == "div" && !vals[1].Type.DType.IsFloat() {
		// Kiln defines x/0 as 0 for integers; ONNX leaves it undefined,
		// and in shape arithmetic it means the model is wrong.
		for _, d := range vals[1].I {
			if d == 0 {
				return nil, im.errorf("integer division by zero in values known at import time (shape arithmetic)")
			}
		}
	}
	op := &ir.Op{Kind: kind, Operands: tmp, Attrs: attrs}
	for i, t := range out {
		op.Results = append(op.Results, &ir.Value{Name: "r" + strconv.Itoa(i), Type: t, Def: op, Index: i, Offset: ir.NoOffset})
	}
	res, err := interp.EvalOp(op, vals)
	if err != nil {
		return nil, im.errorf("folding: %v", err)
	}
	outs := make([]entry, len(res))
	for i, r := range res {
		outs[i] = entry{k: r}
	}
	return outs, nil
}

// constInts returns input i as integers; it must be known at import time.
func (im *importer) constInts(in []entry, i int, what string) ([]int64, error) {
	if i >= len(in) || in[i].missing() {
		return nil, nil
	}
	k := in[i].k
	if k == nil {
		if k = im.initializerConst(in[i]); k == nil {
			return nil, im.needConstant(in[i], what)
		}
	}
	if !k.Type.DType.IsFloat() {
		return append([]int64(nil), k.I...), nil // exact: INT64_MAX stays
	}
	out := make([]int64, k.Len())
	for j := range out {
		out[j] = int64(k.At(j))
	}
	return out, nil
}

func (im *importer) constFloat(in []entry, i int, def float64, what string) (float64, error) {
	if i >= len(in) || in[i].missing() {
		return def, nil
	}
	k := in[i].k
	if k == nil {
		if k = im.initializerConst(in[i]); k == nil {
			return 0, im.needConstant(in[i], what)
		}
	}
	if k.Len() != 1 {
		return 0, im.errorf("%s must be a scalar", what)
	}
	return k.At(0), nil
}

// initializerConst is the value of e when e is a float initializer (an
// argument with the initializer's value, not a graph input) that a node
// reads as a constant (Resize's scales, as onnx-simplifier and tf2onnx
// write them): the value it has at import. The node is recorded; after the
// import an initializer read so must have no other use (it would change
// as a parameter while the shapes stay what its initial value gave), and
// it is no longer an argument. nil for anything else.
func (im *importer) initializerConst(e entry) *interp.Tensor {
	v := e.v
	if v == nil || v.Arg == nil || v.Arg.Init == nil {
		return nil
	}
	if _, input := im.inputOf[v]; input {
		return nil
	}
	if im.readAsConst == nil {
		im.readAsConst = map[*ir.Value]*node{}
	}
	if _, ok := im.readAsConst[v]; !ok {
		im.readAsConst[v] = im.n
	}
	return interp.FromDense(v.Arg.Init)
}

// dropConstInitializers removes the arguments of initializers that nodes
// only read as constants, or refuses one that is also used as a tensor.
func (im *importer) dropConstInitializers() error {
	if len(im.readAsConst) == 0 {
		return nil
	}
	used := map[*ir.Value]bool{}
	for _, op := range im.f.Body {
		for _, x := range op.Operands {
			used[x] = true
		}
	}
	for _, r := range im.f.Results {
		used[r.Value] = true
	}
	args := im.f.Args[:0]
	for _, a := range im.f.Args {
		if n, ok := im.readAsConst[a]; ok {
			if used[a] {
				return fmt.Errorf("%s: node %s (%s) reads initializer %q as a constant (its value at import fixes shapes), and other nodes use it as a tensor; give the node a constant of its own", im.opt.Name, strconv.Quote(n.Name), n.OpType, a.Name)
			}
			continue
		}
		a.Index = len(args)
		args = append(args, a)
	}
	im.f.Args = args
	return nil
}

func attr(n *node, name string) *attribute {
	for _, a := range n.Attrs {
		if a.Name == name {
			return a
		}
	}
	return nil
}

func attrInt(n *node, name string, def int64) int64 {
	if a := attr(n, name); a != nil {
		return a.I
	}
	return def
}

func attrFloat(n *node, name string, def float64) float64 {
	if a := attr(n, name); a != nil {
		return float64(a.F)
	}
	return def
}

func attrInts(n *node, name string) []int64 {
	if a := attr(n, name); a != nil {
		return a.Ints
	}
	return nil
}

func attrString(n *node, name string, def string) string {
	if a := attr(n, name); a != nil {
		return string(a.S)
	}
	return def
}

// f32 rounds an ONNX float attribute (stored as float32) for Kiln's
// float64 attributes: the shortest decimal that is the same float32.
func f32(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', -1, 32), 64)
	if math.IsNaN(v) {
		return x
	}
	return v
}

// needConstant is the error for an operand that a node needs at import
// time but that is computed at run time. When it is computed from graph
// inputs alone (no parameter), it is a NeedsValueError naming them: with
// their values from Options.Value the import specialises the graph.
func (im *importer) needConstant(e entry, what string) error {
	var inputs []string
	pure := true
	seen := map[*ir.Value]bool{}
	var walk func(v *ir.Value)
	walk = func(v *ir.Value) {
		if seen[v] {
			return
		}
		seen[v] = true
		if v.Arg != nil {
			if name, ok := im.inputOf[v]; ok {
				inputs = append(inputs, name)
			} else {
				pure = false
			}
			return
		}
		if v.Def == nil {
			pure = false
			return
		}
		for _, o := range v.Def.Operands {
			walk(o)
		}
	}
	if e.v != nil {
		walk(e.v)
	}
	if !pure || len(inputs) == 0 {
		return im.errorf("%s must be a constant (computable from static shapes); Kiln needs static shapes", what)
	}
	slices.SortFunc(inputs, func(a, b string) int { return im.argIndex(a) - im.argIndex(b) })
	give := make([]string, len(inputs))
	for i, n := range inputs {
		give[i] = fmt.Sprintf("--input %s=FILE.npy", n)
	}
	which := fmt.Sprintf("graph input %q: give its value", inputs[0])
	if len(inputs) > 1 {
		which = fmt.Sprintf("graph inputs %s: give their values", quoteAll(inputs))
	}
	return &NeedsValueError{Inputs: inputs, msg: im.errorf("Kiln needs %s when it imports the model (static shapes), from %s with %s", what, which, strings.Join(give, " ")).Error()}
}

func (im *importer) argIndex(name string) int {
	for v, n := range im.inputOf {
		if n == name {
			return v.Index
		}
	}
	return -1
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// onnxTypeNames are TensorProto.DataType's names.
var onnxTypeNames = map[int64]string{0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64",
	8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64", 14: "COMPLEX64", 15: "COMPLEX128",
	16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4",
	23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2"}

func onnxTypeName(t int64) string {
	if n, ok := onnxTypeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("ONNX data type %d", t)
}

// unreadableType says why Kiln does not read an ONNX element type.
func unreadableType(t int64) string {
	switch t {
	case 0:
		return "no element type (an optional or sequence value, or a malformed model); Kiln reads tensors of numbers"
	case 8:
		return "Kiln computes on numbers, not strings"
	case 14, 15:
		return "Kiln has no complex numbers"
	}
	if _, ok := onnxTypeNames[t]; ok {
		return "Kiln does not read this element type (it reads FLOAT, DOUBLE, FLOAT16, BFLOAT16, FLOAT8E4M3FN, FLOAT8E5M2, INT64, INT32, INT16, INT8, UINT64, UINT32, UINT16, UINT8 and BOOL)"
	}
	return "not an element type ONNX defines"
}

// previewTraining is the ONNX domain of the optimizer operators (Adam,
// Adagrad, Momentum), version 1.
const previewTraining = "ai.onnx.preview.training"

// opKey is the key of n's operator in converters and arity: its type in
// the default domain, "domain.type" in another.
func opKey(n *node) string {
	if n.Domain == "" || n.Domain == "ai.onnx" {
		return n.OpType
	}
	return n.Domain + "." + n.OpType
}

// usesDefaultDomain reports whether a node of g (subgraphs included) is
// an operator of the default domain.
func usesDefaultDomain(g *graph) bool {
	for _, n := range g.Nodes {
		if n.Domain == "" || n.Domain == "ai.onnx" {
			return true
		}
		for _, a := range n.Attrs {
			if a.G != nil && usesDefaultDomain(a.G) {
				return true
			}
		}
	}
	return false
}

// bitsAs reads a value given for a bf16 or fp8 input as the bits of
// that type when it comes as uint16 or uint8 (numpy, and so .npy files,
// have no bf16 or fp8), as npy.ReadAs does for run-time inputs; any
// other value is returned as it is.
func bitsAs(x *interp.Tensor, dt ir.DType) *interp.Tensor {
	var from func(int64) float64
	switch {
	case dt == ir.BF16 && x.Type.DType == ir.U16:
		from = func(b int64) float64 { return ir.BFloat16FromBits(uint16(b)) }
	case dt == ir.F8E4M3 && x.Type.DType == ir.U8:
		from = func(b int64) float64 { return ir.Float8E4M3FromBits(uint8(b)) }
	case dt == ir.F8E5M2 && x.Type.DType == ir.U8:
		from = func(b int64) float64 { return ir.Float8E5M2FromBits(uint8(b)) }
	default:
		return x
	}
	y := interp.New(ir.Type{DType: dt, Shape: x.Type.Shape})
	for i, b := range x.I {
		y.F[i] = from(b)
	}
	return y
}
