package loops

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir"
)

// Collectives lower as copies on a group of one rank. Across ranks they
// are calls into MPI or NCCL, which the backends do not make yet: the
// lowering says so and names the op.
func init() {
	for _, name := range []string{"all_reduce", "reduce_scatter", "all_gather", "broadcast"} {
		elementRules[name] = func(op *ir.Op, in []Tensor, out []ir.Type) ([]accessor, error) {
			if size, _ := ir.CollectiveGroup(op); size > 1 {
				return nil, fmt.Errorf("%s over %d ranks: compiled programs do not call MPI or NCCL yet (the interpreter runs ranks: interp.RunRanks)", op.Kind, size)
			}
			return []accessor{in[0].At}, nil
		}
	}
}
