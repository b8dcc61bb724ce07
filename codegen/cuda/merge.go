package cuda

import (
	"fmt"
	"strconv"
	"strings"
)

// maxMergedParams bounds the parameters of a merged launch (8 bytes each;
// CUDA takes 4 KiB of kernel parameters on every architecture we target).
const maxMergedParams = 256

// maxGridBlocks is the most blocks a launch's grid may have along x.
const maxGridBlocks = 1<<31 - 1

// mergeIndependent rewrites the launches of one kernel op: a run of
// consecutive stage launches on one stream of which none touches bytes
// another writes becomes one launch of a kernel whose blocks are split
// between the stages (each stage a device function taking its block
// index). Only stages outside loops merge (mergeable), and only while the
// merged grid stays within CUDA's 2^31-1 blocks. Stages that depend on
// one another (a fold after its partial sums, a scatter after the fill
// it adds into) stay separate launches: they need the grid-wide order
// that only launch boundaries give.
func (b *planner) mergeIndependent(nodes []Node) ([]Node, error) {
	var out []Node
	for i := 0; i < len(nodes); {
		j := i + 1
		if mergeable(nodes[i]) {
			params, blocks := len(nodes[i].Args), int64(nodes[i].Grid[0])
			for j < len(nodes) && mergeable(nodes[j]) && nodes[j].Stream == nodes[i].Stream &&
				params+len(nodes[j].Args) <= maxMergedParams && blocks+int64(nodes[j].Grid[0]) <= maxGridBlocks &&
				independent(nodes[i:j], nodes[j]) {
				params += len(nodes[j].Args)
				blocks += int64(nodes[j].Grid[0])
				j++
			}
		}
		if j == i+1 {
			out = append(out, nodes[i])
			i = j
			continue
		}
		m, err := b.merged(nodes[i:j])
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		i = j
	}
	return out, nil
}

// mergeable says whether launch n may join a merged launch: a stage
// outside any loop. A stage inside a loop runs once per iteration with
// the indices as arguments, and plan-check holds each kernel to one run
// per point of its loops; merging one iteration's launch with another
// stage's would break that count.
func mergeable(n Node) bool { return n.stage != nil && len(n.stage.outer) == 0 }

// independent reports whether node n touches no bytes that a node of
// group writes, and writes none that one reads.
func independent(group []Node, n Node) bool {
	for _, g := range group {
		for _, a := range g.Args {
			for _, c := range n.Args {
				if a.Pointer == nil || c.Pointer == nil {
					continue
				}
				p, q := a.Pointer, c.Pointer
				if p.Space == q.Space && p.Slot == q.Slot && p.Offset < q.Offset+q.SizeBytes && q.Offset < p.Offset+p.SizeBytes &&
					(p.Mode != "read" || q.Mode != "read") {
					return false
				}
			}
		}
	}
	return true
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

// mergedSource writes the device function of each stage of group not
// written yet, and the kernel that dispatches blocks to them, with its
// launch contract: the threads of every stage before the last in whole
// blocks, and the parameters of each stage in turn.
func (b *planner) mergedSource(name string, group []Node) (string, []string, error) {
	var src, params, calls, bytes, modes, types []string
	threads, start := int64(0), 0
	for k, n := range group {
		sk := n.stage
		if !b.bodySrc[sk.name] {
			body := *sk
			body.body = true
			s, err := kernelSource(&body, b.consts)
			if err != nil {
				return "", nil, err
			}
			src = append(src, s)
			b.bodySrc[sk.name] = true
		}
		t, err := sk.pointerTypes()
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
	src = append(src, launchContract(threads, bytes, modes, nil)+
		fmt.Sprintf("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n  const long long kiln_block = blockIdx.x;\n%s\n}\n",
			BlockSize, name, strings.Join(params, ", "), strings.Join(calls, "\n")))
	return strings.Join(src, ""), types, nil
}
