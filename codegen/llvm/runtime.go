package llvm

import (
	_ "embed"
	"encoding/json"
	"strconv"
	"strings"
	"text/template"

	"github.com/kiln-compiler/kiln/codegen/loops"
	kir "github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
)

// RuntimeHeader is kiln_runtime.h, the C ABI of a compiled step's
// runtime (--emit lib).
//
//go:embed kiln_runtime.h
var RuntimeHeader string

// The fixed C sources of every step's runtime and executable, and the
// header through which they read a step's generated tables.
var (
	//go:embed csrc/runtime.c
	runtimeC string
	// CheckpointSource is checkpoint.c, the .npz checkpoints shared by
	// the CPU and CUDA runtimes.
	//go:embed csrc/checkpoint.c
	CheckpointSource string
	// runtimeSource is runtime.c with the checkpoints and the fp8
	// conversions compiled code calls (loops.FP8C).
	runtimeSource = runtimeC + "\n" + CheckpointSource + "\n#define KILN_F8_FN\n" + loops.FP8C
	//go:embed csrc/driver.c
	driverSource string
	//go:embed csrc/kiln_program.h
	programHeader string
	//go:embed csrc/program.c.tmpl
	tablesSource string
)

var tablesTemplate = template.Must(template.New("program").Parse(tablesSource))

// TensorInfo describes one tensor of a compiled step, as kiln_descriptor
// lists it: arguments (parameters and state, then data inputs), then
// results.
type TensorInfo struct {
	Index    int     `json:"index"`
	Name     string  `json:"name"`
	Kind     string  `json:"kind"` // param, state, input or result
	Role     string  `json:"role"`
	DType    string  `json:"dtype"`
	Shape    []int64 `json:"shape"`
	Bytes    int64   `json:"bytes"`
	InOut    bool    `json:"inout"`
	Embedded bool    `json:"embedded"` // the program holds its initial value
	// Updates is how many times a step updates a running statistic (one
	// per batch-norm application: per microbatch with per-slice
	// statistics); absent otherwise.
	Updates int64 `json:"updates,omitempty"`
}

// Descriptor is the machine-readable description of a compiled step.
type Descriptor struct {
	Entry      string `json:"entry"`
	ArenaBytes int64  `json:"arena_bytes"`
	// WorkspaceBytes is the largest kernel's temporaries; the runtime's
	// block adds a packed matrix panel per thread.
	WorkspaceBytes int64        `json:"workspace_bytes"`
	Tensors        []TensorInfo `json:"tensors"`
}

// Describe lists p's tensors in the runtime's order.
func Describe(p *loops.Program) Descriptor {
	d := Descriptor{Entry: EntryName(p.Func), ArenaBytes: p.ArenaBytes, WorkspaceBytes: p.WorkspaceBytes(), Tensors: []TensorInfo{}}
	add := func(name, kind, role string, t kir.Type, inout, embedded bool) {
		d.Tensors = append(d.Tensors, TensorInfo{Index: len(d.Tensors), Name: name, Kind: kind, Role: role, DType: t.DType.String(),
			Shape: append([]int64{}, t.Shape...), Bytes: t.SizeBytes(), InOut: inout, Embedded: embedded})
	}
	for _, v := range p.Params {
		kind, role := "param", "param"
		if v.Arg != nil && v.Arg.Kind == kir.ArgState {
			kind, role = "state", "state"
		}
		if v.Arg != nil {
			role = v.Arg.Attrs.String("role", role)
		}
		add(v.Name, kind, role, v.Type, v.Arg != nil && v.Arg.InOut, embedded(v))
		if v.Arg != nil {
			d.Tensors[len(d.Tensors)-1].Updates = v.Arg.Attrs.Int("updates", 0)
		}
	}
	for _, v := range p.Inputs {
		add(v.Name, "input", "input", v.Type, false, false)
	}
	for i, r := range p.Func.Results {
		add(resultName(p.Func, i), "result", r.Role(), r.Value.Type, false, false)
	}
	return d
}

func embedded(v *kir.Value) bool {
	return v.Arg != nil && v.Arg.Init != nil && v.Arg.Init.Type.Equal(v.Type)
}

// programTensor is one row of program.c's tensor table (kiln_program.h).
type programTensor struct {
	Name, File, Descr, Shape, Type string // C literals but Descr
	Kind, Slot, Rank               int
	Bytes                          int64
	InOut                          int
	Init                           string // symbol of the embedded initial value, or ""
	Splat                          int    // 1: Init holds one element, every element's value
	ElemBytes                      int64
}

// programKernel is what the profile reports of a kernel besides its time:
// the bytes it reads and writes and its FLOPs, by the cost model.
type programKernel struct {
	Name         string
	Bytes, FLOPs int64
}

// Tables is the C source of p's tables (program.c, declared by
// kiln_program.h): its tensors, kernels, descriptor and sizes, and the
// embedded initial values (files InitFiles names, beside it). The
// runtime (runtime.c) and the executable (driver.c) are fixed sources
// that read them. threads is the executable's thread count (0: the
// cores online).
func Tables(p *loops.Program, threads int) (string, error) {
	return tables(p, threads, true)
}

// HostSources are the C files of p's runtime that do not depend on the
// backend: program.c (its tables, without kilnrt_entry: the backend's
// runtime runs the step), kiln_program.h, kiln_runtime.h, driver.c,
// checkpoint.c and the embedded initial values (InitFiles). The CUDA
// executable builds its host side from them.
func HostSources(p *loops.Program, threads int) (map[string][]byte, error) {
	src, err := tables(p, threads, false)
	if err != nil {
		return nil, err
	}
	files := InitFiles(p)
	files["program.c"], files["kiln_program.h"], files["kiln_runtime.h"] = []byte(src), []byte(programHeader), []byte(RuntimeHeader)
	files["driver.c"], files["checkpoint.c"] = []byte(driverSource), []byte(CheckpointSource)
	return files, nil
}

// tables is Tables; wrapper adds kilnrt_entry, which calls the LLVM
// entry point.
func tables(p *loops.Program, threads int, wrapper bool) (string, error) {
	desc := Describe(p)
	js, err := json.Marshal(desc)
	if err != nil {
		return "", err
	}
	data := struct {
		Entry, Descriptor          string
		ArenaBytes                 int64
		NParams, NInputs, NResults int
		StatusIndexOutOfRange      int
		Ranks, Threads             int64
		Wrapper                    bool
		Tensors                    []programTensor
		Kernels                    []programKernel
	}{Entry: desc.Entry, Descriptor: cString(string(js)), ArenaBytes: p.ArenaBytes,
		NParams: len(p.Params), NInputs: len(p.Inputs), NResults: len(p.Func.Results), StatusIndexOutOfRange: loops.StatusIndexOutOfRange,
		Ranks: Ranks(p), Threads: int64(threads), Wrapper: wrapper}
	var types []kir.Type // in the descriptor's order
	for _, v := range append(append([]*kir.Value{}, p.Params...), p.Inputs...) {
		types = append(types, v.Type)
	}
	for _, r := range p.Func.Results {
		types = append(types, r.Value.Type)
	}
	for i, t := range desc.Tensors {
		descr, err := npy.Descr(types[i].DType)
		if err != nil {
			return "", err
		}
		pt := programTensor{Name: cString(t.Name), Descr: descr, Rank: len(t.Shape), Bytes: t.Bytes, Type: cString(types[i].String()), ElemBytes: types[i].DType.Size()}
		file := FileName(t.Name)
		switch {
		case i < len(p.Params):
			pt.Slot = i
			file = FileName("updated." + t.Name)
			if embedded(p.Params[i]) {
				pt.Init = initSymbol(i)
				if p.Params[i].Arg.Init.IsSplat() {
					pt.Splat = 1
				}
			}
		case i < len(p.Params)+len(p.Inputs):
			pt.Kind, pt.Slot = 1, i-len(p.Params)
		default:
			pt.Kind, pt.Slot = 2, i-len(p.Params)-len(p.Inputs)
		}
		pt.File = cString(file)
		if t.InOut {
			pt.InOut = 1
		}
		dims := []string{"0"}
		if len(t.Shape) > 0 {
			dims = dims[:0]
			for _, s := range t.Shape {
				dims = append(dims, strconv.FormatInt(s, 10)+"LL")
			}
		}
		pt.Shape = strings.Join(dims, ", ")
		data.Tensors = append(data.Tensors, pt)
	}
	for _, k := range p.Kernels {
		var c kir.Cost
		if k.Op != nil {
			c = kir.OpCost(k.Op)
		}
		data.Kernels = append(data.Kernels, programKernel{Name: cString(k.Name), Bytes: c.BytesRead + c.BytesWritten, FLOPs: c.FLOPs})
	}
	var b strings.Builder
	if err := tablesTemplate.Execute(&b, data); err != nil {
		return "", err
	}
	return b.String(), nil
}
