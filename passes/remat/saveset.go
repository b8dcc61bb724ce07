package remat

import (
	"sync"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/passes"
	"github.com/kiln-compiler/kiln/passes/fuse"
	"github.com/kiln-compiler/kiln/passes/reorder"
)

func init() {
	passes.MustRegister(&passes.Pass{
		Name:        "saveset",
		Summary:     "choose which forward values a training step's backward keeps, recomputing the rest through cheap ops where that lowers the peak",
		Invalidates: []passes.Property{passes.Assigned},
		Run: func(ctx *passes.Context, m *ir.Module) error {
			for _, f := range m.Funcs {
				before := ctx.Liveness(f).Peak
				res := SelectSaved(f)
				ctx.AddStat("peak-before", before)
				ctx.AddStat("peak-after", res.Peak)
				ctx.AddStat("recompute-flops", res.FLOPs)
			}
			return nil
		}})
}

// SelectSaved chooses the saved set of a training step (the forward values
// its backward reads) for the lowest peak that recomputation through cheap
// ops reaches: a value the backward needs is recomputed just before its
// first backward use when its chain, stopping at the outputs of
// compute-heavy ops (which stay saved), holds only cheap ops
// (elementwise, normalisation, softmax, dropout from its seed, shape
// ops). Those copies fuse into the backward kernels that read them, so
// they add FLOPs but no memory traffic and no kernel.
//
// Unlike a min-cut over edges, it weighs each choice by the peak of the
// whole schedule: a value is recomputed only while the peak does not rise,
// then values still live at the peak are recomputed while it falls. Having
// found the lowest peak, it plans again with that peak as the target and
// keeps the plan that reaches it with fewer FLOPs, then saves again every
// value whose recomputation that peak (give or take 1/pruneSlack of it)
// does not need. It never returns a
// higher peak than f had, as it stands or after fuse and reorder; a
// function without a backward is left as it is.
func SelectSaved(f *ir.Func) Result {
	before := liveness.Analyze(f).Peak
	none := Result{Peak: before, Solver: "none"}
	if len(savedValues(f)) == 0 {
		return none
	}
	// f's downstream peaks (below) are found beside the search.
	var wg sync.WaitGroup
	var fused, reordered int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		fused, reordered = downstreamPeaks(f)
	}()
	defer wg.Wait()
	lowest := f.Clone()
	flops := cheapOnly(lowest, 0)
	low := liveness.Analyze(lowest).Peak
	if low >= before {
		return none
	}
	plans := []*ir.Func{lowest}
	results := []Result{{Peak: low, FLOPs: flops, Solver: "saveset"}}
	g := f.Clone()
	fl := cheapOnly(g, low)
	if p := liveness.Analyze(g).Peak; p <= low && fl < flops {
		plans = []*ir.Func{g, lowest} // fewer FLOPs first
		results = []Result{{Peak: p, FLOPs: fl, Solver: "saveset"}, results[0]}
	}
	// What the lowest peak does not need is saved again (prune), in a
	// third plan tried first. The peak may rise by pruneSlack of itself
	// for that: a batch norm's statistics are a few bytes a channel, and
	// recomputing them reads the whole activation again.
	pruned := plans[0].Clone()
	if prune(pruned, min(results[0].Peak+results[0].Peak/pruneSlack, before-1)) {
		plans = append([]*ir.Func{pruned}, plans...)
		added := max(0, recomputeFLOPs(pruned)-recomputeFLOPs(f)) // net of what f recomputed already
		results = append([]Result{{Peak: liveness.Analyze(pruned).Peak, FLOPs: added, Solver: "saveset"}}, results...)
	}
	// Fusion and the schedule reorder finds can treat a plan differently
	// from f (a recomputed value read by two kernels stays in memory): a
	// plan is taken only when it is no higher after them either.
	for i, plan := range plans {
		pf, pr := downstreamPeaks(plan)
		wg.Wait()
		if pf <= fused && pr <= reordered {
			*f = *plan
			return results[i]
		}
	}
	return none
}

// pruneSlack: SelectSaved's plans may keep values whose recomputation
// would lower the peak by less than 1/pruneSlack of it.
const pruneSlack = 1024

// downstreamPeaks is the peak of f after fuse, and after fuse and reorder
// (the -O1 and -O2 pipelines that follow saveset).
func downstreamPeaks(f *ir.Func) (fused, reordered int64) {
	g := f.Clone()
	fuse.Fuse(g, fuse.Options{MultiOutput: true})
	fused = liveness.Analyze(g).Peak
	return fused, reorder.Reorder(g, reorder.Options{Algo: "best", ExactStates: 200000, Improve: 200}).After
}
