package ir

import "fmt"

// Optimizer updates: each overwrites a parameter (and its optimizer state)
// in place from its gradient. They have no results, are impure (never
// removed, merged or recomputed), and the overwritten operands must be
// inout arguments. An update may take one more operand, a bool scalar:
// when it is false the update writes nothing (a step skipped because
// dynamic loss scaling found non-finite gradients). overwrite copies a
// value into an inout argument (the loss-scale state).

func init() {
	common := []AttrSpec{{Name: "lr", Kind: AttrFloat, Required: true}, {Name: "weight_decay", Kind: AttrFloat}}
	// sameAll checks n operands of one float type and the optional
	// condition after them.
	sameAll := func(n int) func(in []Type, _ AttrValues) ([]Type, error) {
		return func(in []Type, _ AttrValues) ([]Type, error) {
			if len(in) > n {
				if c := in[n]; c.DType != Bool || c.Rank() != 0 {
					return nil, fmt.Errorf("the condition must be a bool scalar, got %s", c)
				}
				in = in[:n]
			}
			for _, t := range in[1:] {
				if !t.Equal(in[0]) {
					return nil, fmt.Errorf("operands %s and %s differ", in[0], t)
				}
			}
			return nil, floatOperand(in[0])
		}
	}
	perElement := func(k int64) func(in, _ []Type, _ AttrValues) int64 {
		return func(in, _ []Type, _ AttrValues) int64 { return k * in[0].NumElements() }
	}
	Register(&OpDef{
		Name: "sgd_update", Summary: "p -= lr * (g + weight_decay * p), in place (p, g[, ok])",
		MinOperands: 2, MaxOperands: 3, Attrs: common, Infer: sameAll(2),
		FLOPs: perElement(3), Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0}, Update: true,
	})
	Register(&OpDef{
		Name: "momentum_update", Summary: "buf = momentum * buf + g'; p -= lr * buf, in place (p, g, buf[, ok]), g' = g + weight_decay * p",
		MinOperands: 3, MaxOperands: 4, Attrs: append(common, AttrSpec{Name: "momentum", Kind: AttrFloat, Default: FloatAttr(0.9)}), Infer: sameAll(3),
		FLOPs: perElement(5), Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0, 2}, Update: true,
	})
	Register(&OpDef{
		Name: "adam_update", Summary: "Adam (decoupled = true: AdamW) with bias correction for step t, in place (p, g, m, v[, ok])",
		MinOperands: 4, MaxOperands: 5,
		Attrs: append(common, AttrSpec{Name: "beta1", Kind: AttrFloat, Default: FloatAttr(0.9)}, AttrSpec{Name: "beta2", Kind: AttrFloat, Default: FloatAttr(0.999)},
			AttrSpec{Name: "eps", Kind: AttrFloat, Default: FloatAttr(1e-8)}, AttrSpec{Name: "step", Kind: AttrInt, Default: IntAttr(1)}, AttrSpec{Name: "decoupled", Kind: AttrBool}),
		Infer: sameAll(4), FLOPs: perElement(12), Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0, 2, 3}, Update: true,
	})
	Register(&OpDef{
		Name: "overwrite", Summary: "dst := src, in place (dst, src)",
		MinOperands: 2, MaxOperands: 2,
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			if !in[0].Equal(in[1]) {
				return nil, fmt.Errorf("operands %s and %s differ", in[0], in[1])
			}
			return nil, nil
		},
		FLOPs: zeroFLOPs, Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0},
	})
}
