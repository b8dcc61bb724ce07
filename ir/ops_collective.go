package ir

import (
	"fmt"
	"math"
)

// Collectives exchange tensors among the ranks of a group. Every op names
// its group by size and stride: rank r's group is the size ranks
// base + i·stride (i < size) with base = r − ((r / stride) mod size)·stride,
// the ranks along one axis of a row-major device mesh (for a mesh
// [dp=2, tp=4], tp is stride 1 and size 4, dp stride 4 and size 2). With
// size 1 a collective is a copy. Each rank of a group must run the same
// collectives in the same order. Collectives are impure: passes never
// merge, drop or recompute one.

// GroupOf returns the ranks of rank's group of size ranks spaced stride
// apart, in group order.
func GroupOf(rank, size, stride int64) []int64 {
	base := rank - ((rank/stride)%size)*stride
	out := make([]int64, size)
	for i := range out {
		out[i] = base + int64(i)*stride
	}
	return out
}

// CollectiveGroup returns the size and stride of a collective op.
func CollectiveGroup(op *Op) (size, stride int64) {
	a := op.Attr()
	return a.Int("size"), a.Int("stride")
}

// IsCollective reports whether kind is a collective op.
func IsCollective(kind string) bool {
	switch kind {
	case "all_reduce", "reduce_scatter", "all_gather", "broadcast":
		return true
	}
	return false
}

func init() {
	group := []AttrSpec{{Name: "size", Kind: AttrInt, Default: IntAttr(1)}, {Name: "stride", Kind: AttrInt, Default: IntAttr(1)}}
	withGroup := func(extra ...AttrSpec) []AttrSpec { return append(append([]AttrSpec(nil), group...), extra...) }
	checkGroup := func(a AttrValues) error {
		if a.Int("size") < 1 || a.Int("stride") < 1 {
			return fmt.Errorf("group size and stride must be at least 1, got size %d and stride %d", a.Int("size"), a.Int("stride"))
		}
		return nil
	}
	reduction := AttrSpec{Name: "op", Kind: AttrString, Default: StringAttr("sum"), Enum: []string{"sum", "max", "min"}}
	axis := AttrSpec{Name: "axis", Kind: AttrInt}
	// along checks that axis names a dimension of t and returns it.
	along := func(t Type, a AttrValues) (int, error) {
		ax := a.Int("axis")
		if ax < 0 {
			ax += int64(len(t.Shape))
		}
		if ax < 0 || ax >= int64(len(t.Shape)) {
			return 0, fmt.Errorf("axis %d is not a dimension of %s", a.Int("axis"), t)
		}
		return int(ax), nil
	}
	perElement := func(in, _ []Type, _ AttrValues) int64 { return in[0].NumElements() }
	Register(&OpDef{
		Name: "all_reduce", Summary: "every rank of the group gets the elementwise sum (or max, min) of the group's tensors",
		MinOperands: 1, MaxOperands: 1, Attrs: withGroup(reduction),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if err := checkGroup(a); err != nil {
				return nil, err
			}
			if in[0].DType == Bool {
				return nil, fmt.Errorf("cannot reduce %s", in[0])
			}
			return []Type{in[0]}, nil
		},
		FLOPs: perElement, Fusion: Opaque, Impure: true, KeepF32: true,
		// Elementwise across the group: each element folds the ranks' own.
		Axes: broadcastAxes,
		Linear: func(a AttrValues, _ int) [][]int {
			if a.String("op") == "sum" {
				return [][]int{{0}}
			}
			return nil
		},
	})
	// alongAxis infers a result whose axis is the operand's scaled by
	// scale (which may refuse it).
	alongAxis := func(scale func(extent, size int64) (int64, error)) func(in []Type, a AttrValues) ([]Type, error) {
		return func(in []Type, a AttrValues) ([]Type, error) {
			if err := checkGroup(a); err != nil {
				return nil, err
			}
			ax, err := along(in[0], a)
			if err != nil {
				return nil, err
			}
			out := in[0]
			out.Shape = append(Shape(nil), in[0].Shape...)
			if out.Shape[ax], err = scale(in[0].Shape[ax], a.Int("size")); err != nil {
				return nil, fmt.Errorf("dimension %d of %s: %v", ax, in[0], err)
			}
			return []Type{out}, nil
		}
	}
	Register(&OpDef{
		Name: "reduce_scatter", Summary: "the group's tensors summed (or their max, min), and cut along axis into size parts: rank i of the group gets part i",
		MinOperands: 1, MaxOperands: 1, Attrs: withGroup(axis, reduction),
		Infer: alongAxis(func(extent, size int64) (int64, error) {
			if extent%size != 0 {
				return 0, fmt.Errorf("%d does not divide into %d parts", extent, size)
			}
			return extent / size, nil
		}),
		FLOPs: perElement, Fusion: Opaque, Impure: true, KeepF32: true,
		Axes: groupAxes,
	})
	Register(&OpDef{
		Name: "all_gather", Summary: "the group's tensors concatenated along axis, in group order, on every rank",
		MinOperands: 1, MaxOperands: 1, Attrs: withGroup(axis),
		Infer: alongAxis(func(extent, size int64) (int64, error) {
			if extent > math.MaxInt64/size {
				return 0, fmt.Errorf("%d parts of %d elements are too many", size, extent)
			}
			return extent * size, nil
		}),
		FLOPs: zeroFLOPs, Fusion: Opaque, Impure: true,
		Axes: groupAxes, Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "broadcast", Summary: "every rank of the group gets the tensor of the group's rank root",
		MinOperands: 1, MaxOperands: 1, Attrs: withGroup(AttrSpec{Name: "root", Kind: AttrInt}),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if err := checkGroup(a); err != nil {
				return nil, err
			}
			if r := a.Int("root"); r < 0 || r >= a.Int("size") {
				return nil, fmt.Errorf("root %d is not a rank of a group of %d", r, a.Int("size"))
			}
			return []Type{in[0]}, nil
		},
		// Its gradient is the group's sum on the root and zero elsewhere,
		// which depends on the rank: autodiff does not differentiate it.
		FLOPs: zeroFLOPs, Fusion: Opaque, Impure: true, Grad: NoGrad,
		Axes: broadcastAxes, Linear: linearIn([]int{0}),
	})
}

// groupAxes is the axes of a collective that cuts or joins its operand
// along its axis by rank: the axis is at the rank's offset, every other
// dimension elementwise.
func groupAxes(in, _ []Type, a AttrValues) Axes {
	ax := int(a.Int("axis"))
	if ax < 0 {
		ax += in[0].Rank()
	}
	x := Axes{Loops: parallelLoops(in[0].Shape), Operands: [][]Index{identity(0, in[0].Rank())}, Results: [][]Index{identity(0, in[0].Rank())}}
	x.Results[0][ax] = Through(ax)
	return x
}

// Point-to-point ops move a tensor between two ranks, as pipeline stages
// exchange activations and gradients: send gives its operand to rank
// r+offset, and recv takes the tensor of the given type that rank
// r+offset sent with the same tag. A send does not wait for its recv (the
// runtime buffers it); a recv waits for its send. Both are impure.

// IsPointToPoint reports whether kind is send or recv.
func IsPointToPoint(kind string) bool { return kind == "send" || kind == "recv" }

// P2PBytes is the bytes a send or recv moves.
func P2PBytes(op *Op) int64 {
	if op.Kind == "send" {
		return op.Operands[0].Type.SizeBytes()
	}
	return op.Results[0].Type.SizeBytes()
}

func init() {
	peer := []AttrSpec{{Name: "offset", Kind: AttrInt, Required: true}, {Name: "tag", Kind: AttrInt, Required: true}}
	checkPeer := func(a AttrValues) error {
		if a.Int("offset") == 0 || a.Int("offset") < -MaxRanks || a.Int("offset") > MaxRanks {
			return fmt.Errorf("offset must name another rank (a nonzero offset of at most %d), got %d", MaxRanks, a.Int("offset"))
		}
		if t := a.Int("tag"); t < 0 || t > MaxTag {
			return fmt.Errorf("tag must be from 0 to %d, got %d", MaxTag, t)
		}
		return nil
	}
	Register(&OpDef{
		Name: "send", Summary: "give the tensor to rank r+offset, which takes it with a recv of the same tag; defines nothing",
		MinOperands: 1, MaxOperands: 1,
		// held_until: the tag of this rank's recv from the same peer after
		// which the send has surely completed (-1: the end of the
		// function); the tensor keeps its memory until then. assign sets
		// it on pipeline stages (assign.PendingSends).
		Attrs: append(append([]AttrSpec(nil), peer...), AttrSpec{Name: "held_until", Kind: AttrInt}),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if a.Has("held_until") && (a.Int("held_until") < -1 || a.Int("held_until") > MaxTag) {
				return nil, fmt.Errorf("held_until must be a tag or -1, got %d", a.Int("held_until"))
			}
			return nil, checkPeer(a)
		},
		FLOPs: zeroFLOPs, Fusion: Opaque, Impure: true, Grad: NoGrad,
	})
	Register(&OpDef{
		Name: "recv", Summary: "the tensor (of type dtype[shape]) that rank r+offset sent with the same tag",
		MaxOperands: 0, Attrs: append(append([]AttrSpec(nil), peer...), AttrSpec{Name: "shape", Kind: AttrList, Required: true}, AttrSpec{Name: "dtype", Kind: AttrType, Required: true}),
		Infer: func(_ []Type, a AttrValues) ([]Type, error) {
			if err := checkPeer(a); err != nil {
				return nil, err
			}
			s := Shape(a.Ints("shape"))
			if _, ok := s.NumElements(); !ok {
				return nil, fmt.Errorf("shape %s is not valid", s)
			}
			return []Type{{DType: a.DType("dtype"), Shape: s}}, nil
		},
		FLOPs: zeroFLOPs, Fusion: Opaque, Impure: true, Grad: NoGrad,
	})
}

// MaxTag is the largest tag of a send or recv (MPI guarantees tags up to
// 32767).
const MaxTag = 32767
