package cuda

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/codegen/loops"
)

// maxMergedParams bounds the parameters of a combined launch (8 bytes
// each; CUDA takes 4 KiB of kernel parameters on every architecture we
// target).
const maxMergedParams = 256

// maxGridBlocks is the most blocks a launch's grid may have along x.
const maxGridBlocks = 1<<31 - 1

// maxPhaseCalls bounds the stage calls of one cooperative kernel, so
// that a long loop of stages (a convolution per image and chunk) does
// not become one function nvcc takes minutes over.
const maxPhaseCalls = 1024

// combine rewrites the launches of one kernel op so that each run of
// consecutive stage launches on one stream (nothing else between them:
// no library call, copy, collective or host function) is one launch:
//   - a run of which no launch touches bytes another writes, all outside
//     loops, is a merged launch: its grid is the stages' grids end to
//     end, each stage a device function taking its block index
//     (mergedSource);
//   - any other run is a cooperative launch (cooperative): every
//     block of a grid the GPU holds at once loops over the blocks of each
//     stage, and a grid-wide barrier (kiln_grid_sync) separates a stage
//     from the first later one that touches bytes it writes or writes
//     bytes it reads (a fold after its partial sums, a normalisation
//     after its statistics). Independent neighbours share a phase.
//
// A run stops before a launch that would take the kernel past
// maxMergedParams parameters, maxPhaseCalls stage calls or
// maxSharedBytes of static shared memory, or a merged grid past 2^31-1
// blocks.
func (b *planner) combine(nodes []Node) ([]Node, error) {
	b.unrestrict(nodes)
	var groups [][]Node
	for i := 0; i < len(nodes); {
		j := i + 1
		if combinable(nodes[i]) {
			params, shared := newParamSet(), newSharedSet()
			params.add(nodes[i])
			shared.add(nodes[i].stage)
			for j < len(nodes) && combinable(nodes[j]) && nodes[j].Stream == nodes[i].Stream && j-i < maxPhaseCalls {
				if !shared.add(nodes[j].stage) || !params.add(nodes[j]) {
					break
				}
				j++
			}
		}
		groups = append(groups, nodes[i:j])
		i = j
	}
	// A stage inside a loop runs either in cooperative kernels at every
	// iteration or in launches of its own at every one: plan-check holds
	// a kernel with loop indices to one launch per point of its loops. A
	// stage whose blocks synchronise (a tiled product, a block fold)
	// always runs in a cooperative kernel, which the emulation runs with
	// barriers.
	looped := map[string]bool{}
	for _, g := range groups {
		if len(g) > 1 && !mergeable(g) {
			for _, n := range g {
				if len(n.stage.outer) > 0 {
					looped[n.stage.name] = true
				}
			}
		}
	}
	var out []Node
	for _, g := range groups {
		switch {
		case len(g) == 1 && !(g[0].stage != nil && (looped[g[0].stage.name] || g[0].stage.barriers())):
			out = append(out, g[0])
		case len(g) > 1 && mergeable(g):
			m, err := b.merged(g)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		default:
			c, err := b.cooperative(g)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// combinable says whether launch n may join a combined launch: a stage
// launch (not a merged or cooperative one, a library call or a host
// function).
func combinable(n Node) bool { return n.Kind == "kernel" && n.stage != nil }

// mergeable says whether group can be one merged launch: stages outside
// loops (plan-check holds a kernel with loop indices to one launch per
// point of its loops), none that synchronises its block, none touching
// bytes another writes, and a grid of at most 2^31-1 blocks in all.
func mergeable(group []Node) bool {
	blocks := int64(0)
	for i, n := range group {
		if len(n.stage.outer) > 0 || n.stage.barriers() || !independent(group[:i], n) {
			return false
		}
		blocks += int64(n.Grid[0])
	}
	return blocks <= maxGridBlocks
}

// independent reports whether node n touches no bytes that a node of
// group writes, and writes none that one reads.
func independent(group []Node, n Node) bool {
	for _, g := range group {
		for _, a := range g.Args {
			for _, c := range n.Args {
				if a.Pointer != nil && c.Pointer != nil && conflict(a.Pointer, c.Pointer) {
					return false
				}
			}
		}
	}
	return true
}

// conflict says whether two accesses touch a common byte, one writing.
func conflict(p, q *Access) bool {
	return overlap(p, q) && (p.Mode != "read" || q.Mode != "read")
}

func overlap(p, q *Access) bool {
	return p.Space == q.Space && p.Slot == q.Slot && p.Offset < q.Offset+q.SizeBytes && q.Offset < p.Offset+p.SizeBytes
}

// unrestrict marks, for the stages of one op's launches, the pointers a
// stage only reads but another launch of the op writes: their device
// functions take them without __restrict__. Inside a combined kernel a
// const __restrict__ pointer lets nvcc read through the non-coherent
// read-only cache, which may hold bytes from before a barrier that
// another block has since overwritten.
func (b *planner) unrestrict(nodes []Node) {
	for _, n := range nodes {
		if n.stage == nil {
			continue
		}
		for j, p := range n.stage.ptrs {
			if p.write || j >= len(n.Args) || n.Args[j].Pointer == nil {
				continue
			}
			for _, m := range nodes {
				for _, a := range m.Args {
					if a.Pointer != nil && a.Pointer.Mode != "read" && overlap(a.Pointer, n.Args[j].Pointer) {
						if n.stage.plain == nil {
							n.stage.plain = map[bufKey]bool{}
						}
						n.stage.plain[p.key] = true
					}
				}
			}
		}
	}
}

// merged is the one launch of the independent stage launches group: its
// kernel calls stage k's device function with the blocks after those of
// the stages before it. One kernel serves every merge of the same stages
// with the same grids.
func (b *planner) merged(group []Node) (Node, error) {
	var key []string
	for _, n := range group {
		key = append(key, n.Kernel+":"+strconv.Itoa(n.Grid[0]))
	}
	k := strings.Join(key, "|")
	name, ok := b.mergedName[k]
	if !ok {
		name = fmt.Sprintf("%s_m%d", group[0].Kernel, len(b.mergedName))
		src, types, err := b.mergedSource(name, group)
		if err != nil {
			return Node{}, err
		}
		b.mergedName[k] = name
		b.kernels = append(b.kernels, src)
		b.argTypes[name] = types
	}
	m := Node{Kind: "kernel", Stream: group[0].Stream, Op: group[0].Op, Kernel: name, Grid: &[3]int{0, 1, 1}, Block: &[3]int{BlockSize, 1, 1}}
	for _, n := range group {
		m.Grid[0] += n.Grid[0]
		m.Args = append(m.Args, n.Args...)
	}
	return m, nil
}

// body writes the device function of stage launch n, once, and returns
// the C types of its pointer parameters.
func (b *planner) body(n Node) ([]string, error) {
	sk := n.stage
	if !b.bodySrc[sk.name] {
		body := *sk
		body.body = true
		s, err := kernelSource(&body, b.consts)
		if err != nil {
			return nil, err
		}
		b.kernels = append(b.kernels, s)
		b.bodySrc[sk.name] = true
	}
	return sk.pointerTypes()
}

// mergedSource writes the device function of each stage of group not
// written yet, and the kernel that dispatches blocks to them, with its
// launch contract: the threads of every stage before the last in whole
// blocks, and the parameters of each stage in turn.
func (b *planner) mergedSource(name string, group []Node) (string, []string, error) {
	var params, calls, bytes, modes, types []string
	threads, start := int64(0), 0
	for k, n := range group {
		sk := n.stage
		t, err := b.body(n)
		if err != nil {
			return "", nil, err
		}
		var args []string
		for _, pt := range t {
			p := fmt.Sprintf("b%d", len(types))
			types = append(types, pt)
			params = append(params, pt+"__restrict__ "+p)
			args = append(args, p)
		}
		kb, km, _ := sk.contract() // no scalars: a merged stage is outside any loop
		bytes, modes = append(bytes, kb...), append(modes, km...)
		block := "kiln_block"
		if start > 0 {
			block = fmt.Sprintf("kiln_block - %d", start)
		}
		call := fmt.Sprintf("%s_b(%s)", sk.name, strings.Join(append(args, block), ", "))
		if k < len(group)-1 {
			start += n.Grid[0]
			calls = append(calls, fmt.Sprintf("  if (kiln_block < %d) { %s; return; }", start, call))
			threads = int64(start) * BlockSize
		} else {
			calls = append(calls, "  "+call+";")
			threads += sk.threads
		}
	}
	return launchContract(threads, bytes, modes, nil) +
		fmt.Sprintf("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n  const long long kiln_block = blockIdx.x;\n%s\n}\n",
			BlockSize, name, strings.Join(params, ", "), strings.Join(calls, "\n")), types, nil
}

// paramSet is the parameters of a cooperative kernel: one per distinct
// byte range its stages touch (the same range read by one stage and
// written by another is one parameter, used both ways), in the order the
// stages first touch them, which plan-check follows.
type paramSet struct {
	index map[paramKey]int
	acc   []Access
}

type paramKey struct {
	space             string
	slot, buffer      int
	offset, sizeBytes int64
}

func newParamSet() *paramSet { return &paramSet{index: map[paramKey]int{}} }

func keyOfAccess(a *Access) paramKey {
	return paramKey{a.Space, a.Slot, a.Buffer, a.Offset, a.SizeBytes}
}

// add takes n's pointers in, unless that would pass maxMergedParams.
func (s *paramSet) add(n Node) bool {
	fresh := 0
	seen := map[paramKey]bool{}
	for _, a := range n.Args {
		if a.Pointer != nil {
			k := keyOfAccess(a.Pointer)
			if _, ok := s.index[k]; !ok && !seen[k] {
				seen[k] = true
				fresh++
			}
		}
	}
	if len(s.acc)+fresh > maxMergedParams {
		return false
	}
	for _, a := range n.Args {
		if a.Pointer == nil {
			continue
		}
		k := keyOfAccess(a.Pointer)
		i, ok := s.index[k]
		if !ok {
			i = len(s.acc)
			s.index[k] = i
			s.acc = append(s.acc, *a.Pointer)
		}
		// The mode is what the kernel does first: a range a stage writes
		// before later ones read it is written (its bytes need no
		// writer before the launch); one read before it is written is
		// read and written.
		if s.acc[i].Mode == "read" && a.Pointer.Mode != "read" {
			s.acc[i].Mode = "readwrite"
		}
	}
	return true
}

// cooperative is the one cooperative launch of the stage launches group
// (combine). Its grid is the most blocks any phase has; the runtime
// launches it with as many of them as the GPU holds at once.
func (b *planner) cooperative(group []Node) (Node, error) {
	name := fmt.Sprintf("%s_c%d", group[0].Kernel, len(b.mergedName))
	b.mergedName["cooperative:"+name] = name
	params := newParamSet()
	for _, n := range group {
		params.add(n)
	}
	elem := make([]string, len(params.acc)) // element types, from the stages' parameters
	var calls, phases []string
	blocks, start, phase := 0, 0, 0 // start: the first launch of the phase
	for i, n := range group {
		if i > 0 && !independent(group[start:i], n) {
			calls = append(calls, "  kiln_grid_sync();")
			start = i
			phase++
		}
		var touched []string // this call's parameters and how it uses them, for plan-check
		types, err := b.body(n)
		if err != nil {
			return Node{}, err
		}
		var args []string
		p := 0
		for _, a := range n.Args {
			if a.Pointer == nil {
				args = append(args, strconv.FormatInt(a.Value, 10)+"LL")
				continue
			}
			j := params.index[keyOfAccess(a.Pointer)]
			e := strings.TrimSpace(strings.TrimPrefix(strings.TrimSuffix(types[p], "*"), "const "))
			if elem[j] != "" && elem[j] != e {
				return Node{}, fmt.Errorf("stages %s and %s read the same bytes as %s and %s", group[0].Kernel, n.Kernel, elem[j], e)
			}
			elem[j] = e
			args = append(args, fmt.Sprintf("b%d", j))
			touched = append(touched, fmt.Sprintf("%d%s", j, shortMode[a.Pointer.Mode]))
			p++
		}
		phases = append(phases, fmt.Sprintf("%d:%s", phase, strings.Join(touched, ".")))
		// The scalars follow the pointers in the device function's
		// parameters, as in the node's arguments.
		calls = append(calls, fmt.Sprintf("  for (long long kiln_b = blockIdx.x; kiln_b < %dLL; kiln_b += gridDim.x) %s_b(%s);",
			n.Grid[0], n.stage.name, strings.Join(append(args, "kiln_b"), ", ")))
		blocks = max(blocks, n.Grid[0])
	}
	var decl, types, bytes, modes []string
	m := Node{Kind: "kernel", Stream: group[0].Stream, Op: group[0].Op, Kernel: name, Grid: &[3]int{blocks, 1, 1},
		Block: &[3]int{BlockSize, 1, 1}, Cooperative: true}
	for j := range params.acc {
		a := params.acc[j]
		t := elem[j] + " *"
		if a.Mode == "read" {
			t = "const " + t
		}
		types = append(types, t)
		decl = append(decl, fmt.Sprintf("%sb%d", t, j))
		bytes = append(bytes, strconv.FormatInt(a.SizeBytes, 10))
		modes = append(modes, shortMode[a.Mode])
		m.Args = append(m.Args, KArg{Kind: "pointer", Pointer: &a})
	}
	b.kernels = append(b.kernels, cooperativeContract(bytes, modes, phases)+
		fmt.Sprintf("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n%s\n}\n", BlockSize, name, strings.Join(decl, ", "), strings.Join(calls, "\n")))
	b.argTypes[name] = types
	return m, nil
}

// maxSharedBytes is the static shared memory a kernel may declare (48
// KiB on every architecture, without the opt-in of dynamic memory).
const maxSharedBytes = 48 << 10

// sharedSet is the static shared memory of a combined kernel's stages:
// each tiled product's tiles, and kiln_block_fold's array, once per type
// it folds.
type sharedSet struct {
	seen  map[string]bool
	bytes int64
}

func newSharedSet() *sharedSet { return &sharedSet{seen: map[string]bool{}} }

// add counts stage k's shared memory in, unless that would pass
// maxSharedBytes.
func (s *sharedSet) add(k *stageKernel) bool {
	fresh := map[string]int64{}
	if k.tile != nil {
		fresh["tile:"+k.name] = k.tile.sharedBytes(k.stage.Matmul.A.Kind())
	}
	for _, r := range k.fold {
		fresh["fold:"+cType(r.Acc)] = BlockSize * kindBytes(r.Acc)
	}
	total := s.bytes
	for key, n := range fresh {
		if !s.seen[key] {
			total += n
		}
	}
	if total > maxSharedBytes {
		return false
	}
	for key := range fresh {
		s.seen[key] = true
	}
	s.bytes = total
	return true
}

// kindBytes is the size of a C value of kind k.
func kindBytes(k loops.Kind) int64 {
	if k == loops.F32 {
		return 4
	}
	return 8
}

// shortMode is how a launch contract writes an access mode.
var shortMode = map[string]string{"read": "r", "write": "w", "readwrite": "rw"}
