package plancheck_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/plancheck"
)

// planJSON reads plan.json of dir as generic JSON.
func planJSON(t *testing.T, dir string) map[string]any {
	raw, err := os.ReadFile(filepath.Join(dir, "plan.json"))
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	return doc
}

// checkDoc writes doc as plan.json next to the other files of dir and
// loads and checks it; it returns the error, and fails the test on a
// panic or an internal error.
func checkDoc(t *testing.T, dir string, doc map[string]any) (err error) {
	t.Helper()
	tmp := t.TempDir()
	for _, name := range []string{"kernels.cu", "module.kir", "kiln_cuda.h"} {
		b, rerr := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, rerr)
		require.NoError(t, os.WriteFile(filepath.Join(tmp, name), b, 0o644))
	}
	raw, merr := json.Marshal(doc)
	require.NoError(t, merr)
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "plan.json"), raw, 0o644))
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("plan-check panicked: %v", r)
		}
		if err != nil && strings.Contains(err.Error(), "internal error") {
			t.Fatalf("plan-check reported an internal error: %v", err)
		}
	}()
	lp, err := plancheck.LoadDir(tmp)
	if err != nil {
		return err
	}
	_, err = plancheck.CheckPlan(lp, 3)
	return err
}

// leaf is a place in a JSON document: a map key or an array index.
type leaf struct {
	parent any
	key    string
	index  int
}

func (l leaf) get() any {
	if m, ok := l.parent.(map[string]any); ok {
		return m[l.key]
	}
	return l.parent.([]any)[l.index]
}

func (l leaf) set(v any) {
	if m, ok := l.parent.(map[string]any); ok {
		m[l.key] = v
		return
	}
	l.parent.([]any)[l.index] = v
}

// leaves lists every place of doc, depth first.
func leaves(doc any) []leaf {
	var out []leaf
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				out = append(out, leaf{parent: v, key: k})
				walk(x)
			}
		case []any:
			for i, x := range v {
				out = append(out, leaf{parent: v, index: i})
				walk(x)
			}
		}
	}
	walk(doc)
	return out
}

func clone(doc map[string]any) map[string]any {
	raw, _ := json.Marshal(doc)
	var out map[string]any
	json.Unmarshal(raw, &out)
	return out
}

var hostileStrings = []string{"", "read", "write", "readwrite", "kernel", "copy", "event_wait", "device", "host", "param",
	"../../x", "sm_80", "sm_x", "k0_kernel_s0", "nosuchkernel", "device_to_host", "f32", "i64", "\x00", strings.Repeat("a", 300)}

var hostileNumbers = []float64{0, -1, 1, 2, 3, 255, 256, math.MaxInt32, 1 << 32, math.MaxInt64, -math.MaxInt64, 1e300, 0.5}

// mutate changes one random place of doc: a number to an edge value or
// off by one, a string to another, a bool flipped, an array element
// dropped or doubled, a key deleted.
func mutate(doc map[string]any, rng *rand.Rand) string {
	ls := leaves(doc)
	l := ls[rng.IntN(len(ls))]
	switch v := l.get().(type) {
	case float64:
		var n float64
		switch rng.IntN(3) {
		case 0:
			n = v + 1
		case 1:
			n = v - 1
		default:
			n = hostileNumbers[rng.IntN(len(hostileNumbers))]
		}
		l.set(n)
		return fmt.Sprintf("%s%d: number %v -> %v", l.key, l.index, v, n)
	case string:
		s := hostileStrings[rng.IntN(len(hostileStrings))]
		l.set(s)
		return fmt.Sprintf("%s%d: string %q -> %q", l.key, l.index, v, s)
	case bool:
		l.set(!v)
		return "bool flipped"
	case []any:
		if len(v) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(v))
			l.set(append(append([]any{}, v[:i]...), v[i+1:]...))
			return l.key + ": array element dropped"
		}
		if len(v) > 0 {
			l.set(append(append([]any{}, v...), v[rng.IntN(len(v))]))
			return l.key + ": array element doubled"
		}
	case map[string]any:
		for k := range v {
			delete(v, k)
			return "key " + k + " deleted"
		}
	}
	return "no change"
}

// TestPlanMutations: 1,000 random mutations of a valid plan (the first
// 100 with -short), each either rejected with an error or still a plan that
// replays to the interpreter's results; never a panic or an internal
// error. The defects found by hand are each rejected.
func TestPlanMutations(t *testing.T) {
	dir := plan(t, smallCNN, swapped)
	base := planJSON(t, dir)
	require.NoError(t, checkDoc(t, dir, clone(base)), "the unmutated plan passes")

	n := 1000
	if testing.Short() {
		n = 100
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rejected := 0
	for i := 0; i < n; i++ {
		doc := clone(base)
		what := mutate(doc, rng)
		if err := checkDoc(t, dir, doc); err != nil {
			rejected++
		} else {
			t.Logf("accepted: %s", what)
		}
	}
	t.Logf("%d mutations: %d rejected, %d still correct plans", n, rejected, n-rejected)

	firstKernel := func(doc map[string]any) map[string]any {
		for _, x := range doc["nodes"].([]any) {
			if nd := x.(map[string]any); nd["kind"] == "kernel" {
				return nd
			}
		}
		t.Fatal("no kernel node")
		return nil
	}
	for what, fn := range map[string]func(doc map[string]any){
		"an offset of 2^63-1": func(doc map[string]any) {
			doc["buffers"].([]any)[len(doc["buffers"].([]any))-1].(map[string]any)["offset"] = float64(math.MaxInt64)
		},
		"a kernel without its arguments": func(doc map[string]any) { firstKernel(doc)["args"] = []any{} },
		"a write turned into a read": func(doc map[string]any) {
			for _, a := range firstKernel(doc)["args"].([]any) {
				if ptr, ok := a.(map[string]any)["pointer"].(map[string]any); ok && ptr["mode"] == "write" {
					ptr["mode"] = "read"
					return
				}
			}
		},
		"grid 0":              func(doc map[string]any) { firstKernel(doc)["grid"].([]any)[0] = float64(0) },
		"block 0":             func(doc map[string]any) { firstKernel(doc)["block"].([]any)[0] = float64(0) },
		"an unknown kernel":   func(doc map[string]any) { firstKernel(doc)["kernel"] = "k999_nothing" },
		"arch ../../x":        func(doc map[string]any) { doc["target"].(map[string]any)["arch"] = "../../x" },
		"a buffer id of 2^32": func(doc map[string]any) { doc["buffers"].([]any)[0].(map[string]any)["id"] = float64(1 << 32) },
		"an access id of 2^32": func(doc map[string]any) {
			firstKernel(doc)["args"].([]any)[0].(map[string]any)["pointer"].(map[string]any)["buffer"] = float64(1 << 32)
		},
		"a negative size":        func(doc map[string]any) { doc["buffers"].([]any)[0].(map[string]any)["size_bytes"] = float64(-8) },
		"a scalar for a pointer": func(doc map[string]any) { firstKernel(doc)["args"].([]any)[0].(map[string]any)["kind"] = "scalar" },
		// Launches CUDA refuses.
		"a block above the kernel's __launch_bounds__": func(doc map[string]any) { firstKernel(doc)["block"].([]any)[0] = float64(512) },
		"grid.z of 2^31-1":              func(doc map[string]any) { firstKernel(doc)["grid"].([]any)[2] = float64(math.MaxInt32) },
		"grid.y of 65536":               func(doc map[string]any) { firstKernel(doc)["grid"].([]any)[1] = float64(65536) },
		"2^31-1 bytes of shared memory": func(doc map[string]any) { firstKernel(doc)["shared_bytes"] = float64(math.MaxInt32) },
		"an arena alignment of 3":       func(doc map[string]any) { doc["arena"].(map[string]any)["alignment"] = float64(3) },
		"a host arena alignment of 0":   func(doc map[string]any) { doc["host"].(map[string]any)["alignment"] = float64(0) },
		"a workspace past the arena": func(doc map[string]any) {
			doc["workspace"].(map[string]any)["size_bytes"] = doc["arena"].(map[string]any)["size_bytes"].(float64) + 64
		},
		"a workspace offset of 1": func(doc map[string]any) { doc["workspace"].(map[string]any)["offset"] = float64(1) },
		"a workspace over the values": func(doc map[string]any) {
			doc["workspace"].(map[string]any)["offset"] = float64(0)
			doc["workspace"].(map[string]any)["size_bytes"] = doc["arena"].(map[string]any)["size_bytes"]
		},
	} {
		doc := clone(base)
		fn(doc)
		if checkDoc(t, dir, doc) == nil {
			t.Errorf("plan-check accepts %s", what)
		}
	}
}
