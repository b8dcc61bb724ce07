package passes

import (
	"fmt"
	"sort"
	"strings"
)

// Approximations Kiln makes only when the user names them: --allow NAME
// on the command line, allow=[...] in Python. Passes ask Context.Allows,
// and record each approximation they make with Context.Approximate, so
// that every report says what was allowed and what it changed. Without
// them a transformation that would change a result is refused.
const (
	// PerSliceBN: normalisations take the statistics of each microbatch
	// or data-parallel rank, as PyTorch's gradient accumulation and DDP
	// do, not the whole batch's.
	PerSliceBN = "per-slice-bn"
	// PerRankDropout: data-parallel ranks draw their dropout masks from
	// the same counters, as DDP's ranks seeded alike do, not their rows of
	// the one-device step's masks.
	PerRankDropout = "per-rank-dropout"
)

var approximations = map[string]string{
	PerSliceBN:     "normalisations take each microbatch's (or data-parallel rank's) statistics, not the whole batch's (PyTorch's gradient accumulation, DDP)",
	PerRankDropout: "data-parallel ranks draw dropout masks from the same counters (DDP's ranks seeded alike), not their rows of the one-device masks",
}

// RegisterApproximation adds a name to the list (the precision passes add
// narrower saved values). Registering a name twice panics.
func RegisterApproximation(name, doc string) {
	if _, dup := approximations[name]; dup {
		panic("passes: approximation " + name + " registered twice")
	}
	approximations[name] = doc
}

// ApproximationNames lists every approximation Kiln knows, sorted.
func ApproximationNames() []string {
	out := make([]string, 0, len(approximations))
	for n := range approximations {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ApproximationDoc says what approximation name changes ("" if unknown).
func ApproximationDoc(name string) string { return approximations[name] }

// CheckAllowed reports an error for a name that is no approximation.
func CheckAllowed(names []string) error {
	for _, n := range names {
		if _, ok := approximations[n]; !ok {
			return fmt.Errorf("unknown approximation %q (known: %s)", n, strings.Join(ApproximationNames(), ", "))
		}
	}
	return nil
}

// Approximation is one approximation a pass made: its name and what it
// changed.
type Approximation struct {
	Name string `json:"name"`
	What string `json:"what"`
}
