package ir

import "fmt"

// Shape ops: views and data movement.

func init() {
	Register(&OpDef{
		Name: "reshape", Summary: "same elements, new shape (a view)", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "shape", Kind: AttrList, Required: true}},
		Infer: func(in []Type, a Attrs) ([]Type, error) {
			shape := Shape(a.Ints("shape", nil))
			n, ok := shape.NumElements()
			if !ok {
				return nil, fmt.Errorf("reshape target %s is not a valid shape", shape)
			}
			if n != in[0].NumElements() {
				return nil, fmt.Errorf("cannot reshape %s (%d elements) to %s (%d elements)", in[0], in[0].NumElements(), shape, n)
			}
			return []Type{{DType: in[0].DType, Shape: shape}}, nil
		},
		FLOPs:  zeroFLOPs,
		Fusion: Injective,
		View:   true,
	})
	Register(&OpDef{
		Name: "transpose", Summary: "permute dimensions", MinOperands: 1, MaxOperands: 1,
		Attrs: []AttrSpec{{Name: "perm", Kind: AttrList, Required: true}},
		Infer: func(in []Type, a Attrs) ([]Type, error) {
			perm := a.Ints("perm", nil)
			if err := CheckPermutation(perm, in[0].Rank()); err != nil {
				return nil, err
			}
			out := make(Shape, len(perm))
			for i, p := range perm {
				out[i] = in[0].Shape[p]
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs:  zeroFLOPs,
		Fusion: Injective,
	})
}

// CheckPermutation reports whether perm is a permutation of 0..rank-1.
func CheckPermutation(perm []int64, rank int) error {
	if len(perm) != rank {
		return fmt.Errorf("permutation %v has %d entries for rank %d", perm, len(perm), rank)
	}
	seen := make([]bool, rank)
	for _, p := range perm {
		if p < 0 || p >= int64(rank) || seen[p] {
			return fmt.Errorf("%v is not a permutation of 0..%d", perm, rank-1)
		}
		seen[p] = true
	}
	return nil
}

// NormalizeAxis maps a possibly negative axis into [0, rank).
func NormalizeAxis(axis int64, rank int) (int, error) {
	if axis < -int64(rank) || axis >= int64(rank) {
		return 0, fmt.Errorf("axis %d is out of range for rank %d", axis, rank)
	}
	if axis < 0 {
		axis += int64(rank)
	}
	return int(axis), nil
}
