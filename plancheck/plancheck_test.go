package plancheck_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/onnx"
	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/fuse"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	_ "github.com/kiln-compiler/kiln/passes/reorder"
	_ "github.com/kiln-compiler/kiln/passes/swap"
	"github.com/kiln-compiler/kiln/passtest"
	"github.com/kiln-compiler/kiln/plancheck"
)

// plan compiles an ONNX model with pipeline into a plan directory.
func plan(t testing.TB, model, pipeline string) string {
	t.Helper()
	m, err := onnx.ImportFile(model, onnx.Options{})
	require.NoError(t, err)
	return planModule(t, m, pipeline)
}

// planKir compiles the .kir file path with pipeline into a plan
// directory.
func planKir(t testing.TB, path, pipeline string) string {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	return planModule(t, passtest.Parse(t, string(src)), pipeline)
}

// planModule runs pipeline on m and writes its launch plan to a new
// folder, which it returns.
func planModule(t testing.TB, m *ir.Module, pipeline string) string {
	t.Helper()
	passtest.Run(t, m, pipeline)
	out, err := cuda.Lower(m.Funcs[0], costmodel.Default)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, cuda.Write(dir, out, m, nil, nil))
	return dir
}

func validate(t *testing.T, dir string) {
	t.Helper()
	c := jsonschema.NewCompiler()
	schema, err := c.Compile("../codegen/cuda/plan.schema.json")
	require.NoError(t, err)
	f, err := os.Open(filepath.Join(dir, "plan.json"))
	require.NoError(t, err)
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	require.NoError(t, err)
	require.NoError(t, schema.Validate(doc))
}

const (
	smallCNN = "../testdata/models/small_cnn/model.onnx"
	// A budget swap reaches by copies of activations alone (recompute and
	// parameter moves off): what remains on the device is the step's state
	// and what the kernels need at once.
	swapped = "autodiff,optimizer{kind=momentum,lr=0.1},fuse,reorder,swap{device-budget=0.92,recompute=false,params=false},assign"
)

// TestPlansValidateAndReplay: plans of training steps (with swaps and
// optimizer updates) match the schema and replay to the interpreter's
// results, bit for bit.
func TestPlansValidateAndReplay(t *testing.T) {
	cases := []struct{ model, pipeline string }{
		{smallCNN, swapped},
		{"../testdata/models/one_layer_transformer/model.onnx", "autodiff,optimizer{kind=adam,lr=0.001},fuse,reorder,swap{device-budget=0.9,params=false},assign"},
		{"../testdata/models/mlp/model.onnx", "autodiff,fuse,reorder,assign"},
	}
	if !testing.Short() {
		cases = append(cases,
			struct{ model, pipeline string }{"../testdata/models/ci/resnet50_ci.onnx", "autodiff,optimizer{kind=sgd,lr=0.01},fuse,reorder,swap{device-budget=0.92,params=false},assign"},
			struct{ model, pipeline string }{"../testdata/models/ci/gpt2_small_ci.onnx", "autodiff,optimizer{kind=sgd,lr=0.01},fuse,reorder,swap{device-budget=0.7,params=false},assign"})
	}
	for _, c := range cases {
		dir := plan(t, c.model, c.pipeline)
		validate(t, dir)
		p, f, err := plancheck.Load(dir)
		require.NoError(t, err)
		r, err := plancheck.Check(p, f, 3)
		require.NoError(t, err, c.model)
		require.Positive(t, r.Kernels)
		t.Logf("%s: %d nodes (%d launches, %d copies, %d events), %.1f us (compute %.1f, copies %.1f, stalled %.1f)",
			filepath.Base(filepath.Dir(c.model))+"/"+filepath.Base(c.model), r.Nodes, r.Kernels, r.Copies, r.Events, r.Seconds*1e6, r.ComputeSeconds*1e6, r.CopySeconds*1e6, r.StallSeconds*1e6)
	}
}

// renumber removes node i and recomputes ids and deps the way the plan
// writer does, so that only the semantic damage remains.
func renumber(p *cuda.Plan, drop int) {
	nodes := append(append([]cuda.Node{}, p.Nodes[:drop]...), p.Nodes[drop+1:]...)
	prev := map[int]int{}
	record := map[int]int{}
	for i := range nodes {
		n := &nodes[i]
		n.ID = i
		n.Deps = []int{}
		if q, ok := prev[n.Stream]; ok {
			n.Deps = append(n.Deps, q)
		}
		if n.Kind == "event_record" {
			record[*n.Event] = i
		}
		if n.Kind == "event_wait" {
			n.Deps = append(n.Deps, record[*n.Event])
		}
		prev[n.Stream] = i
	}
	p.Nodes = nodes
}

func load(t *testing.T, dir string) *cuda.Plan {
	p, _, err := plancheck.Load(dir)
	require.NoError(t, err)
	return p
}

func check(t *testing.T, dir string, p *cuda.Plan) error {
	t.Helper()
	_, f, err := plancheck.Load(dir)
	require.NoError(t, err)
	return func() error { _, err := plancheck.Check(p, f, 3); return err }()
}

// TestPlantedBugsAreCaught: a missing event wait (every one of them, in
// turn), a missing swap-in, overlapping buffers, a kernel that never ran.
func TestPlantedBugsAreCaught(t *testing.T) {
	dir := plan(t, smallCNN, swapped)
	base := load(t, dir)
	require.NoError(t, check(t, dir, base))
	waits := 0
	for i, n := range base.Nodes {
		if n.Kind != "event_wait" {
			continue
		}
		waits++
		p := load(t, dir)
		renumber(p, i)
		require.ErrorContains(t, check(t, dir, p), "race:", "dropping the wait at node %d", i)
	}
	require.Positive(t, waits)

	for i, n := range base.Nodes {
		if n.Kind == "copy" && n.Direction == "host_to_device" {
			// The copy back is gone (with its events kept in order).
			p := load(t, dir)
			p.Nodes[i] = cuda.Node{ID: i, Kind: "event_record", Stream: n.Stream, Deps: n.Deps, Op: -1, Event: new(int)}
			*p.Nodes[i].Event = p.Events
			p.Events++
			err := check(t, dir, p)
			require.Error(t, err)
			require.Regexp(t, "nothing has written|wrote those bytes last", err.Error())
			break
		}
	}

	p := load(t, dir)
	var dev []int
	for i, b := range p.Buffers {
		if b.Space == "device" && b.SizeBytes > 0 {
			dev = append(dev, i)
		}
	}
	p.Buffers[dev[1]].Offset = p.Buffers[dev[0]].Offset
	p.Buffers[dev[1]].FirstOp = p.Buffers[dev[0]].FirstOp
	require.ErrorContains(t, check(t, dir, p), "are live together and overlap")

	p = load(t, dir)
	for i := len(p.Nodes) - 1; i >= 0; i-- {
		if p.Nodes[i].Kind == "kernel" && p.Nodes[i].Last && len(p.Nodes[i].Args) > 0 {
			p.Nodes[i].Last = false // the replay would never check its op's results
			break
		}
	}
	require.ErrorContains(t, check(t, dir, p), "is not marked last_of_op")
}

// TestTimelineJSON: the simulated timeline has a span per launch and
// copy, each after its dependencies.
func TestTimelineJSON(t *testing.T) {
	dir := plan(t, smallCNN, swapped)
	p, f, err := plancheck.Load(dir)
	require.NoError(t, err)
	r, err := plancheck.Check(p, f, 1)
	require.NoError(t, err)
	require.Equal(t, r.Kernels+r.LibraryCalls+r.Copies, len(r.Timeline))
	end := map[int]float64{}
	for _, s := range r.Timeline {
		for _, d := range p.Nodes[s.Node].Deps {
			if e, ok := end[d]; ok {
				require.GreaterOrEqual(t, s.Start, e)
			}
		}
		end[s.Node] = s.Finish
	}
	_, err = json.Marshal(r)
	require.NoError(t, err)
}

// TestMalformedPlansAreErrors: edited plans give errors, never panics.
func TestMalformedPlansAreErrors(t *testing.T) {
	dir := plan(t, smallCNN, swapped)
	for name, spoil := range map[string]func(p *cuda.Plan){
		"copy without src": func(p *cuda.Plan) {
			for i := range p.Nodes {
				if p.Nodes[i].Kind == "copy" {
					p.Nodes[i].Src = nil
					return
				}
			}
		},
		"buffer without values": func(p *cuda.Plan) { p.Buffers[0].Values = nil },
		"unknown mode": func(p *cuda.Plan) {
			p.Nodes[0].Args[0].Pointer.Mode = "scribble"
		},
		"small arena":  func(p *cuda.Plan) { p.Arena.SizeBytes = 64 },
		"unknown kind": func(p *cuda.Plan) { p.Nodes[0].Kind = "nap" },
	} {
		p := load(t, dir)
		spoil(p)
		require.Error(t, check(t, dir, p), name)
	}
}

// TestOffloadedGradientsReplay: a step whose finished weight gradients
// were offloaded to host memory (returned from there) replays to the
// interpreter's results, host results included.
func TestOffloadedGradientsReplay(t *testing.T) {
	raw, err := os.ReadFile("../testdata/examples/wide.kir")
	require.NoError(t, err)
	wide := string(raw)
	m := passtest.Parse(t, wide)
	passtest.Run(t, m, "autodiff,fuse,reorder,swap{device-budget=0.75,params=false},assign")
	out, err := cuda.Lower(m.Funcs[0], costmodel.Default)
	require.NoError(t, err)
	hostResults := 0
	for _, r := range out.Plan.Results {
		if out.Plan.Buffers[r.Buffer].Space == "host" {
			hostResults++
		}
	}
	require.Positive(t, hostResults, "no gradient is returned from host memory")
	dir := t.TempDir()
	require.NoError(t, cuda.Write(dir, out, m, nil, nil))
	validate(t, dir)
	p, f, err := plancheck.Load(dir)
	require.NoError(t, err)
	_, err = plancheck.Check(p, f, 3)
	require.NoError(t, err)
}

// TestReplayMemoryIsBounded: a plan.json that declares a huge arena is
// refused before the replay allocates it, with a hint to --fast; the
// structural checks still run on it.
func TestReplayMemoryIsBounded(t *testing.T) {
	dir := plan(t, "../testdata/models/mlp/model.onnx", "autodiff,fuse,reorder,assign")
	lp, err := plancheck.LoadDir(dir)
	require.NoError(t, err)
	lp.Arena.SizeBytes = 1 << 40
	_, err = plancheck.CheckStructure(lp)
	require.NoError(t, err)
	_, err = plancheck.CheckPlan(lp, 1)
	require.ErrorContains(t, err, "--fast checks the plan without replaying it")
}

// TestLibraryCallsReplay: a transformer step's contractions are cuBLAS
// calls; the replay recomputes the ones whose operands and result are
// the op's own from the call's parameters and compares them with the
// interpreter, so a call that sums too few terms is caught, and so are
// calls cuBLAS would refuse or that would touch bytes outside their
// arguments.
func TestLibraryCallsReplay(t *testing.T) {
	dir := plan(t, "../testdata/models/one_layer_transformer/model.onnx", "autodiff,optimizer{kind=sgd,lr=0.01},fuse,reorder,assign")
	validate(t, dir)
	p, f, err := plancheck.Load(dir)
	require.NoError(t, err)
	r, err := plancheck.Check(p, f, 3)
	require.NoError(t, err)
	require.Positive(t, r.LibraryCalls)
	require.Positive(t, r.GEMMsChecked, "library calls recomputed")
	checked := -1
	for i, n := range p.Nodes {
		if n.Kind == "library" && n.Last && n.Library.Beta == 0 && n.Library.K > 1 {
			checked = i
		}
	}
	require.GreaterOrEqual(t, checked, 0, "a library call that is its op's last node")
	for _, c := range []struct {
		name  string
		apply func(l *cuda.Library)
		want  string
	}{
		{"one term fewer", func(l *cuda.Library) { l.K-- }, "terms, where op"},
		{"lda below the rows", func(l *cuda.Library) { l.LDA = 0 }, "positive int"},
		{"a leading dimension past its argument", func(l *cuda.Library) { l.LDB *= 1000 }, "touches"},
		{"a beta without reading C", func(l *cuda.Library) { l.Beta = 1 }, "access is"},
		{"mixed types", func(l *cuda.Library) { l.AType = "bf16" }, "which it does not do"},
		{"alpha 2", func(l *cuda.Library) { l.Alpha = 2 }, "alpha"},
	} {
		q := load(t, dir)
		lib := *q.Nodes[checked].Library
		c.apply(&lib)
		q.Nodes[checked].Library = &lib
		require.ErrorContains(t, check(t, dir, q), c.want, c.name)
	}
}

// TestBiasEpilogueReplays: linear layers whose bias cuBLASLt adds in the
// GEMM's epilogue (codegen/cuda/testdata/bias.kir); the replay adds the
// bias it reads and compares with the interpreter, so a bias read from
// the wrong place, or dropped, is caught, and so are a bias argument
// too short for the rows, one that overlaps C or is not 16-byte aligned,
// and epilogues the runtime does not call.
func TestBiasEpilogueReplays(t *testing.T) {
	dir := planKir(t, "../codegen/cuda/testdata/bias.kir", "fuse,reorder,assign")
	validate(t, dir)
	p, f, err := plancheck.Load(dir)
	require.NoError(t, err)
	r, err := plancheck.Check(p, f, 3)
	require.NoError(t, err)
	fused := []int{}
	for i, n := range p.Nodes {
		if n.Kind == "library" && n.Library.Call == cuda.LtCall {
			require.Equal(t, cuda.BiasEpilogue, n.Library.Epilogue)
			fused = append(fused, i)
		}
	}
	// The gemm's product goes to a temporary of the op that squares and
	// sums it, which the replay does not compute; the add's is the op's
	// result.
	require.Len(t, fused, 2, "the add after a matmul and the gemm's bias")
	require.Equal(t, 1, r.GEMMsChecked, "library calls recomputed")
	for _, i := range fused {
		for _, c := range []struct {
			name   string
			apply  func(n *cuda.Node)
			want   string
			replay bool // caught by the recomputation
		}{
			{"the bias read from A", func(n *cuda.Node) { a := *n.Args[0].Pointer; a.SizeBytes = 4 * n.Library.M; n.Args[3].Pointer = &a }, "where the interpreter has", true},
			{"no bias", func(n *cuda.Node) { n.Library.Call, n.Library.Epilogue, n.Args = cuda.GemmCall, "", n.Args[:3] }, "where the interpreter has", true},
			{"a bias off its alignment", func(n *cuda.Node) { n.Args[3].Pointer.Offset += 4 }, "aligned", false},
			{"a bias short of the rows", func(n *cuda.Node) { n.Args[3].Pointer.SizeBytes = 4 * (n.Library.M - 1) }, "the bias is read for", false},
			{"a bias over C", func(n *cuda.Node) { a := *n.Args[2].Pointer; a.Mode = "read"; n.Args[3].Pointer = &a }, "overlaps C", false},
			{"cuBLAS with an epilogue", func(n *cuda.Node) { n.Library.Call = cuda.GemmCall }, "has no epilogue", false},
			{"a ReLU epilogue", func(n *cuda.Node) { n.Library.Epilogue = "relu_bias" }, "with epilogue", false},
			{"a batch of 2", func(n *cuda.Node) { n.Library.Batch, n.Library.StrideC = 2, 0 }, "batch", false},
		} {
			if c.replay && !p.Nodes[i].Last {
				continue
			}
			q := load(t, dir)
			nd := &q.Nodes[i]
			lib := *nd.Library
			nd.Library = &lib
			args := append([]cuda.KArg(nil), nd.Args...)
			for j := range args {
				a := *args[j].Pointer
				args[j].Pointer = &a
			}
			nd.Args = args
			c.apply(nd)
			require.ErrorContains(t, check(t, dir, q), c.want, "node %d: %s", i, c.name)
		}
	}
}

// TestAccumulatingGemmReplays: microbatches sum the weight gradients
// with gemms that add their C operand in place, which are cuBLAS calls
// with beta 1; the replay adds the operand it finds in C and compares
// with the interpreter, so a sum of one term fewer is caught, and so is
// the call made with beta 0 (the operand overwritten, not added).
func TestAccumulatingGemmReplays(t *testing.T) {
	dir := planKir(t, "../codegen/cuda/testdata/mlp.kir", "autodiff{loss=sum},microbatch{n=2},fuse,reorder,assign")
	p, f, err := plancheck.Load(dir)
	require.NoError(t, err)
	r, err := plancheck.Check(p, f, 3)
	require.NoError(t, err)
	var sums []int
	for i, n := range p.Nodes {
		if n.Kind == "library" && n.Library.Beta == 1 {
			sums = append(sums, i)
		}
	}
	require.Len(t, sums, 2, "the two weight gradients' sums over the microbatches")
	require.GreaterOrEqual(t, r.GEMMsChecked, 2+len(sums), "library calls recomputed, the sums among them")
	for _, i := range sums {
		// One term fewer, and beta 0 (the operand overwritten).
		q := load(t, dir)
		lib := *q.Nodes[i].Library
		lib.K--
		q.Nodes[i].Library = &lib
		require.ErrorContains(t, check(t, dir, q), "terms, where op", "node %d with a term fewer", i)
		q = load(t, dir)
		lib = *q.Nodes[i].Library
		lib.Beta = 0
		q.Nodes[i].Library = &lib
		c := *q.Nodes[i].Args[2].Pointer
		c.Mode = "write"
		q.Nodes[i].Args = append([]cuda.KArg(nil), q.Nodes[i].Args...)
		q.Nodes[i].Args[2].Pointer = &c
		require.ErrorContains(t, check(t, dir, q), "where the interpreter has", "node %d with beta 0", i)
	}
}
