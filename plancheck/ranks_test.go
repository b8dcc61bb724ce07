package plancheck_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/costmodel"
	_ "github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/kiln-compiler/kiln/plancheck"
)

// An MLP whose first weight splits on 4 ranks only along its second
// dimension (ZeRO shards there: NCCL's parts are packed around it).
const rankMLP = `func @mlp(%x: f32[8,6], %w1: f32[6,16] {param}, %b1: f32[16] {param}, %w2: f32[16,4] {param}) -> (f32[8,4]) {
  %h = matmul(%x, %w1) : f32[8,16]
  %hb = add(%h, %b1) : f32[8,16]
  %a = tanh(%hb) : f32[8,16]
  %y = matmul(%a, %w2) : f32[8,4]
  return %y
}`

// rankPlan compiles rankMLP's training step under spec to a plan
// directory.
func rankPlan(t *testing.T, spec string) string {
	t.Helper()
	m := passtest.Parse(t, rankMLP)
	passtest.Run(t, m, "autodiff{loss=sum},optimizer{kind=adam},parallel{"+spec+"},fuse,reorder,assign")
	out, err := cuda.Lower(m.Funcs[0], costmodel.Default)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, cuda.Write(dir, out, m, nil, nil))
	return dir
}

// TestPlansReplayAcrossRanks: the launch plans of partitioned steps
// (gradient buckets, ZeRO 1 to 3 on 2 and 4 ranks) call NCCL on the
// communication stream, match the schema, and replay on all their ranks
// together, each rank on its own data, the collectives exchanging among
// the ranks' memories, to the interpreter's results on every rank, bit
// for bit.
func TestPlansReplayAcrossRanks(t *testing.T) {
	for _, spec := range []string{"dp=2", "dp=4,bucket=0", "dp=2,zero=1", "dp=2,zero=2", "dp=4,zero=3", "dp=2,microbatches=2"} {
		t.Run(spec, func(t *testing.T) {
			dir := rankPlan(t, spec)
			validate(t, dir)
			lp, err := plancheck.LoadDir(dir)
			require.NoError(t, err)
			r, err := plancheck.CheckPlan(lp, 5)
			require.NoError(t, err)
			require.True(t, r.Replayed)
			require.Positive(t, r.Collectives)
			require.Equal(t, lp.Ranks, r.Ranks)
			require.Positive(t, r.CommSeconds)
			for _, n := range lp.Nodes {
				if n.Kind == "collective" {
					require.Equal(t, cuda.CommStream, n.Stream)
					require.True(t, strings.HasPrefix(n.Collective.Call, "nccl"))
				}
			}
			t.Logf("%s: %d ranks, %d nodes, %d collectives, %d events; %.1f µs (comm %.1f µs)", spec, r.Ranks, r.Nodes, r.Collectives, r.Events, r.Seconds*1e6, r.CommSeconds*1e6)
		})
	}
}

// TestPlantedMissingCollectiveEventIsCaught: dropping any event wait
// that orders a collective against the compute stream is a race that
// names the NCCL call; so is a collective whose result the ranks would
// read before it came (its wait dropped), and a collective node whose
// group does not tile the ranks.
func TestPlantedMissingCollectiveEventIsCaught(t *testing.T) {
	dir := rankPlan(t, "dp=2,zero=2")
	base := load(t, dir)
	require.NoError(t, check(t, dir, base))
	planted := 0
	for i, n := range base.Nodes {
		if n.Kind != "event_wait" {
			continue
		}
		// A wait on the comm stream, or a wait for an event it records.
		rec := -1
		for j, m := range base.Nodes {
			if m.Kind == "event_record" && *m.Event == *n.Event {
				rec = j
			}
		}
		if n.Stream != cuda.CommStream && base.Nodes[rec].Stream != cuda.CommStream {
			continue
		}
		planted++
		p := load(t, dir)
		renumber(p, i)
		err := check(t, dir, p)
		require.ErrorContains(t, err, "race:", "dropping the wait at node %d", i)
		require.ErrorContains(t, err, "nccl", "dropping the wait at node %d", i)
	}
	require.Positive(t, planted)

	p := load(t, dir)
	for i := range p.Nodes {
		if p.Nodes[i].Kind == "collective" {
			p.Nodes[i].Collective.Size = 3
			break
		}
	}
	require.ErrorContains(t, check(t, dir, p), "over 3 ranks")
}

// TestOffloadedParametersReplay: a plan whose parameters and Adam moments
// swap moved to host memory binds them in host_param slots, runs each
// update as a host function on the host stream, ordered against the
// copies that read the parameters and bring the gradients, and replays to
// the interpreter's results and updated arguments bit for bit; dropping
// any event wait that orders a host function is a race naming it.
func TestOffloadedParametersReplay(t *testing.T) {
	m := passtest.Parse(t, passtest.ReadFile("../testdata/examples/wide.kir"))
	passtest.Run(t, m, "autodiff,optimizer{kind=adam,lr=0.01},fuse,reorder,swap{device-budget=0.3},assign")
	out, err := cuda.Lower(m.Funcs[0], costmodel.Default)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, cuda.Write(dir, out, m, nil, nil))
	validate(t, dir)
	lp, err := plancheck.LoadDir(dir)
	require.NoError(t, err)
	r, err := plancheck.CheckPlan(lp, 5)
	require.NoError(t, err)
	require.True(t, r.Replayed)
	require.Positive(t, r.HostCalls)
	hostParams := 0
	for _, b := range lp.Buffers {
		if b.Space == "host_param" {
			hostParams++
		}
	}
	require.Positive(t, hostParams)
	base := load(t, dir)
	planted := 0
	for i, n := range base.Nodes {
		if n.Kind != "event_wait" {
			continue
		}
		rec := -1
		for j, o := range base.Nodes {
			if o.Kind == "event_record" && *o.Event == *n.Event {
				rec = j
			}
		}
		if n.Stream != cuda.HostStream && base.Nodes[rec].Stream != cuda.HostStream {
			continue
		}
		planted++
		p := load(t, dir)
		renumber(p, i)
		err := check(t, dir, p)
		require.ErrorContains(t, err, "race:", "dropping the wait at node %d", i)
		require.ErrorContains(t, err, "host function", "dropping the wait at node %d", i)
	}
	require.Positive(t, planted)
	t.Logf("%d host functions, %d host_param buffers, %d waits planted", r.HostCalls, hostParams, planted)

	// A parameter moved back to device memory while a host function still
	// updates it: the host would dereference a device pointer.
	p := load(t, dir)
	moved := -1
	for _, n := range p.Nodes {
		if n.Kind == "host" {
			moved = n.Args[0].Pointer.Buffer
			break
		}
	}
	require.GreaterOrEqual(t, moved, 0)
	require.Equal(t, "host_param", p.Buffers[moved].Space)
	p.Buffers[moved].Space = "param"
	for _, n := range p.Nodes {
		for _, a := range n.Args {
			if a.Pointer != nil && a.Pointer.Buffer == moved {
				a.Pointer.Space = "param"
			}
		}
	}
	require.ErrorContains(t, check(t, dir, p), "in param memory")
}
