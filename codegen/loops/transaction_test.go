package loops_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	"github.com/kiln-compiler/kiln/passtest"
)

// transactionalOrder is the first kernel of p that tests the status
// (writes an argument) and the last check kernel.
func transactionalOrder(t *testing.T, p *loops.Program) (firstWrite, lastCheck int) {
	t.Helper()
	firstWrite, lastCheck = -1, -1
	for i, k := range p.Kernels {
		if k.TestStatus && firstWrite < 0 {
			firstWrite = i
		}
		if k.Op == nil {
			lastCheck = i
		}
	}
	return firstWrite, lastCheck
}

// TestLabelsCheckedBeforeRunningStatistics: batch norm's running
// statistics are written back in the forward, before the cross-entropy
// reads its labels, and so is the embedding's gather: the labels and the
// indices (arguments) are checked by kernels of their own at the start,
// so a bad one fails the run before any write. The gradients read the
// same values against the same bounds: no second check.
func TestLabelsCheckedBeforeRunningStatistics(t *testing.T) {
	src := `func @f(%x: f32[4,2,3,3], %w: f32[2,2,1,1] {param}, %g: f32[2] {param}, %b: f32[2] {param}, %m: f32[2] {state}, %v: f32[2] {state}, %e: f32[7,18] {param}, %i: i64[4], %y: i64[4]) -> (f32[]) {
  %c = conv2d(%x, %w) : f32[4,2,3,3]
  %n, %rm, %rv, %sm, %si = batch_norm_train(%c, %g, %b, %m, %v) {epsilon = 1e-05, momentum = 0.9} : f32[4,2,3,3], f32[2], f32[2], f32[2], f32[2]
  %h = reshape(%n) {shape = [4, 18]} : f32[4,18]
  %emb = gather(%e, %i) : f32[4,18]
  %s = add(%h, %emb) : f32[4,18]
  %l = softmax_cross_entropy(%s, %y) : f32[]
  return %l
}
`
	m := passtest.Parse(t, src)
	passtest.Run(t, m, "autodiff,optimizer{kind=adam},assign")
	p, err := loops.Lower(m.Funcs[0])
	require.NoError(t, err)
	for _, k := range p.Kernels {
		require.NotNil(t, k.Op, "loops.Lower without Transactional adds no check kernel")
	}
	p, err = loops.LowerWith(m.Funcs[0], loops.Options{Transactional: true})
	require.NoError(t, err)
	first, last := transactionalOrder(t, p)
	require.GreaterOrEqual(t, first, 0, "the step writes its arguments")
	require.Less(t, last, first, "every check kernel runs before the first write")
	var checks []*loops.Kernel
	for i, k := range p.Kernels {
		if k.Op == nil {
			checks = append(checks, k)
			continue
		}
		writes := false
		for _, op := range append([]*ir.Op{k.Op}, regionOps(k.Op)...) {
			writes = writes || len(op.Def().Writes) > 0
		}
		if writes {
			require.True(t, k.TestStatus, "kernel %d (%s) writes an argument without testing the status", i, k.Op.Kind)
		}
	}
	require.Len(t, checks, 2, "the labels and the gather's indices are checked up front, once each: the gradients reuse those checks")
	require.Equal(t, "k0_check_gather", checks[0].Name)
	require.Equal(t, "k1_check_softmax_cross_entropy", checks[1].Name)
	require.Same(t, checks[1], p.Kernels[1], "both at the start of the run")
}

func regionOps(op *ir.Op) []*ir.Op {
	if op == nil || op.Region == nil {
		return nil
	}
	return op.Region.Body
}

// TestIndicesComputedAfterAWriteRestore: an index computed only after the
// step has written an argument cannot be checked before the write: the
// argument is copied to a backup past the planned arena before it is
// written, and the program's Restore copies it back. Computed before the
// write, the same index is checked right after the kernel that makes it,
// with no backup.
func TestIndicesComputedAfterAWriteRestore(t *testing.T) {
	src := `func @f(%s: f32[4] {state, inout}, %x: f32[4], %e: f32[5,3]) -> (f32[4,3]) {
  %n = add(%s, %x) : f32[4]
  overwrite(%s, %n)
  %i = cast(%x) {to = i64} : i64[4]
  %g = gather(%e, %i) : f32[4,3]
  return %g
}
`
	m := passtest.CheckPipeline(t, src, "assign", 0)
	planned := int64(0)
	if p, err := loops.Lower(m.Funcs[0]); assert.NoError(t, err) {
		planned = p.ArenaBytes
	}
	p, err := loops.LowerWith(m.Funcs[0], loops.Options{Transactional: true})
	require.NoError(t, err)
	require.Len(t, p.Restore, 1)
	require.Equal(t, int64(16), p.BackupBytes, "one f32[4] argument backed up")
	require.GreaterOrEqual(t, p.ArenaBytes, planned+16)
	var kinds []string
	for _, k := range p.Kernels {
		if k.Op == nil {
			kinds = append(kinds, k.Name)
		} else {
			kinds = append(kinds, k.Op.Kind)
		}
	}
	require.Equal(t, []string{"add", "k1_backup", "overwrite", "cast", "gather"}, kinds)
	require.Equal(t, 0, p.Kernels[0].Backups)
	require.Equal(t, 1, p.Kernels[2].Backups, "a failure found before the overwrite restores its backup")

	early := `func @f(%s: f32[4] {state, inout}, %x: f32[4], %e: f32[5,3]) -> (f32[4,3]) {
  %i = cast(%x) {to = i64} : i64[4]
  %n = add(%s, %x) : f32[4]
  overwrite(%s, %n)
  %g = gather(%e, %i) : f32[4,3]
  return %g
}
`
	m = passtest.CheckPipeline(t, early, "assign", 0)
	p, err = loops.LowerWith(m.Funcs[0], loops.Options{Transactional: true})
	require.NoError(t, err)
	require.Empty(t, p.Restore, "nothing to back up")
	require.Equal(t, "cast", p.Kernels[0].Op.Kind)
	require.Nil(t, p.Kernels[1].Op, "the check follows the index's kernel")
	first, _ := transactionalOrder(t, p)
	require.Equal(t, 3, first)
}

// TestPartialChecksProveNothing: an embedding gather fused with a slice
// (CLS pooling) computes, and checks, only the rows the slice keeps; the
// gradient's scatter after the updates reads every index. The fused
// check proves nothing about the others: the indices are checked whole
// at the start of the run.
func TestPartialChecksProveNothing(t *testing.T) {
	src := `func @f(%e: f32[7,4] {param}, %ids: i64[2,3], %w: f32[4,2] {param}) -> (f32[]) {
  %emb = gather(%e, %ids) : f32[2,3,4]
  %cls = slice(%emb) {axes = [1], ends = [1], starts = [0]} : f32[2,1,4]
  %flat = reshape(%cls) {shape = [2, 4]} : f32[2,4]
  %y = matmul(%flat, %w) : f32[2,2]
  %l = reduce_sum(%y) : f32[]
  return %l
}
`
	m := passtest.Parse(t, src)
	passtest.Run(t, m, "autodiff,optimizer{kind=adam},fuse,assign")
	p, err := loops.LowerWith(m.Funcs[0], loops.Options{Transactional: true})
	require.NoError(t, err)
	fusedGather := false
	for _, k := range p.Kernels {
		for _, op := range regionOps(k.Op) {
			fusedGather = fusedGather || op.Kind == "gather"
		}
	}
	require.True(t, fusedGather, "the gather is fused (else the case tests nothing)")
	require.Nil(t, p.Kernels[0].Op, "a whole check of the indices at the start")
	require.Equal(t, "k0_check_gather_grad", p.Kernels[0].Name)
}
