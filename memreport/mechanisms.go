package memreport

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
)

// Mechanism is what one way of saving memory contributed over a pipeline:
// how far its passes lowered the peak (device bytes live at once; a
// negative saving is a rise), and the FLOPs and modelled step time
// (costmodel.Default) they added. Field names are a contract.
type Mechanism struct {
	Passes       []string `json:"passes"`
	BytesSaved   int64    `json:"bytes_saved"`
	FLOPsAdded   int64    `json:"flops_added"`
	SecondsAdded float64  `json:"seconds_added"`
}

// mechanismOrder lists the mechanisms in the order reports print them.
var mechanismOrder = []string{"recompute", "microbatch", "swap", "fusion", "reorder", "precision"}

// MechanismOf names the mechanism a pass is part of, "" for passes that
// are not ways of saving memory (autodiff, the optimizer, clean-ups,
// assignment).
func MechanismOf(pass string) string {
	switch pass {
	case "saveset", "remat":
		return "recompute"
	case "microbatch":
		return "microbatch"
	case "swap":
		return "swap"
	case "fuse":
		return "fusion"
	case "reorder":
		return "reorder"
	case "precision":
		return "precision"
	}
	return ""
}

// Mechanisms charges each step of effects (the input first, then the
// function after each pass) to its pass's mechanism.
func Mechanisms(effects []Effect) map[string]*Mechanism {
	out := map[string]*Mechanism{}
	charge := func(pass string, before, after Effect) {
		name := MechanismOf(pass)
		if name == "" {
			return
		}
		m := out[name]
		if m == nil {
			m = &Mechanism{}
			out[name] = m
		}
		if !slices.Contains(m.Passes, pass) {
			m.Passes = append(m.Passes, pass)
		}
		m.BytesSaved += before.Peak - after.Peak
		m.FLOPsAdded += after.FLOPs - before.FLOPs
		m.SecondsAdded += after.Seconds - before.Seconds
	}
	for i := 1; i < len(effects); i++ {
		charge(effects[i].Pass, effects[i-1], effects[i])
	}
	return out
}

// describe says what m did in one line; total is the step's FLOPs.
func (m *Mechanism) describe(total int64) string {
	var b strings.Builder
	if m.BytesSaved >= 0 {
		fmt.Fprintf(&b, "saved %s", diag.Bytes(m.BytesSaved))
	} else {
		fmt.Fprintf(&b, "added %s", diag.Bytes(-m.BytesSaved))
	}
	fmt.Fprintf(&b, ", %+d FLOPs", m.FLOPsAdded)
	if base := total - m.FLOPsAdded; base > 0 && m.FLOPsAdded != 0 {
		fmt.Fprintf(&b, " (%+.2f%%)", 100*float64(m.FLOPsAdded)/float64(base))
	}
	fmt.Fprintf(&b, ", %+.1f µs modelled (%s)", m.SecondsAdded*1e6, strings.Join(m.Passes, ", "))
	return b.String()
}
