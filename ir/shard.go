package ir

import "fmt"

// ShardLevel is one way an argument is cut among the ranks of an SPMD
// step: along dimension Dim into Size parts, rank r holding part
// (r / Stride) mod Size (the groups of a mesh axis). With Outer > 1 the
// dimension is Outer equal segments, each cut alike, and a rank holds its
// part of every segment, in order (the query, key and value rows of a
// fused projection, each split by heads). An argument cut at several
// levels (a weight split by tensor parallelism, then its part by ZeRO
// over the data-parallel ranks) holds, at each level in order, that part
// of what the level before left.
type ShardLevel struct{ Dim, Size, Stride, Outer int64 }

// Segments is the number of segments l cuts alike (Outer, at least 1).
func (l ShardLevel) Segments() int64 { return max(l.Outer, 1) }

// WholeIndex maps index p along l's dimension of rank r's part to the
// index in what the level cut.
func (l ShardLevel) WholeIndex(p, partExtent, r int64) int64 {
	i := (r / l.Stride) % l.Size
	blk := partExtent / l.Segments() // a segment's part
	return (p/blk)*blk*l.Size + i*blk + p%blk
}

// ShardLevels reads argument a's cuts: attribute shard = d (one level,
// all ranks ranks of f, stride 1), or shard, shard_size and shard_stride
// lists of one length. It returns nil for an argument every rank holds
// whole, and an error for malformed attributes.
func ShardLevels(f *Func, a *Value) ([]ShardLevel, error) {
	sh, ok := a.Arg.Attrs["shard"]
	if !ok {
		return nil, nil
	}
	ranks := f.Attrs.Int("ranks", 1)
	rank := int64(len(a.Type.Shape))
	if sh.Kind == AttrInt {
		if sh.Int < 0 || sh.Int >= rank {
			return nil, fmt.Errorf("shard names dimension %d, which %s does not have", sh.Int, a.Type)
		}
		return []ShardLevel{{sh.Int, ranks, 1, 1}}, nil
	}
	dims, ok1 := sh.Ints()
	sizes, ok2 := a.Arg.Attrs["shard_size"].Ints()
	strides, ok3 := a.Arg.Attrs["shard_stride"].Ints()
	outers := make([]int64, len(dims))
	if o, ok := a.Arg.Attrs["shard_outer"]; ok {
		outers, ok1 = o.Ints()
		ok1 = ok1 && len(outers) == len(dims)
	}
	if !ok1 || !ok2 || !ok3 || len(dims) != len(sizes) || len(dims) != len(strides) || len(dims) == 0 {
		return nil, fmt.Errorf("shard must be a dimension, or shard, shard_size and shard_stride (and shard_outer) lists of one length")
	}
	out := make([]ShardLevel, len(dims))
	extent := append(Shape(nil), a.Type.Shape...) // the part each level cuts, from the last
	for i := len(dims) - 1; i >= 0; i-- {
		l := ShardLevel{dims[i], sizes[i], strides[i], max(outers[i], 1)}
		if l.Dim < 0 || l.Dim >= rank || l.Size < 1 || l.Stride < 1 || l.Size > MaxRanks || l.Stride > MaxRanks || l.Size*l.Stride > max(ranks, 1) {
			return nil, fmt.Errorf("shard level %d (dimension %d, %d parts, stride %d) does not fit %s on %d ranks", i, l.Dim, l.Size, l.Stride, a.Type, ranks)
		}
		if l.Outer > extent[l.Dim] || extent[l.Dim]%l.Outer != 0 {
			return nil, fmt.Errorf("shard level %d: %d segments do not divide dimension %d of the part (%d)", i, l.Outer, l.Dim, extent[l.Dim])
		}
		extent[l.Dim] *= l.Size
		out[i] = l
	}
	return out, nil
}

// AddShardLevel records that argument a (on ranks ranks) is cut once
// more: its attributes become the list form when it already had a cut.
func AddShardLevel(f *Func, a *Value, l ShardLevel) {
	levels, _ := ShardLevels(f, a)
	if a.Arg.Attrs == nil {
		a.Arg.Attrs = Attrs{}
	}
	if len(levels) == 0 && l.Stride == 1 && l.Size == f.Attrs.Int("ranks", 1) && l.Segments() == 1 {
		a.Arg.Attrs["shard"] = IntAttr(l.Dim)
		return
	}
	levels = append(levels, l)
	var dims, sizes, strides, outers []int64
	segmented := false
	for _, x := range levels {
		dims, sizes, strides, outers = append(dims, x.Dim), append(sizes, x.Size), append(strides, x.Stride), append(outers, x.Segments())
		segmented = segmented || x.Segments() > 1
	}
	a.Arg.Attrs["shard"] = IntsAttr(dims...)
	a.Arg.Attrs["shard_size"] = IntsAttr(sizes...)
	a.Arg.Attrs["shard_stride"] = IntsAttr(strides...)
	if segmented {
		a.Arg.Attrs["shard_outer"] = IntsAttr(outers...)
	}
}

// InitType is the type of argument a's initial value: a's type, or for
// an argument that holds a rank's part (ShardLevels), the whole tensor's,
// which the runner cuts.
func InitType(f *Func, a *Value) Type {
	t := a.Type
	levels, err := ShardLevels(f, a)
	if err != nil || len(levels) == 0 {
		return t
	}
	t.Shape = append(Shape(nil), t.Shape...)
	for _, l := range levels {
		t.Shape[l.Dim] *= l.Size
	}
	return t
}
