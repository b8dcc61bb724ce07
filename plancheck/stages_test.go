package plancheck_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes/assign"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/kiln-compiler/kiln/plancheck"
)

// stagePlans compiles the MLP blocks' Adam step cut by spec into a plan
// directory per stage and loads them.
func stagePlans(t *testing.T, spec string) []*plancheck.Plan {
	t.Helper()
	return stagePlansAssigned(t, spec, true)
}

// stagePlansAssigned is stagePlans; without pending, each stage is
// assigned alone (assign.Assign), blind to how long its sends stay
// pending.
func stagePlansAssigned(t *testing.T, spec string, pending bool) []*plancheck.Plan {
	t.Helper()
	m := passtest.Parse(t, passtest.ReadFile("../testdata/steps/mlp_blocks_f64.kir"))
	pipe := "autodiff{loss=mean},optimizer{kind=adam},parallel{" + spec + "},fuse,reorder"
	if pending {
		pipe += ",assign"
	}
	passtest.Run(t, m, pipe)
	root := t.TempDir()
	var lps []*plancheck.Plan
	for s, f := range parallel.Stages(m) {
		if !pending {
			_, err := assign.Assign(f, "best", 64, 0)
			require.NoError(t, err)
		}
		out, err := cuda.Lower(f, costmodel.Default)
		require.NoError(t, err)
		dir := filepath.Join(root, fmt.Sprintf("stage%d", s))
		require.NoError(t, cuda.Write(dir, out, m, nil, nil))
		validate(t, dir)
		lp, err := plancheck.LoadDir(dir)
		require.NoError(t, err)
		lps = append(lps, lp)
	}
	return lps
}

// TestStagePlansReplayTogether: the launch plans of pipeline stages (2
// and 4 stages, with 1F1B microbatches and beside dp with ZeRO-2) send
// and receive with ncclSend and ncclRecv, each direction on its own
// stream, pass the rendezvous check, and replay on all their ranks
// together, sends meeting recvs in issue order, to the interpreter's
// results on every rank.
func TestStagePlansReplayTogether(t *testing.T) {
	for _, spec := range []string{"pp=2,microbatches=2", "pp=4", "dp=2,pp=2,zero=2,microbatches=2", "pp=2,tp=2"} {
		t.Run(spec, func(t *testing.T) {
			lps := stagePlans(t, spec)
			reports, err := plancheck.CheckStages(lps, 5, true)
			require.NoError(t, err)
			p2p := 0
			for s, lp := range lps {
				require.True(t, reports[s].Replayed)
				require.Equal(t, len(lps), lp.Stages)
				for _, n := range lp.Nodes {
					if c := n.Collective; c != nil && (c.Call == "ncclSend" || c.Call == "ncclRecv") {
						p2p++
						require.Equal(t, cuda.P2PStream(c.Call == "ncclRecv", c.Peer), n.Stream)
					}
				}
			}
			require.Positive(t, p2p)
		})
	}
}

// TestStagePlanBugsAreCaught: a stage's plan alone does not replay (its
// peers are elsewhere); dropping the event wait right before a send or
// recv is a race (an earlier wait on its stream may be implied by that
// one: a recv into the memory a send just read waits for the send, which
// waited for the compute that wrote it); a recv whose tag no send uses deadlocks the stages, which
// the replay reports rather than hangs; a send on the wrong stream is an
// error.
func TestStagePlanBugsAreCaught(t *testing.T) {
	lps := stagePlans(t, "pp=2,microbatches=2")
	_, err := plancheck.CheckPlan(lps[1], 5)
	require.ErrorContains(t, err, "replay with the other stages")

	planted := 0
	for i, n := range lps[1].Nodes {
		if n.Kind != "event_wait" || n.Stream < 4 || i+1 == len(lps[1].Nodes) || lps[1].Nodes[i+1].Kind != "collective" {
			continue
		}
		planted++
		p := *lps[1].Plan
		p.Nodes = append([]cuda.Node(nil), lps[1].Nodes...)
		renumber(&p, i)
		_, err := plancheck.CheckStructure(&plancheck.Plan{Plan: &p, Func: lps[1].Func})
		require.ErrorContains(t, err, "race:", "dropping the wait at node %d", i)
	}
	require.Positive(t, planted)

	lps = stagePlans(t, "pp=2,microbatches=2")
	for i, n := range lps[1].Nodes {
		if c := n.Collective; c != nil && c.Call == "ncclRecv" {
			lps[1].Nodes[i].Collective.Tag += 100
			lps[1].Func.Body[n.Op].Attrs["tag"] = ir.IntAttr(lps[1].Nodes[i].Collective.Tag)
			break
		}
	}
	_, err = plancheck.CheckStages(lps, 5, true)
	require.ErrorContains(t, err, "would take each other's tensors")

	lps = stagePlans(t, "pp=2,microbatches=2")
	for i, n := range lps[0].Nodes {
		if c := n.Collective; c != nil && c.Call == "ncclSend" {
			lps[0].Nodes[i].Stream = cuda.P2PStream(true, c.Peer)
			break
		}
	}
	_, err = plancheck.CheckStages(lps, 5, false)
	require.ErrorContains(t, err, "stream")
}

// TestStagePlansThatWouldDeadlock: where a recv reuses the bytes a send
// of its stage read, the recv waits for that send, which under NCCL waits
// for its peer's recv: with 4 stages of 4 microbatches the events close a
// cycle through the other stage. Rendezvous finds it in stages assigned
// alone (the replay, whose sends complete when issued, would not).
// assign keeps a sent tensor's memory until the peer is known to have
// received it, and those plans (and those of 2 stages of 2
// tensor-parallel ranks with 2 microbatches) pass the rendezvous and
// replay to the interpreter's results.
func TestStagePlansThatWouldDeadlock(t *testing.T) {
	for _, spec := range []string{"pp=4,microbatches=4", "pp=2,tp=2,microbatches=2"} {
		lps := stagePlansAssigned(t, spec, false)
		plans := make([]*cuda.Plan, len(lps))
		for s, lp := range lps {
			plans[s] = lp.Plan
		}
		if spec == "pp=4,microbatches=4" {
			require.ErrorContains(t, plancheck.Rendezvous(plans), "deadlock", spec)
		}

		lps = stagePlans(t, spec)
		for s, lp := range lps {
			plans[s] = lp.Plan
		}
		require.NoError(t, plancheck.Rendezvous(plans), spec)
		reports, err := plancheck.CheckStages(lps, 5, true)
		require.NoError(t, err, spec)
		for s := range lps {
			require.True(t, reports[s].Replayed, spec)
		}
	}
}

// TestCollectiveReductionIsChecked: a collective node must reduce as its
// op does: tensor parallelism takes a dropout mask's part by a
// reduce_scatter by max, and the same node reducing by sum (twice the
// scale on two ranks) is an error.
func TestCollectiveReductionIsChecked(t *testing.T) {
	// The MLP blocks, with a dropout between the first block's products.
	src := strings.Replace(passtest.ReadFile("../testdata/steps/mlp_blocks_f64.kir"), "%o1 = matmul(%a1, %w2)", "%d1, %k1 = dropout(%a1) {ratio = 0.25, seed = 11} : f64[4,5,16], bool[4,5,16]\n  %o1 = matmul(%d1, %w2)", 1)
	m := passtest.Parse(t, src)
	passtest.Run(t, m, "autodiff{loss=sum},parallel{tp=2},fuse,reorder,assign")
	out, err := cuda.Lower(m.Funcs[0], costmodel.Default)
	require.NoError(t, err)
	lp := &plancheck.Plan{Plan: out.Plan, Func: m.Funcs[0]}
	_, err = plancheck.CheckStructure(lp)
	require.NoError(t, err)
	planted := 0
	for i, n := range lp.Nodes {
		if c := n.Collective; c != nil && c.Reduce == "ncclMax" {
			lp.Nodes[i].Collective.Reduce = "ncclSum"
			planted++
			break
		}
	}
	require.Equal(t, 1, planted)
	_, err = plancheck.CheckStructure(lp)
	require.ErrorContains(t, err, "reduces by")
}
