package plancheck

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/ir"
)

// within reports whether [off, off+size) lies in [0, limit) without
// overflowing.
func within(off, size, limit int64) bool {
	return off >= 0 && size >= 0 && size <= limit && off <= limit-size
}

var (
	schemaOnce sync.Once
	schema     *jsonschema.Schema
	schemaErr  error
)

// validateSchema checks plan.json against cuda.Schema: every field's type,
// range and pattern (ids below 2^31, byte counts below 2^62, grid and
// block sizes at least 1, the arch sm_N, kernel names identifiers).
func validateSchema(raw []byte) error {
	schemaOnce.Do(func() {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(cuda.Schema))
		if err != nil {
			schemaErr = err
			return
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource("plan.schema.json", doc); err != nil {
			schemaErr = err
			return
		}
		schema, schemaErr = c.Compile("plan.schema.json")
	})
	if schemaErr != nil {
		return fmt.Errorf("internal error: the plan schema: %v", schemaErr)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	if err := schema.Validate(doc); err != nil {
		return fmt.Errorf("does not match the plan schema: %v", err)
	}
	return nil
}

// Signature is what kernels.cu says of a kernel: its parameters and its
// launch contract (the "// kiln launch:" line above it).
type Signature struct {
	Params  []Param
	Threads int64 // threads the kernel needs (grid × block at least)
	// MaxBlock is the kernel's __launch_bounds__: a block of more threads
	// fails to launch.
	MaxBlock int64
	Bytes    []int64  // bytes each pointer parameter may touch
	Modes    []string // how each pointer parameter is used: read, write or readwrite
	Outer    []int64  // extent of each scalar parameter (an outer loop index)
	Host     bool     // a C function called on the host, not a kernel
	// Cooperative: the kernel has grid-wide barriers and must be launched
	// cooperatively (a plain launch of it could wait forever on blocks
	// that never start).
	Cooperative bool
	// Calls are a cooperative kernel's stage calls in order: the phase
	// each runs in (phases are separated by grid-wide barriers) and the
	// parameters it touches, with how.
	Calls []Call
}

// Call is one stage call of a cooperative kernel: its phase, and the
// pointer parameters it touches (indices) with their modes.
type Call struct {
	Phase  int
	Params []int
	Modes  []string
}

// Param is one kernel parameter: a pointer to Elem (Const: read only) or
// a long long scalar.
type Param struct {
	Pointer bool
	Const   bool
	Elem    string
}

var (
	kernelRE = regexp.MustCompile(`(?m)^// kiln launch: threads=(\d+) bytes=([\d,]*) modes=([rw,]*) outer=([\d,]*)( cooperative=1 phases=([\d:rw./]*))?\nextern "C" __global__ void __launch_bounds__\((\d+)\) ([A-Za-z_][A-Za-z0-9_]*)\(([^)]*)\) \{$`)
	// hostRE is a host function (an update of offloaded parameters).
	hostRE  = regexp.MustCompile(`(?m)^// kiln host: threads=(\d+) bytes=([\d,]*) modes=([rw,]*) outer=([\d,]*)()()\nextern "C" void ()([A-Za-z_][A-Za-z0-9_]*)\(([^)]*)\) \{$`)
	paramRE = regexp.MustCompile(`^(const )?([a-z ]+?) \*(?:__restrict__ )?b\d+$|^long long v\d+$`)
)

// signatures reads the __global__ kernels of kernels.cu.
func signatures(src string) (map[string]Signature, error) {
	out := map[string]Signature{}
	kernels := kernelRE.FindAllStringSubmatch(src, -1)
	var err error
	for i, m := range append(kernels, hostRE.FindAllStringSubmatch(src, -1)...) {
		name := m[8]
		sig := Signature{Host: i >= len(kernels), Cooperative: m[5] != ""}
		if !sig.Host {
			if sig.MaxBlock, err = strconv.ParseInt(m[7], 10, 64); err != nil || sig.MaxBlock < 1 || sig.MaxBlock > 1024 {
				return nil, fmt.Errorf("kernel %s: __launch_bounds__(%s) is not 1 to 1024 threads", name, m[7])
			}
		}
		if sig.Cooperative {
			if sig.Calls, err = calls(m[6]); err != nil {
				return nil, fmt.Errorf("kernel %s: %v", name, err)
			}
		}
		for _, md := range strings.Split(m[3], ",") {
			switch md {
			case "r":
				sig.Modes = append(sig.Modes, "read")
			case "w":
				sig.Modes = append(sig.Modes, "write")
			case "rw":
				sig.Modes = append(sig.Modes, "readwrite")
			case "":
			default:
				return nil, fmt.Errorf("kernel %s: mode %q", name, md)
			}
		}
		if sig.Threads, err = strconv.ParseInt(m[1], 10, 64); err != nil {
			return nil, fmt.Errorf("kernel %s: threads %q", name, m[1])
		}
		if sig.Bytes, err = intList(m[2]); err != nil {
			return nil, fmt.Errorf("kernel %s: %v", name, err)
		}
		if sig.Outer, err = intList(m[4]); err != nil {
			return nil, fmt.Errorf("kernel %s: %v", name, err)
		}
		pointers, scalars := 0, 0
		if strings.TrimSpace(m[9]) != "" {
			for _, p := range strings.Split(m[9], ", ") {
				pm := paramRE.FindStringSubmatch(p)
				if pm == nil {
					return nil, fmt.Errorf("kernel %s: parameter %q is not one kiln writes", name, p)
				}
				if strings.HasPrefix(p, "long long v") {
					sig.Params = append(sig.Params, Param{})
					scalars++
				} else {
					sig.Params = append(sig.Params, Param{Pointer: true, Const: pm[1] != "", Elem: pm[2]})
					pointers++
				}
			}
		}
		if pointers != len(sig.Bytes) || pointers != len(sig.Modes) || scalars != len(sig.Outer) {
			return nil, fmt.Errorf("kernel %s: its launch line gives %d sizes and %d extents for %d pointers and %d scalars", name, len(sig.Bytes), len(sig.Outer), pointers, scalars)
		}
		for _, c := range sig.Calls {
			for _, j := range c.Params {
				if j >= pointers {
					return nil, fmt.Errorf("kernel %s: a stage call touches parameter %d of %d", name, j, pointers)
				}
			}
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("kernel %s is defined twice", name)
		}
		out[name] = sig
	}
	if n := strings.Count(src, "__global__ void") + strings.Count(src, "\nextern \"C\" void "); n != len(out) {
		return nil, fmt.Errorf("%d kernels and host functions, of which %d in the form kiln writes (a launch line above each)", n, len(out))
	}
	return out, nil
}

// calls reads a cooperative kernel's phases=: its stage calls, each
// PHASE:PARAM MODE.PARAM MODE..., separated by '/', phases not
// decreasing.
func calls(s string) ([]Call, error) {
	var out []Call
	for _, c := range strings.Split(s, "/") {
		ph, params, ok := strings.Cut(c, ":")
		n, err := strconv.Atoi(ph)
		if !ok || err != nil || n < 0 || (len(out) > 0 && n < out[len(out)-1].Phase) {
			return nil, fmt.Errorf("stage call %q is not PHASE:PARAMS in order", c)
		}
		call := Call{Phase: n}
		for _, p := range strings.Split(params, ".") {
			digits := strings.TrimRight(p, "rw")
			j, err := strconv.Atoi(digits)
			mode, known := map[string]string{"r": "read", "w": "write", "rw": "readwrite"}[p[len(digits):]]
			if err != nil || j < 0 || !known {
				return nil, fmt.Errorf("stage call %q: parameter %q is not INDEX MODE", c, p)
			}
			call.Params, call.Modes = append(call.Params, j), append(call.Modes, mode)
		}
		out = append(out, call)
	}
	return out, nil
}

// barriers checks that a cooperative launch's stage calls that touch a
// common byte, one writing, run in different phases: only the grid-wide
// barrier between phases orders one block's work against another's.
func barriers(i int, n cuda.Node, sig Signature) error {
	for a, c := range sig.Calls {
		for _, d := range sig.Calls[a+1:] {
			if d.Phase != c.Phase {
				break
			}
			for x, pj := range c.Params {
				for y, qj := range d.Params {
					p, q := n.Args[pj].Pointer, n.Args[qj].Pointer
					if p == nil || q == nil || (c.Modes[x] == "read" && d.Modes[y] == "read") {
						continue
					}
					if p.Space == q.Space && p.Slot == q.Slot && p.Offset < q.Offset+q.SizeBytes && q.Offset < p.Offset+p.SizeBytes {
						return fmt.Errorf("node %d: kernel %s runs two stages touching %s in phase %d, one writing, with no barrier between", i, n.Kernel, describeAccess(p), c.Phase)
					}
				}
			}
		}
	}
	return nil
}

func cooperativeName(c bool) string {
	if c {
		return "cooperatively"
	}
	return "plainly"
}

func intList(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a list of counts", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// CUDA's launch limits: grid dimensions, and the dynamic shared memory
// of one block without the opt-in attribute (48 KiB on every
// architecture; a plan has no way to ask for more).
const (
	maxGridX       = 1<<31 - 1
	maxGridYZ      = 65535
	maxSharedBytes = 48 << 10
)

// storage is the C element type of each dtype in kernels.cu.
var storage = map[string]string{"f32": "float", "f64": "double", "f16": "unsigned short", "bf16": "unsigned short",
	"i64": "long long", "i32": "int", "i8": "unsigned char", "bool": "unsigned char"}

// launches checks every kernel node against the kernel it launches and
// the op it runs: the kernel exists; its arguments match the parameters
// one for one (a pointer for a pointer, of the buffer's element type; a
// write access exactly where the parameter is not const); every access
// lies within its buffer; and the op's launches write every byte of its
// results.
func launches(p *cuda.Plan, f *ir.Func, kernels map[string]Signature) error {
	written := map[int]map[int]bool{} // op -> buffers written by its launches
	// Each kernel with scalar arguments runs once per point of its outer
	// loops: every tuple of scalars once.
	tuples := map[string]map[string]bool{}
	for i, n := range p.Nodes {
		for _, a := range accesses(n) {
			b := p.Buffers[a.Buffer]
			if a.Space != b.Space || a.Slot != b.Slot || !within(a.Offset-b.Offset, a.SizeBytes, b.SizeBytes) {
				return fmt.Errorf("node %d: an access of %s [%d, %d) in %s/%d is outside the buffer [%d, %d) in %s/%d",
					i, b.Values[0], a.Offset, a.Offset+a.SizeBytes, a.Space, a.Slot, b.Offset, b.Offset+b.SizeBytes, b.Space, b.Slot)
			}
			if a.Mode != "read" {
				if written[n.Op] == nil {
					written[n.Op] = map[int]bool{}
				}
				written[n.Op][a.Buffer] = true
			}
		}
		if n.Kind != "kernel" && n.Kind != "host" {
			continue
		}
		sig, ok := kernels[n.Kernel]
		if !ok || sig.Host != (n.Kind == "host") {
			return fmt.Errorf("node %d launches %s %q, which kernels.cu does not define", i, map[bool]string{true: "host function", false: "kernel"}[n.Kind == "host"], n.Kernel)
		}
		if len(n.Args) != len(sig.Params) {
			return fmt.Errorf("node %d: kernel %s takes %d arguments, the launch passes %d", i, n.Kernel, len(sig.Params), len(n.Args))
		}
		if n.Cooperative != sig.Cooperative || (n.Cooperative && n.Kind != "kernel") {
			return fmt.Errorf("node %d launches %s %s, which kernels.cu declares %s", i, n.Kernel, cooperativeName(n.Cooperative), cooperativeName(sig.Cooperative))
		}
		if sig.Cooperative && len(n.Args) == len(sig.Params) {
			if err := barriers(i, n, sig); err != nil {
				return err
			}
		}
		if n.Kind == "kernel" {
			if threads := int64(n.Grid[0]) * int64(n.Grid[1]) * int64(n.Grid[2]) * int64(n.Block[0]) * int64(n.Block[1]) * int64(n.Block[2]); threads < sig.Threads {
				return fmt.Errorf("node %d: kernel %s needs %d threads, the launch has %d", i, n.Kernel, sig.Threads, threads)
			}
			if b := n.Block; b[0]*b[1]*b[2] > 1024 || b[2] > 64 {
				return fmt.Errorf("node %d: block %v is larger than CUDA allows (1024 threads, z at most 64)", i, *b)
			}
			if b := n.Block; int64(b[0])*int64(b[1])*int64(b[2]) > sig.MaxBlock {
				return fmt.Errorf("node %d: a block of %d threads, but kernel %s is compiled for at most %d (__launch_bounds__)", i, b[0]*b[1]*b[2], n.Kernel, sig.MaxBlock)
			}
			if g := n.Grid; g[0] > maxGridX || g[1] > maxGridYZ || g[2] > maxGridYZ {
				return fmt.Errorf("node %d: grid %v is larger than CUDA allows (x at most 2^31-1, y and z at most 65535)", i, *g)
			}
			if n.SharedBytes > maxSharedBytes {
				return fmt.Errorf("node %d: %d bytes of shared memory, more than a block may have (%d)", i, n.SharedBytes, maxSharedBytes)
			}
		}
		var tuple []int64
		ptr, sc := 0, 0
		for j, a := range n.Args {
			prm := sig.Params[j]
			if prm.Pointer != (a.Kind == "pointer") {
				return fmt.Errorf("node %d: argument %d of kernel %s is a %s, the launch passes a %s", i, j, n.Kernel, kindName(prm.Pointer), a.Kind)
			}
			if !prm.Pointer {
				if a.Value < 0 || a.Value >= sig.Outer[sc] {
					return fmt.Errorf("node %d: scalar argument %d of kernel %s is %d, outside its loop [0, %d)", i, j, n.Kernel, a.Value, sig.Outer[sc])
				}
				tuple = append(tuple, a.Value)
				sc++
				continue
			}
			if a.Pointer.SizeBytes != sig.Bytes[ptr] {
				return fmt.Errorf("node %d: argument %d of kernel %s may touch %d bytes, the launch declares %d", i, j, n.Kernel, sig.Bytes[ptr], a.Pointer.SizeBytes)
			}
			if a.Pointer.Mode != sig.Modes[ptr] {
				return fmt.Errorf("node %d: kernel %s uses argument %d as %s, the launch declares %s", i, n.Kernel, j, sig.Modes[ptr], a.Pointer.Mode)
			}
			ptr++
			b := p.Buffers[a.Pointer.Buffer]
			if storage[b.DType] != prm.Elem {
				return fmt.Errorf("node %d: argument %d of kernel %s points to %s, but buffer %s holds %s", i, j, n.Kernel, prm.Elem, b.Values[0], b.DType)
			}
			if writes := a.Pointer.Mode != "read"; writes == prm.Const {
				return fmt.Errorf("node %d: argument %d of kernel %s is %s, but the launch says %s", i, j, n.Kernel, constName(prm.Const), a.Pointer.Mode)
			}
		}
		key := fmt.Sprint(n.Op, tuple)
		if tuples[n.Kernel] == nil {
			tuples[n.Kernel] = map[string]bool{}
		}
		if tuples[n.Kernel][key] {
			return fmt.Errorf("node %d: kernel %s runs twice for op %d at loop indices %v", i, n.Kernel, n.Op, tuple)
		}
		tuples[n.Kernel][key] = true
	}
	for name, seen := range tuples {
		points := int64(1)
		for _, e := range kernels[name].Outer {
			points *= e
		}
		ops := map[string]bool{}
		for key := range seen {
			op, _, _ := strings.Cut(key, " ")
			ops[op] = true
		}
		if want := points * int64(len(ops)); int64(len(seen)) != want {
			return fmt.Errorf("kernel %s runs %d times, but its loops have %d points for each of %d ops", name, len(seen), points, len(ops))
		}
	}
	for opIndex, op := range f.Body {
		d := op.Def()
		if d != nil && (d.View || d.Host) {
			continue
		}
		for _, r := range op.Results {
			id, ok := bufferOf(p, r.Name)
			if !ok || p.Buffers[id].Space != "device" {
				continue
			}
			if !written[opIndex][id] {
				return fmt.Errorf("op %d (%s defining %s): no launch of it writes %s", opIndex, op.Kind, r.Ref(), p.Buffers[id].Values[0])
			}
		}
	}
	return nil
}

func bufferOf(p *cuda.Plan, value string) (int, bool) {
	for _, b := range p.Buffers {
		for _, v := range b.Values {
			if v == value {
				return b.ID, true
			}
		}
	}
	return 0, false
}

func kindName(pointer bool) string {
	if pointer {
		return "pointer"
	}
	return "scalar"
}

func constName(c bool) string {
	if c {
		return "read only (const)"
	}
	return "written"
}

// describeAccess names an access's bytes.
func describeAccess(a *cuda.Access) string {
	return fmt.Sprintf("[%d, %d) of %s/%d", a.Offset, a.Offset+a.SizeBytes, a.Space, a.Slot)
}
