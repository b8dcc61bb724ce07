package driver

import (
	"bufio"
	"fmt"
	"os"
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
// program's own arena comes on top).
func hostBytesNeeded(f *ir.Func, interpreted bool) int64 {
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
		peak = max(peak, live)
		for _, v := range dying[i] {
			live -= elems(v)
		}
	}
	return satMul(peak, hostTensorBytes)
}

func satMul(a, b int64) int64 {
	if a > (1<<63-1)/b {
		return 1<<63 - 1
	}
	return a * b
}

// availableMemory is the memory the system says is available (Linux's
// MemAvailable), or 0 when it cannot tell.
func availableMemory() int64 {
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
	how := "the interpreter holds every element of a live value as 8 bytes"
	if !interpreted {
		how = "its arguments and results as 8 bytes per element, before the program's own arena"
	}
	return fmt.Errorf("%s: error: running @%s needs about %s of host memory (%s), more than the %s available",
		at, f.Name, diag.Bytes(need), how, diag.Bytes(available))
}
