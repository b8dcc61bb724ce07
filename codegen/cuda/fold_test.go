package cuda

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/ir/scalar"
)

// TestBlockFoldsReachEveryThread: a stage of a point per row folds each
// long reduction every thread reaches, and only those: the sum read
// under a guard first and plainly later is folded, before the branch; a
// reduction only under a guard, one in the index of a guarded read,
// and a short one stay in each thread. The device function has no
// __syncthreads inside a branch of the stage's own code.
func TestBlockFoldsReachEveryThread(t *testing.T) {
	x := &loops.Buffer{Name: "x", Type: ir.Type{DType: ir.F32, Shape: ir.Shape{8, 1024}}}
	idx := &loops.Buffer{Name: "i", Type: ir.Type{DType: ir.I64, Shape: ir.Shape{8}}}
	out := &loops.Buffer{Name: "y", Type: ir.Type{DType: ir.F32, Shape: ir.Shape{8}}}
	row := &loops.Var{ID: 1}
	sum := func(id int, n int64, op scalar.Prim) *loops.Reduce {
		k := &loops.Var{ID: id}
		return &loops.Reduce{Op: op, Vars: []*loops.Var{k}, Extents: []int64{n}, Acc: loops.F32,
			Body: &loops.Load{Buf: x, Index: []loops.Expr{row, k}}}
	}
	shared, maxed, guarded, short := sum(2, 1024, scalar.Add), sum(3, 1024, scalar.Max), sum(4, 1024, scalar.Min), sum(5, 100, scalar.Add)
	positive := &loops.Compare{Pred: scalar.Ge, A: &loops.Load{Buf: idx, Index: []loops.Expr{row}}, B: loops.Int{V: 1}}
	inIndex := &loops.Load{Buf: x, Index: []loops.Expr{row, &loops.Convert{X: sum(6, 1024, scalar.Add), To: loops.I64}},
		Guard: &loops.Compare{Pred: scalar.Ge, A: &loops.Load{Buf: idx, Index: []loops.Expr{row}}, B: loops.Int{V: 0}}}
	value := &loops.Binary{Op: scalar.Add, A: &loops.Binary{Op: scalar.Add,
		A: &loops.Guarded{Cond: positive, X: &loops.Binary{Op: scalar.Add, A: shared, B: guarded}}, B: maxed},
		B: &loops.Binary{Op: scalar.Add, A: &loops.Binary{Op: scalar.Add, A: short, B: inIndex}, B: shared}}
	st := &loops.Stage{Vars: []*loops.Var{row}, Extents: []int64{8}, Out: out, Value: value}
	folds := blockFolds(st, nil)
	require.ElementsMatch(t, []*loops.Reduce{shared, maxed}, folds, "the sum (read plainly after the guard) and the max")

	sk := &stageKernel{name: "k", stage: st, ptrs: pointers(st, nil), threads: 8 * BlockSize, fold: folds, body: true}
	src, err := kernelSource(sk, &constTable{names: map[*ir.Dense]string{}})
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(src, "kiln_block_fold("), "two folds: %s", src)
	first := strings.Index(src, "if (")
	require.Less(t, strings.LastIndex(src, "kiln_block_fold("), first, "both folds before the first branch: %s", src)
	require.NotContains(t, src, "if (kiln_i >=", "no thread leaves before the folds")
}
