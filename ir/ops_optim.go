package ir

import "fmt"

// Optimizer updates: each overwrites a parameter (and its optimizer state)
// in place from its gradient. They have no results, are impure (never
// removed, merged or recomputed), and the overwritten operands must be
// inout arguments. What changes from step to step is an operand, never an
// attribute: the learning rate (a float scalar, after the tensors), the
// momentum of SGD (after the learning rate) and, for Adam, the number of
// steps taken before this one (bias correction uses t = that number + 1,
// so the first step is t = 1) and its two betas, all float scalars (a
// scheduler such as OneCycleLR moves the learning rate and the momentum or
// beta1 every step). An update may take one more operand, a bool scalar:
// when it is false the update writes nothing (a step skipped because
// dynamic loss scaling found non-finite gradients). overwrite copies a
// value into an inout argument (the loss-scale state, the step count,
// batch-norm running statistics).

func init() {
	common := []AttrSpec{{Name: "weight_decay", Kind: AttrFloat}}
	// updateTypes checks n tensor operands of one float type, then the
	// scalars float scalars, then the optional condition.
	updateTypes := func(n, scalars int) func(in []Type, _ AttrValues) ([]Type, error) {
		return func(in []Type, _ AttrValues) ([]Type, error) {
			if len(in) < n+scalars {
				return nil, fmt.Errorf("want %d tensors and %d float scalars (the learning rate and the hyper-parameters that change), got %d operands", n, scalars, len(in))
			}
			if len(in) > n+scalars {
				if c := in[n+scalars]; c.DType != Bool || c.Rank() != 0 {
					return nil, fmt.Errorf("the condition must be a bool scalar, got %s", c)
				}
			}
			for _, t := range in[1:n] {
				if !t.Equal(in[0]) {
					return nil, fmt.Errorf("operands %s and %s differ", in[0], t)
				}
			}
			for _, t := range in[n : n+scalars] {
				if t.Rank() != 0 || !t.DType.IsFloat() {
					return nil, fmt.Errorf("the learning rate and the hyper-parameters after it must be float scalars, got %s", t)
				}
			}
			return nil, floatOperand(in[0])
		}
	}
	perElement := func(k int64) func(in, _ []Type, _ AttrValues) int64 {
		return func(in, _ []Type, _ AttrValues) int64 { return k * in[0].NumElements() }
	}
	Register(&OpDef{
		Name: "sgd_update", Summary: "p -= lr * (g + weight_decay * p), in place (p, g, lr[, ok])",
		MinOperands: 3, MaxOperands: 4, Attrs: common, Infer: updateTypes(2, 1),
		FLOPs: perElement(3), Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0}, Update: true,
	})
	Register(&OpDef{
		Name: "momentum_update", Summary: "buf = momentum * buf + g'; p -= lr * buf (nesterov: p -= lr * (g' + momentum * buf)), in place (p, g, buf, lr, momentum[, ok]), g' = g + weight_decay * p",
		MinOperands: 5, MaxOperands: 6, Attrs: append(common, AttrSpec{Name: "nesterov", Kind: AttrBool}), Infer: updateTypes(3, 2),
		FLOPs: perElement(5), Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0, 2}, Update: true,
	})
	adamAttrs := append(common, AttrSpec{Name: "eps", Kind: AttrFloat, Default: FloatAttr(1e-8)}, AttrSpec{Name: "decoupled", Kind: AttrBool})
	Register(&OpDef{
		Name: "adam_update", Summary: "Adam (decoupled = true: AdamW) with bias correction for step t = taken + 1, in place (p, g, m, v, lr, taken, beta1, beta2[, ok])",
		MinOperands: 8, MaxOperands: 9, Attrs: adamAttrs,
		Infer: updateTypes(4, 4), FLOPs: perElement(12), Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0, 2, 3}, Update: true,
	})
	Register(&OpDef{
		Name: "amsgrad_update", Summary: "Adam's AMSGrad variant: as adam_update, dividing by the root of vmax = max(vmax, v), in place (p, g, m, v, vmax, lr, taken, beta1, beta2[, ok])",
		MinOperands: 9, MaxOperands: 10, Attrs: adamAttrs,
		Infer: updateTypes(5, 4), FLOPs: perElement(13), Fusion: Opaque, Impure: true, KeepF32: true, Grad: NoGrad, Writes: []int{0, 2, 3, 4}, Update: true,
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
