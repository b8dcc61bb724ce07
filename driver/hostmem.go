package driver

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
)

// hostTensorBytes is what kiln run holds per element of a host tensor:
// the interpreter and the values handed to a compiled program keep every
// element as a float64 or an int64.
const hostTensorBytes = 8

// hostBytesNeeded estimates the memory kiln run needs on the host for f:
// with the interpreter, the most elements live at once in schedule order
// (arguments throughout, each value from its op to its last use, results
// to the end); with a compiled program, its arguments and results (the
// program's own arena comes on top); and with either, one .npy file's
// bytes, as each input is read and each result written whole, one at a
// time. A quarter more is the Go runtime's headroom: the collector runs
// with a memory limit at what is available (limitHeap), so garbage stays
// near that, but a heap also holds freed spans and its own structures
// (measured under RLIMIT_AS: a 512 MiB result needed 2.15 GiB where the
// live tensors were 1.5 GiB, 2026-12-07).
func hostBytesNeeded(f *ir.Func, interpreted bool) int64 {
	need := satAdd(liveHostBytes(f, interpreted), largestFile(f))
	return satAdd(need, need/4)
}

// largestFile is the bytes of the largest argument or result as a .npy
// file.
func largestFile(f *ir.Func) int64 {
	var n int64
	for _, a := range f.Args {
		n = max(n, a.Type.SizeBytes())
	}
	for _, r := range f.Results {
		n = max(n, r.Value.Type.SizeBytes())
	}
	return n
}

// liveHostBytes is the most bytes of tensors kiln run holds at once (8
// per element).
func liveHostBytes(f *ir.Func, interpreted bool) int64 {
	elems := func(v *ir.Value) int64 { return v.Type.NumElements() }
	live := int64(0)
	for _, a := range f.Args {
		live += elems(a)
	}
	if !interpreted {
		for _, r := range f.Results {
			live += elems(r.Value)
		}
		return satMul(live, hostTensorBytes)
	}
	last := map[*ir.Value]int{}
	for i, op := range f.Body {
		for _, x := range op.Operands {
			last[x] = i
		}
	}
	for _, r := range f.Results {
		last[r.Value] = len(f.Body)
	}
	dying := make([][]*ir.Value, len(f.Body)+1)
	for v, i := range last {
		if v.Arg == nil {
			dying[i] = append(dying[i], v)
		}
	}
	peak := live
	for i, op := range f.Body {
		for _, r := range op.Results {
			live += elems(r)
			if _, used := last[r]; !used {
				dying[i] = append(dying[i], r)
			}
		}
		// A fused kernel's values live while it runs (the interpreter
		// keeps every one of them until the kernel ends).
		peak = max(peak, satAdd(live, regionElems(op.Region)))
		for _, v := range dying[i] {
			live -= elems(v)
		}
	}
	return satMul(peak, hostTensorBytes)
}

// regionElems is the elements of every value a fused kernel's region
// (and the regions inside it) computes.
func regionElems(r *ir.Region) int64 {
	if r == nil {
		return 0
	}
	var n int64
	for _, op := range r.Body {
		for _, v := range op.Results {
			n = satAdd(n, v.Type.NumElements())
		}
		n = satAdd(n, regionElems(op.Region))
	}
	return n
}

func satAdd(a, b int64) int64 {
	if a > 1<<63-1-b {
		return 1<<63 - 1
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a > (1<<63-1)/b {
		return 1<<63 - 1
	}
	return a * b
}

// limitHeap has the Go runtime collect garbage before it holds available
// bytes more than it holds now (debug.SetMemoryLimit caps the runtime's
// total: what it has mapped and not released, plus what is still
// available), so that a run sized to fit does not fail for garbage not yet
// collected. available <= 0 leaves the runtime as it is.
func limitHeap(available int64) {
	if available <= 0 {
		return
	}
	sample := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(sample)
	var held int64
	if sample[0].Value.Kind() == metrics.KindUint64 && sample[1].Value.Kind() == metrics.KindUint64 {
		held = int64(sample[0].Value.Uint64() - sample[1].Value.Uint64())
	}
	debug.SetMemoryLimit(satAdd(held, available))
}

// availableMemory is the memory kiln may still use, or 0 when it cannot
// tell: the least of what the system says is available (Linux's
// MemAvailable), what the process's cgroup allows beyond what it holds,
// and its address space limit (RLIMIT_AS) beyond what it has mapped.
func availableMemory() int64 {
	avail := memAvailable()
	for _, lim := range []int64{cgroupLeft(), addressSpaceLeft()} {
		if lim > 0 && (avail <= 0 || lim < avail) {
			avail = lim
		}
	}
	return avail
}

// cgroupLeft is the least, over the process's cgroups (version 2, or
// version 1's memory controller) and their ancestors, of the limit less
// what the cgroup uses without its reclaimable file cache (memory.max,
// memory.current and inactive_file; memory.limit_in_bytes,
// memory.usage_in_bytes and total_inactive_file), or 0 when no cgroup
// limits memory.
func cgroupLeft() int64 {
	raw, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	var left int64
	for _, line := range strings.Split(string(raw), "\n") {
		// Version 2 ("0::PATH") and version 1's memory controller
		// ("N:memory:PATH"), each with its own files.
		root, limitFile, usedFile, inactive := "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"
		parts := strings.SplitN(line, ":", 3)
		switch {
		case len(parts) == 3 && parts[0] == "0" && parts[1] == "":
		case len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory"):
			root, limitFile, usedFile, inactive = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
		default:
			continue
		}
		for dir := filepath.Join(root, filepath.Clean("/"+parts[2])); strings.HasPrefix(dir, root); dir = filepath.Dir(dir) {
			limit, err1 := readInt(filepath.Join(dir, limitFile))
			used, err2 := readInt(filepath.Join(dir, usedFile))
			if err1 == nil && err2 == nil && limit < 1<<62 { // "max" fails to parse; version 1 writes no limit as about 2^63
				used -= statValue(filepath.Join(dir, "memory.stat"), inactive)
				if l := limit - used; left == 0 || l < left {
					left = l
				}
			}
			if dir == root {
				break
			}
		}
	}
	if left < 0 {
		left = 1
	}
	return left
}

// statValue is the value of key in a flat-keyed file (memory.stat), or 0.
func statValue(path, key string) int64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			return n
		}
	}
	return 0
}

// mappedBytes is the process's virtual size (VmSize), or 0.
func mappedBytes() int64 { return statusKB("VmSize:") * 1024 }

func readInt(path string) (int64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
}

func statusKB(key string) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// memAvailable is Linux's MemAvailable, or 0 when it cannot tell.
func memAvailable() int64 {
	fh, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}

// checkHostMemory refuses to run f when kiln run would need more host
// memory than is available, instead of dying in the Go runtime.
func checkHostMemory(file string, f *ir.Func, interpreted bool, available int64) error {
	need := hostBytesNeeded(f, interpreted)
	if available <= 0 || need <= available {
		return nil
	}
	at := file
	if f.Pos.IsValid() {
		at = f.Pos.String()
	}
	how := "the interpreter holds every element of a live value as 8 bytes, with one file's bytes and a quarter more for the Go runtime"
	if !interpreted {
		how = "its arguments and results as 8 bytes per element, with one file's bytes and a quarter more for the Go runtime, before the program's own arena"
	}
	return fmt.Errorf("%s: error: running @%s needs about %s of host memory (%s), more than the %s available",
		at, f.Name, diag.Bytes(need), how, diag.Bytes(available))
}
