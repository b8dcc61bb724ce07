package plancheck_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLibraryCallsComputeTheWholeProduct: every library call of a
// microbatched MLP step (and, without -short, a transformer's) is refused
// with one row, one column or one batch fewer, or with a single term per
// sum, whether or not the replay can recompute it: the call must be a
// product its op's loop program computes, every byte it owns it writes,
// and a result it is alone to make it writes whole (an accumulating call
// one column short left that column's old sum, and a gradient's column
// unwritten passed before).
func TestLibraryCallsComputeTheWholeProduct(t *testing.T) {
	dirs := []string{planKir(t, "../codegen/cuda/testdata/mlp.kir", "autodiff{loss=sum},microbatch{n=2},fuse,reorder,assign")}
	if !testing.Short() {
		dirs = append(dirs, plan(t, "../testdata/models/one_layer_transformer/model.onnx", "autodiff,optimizer{kind=sgd,lr=0.01},fuse,reorder,assign"))
	}
	for _, dir := range dirs {
		base := load(t, dir)
		require.NoError(t, check(t, dir, base))
		calls := 0
		for i, n := range base.Nodes {
			if n.Kind != "library" {
				continue
			}
			calls++
			for _, mut := range []string{"m-1", "n-1", "k=1", "batch-1"} {
				lib := *n.Library
				switch mut {
				case "m-1":
					lib.M--
				case "n-1":
					lib.N--
				case "k=1":
					lib.K = 1
				case "batch-1":
					lib.Batch--
				}
				if lib.M < 1 || lib.N < 1 || lib.Batch < 1 || lib == *n.Library {
					continue
				}
				q := load(t, dir)
				q.Nodes[i].Library = &lib
				require.Error(t, check(t, dir, q), "%s: node %d (%s) with %s", dir, i, fmt.Sprint(n.Library), mut)
			}
		}
		require.Positive(t, calls)
	}
}
