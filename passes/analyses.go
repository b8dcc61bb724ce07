package passes

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// Analysis names a result computed from a function that passes and the
// planner read: computed once, kept while the function stays as it was.
type Analysis uint8

const (
	// Liveness is liveness.Analyze: buffers, their lifetimes and the peak.
	Liveness Analysis = iota + 1
)

func (a Analysis) String() string {
	if a == Liveness {
		return "liveness"
	}
	return fmt.Sprintf("analysis(%d)", uint8(a))
}

// Analyses caches the analyses of a pipeline's functions. The manager
// drops them after every pass that does not declare it preserves them
// (Pass.Preserves), so a cached result is always that of the function as
// it stands; under verify-each it checks a preserved result against a
// fresh one. A nil *Analyses computes every time.
type Analyses struct {
	live map[*ir.Func]*liveness.Info
}

// Liveness is f's liveness, computed at most once while f is unchanged.
// The caller must not change the result.
func (a *Analyses) Liveness(f *ir.Func) *liveness.Info {
	if a == nil {
		return liveness.Analyze(f)
	}
	if info, ok := a.live[f]; ok {
		return info
	}
	if a.live == nil {
		a.live = map[*ir.Func]*liveness.Info{}
	}
	info := liveness.Analyze(f)
	a.live[f] = info
	return info
}

// invalidate drops what p does not preserve.
func (a *Analyses) invalidate(p *Pass) {
	for _, k := range p.Preserves {
		if k == Liveness {
			return
		}
	}
	a.live = nil
}

// check compares every cached result with a fresh one: a pass that claims
// to preserve an analysis and does not is an error.
func (a *Analyses) check(m *ir.Module) error {
	for _, f := range m.Funcs {
		cached, ok := a.live[f]
		if !ok {
			continue
		}
		fresh := liveness.Analyze(f)
		if cached.Peak != fresh.Peak || len(cached.Buffers) != len(fresh.Buffers) || cached.PeakAt != fresh.PeakAt {
			return fmt.Errorf("it claims to preserve %s, but @%s's peak moved from %d bytes at op %d to %d bytes at op %d", Liveness, f.Name, cached.Peak, cached.PeakAt, fresh.Peak, fresh.PeakAt)
		}
	}
	return nil
}
