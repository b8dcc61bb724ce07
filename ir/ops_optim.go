package ir

import "fmt"

// Optimizer updates: each overwrites a parameter (and its optimizer state)
// in place from its gradient. They have no results, are impure (never
// removed, merged or recomputed), and the overwritten operands must be
// inout arguments.

func init() {
	common := []AttrSpec{{Name: "lr", Kind: AttrFloat, Required: true}, {Name: "weight_decay", Kind: AttrFloat}}
	sameAll := func(in []Type, _ Attrs) ([]Type, error) {
		for _, t := range in[1:] {
			if !t.Equal(in[0]) {
				return nil, fmt.Errorf("operands %s and %s differ", in[0], t)
			}
		}
		return nil, floatOperand(in[0])
	}
	perElement := func(k int64) func(in, _ []Type, _ Attrs) int64 {
		return func(in, _ []Type, _ Attrs) int64 { return k * in[0].NumElements() }
	}
	Register(&OpDef{
		Name: "sgd_update", Summary: "p -= lr * (g + weight_decay * p), in place (p, g)",
		MinOperands: 2, MaxOperands: 2, Attrs: common, Infer: sameAll,
		FLOPs: perElement(3), Fusion: Opaque, Impure: true, Writes: []int{0},
	})
	Register(&OpDef{
		Name: "momentum_update", Summary: "buf = momentum * buf + g'; p -= lr * buf, in place (p, g, buf), g' = g + weight_decay * p",
		MinOperands: 3, MaxOperands: 3, Attrs: append(common, AttrSpec{Name: "momentum", Kind: AttrFloat}), Infer: sameAll,
		FLOPs: perElement(5), Fusion: Opaque, Impure: true, Writes: []int{0, 2},
	})
	Register(&OpDef{
		Name: "adam_update", Summary: "Adam (decoupled = true: AdamW) with bias correction for step t, in place (p, g, m, v)",
		MinOperands: 4, MaxOperands: 4,
		Attrs: append(common, AttrSpec{Name: "beta1", Kind: AttrFloat}, AttrSpec{Name: "beta2", Kind: AttrFloat},
			AttrSpec{Name: "eps", Kind: AttrFloat}, AttrSpec{Name: "step", Kind: AttrInt}, AttrSpec{Name: "decoupled", Kind: AttrBool}),
		Infer: sameAll, FLOPs: perElement(12), Fusion: Opaque, Impure: true, Writes: []int{0, 2, 3},
	})
}
