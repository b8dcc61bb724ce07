package ir

import (
	"fmt"

	"github.com/kiln-compiler/kiln/ir/scalar"
)

// Neural-network ops: convolution, pooling, normalisation, softmax,
// dropout, losses.

func init() {
	convAttrs := []AttrSpec{{Name: "strides", Kind: AttrList, Default: IntsAttr(1, 1)}, {Name: "pads", Kind: AttrList, Default: IntsAttr(0, 0, 0, 0)},
		{Name: "dilations", Kind: AttrList, Default: IntsAttr(1, 1)}, {Name: "groups", Kind: AttrInt, Default: IntAttr(1)}, ResultDTypeAttr}
	Register(&OpDef{
		Name: "conv2d", Summary: "2-D convolution of x[N,C,H,W] with w[M,C/groups,kH,kW] and optional bias[M]; pads = [top, left, bottom, right]",
		MinOperands: 2, MaxOperands: 3, Attrs: convAttrs,
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			g, err := ConvGeometryOf(in[0].Shape, in[1].Shape, a)
			if err != nil {
				return nil, err
			}
			d, err := ResultDTypeOf(a, in...)
			if err != nil {
				return nil, err
			}
			if len(in) == 3 && (in[2].Rank() != 1 || in[2].Shape[0] != in[1].Shape[0]) {
				return nil, fmt.Errorf("bias %s does not match %d output channels", in[2], in[1].Shape[0])
			}
			return []Type{{DType: d, Shape: Shape{g.N, g.M, g.OH, g.OW}}}, nil
		},
		FLOPs: func(in, out []Type, a AttrValues) int64 {
			g, _ := ConvGeometryOf(in[0].Shape, in[1].Shape, a)
			return 2 * out[0].NumElements() * (g.C / g.Groups) * g.KH * g.KW
		},
		Fusion: OutFusable, Contraction: true,
		Axes: convAxes,
		Linear: func(_ AttrValues, n int) [][]int {
			if n == 3 {
				return [][]int{{0, 2}, {1, 2}} // x·w + b: jointly in x and b, or w and b
			}
			return [][]int{{0}, {1}}
		},
	})
	Register(&OpDef{
		Name: "conv2d_grad_input", Summary: "gradient of conv2d with respect to its input, from dy and w",
		MinOperands: 2, MaxOperands: 2, Attrs: append(convAttrs, AttrSpec{Name: "input_shape", Kind: AttrList, Required: true}),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			xs := Shape(a.Ints("input_shape"))
			g, err := ConvGeometryOf(xs, in[1].Shape, a)
			if err != nil {
				return nil, err
			}
			if !in[0].Shape.Equal(Shape{g.N, g.M, g.OH, g.OW}) {
				return nil, fmt.Errorf("dy %s does not match the convolution output [%d,%d,%d,%d]", in[0], g.N, g.M, g.OH, g.OW)
			}
			d, err := ResultDTypeOf(a, in...)
			if err != nil {
				return nil, err
			}
			return []Type{{DType: d, Shape: xs}}, nil
		},
		FLOPs: func(in, out []Type, a AttrValues) int64 {
			g, _ := ConvGeometryOf(out[0].Shape, in[1].Shape, a)
			return 2 * in[0].NumElements() * (g.C / g.Groups) * g.KH * g.KW
		},
		Fusion: OutFusable, Contraction: true, // a transposed convolution: autodiff has a rule
		// Loops [N, C, H, W, M/groups, kH, kW]: dy is read through the
		// window, and summed over the output channels of the group.
		Axes: func(in, out []Type, a AttrValues) Axes {
			g, _ := ConvGeometryOf(out[0].Shape, in[1].Shape, a)
			x := Axes{Loops: []Loop{{Parallel, g.N}, {Parallel, g.C}, {Mixed, g.H}, {Mixed, g.W}, {Summed, g.M / g.Groups}, {Mixed, g.KH}, {Mixed, g.KW}}}
			dyM, wM, wC := At(4), At(4), At(1)
			if g.Groups != 1 {
				dyM, wM, wC = Through(1, 4), Through(1, 4), Through(1)
			}
			x.Operands = [][]Index{{At(0), dyM, Through(2, 5), Through(3, 6)}, {wM, wC, At(5), At(6)}}
			x.Results = [][]Index{identity(0, 4)}
			return x
		},
		Linear: linearIn([]int{0}, []int{1}), ShapeAttr: "input_shape",
	})
	Register(&OpDef{
		Name: "conv2d_grad_weight", Summary: "gradient of conv2d with respect to its weight, from dy and x",
		MinOperands: 2, MaxOperands: 2, Attrs: append(convAttrs, AttrSpec{Name: "weight_shape", Kind: AttrList, Required: true}),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			ws := Shape(a.Ints("weight_shape"))
			g, err := ConvGeometryOf(in[1].Shape, ws, a)
			if err != nil {
				return nil, err
			}
			if !in[0].Shape.Equal(Shape{g.N, g.M, g.OH, g.OW}) {
				return nil, fmt.Errorf("dy %s does not match the convolution output [%d,%d,%d,%d]", in[0], g.N, g.M, g.OH, g.OW)
			}
			d, err := ResultDTypeOf(a, in...)
			if err != nil {
				return nil, err
			}
			return []Type{{DType: d, Shape: ws}}, nil
		},
		FLOPs: func(in, out []Type, a AttrValues) int64 {
			g, _ := ConvGeometryOf(in[1].Shape, out[0].Shape, a)
			return 2 * in[0].NumElements() * (g.C / g.Groups) * g.KH * g.KW
		},
		Fusion: OutFusable, Contraction: true, Grad: NoGrad,
		// Loops [M, C/groups, kH, kW, N, OH, OW]: summed over the batch,
		// x read through the window.
		Axes: func(in, out []Type, a AttrValues) Axes {
			g, _ := ConvGeometryOf(in[1].Shape, out[0].Shape, a)
			x := Axes{Loops: []Loop{{Parallel, g.M}, {Parallel, g.C / g.Groups}, {Mixed, g.KH}, {Mixed, g.KW}, {Summed, g.N}, {Mixed, g.OH}, {Mixed, g.OW}}}
			xC := At(1)
			if g.Groups != 1 {
				xC = Through(0, 1)
			}
			x.Operands = [][]Index{{At(4), At(0), At(5), At(6)}, {At(4), xC, Through(2, 5), Through(3, 6)}}
			x.Results = [][]Index{identity(0, 4)}
			return x
		},
		Linear: linearIn([]int{0}, []int{1}), ShapeAttr: "weight_shape",
	})

	poolAttrs := []AttrSpec{{Name: "kernel", Kind: AttrList, Required: true}, {Name: "strides", Kind: AttrList}, // default: the kernel
		{Name: "pads", Kind: AttrList, Default: IntsAttr(0, 0, 0, 0)}, {Name: "dilations", Kind: AttrList, Default: IntsAttr(1, 1)}, {Name: "ceil_mode", Kind: AttrBool},
		{Name: "count_include_pad", Kind: AttrBool}}
	for _, name := range []string{"max_pool2d", "avg_pool2d"} {
		Register(&OpDef{
			Name: name, Summary: "2-D pooling over x[N,C,H,W]", MinOperands: 1, MaxOperands: 1, Attrs: poolAttrs,
			Infer: func(in []Type, a AttrValues) ([]Type, error) {
				if err := floatOperand(in[0]); err != nil {
					return nil, err
				}
				p, err := PoolGeometryOf(in[0].Shape, a)
				if err != nil {
					return nil, err
				}
				return []Type{{DType: in[0].DType, Shape: Shape{p.N, p.C, p.OH, p.OW}}}, nil
			},
			FLOPs: func(in, out []Type, a AttrValues) int64 {
				p, _ := PoolGeometryOf(in[0].Shape, a)
				return out[0].NumElements() * p.KH * p.KW
			},
			Fusion: Reduction,
			Axes: func(_, out []Type, _ AttrValues) Axes {
				return Axes{Loops: poolLoops(out[0].Shape), Operands: [][]Index{windowed()}, Results: [][]Index{identity(0, 4)}}
			},
			Linear: func(AttrValues, int) [][]int {
				if name == "avg_pool2d" {
					return [][]int{{0}}
				}
				return nil
			},
		})
	}
	Register(&OpDef{
		Name: "max_pool2d_grad", Summary: "gradient of max_pool2d, from dy and x", MinOperands: 2, MaxOperands: 2, Attrs: poolAttrs,
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			p, err := PoolGeometryOf(in[1].Shape, a)
			if err != nil {
				return nil, err
			}
			if !in[0].Shape.Equal(Shape{p.N, p.C, p.OH, p.OW}) {
				return nil, fmt.Errorf("dy %s does not match the pooling output", in[0])
			}
			if err := floatOperand(in[1]); err != nil {
				return nil, err
			}
			return []Type{{DType: in[0].DType, Shape: in[1].Shape}}, nil
		},
		Fusion: Opaque, Grad: NoGrad, ScaleFree: []int{1},
		// Loops over dx (x's shape); dy is read through the windows.
		Axes: func(in, out []Type, _ AttrValues) Axes {
			return Axes{Loops: poolLoops(out[0].Shape), Operands: [][]Index{windowed(), identity(0, 4)}, Results: [][]Index{identity(0, 4)}}
		},
		Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "avg_pool2d_grad", Summary: "gradient of avg_pool2d, from dy",
		MinOperands: 1, MaxOperands: 1, Attrs: append(poolAttrs, AttrSpec{Name: "input_shape", Kind: AttrList, Required: true}),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			xs := Shape(a.Ints("input_shape"))
			p, err := PoolGeometryOf(xs, a)
			if err != nil {
				return nil, err
			}
			if !in[0].Shape.Equal(Shape{p.N, p.C, p.OH, p.OW}) {
				return nil, fmt.Errorf("dy %s does not match the pooling output", in[0])
			}
			return []Type{{DType: in[0].DType, Shape: xs}}, nil
		},
		Fusion: Opaque, Grad: NoGrad,
		Axes: func(_, out []Type, _ AttrValues) Axes {
			return Axes{Loops: poolLoops(out[0].Shape), Operands: [][]Index{windowed()}, Results: [][]Index{identity(0, 4)}}
		},
		Linear: linearIn([]int{0}), ShapeAttr: "input_shape",
	})
	Register(&OpDef{
		Name: "global_avg_pool", Summary: "mean over H and W: [N,C,H,W] -> [N,C,1,1]", MinOperands: 1, MaxOperands: 1,
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			if in[0].Rank() < 3 {
				return nil, fmt.Errorf("needs rank >= 3, got %s", in[0])
			}
			out := in[0].Shape.Clone()
			for i := 2; i < len(out); i++ {
				out[i] = 1
			}
			return []Type{{DType: in[0].DType, Shape: out}}, nil
		},
		FLOPs:  inputFLOPs,
		Fusion: Reduction,
		Axes: func(in, _ []Type, _ AttrValues) Axes {
			x := Axes{Loops: parallelLoops(in[0].Shape), Operands: [][]Index{identity(0, in[0].Rank())}}
			res := identity(0, in[0].Rank())
			for d := 2; d < in[0].Rank(); d++ {
				x.Loops[d].Kind, res[d] = Averaged, Fixed
			}
			x.Results = [][]Index{res}
			return x
		},
		Linear: linearIn([]int{0}),
	})

	Register(&OpDef{
		Name: "batch_norm_train", Summary: "batch normalisation with batch statistics: (x, scale, bias, running_mean, running_var) -> (y, new_running_mean, new_running_var, saved_mean, saved_invstd); the running variance takes the unbiased batch variance (PyTorch's update) unless unbiased = false (ONNX's)",
		MinOperands: 5, MaxOperands: 5, Attrs: []AttrSpec{{Name: "epsilon", Kind: AttrFloat, Default: FloatAttr(1e-5)}, {Name: "momentum", Kind: AttrFloat, Default: FloatAttr(0.9)},
			{Name: "unbiased", Kind: AttrBool, Default: BoolAttr(true)}},
		Running: map[int]int{3: 1, 4: 2},
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			c, err := channelParams(in)
			if err != nil {
				return nil, err
			}
			return []Type{in[0], c, c, c, c}, nil
		},
		FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 4 * in[0].NumElements() },
		Fusion: Reduction, KeepF32: true, LowOperands: []int{0},
		Axes:    func(in, out []Type, _ AttrValues) Axes { return channelAxes(in, out, Mixed) },
		PerPart: func(in, out []Type, _ AttrValues) Axes { return channelAxes(in, out, Parallel) },
	})
	// ema is a running statistic's update written out (a batch norm
	// decomposed into its sums, as microbatch's exact-bn and data
	// parallelism do): its record says, as batch_norm_train's does, that
	// the result is the new value of operand 0, which a training step
	// writes back when operand 0 is state.
	registerBinary(&OpDef{
		Name: "ema", Summary: "a running statistic's update: old * momentum + new * (1 - momentum) (old, new)",
		Attrs:   []AttrSpec{{Name: "momentum", Kind: AttrFloat, Default: FloatAttr(0.9)}},
		Running: map[int]int{0: 0},
		Scalar: func(a AttrValues, _ []Type, _ Type) *scalar.Expr {
			m := a.Float("momentum")
			return x0.Mul(num(m)).Add(x1.Mul(num(1 - m)))
		},
		KeepF32: true, Grad: NoGrad,
	})
	Register(&OpDef{
		Name: "batch_norm_infer", Summary: "batch normalisation with given statistics: (x, scale, bias, mean, var) -> y",
		MinOperands: 5, MaxOperands: 5, Attrs: []AttrSpec{{Name: "epsilon", Kind: AttrFloat, Default: FloatAttr(1e-5)}},
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			if _, err := channelParams(in); err != nil {
				return nil, err
			}
			return []Type{in[0]}, nil
		},
		FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 2 * in[0].NumElements() },
		Fusion: Broadcast, KeepF32: true, LowOperands: []int{0},
		Axes: func(in, out []Type, _ AttrValues) Axes {
			x := channelAxes(in, out, Parallel)
			for d := 2; d < in[0].Rank(); d++ {
				x.Loops[d].Kind = Parallel
			}
			return x
		},
	})
	Register(&OpDef{
		Name: "batch_norm_grad", Summary: "gradient of batch_norm_train: (dy, x, scale, saved_mean, saved_invstd) -> (dx, dscale, dbias)",
		MinOperands: 5, MaxOperands: 5,
		Infer: func(in []Type, _ AttrValues) ([]Type, error) {
			c, err := channelParams([]Type{in[1], in[2], in[3], in[4]})
			if err != nil {
				return nil, err
			}
			if !in[0].Shape.Equal(in[1].Shape) {
				return nil, fmt.Errorf("dy %s and x %s differ", in[0], in[1])
			}
			return []Type{{DType: in[0].DType, Shape: in[1].Shape}, c, c}, floatOperand(in[0])
		},
		FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 6 * in[0].NumElements() },
		Fusion: Reduction, KeepF32: true, Grad: NoGrad, LowOperands: []int{0, 1},
		Axes: func(in, out []Type, _ AttrValues) Axes { return channelAxes(in[1:], out, Mixed, in[0]) },
		// Per part: dx is the part's own; dscale and dbias sum over the
		// parts.
		PerPart: func(in, out []Type, _ AttrValues) Axes { return channelAxes(in[1:], out, Summed, in[0]) },
		Linear:  linearIn([]int{0}),
	})

	Register(&OpDef{
		Name: "layer_norm", Summary: "normalise over the axes from axis on: (x, scale[, bias]) -> (y, mean, invstd); center = false is RMSNorm (the mean taken as 0)",
		MinOperands: 2, MaxOperands: 3, Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(-1)}, {Name: "epsilon", Kind: AttrFloat, Default: FloatAttr(1e-5)},
			{Name: "center", Kind: AttrBool, Default: BoolAttr(true)}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			stat, norm, err := layerNormShapes(in[0], a)
			if err != nil {
				return nil, err
			}
			p := in[1].DType // of the statistics too
			for _, t := range in[1:] {
				if !t.Shape.Equal(norm) || t.DType != p || !p.IsFloat() {
					return nil, fmt.Errorf("scale/bias %s must be %s%s", t, p, norm)
				}
			}
			return []Type{in[0], {DType: p, Shape: stat}, {DType: p, Shape: stat}}, nil
		},
		FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 5 * in[0].NumElements() },
		Fusion: Reduction, KeepF32: true, LowOperands: []int{0},
		Axes: func(in, out []Type, a AttrValues) Axes {
			ax, _ := NormalizeAxis(a.Int("axis"), in[0].Rank())
			x := rowAxes(in[0].Shape, ax, Parallel)
			x.Operands = [][]Index{identity(0, in[0].Rank())}
			for range in[1:] {
				x.Operands = append(x.Operands, identity(ax, in[0].Rank()-ax))
			}
			x.Results = [][]Index{identity(0, in[0].Rank()), rowIndex(in[0].Rank(), ax), rowIndex(in[0].Rank(), ax)}
			return x
		},
	})
	Register(&OpDef{
		Name: "layer_norm_grad", Summary: "gradient of layer_norm: (dy, x, scale, mean, invstd) -> (dx, dscale, dbias)",
		MinOperands: 5, MaxOperands: 5, Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(-1)}, {Name: "center", Kind: AttrBool, Default: BoolAttr(true)}},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			stat, norm, err := layerNormShapes(in[1], a)
			if err != nil {
				return nil, err
			}
			if !in[0].Shape.Equal(in[1].Shape) || !in[2].Shape.Equal(norm) || !in[3].Shape.Equal(stat) || !in[4].Shape.Equal(stat) {
				return nil, fmt.Errorf("operand shapes do not fit layer_norm of %s", in[1])
			}
			for _, t := range in {
				if err := floatOperand(t); err != nil {
					return nil, err
				}
			}
			return []Type{{DType: in[0].DType, Shape: in[1].Shape}, in[2], in[2]}, nil
		},
		FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 8 * in[0].NumElements() },
		Fusion: Reduction, KeepF32: true, Grad: NoGrad, LowOperands: []int{0, 1},
		// dscale and dbias sum over the rows; dx is each row's own.
		Axes: func(in, out []Type, a AttrValues) Axes {
			r := in[1].Rank()
			ax, _ := NormalizeAxis(a.Int("axis"), r)
			x := rowAxes(in[1].Shape, ax, Summed)
			x.Operands = [][]Index{identity(0, r), identity(0, r), identity(ax, r-ax), rowIndex(r, ax), rowIndex(r, ax)}
			x.Results = [][]Index{identity(0, r), identity(ax, r-ax), identity(ax, r-ax)}
			return x
		},
		Linear: linearIn([]int{0}),
	})

	for _, name := range []string{"softmax", "log_softmax"} {
		Register(&OpDef{
			Name: name, Summary: "along axis", MinOperands: 1, MaxOperands: 1,
			Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(-1)}, ResultDTypeAttr},
			Infer: func(in []Type, a AttrValues) ([]Type, error) {
				if _, err := NormalizeAxis(a.Int("axis"), in[0].Rank()); err != nil {
					return nil, err
				}
				d, err := ResultDTypeOf(a, in[0])
				if err == nil {
					err = floatOperand(in[0])
				}
				return []Type{{DType: d, Shape: in[0].Shape}}, err
			},
			FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 3 * in[0].NumElements() },
			Fusion: Reduction, KeepF32: true, LowOperands: []int{0},
			Axes: alongAxis,
		})
		Register(&OpDef{
			Name: name + "_grad", Summary: "gradient of " + name + " from dy and its output y", MinOperands: 2, MaxOperands: 2,
			Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: IntAttr(-1)}, ResultDTypeAttr},
			Infer: func(in []Type, a AttrValues) ([]Type, error) {
				if !in[0].Shape.Equal(in[1].Shape) {
					return nil, fmt.Errorf("dy %s and y %s differ", in[0], in[1])
				}
				d, err := ResultDTypeOf(a, in...)
				if err != nil {
					return nil, err
				}
				_, err = NormalizeAxis(a.Int("axis"), in[0].Rank())
				return []Type{{DType: d, Shape: in[0].Shape}}, err
			},
			FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 3 * in[0].NumElements() },
			Fusion: Reduction, KeepF32: true, Grad: NoGrad, LowOperands: []int{0, 1},
			Axes: alongAxis, Linear: linearIn([]int{0}),
		})
	}

	Register(&OpDef{
		Name: "dropout", Summary: "zero elements with probability ratio, scale the rest by 1/(1-ratio); the mask comes from a counter-based RNG seeded by the seed attribute, element i drawing number key+offset+i (key: the optional i64 scalar operand, the generator's position that a training step advances), so recomputing reproduces it (and a slice of a batch, offset by its first element, draws the whole batch's mask)",
		MinOperands: 1, MaxOperands: 2, Attrs: append([]AttrSpec{{Name: "ratio", Kind: AttrFloat, Default: FloatAttr(0.5)}, {Name: "seed", Kind: AttrInt, Required: true}, {Name: "offset", Kind: AttrInt, Default: IntAttr(0)}}, rankCounter...),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if r := a.Float("ratio"); r < 0 || r >= 1 {
				return nil, fmt.Errorf("ratio %g must be in [0, 1)", r)
			}
			if len(in) == 2 && !IsRandomKey(in[1]) {
				return nil, fmt.Errorf("the random key must be an i64 scalar, got %s", in[1])
			}
			return []Type{in[0], {DType: Bool, Shape: in[0].Shape}}, floatOperand(in[0])
		},
		Fusion: Elementwise,
		Axes:   broadcastAxes, Random: func([]Type) bool { return true }, Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "dropout_grad", Summary: "dy * mask / (1 - ratio), (dy, mask) or (dy[, key]): without a mask operand the mask is regenerated from the seed attribute and the key (as the dropout with that seed and key made it)", MinOperands: 1, MaxOperands: 2,
		Attrs: append([]AttrSpec{{Name: "ratio", Kind: AttrFloat, Default: FloatAttr(0.5)}, {Name: "seed", Kind: AttrInt}, {Name: "offset", Kind: AttrInt, Default: IntAttr(0)}}, rankCounter...),
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if len(in) == 1 || IsRandomKey(in[1]) {
				if !a.Has("seed") {
					return nil, fmt.Errorf("without a mask operand the seed attribute is required")
				}
			} else if in[1].DType != Bool || !in[1].Shape.Equal(in[0].Shape) {
				return nil, fmt.Errorf("mask %s must be bool%s (or the random key, an i64 scalar)", in[1], in[0].Shape)
			}
			return []Type{in[0]}, nil
		},
		Fusion: Elementwise, Grad: NoGrad,
		InPlace: true,
		Axes:    broadcastAxes, Linear: linearIn([]int{0}),
		Random: func(in []Type) bool { return len(in) == 1 || IsRandomKey(in[1]) }, // with a mask operand it draws nothing
	})
	Register(&OpDef{
		Name: "random_uniform", Summary: "uniform [0,1) numbers from a counter-based generator seeded by seed (dropout's), element i drawing number offset+i, so that every backend draws the same; impure: never merged or recomputed",
		MaxOperands: 1, Attrs: []AttrSpec{{Name: "shape", Kind: AttrList, Required: true}, {Name: "dtype", Kind: AttrType, Default: TypeAttr(F32)},
			{Name: "seed", Kind: AttrInt}, {Name: "offset", Kind: AttrInt, Default: IntAttr(0)}, rankCounter[0], rankCounter[1], rankCounter[2]},
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if len(in) == 1 && !IsRandomKey(in[0]) {
				return nil, fmt.Errorf("the random key must be an i64 scalar, got %s", in[0])
			}
			d := a.DType("dtype")
			s := Shape(a.Ints("shape"))
			if _, ok := s.NumElements(); !ok {
				return nil, fmt.Errorf("shape %s is not valid", s)
			}
			return []Type{{DType: d, Shape: s}}, nil
		},
		Fusion: Opaque, KeepF32: true, Grad: NoGrad,
		Impure: true,
		Axes: func(in, out []Type, _ AttrValues) Axes {
			a := Axes{Loops: parallelLoops(out[0].Shape), Results: [][]Index{identity(0, out[0].Rank())}}
			if len(in) == 1 {
				a.Operands = [][]Index{{}} // the key: a scalar every element reads
			}
			return a
		},
		Random: func([]Type) bool { return true }, ShapeAttr: "shape",
	})

	Register(&OpDef{
		Name: "softmax_cross_entropy", Summary: "softmax cross-entropy of logits[N,K] (or [N,K,...]) with integer labels[N] (or [N,...]); reduction mean or sum",
		MinOperands: 2, MaxOperands: 2, Attrs: []AttrSpec{{Name: "reduction", Kind: AttrString, Default: StringAttr("mean"), Enum: []string{"mean", "sum"}}, ResultDTypeAttr},
		Indices: func(in []Type, _ AttrValues) []IndexOperand { return labelIndices(1, in[0]) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if err := crossEntropyShapes(in[0], in[1]); err != nil {
				return nil, err
			}
			d, err := ResultDTypeOf(a, in[0])
			return []Type{{DType: d, Shape: Shape{}}}, err
		},
		FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 4 * in[0].NumElements() },
		Fusion: Reduction, KeepF32: true, LowOperands: []int{0},
		// Summed (or averaged) over the samples and positions, each term
		// a softmax over the classes.
		Axes: func(in, _ []Type, a AttrValues) Axes {
			fold := Averaged
			if a.String("reduction") == "sum" {
				fold = Summed
			}
			x := crossEntropyAxes(in[0].Shape, fold)
			x.Results = [][]Index{{}}
			return x
		},
	})
	Register(&OpDef{
		Name: "softmax_cross_entropy_grad", Summary: "gradient of softmax_cross_entropy: (dloss, logits, labels) -> dlogits",
		MinOperands: 3, MaxOperands: 3, Attrs: []AttrSpec{{Name: "reduction", Kind: AttrString, Default: StringAttr("mean"), Enum: []string{"mean", "sum"}}, ResultDTypeAttr},
		Indices: func(in []Type, _ AttrValues) []IndexOperand { return labelIndices(2, in[1]) },
		Infer: func(in []Type, a AttrValues) ([]Type, error) {
			if in[0].Rank() != 0 {
				return nil, fmt.Errorf("dloss must be a scalar, got %s", in[0])
			}
			d, err := ResultDTypeOf(a, in[1])
			if err != nil {
				return nil, err
			}
			return []Type{{DType: d, Shape: in[1].Shape}}, crossEntropyShapes(in[1], in[2])
		},
		FLOPs:  func(in, _ []Type, _ AttrValues) int64 { return 4 * in[1].NumElements() },
		Fusion: Reduction, KeepF32: true, Grad: NoGrad, LowOperands: []int{1},
		// Each sample's gradient is its own, but the mean divides by the
		// number of samples: a part of them would divide by fewer.
		Axes: func(in, _ []Type, a AttrValues) Axes {
			rows := Parallel
			if a.String("reduction") == "mean" {
				rows = Mixed
			}
			x := crossEntropyAxes(in[1].Shape, rows)
			x.Operands = append([][]Index{{}}, x.Operands...)
			x.Results = [][]Index{identity(0, in[1].Rank())}
			return x
		},
		Linear: linearIn([]int{0}),
	})
}

func crossEntropyShapes(logits, labels Type) error {
	if err := floatOperand(logits); err != nil {
		return err
	}
	if !labels.DType.IsInt() {
		return fmt.Errorf("labels must be integers, got %s", labels)
	}
	if logits.Rank() < 2 || labels.Rank() != logits.Rank()-1 || labels.Shape[0] != logits.Shape[0] {
		return fmt.Errorf("labels %s do not fit logits %s", labels, logits)
	}
	for i := 1; i < labels.Rank(); i++ {
		if labels.Shape[i] != logits.Shape[i+1] {
			return fmt.Errorf("labels %s do not fit logits %s", labels, logits)
		}
	}
	return nil
}

func floatOperand(t Type) error {
	if !t.DType.IsFloat() {
		return fmt.Errorf("needs a floating-point operand, got %s", t)
	}
	return nil
}

func sameDType(ts ...Type) error {
	for _, t := range ts[1:] {
		if t.DType != ts[0].DType {
			return fmt.Errorf("operand dtypes differ: %s and %s", ts[0].DType, t.DType)
		}
	}
	return nil
}

// channelParams checks batch-norm operands: x[N,C,...] and four [C] vectors.
func channelParams(in []Type) (Type, error) {
	if in[0].Rank() < 2 {
		return Type{}, fmt.Errorf("x must have rank >= 2, got %s", in[0])
	}
	// The per-channel operands share one float dtype, which the
	// statistics have; x's may differ (a bf16 activation normalised with
	// f32 parameters).
	c := Type{DType: in[1].DType, Shape: Shape{in[0].Shape[1]}}
	for _, p := range in[1:] {
		if !p.Equal(c) {
			return Type{}, fmt.Errorf("per-channel operand %s must be %s", p, c)
		}
	}
	if err := floatOperand(c); err != nil {
		return Type{}, err
	}
	return c, floatOperand(in[0])
}

// layerNormShapes returns the statistics shape (x's shape with the
// normalised axes set to 1) and the normalised shape.
func layerNormShapes(x Type, a AttrValues) (stat, norm Shape, err error) {
	axis, err := NormalizeAxis(a.Int("axis"), x.Rank())
	if err != nil {
		return nil, nil, err
	}
	stat = x.Shape.Clone()
	for i := axis; i < len(stat); i++ {
		stat[i] = 1
	}
	return stat, x.Shape[axis:].Clone(), floatOperand(x)
}

// ConvGeometry is the resolved shape arithmetic of a 2-D convolution.
type ConvGeometry struct {
	N, C, H, W, M, KH, KW, OH, OW int64
	SH, SW, DH, DW                int64
	PT, PL, PB, PR                int64
	Groups                        int64
}

// MaxExtent bounds the windows, strides and paddings of convolutions and
// pooling: no tensor has an axis that long, and sums and products of a
// few such numbers stay far inside int64.
const MaxExtent = int64(1) << 40

// DilatedExtent is the span (k-1)·d+1 of a kernel of k taps d apart, and
// whether it is at most MaxExtent (false also for k or d below 1).
func DilatedExtent(k, d int64) (int64, bool) {
	if k < 1 || d < 1 || k > MaxExtent || d > MaxExtent || (k > 1 && d > (MaxExtent-1)/(k-1)) {
		return 0, false
	}
	return (k-1)*d + 1, true
}

// windowFits checks the attributes of one axis of a window: stride,
// dilation and pads within MaxExtent, the dilated kernel too.
func windowFits(what string, k, s, d, pa, pb int64) error {
	if s < 1 || d < 1 || pa < 0 || pb < 0 {
		return fmt.Errorf("%s strides and dilations must be positive and pads not negative", what)
	}
	if s > MaxExtent || pa > MaxExtent || pb > MaxExtent {
		return fmt.Errorf("%s strides and pads must be at most 2^40", what)
	}
	if _, ok := DilatedExtent(k, d); !ok && k >= 1 {
		return fmt.Errorf("%s kernel of %d taps with dilation %d spans more than 2^40 elements", what, k, d)
	}
	return nil
}

// ConvGeometryOf resolves conv2d attributes for x[N,C,H,W] and w[M,C/g,kH,kW].
func ConvGeometryOf(x, w Shape, a AttrValues) (ConvGeometry, error) {
	var g ConvGeometry
	if len(x) != 4 || len(w) != 4 {
		return g, fmt.Errorf("conv2d needs x[N,C,H,W] and w[M,C/groups,kH,kW], got %s and %s", x, w)
	}
	g.N, g.C, g.H, g.W = x[0], x[1], x[2], x[3]
	g.M, g.KH, g.KW = w[0], w[2], w[3]
	g.Groups = a.Int("groups")
	s := a.Ints("strides")
	d := a.Ints("dilations")
	p := a.Ints("pads")
	if len(s) != 2 || len(d) != 2 || len(p) != 4 {
		return g, fmt.Errorf("conv2d wants 2 strides, 2 dilations and 4 pads")
	}
	g.SH, g.SW, g.DH, g.DW = s[0], s[1], d[0], d[1]
	g.PT, g.PL, g.PB, g.PR = p[0], p[1], p[2], p[3]
	if g.Groups < 1 || g.C%g.Groups != 0 || g.M%g.Groups != 0 || w[1] != g.C/g.Groups {
		return g, fmt.Errorf("conv2d groups=%d does not fit %d input and %d output channels with weight %s", g.Groups, g.C, g.M, w)
	}
	if err := windowFits("conv2d", g.KH, g.SH, g.DH, g.PT, g.PB); err != nil {
		return g, err
	}
	if err := windowFits("conv2d", g.KW, g.SW, g.DW, g.PL, g.PR); err != nil {
		return g, err
	}
	if g.H+g.PT+g.PB < g.DH*(g.KH-1)+1 || g.W+g.PL+g.PR < g.DW*(g.KW-1)+1 {
		return g, fmt.Errorf("conv2d of %s with kernel %s: the window is larger than the padded input", x, w)
	}
	g.OH = (g.H+g.PT+g.PB-g.DH*(g.KH-1)-1)/g.SH + 1
	g.OW = (g.W+g.PL+g.PR-g.DW*(g.KW-1)-1)/g.SW + 1
	if g.OH < 1 || g.OW < 1 || g.KH < 1 || g.KW < 1 {
		return g, fmt.Errorf("conv2d of %s with kernel %s gives an empty output", x, w)
	}
	return g, nil
}

// PoolGeometry is the resolved shape arithmetic of 2-D pooling.
type PoolGeometry struct {
	N, C, H, W, KH, KW, OH, OW int64
	SH, SW, DH, DW             int64
	PT, PL, PB, PR             int64
	CeilMode, CountIncludePad  bool
}

// PoolGeometryOf resolves pooling attributes for x[N,C,H,W]. With
// ceil_mode the output rounds up, but a window never starts in the
// bottom/right padding (PyTorch's rule).
func PoolGeometryOf(x Shape, a AttrValues) (PoolGeometry, error) {
	var p PoolGeometry
	if len(x) != 4 {
		return p, fmt.Errorf("pooling needs x[N,C,H,W], got %s", x)
	}
	p.N, p.C, p.H, p.W = x[0], x[1], x[2], x[3]
	k := a.Ints("kernel")
	if len(k) != 2 {
		return p, fmt.Errorf("pooling wants a kernel of 2 sizes")
	}
	p.KH, p.KW = k[0], k[1]
	s := a.IntsOr("strides", k)
	d := a.Ints("dilations")
	pads := a.Ints("pads")
	if len(s) != 2 || len(d) != 2 || len(pads) != 4 {
		return p, fmt.Errorf("pooling wants 2 strides, 2 dilations and 4 pads")
	}
	p.SH, p.SW, p.DH, p.DW = s[0], s[1], d[0], d[1]
	p.PT, p.PL, p.PB, p.PR = pads[0], pads[1], pads[2], pads[3]
	p.CeilMode = a.Bool("ceil_mode")
	p.CountIncludePad = a.Bool("count_include_pad")
	if p.KH < 1 || p.KW < 1 || p.SH < 1 || p.SW < 1 || p.DH < 1 || p.DW < 1 || p.PT < 0 || p.PL < 0 || p.PB < 0 || p.PR < 0 {
		return p, fmt.Errorf("pooling kernel, strides and dilations must be positive and pads not negative")
	}
	if err := windowFits("pooling", p.KH, p.SH, p.DH, p.PT, p.PB); err != nil {
		return p, err
	}
	if err := windowFits("pooling", p.KW, p.SW, p.DW, p.PL, p.PR); err != nil {
		return p, err
	}
	out := func(in, pa, pb, k, s, d int64) int64 {
		span := in + pa + pb - d*(k-1) - 1
		if span < 0 {
			return 0 // the window is larger than the padded input
		}
		o := span/s + 1
		if p.CeilMode {
			o = (span+s-1)/s + 1
			if (o-1)*s >= in+pa {
				o--
			}
		}
		return o
	}
	p.OH = out(p.H, p.PT, p.PB, p.KH, p.SH, p.DH)
	p.OW = out(p.W, p.PL, p.PR, p.KW, p.SW, p.DW)
	if p.OH < 1 || p.OW < 1 {
		return p, fmt.Errorf("pooling of %s with kernel %v gives an empty output", x, k)
	}
	return p, nil
}

// rankCounter are the attributes of a random op of a data-parallel
// rank: its counter starts rank_offset elements further for each rank
// before it in its group (rank_size ranks rank_stride apart, as a
// collective's group), so the ranks' parts draw what one device draws for
// the whole batch.
var rankCounter = []AttrSpec{{Name: "rank_offset", Kind: AttrInt, Default: IntAttr(0)},
	{Name: "rank_size", Kind: AttrInt, Default: IntAttr(1)}, {Name: "rank_stride", Kind: AttrInt, Default: IntAttr(1)}}

// RankIndex is rank's index in the group of size ranks stride apart that
// it belongs to (collectives' groups).
func RankIndex(rank, size, stride int64) int64 {
	if size <= 1 || stride < 1 {
		return 0
	}
	return (rank / stride) % size
}

// RandomOffset is where the counter of a random op (dropout, its
// gradient, random_uniform) starts on rank: its offset, plus rank_offset
// for each rank before this one in its group.
func RandomOffset(a AttrValues, rank int64) int64 {
	return a.Int("offset") + a.Int("rank_offset")*RankIndex(rank, a.Int("rank_size"), a.Int("rank_stride"))
}

// always is the Random of ops that always draw.
func always(int) bool { return true }

// convAxes is conv2d's: loops [N, M, OH, OW, C/groups, kH, kW], summed
// over the input channels of the group; x is read through the window,
// and its channel through the group of M when there are groups.
func convAxes(in, _ []Type, a AttrValues) Axes {
	g, _ := ConvGeometryOf(in[0].Shape, in[1].Shape, a)
	x := Axes{Loops: []Loop{{Parallel, g.N}, {Parallel, g.M}, {Mixed, g.OH}, {Mixed, g.OW}, {Summed, g.C / g.Groups}, {Mixed, g.KH}, {Mixed, g.KW}}}
	xC := At(4)
	if g.Groups != 1 {
		xC = Through(1, 4)
	}
	x.Operands = [][]Index{{At(0), xC, Through(2, 5), Through(3, 6)}, {At(1), At(4), At(5), At(6)}}
	if len(in) == 3 {
		// The bias is added once, not per part of the channels.
		x.Operands = append(x.Operands, []Index{At(1)})
		x.Loops[4].Kind = Mixed
	}
	x.Results = [][]Index{identity(0, 4)}
	return x
}

// poolLoops are the loops of 2-D pooling and its gradients over a
// tensor of shape [N, C, H, W]: the windows' loops are mixed.
func poolLoops(s Shape) []Loop {
	return []Loop{{Parallel, s[0]}, {Parallel, s[1]}, {Mixed, s[2]}, {Mixed, s[3]}}
}

// windowed is the index of a tensor read through pooling windows.
func windowed() []Index { return []Index{At(0), At(1), Through(2), Through(3)} }

// channelAxes is batch normalisation's over x (in[0]) and per-channel
// operands (the rest; first, when given, is a leading operand of x's
// shape, batch_norm_grad's dy): the batch loop has kind batch, the
// spatial loops are mixed and the channel loop is parallel; results of
// x's rank index every loop, the others the channel.
func channelAxes(in, out []Type, batch LoopKind, first ...Type) Axes {
	r := in[0].Rank()
	x := Axes{Loops: parallelLoops(in[0].Shape)}
	x.Loops[0].Kind = batch
	for d := 2; d < r; d++ {
		x.Loops[d].Kind = Mixed
	}
	for range first {
		x.Operands = append(x.Operands, identity(0, r))
	}
	x.Operands = append(x.Operands, identity(0, r))
	for range in[1:] {
		x.Operands = append(x.Operands, []Index{At(1)})
	}
	for _, t := range out {
		if t.Rank() == r {
			x.Results = append(x.Results, identity(0, r))
		} else {
			x.Results = append(x.Results, []Index{At(1)})
		}
	}
	return x
}

// rowAxes is layer normalisation's over a tensor of shape s normalised
// from axis ax on: the row loops (before ax) have kind rows, the
// normalised ones are mixed.
func rowAxes(s Shape, ax int, rows LoopKind) Axes {
	x := Axes{Loops: parallelLoops(s)}
	for d := range x.Loops {
		if d >= ax {
			x.Loops[d].Kind = Mixed
		} else {
			x.Loops[d].Kind = rows
		}
	}
	return x
}

// rowIndex maps a statistic (x's shape, 1 from ax on) to rowAxes' loops.
func rowIndex(r, ax int) []Index {
	m := identity(0, r)
	for d := ax; d < r; d++ {
		m[d] = Fixed
	}
	return m
}

// alongAxis is the axes of softmax and its kin: every loop parallel but
// the axis's, whose results are normalised over it.
func alongAxis(in, out []Type, a AttrValues) Axes {
	ax, _ := NormalizeAxis(a.Int("axis"), in[0].Rank())
	x := broadcastAxes(in, out, a)
	x.Loops[ax].Kind = Mixed
	return x
}

// crossEntropyAxes is the axes of the cross-entropy of logits of shape
// s ([N, K, ...]): the sample and position loops have kind rows, the
// class loop is mixed; the operands are logits and labels ([N, ...]).
func crossEntropyAxes(s Shape, rows LoopKind) Axes {
	x := Axes{Loops: parallelLoops(s)}
	labels := []Index{At(0)}
	for d := range x.Loops {
		x.Loops[d].Kind = rows
		if d >= 2 {
			labels = append(labels, At(d))
		}
	}
	x.Loops[1].Kind = Mixed
	x.Operands = [][]Index{identity(0, len(s)), labels}
	return x
}

// labelIndices says that operand k holds class labels of the logits x,
// from 0 to x's class dimension (1).
func labelIndices(k int, x Type) []IndexOperand {
	if x.Rank() < 2 {
		return nil
	}
	return []IndexOperand{{Operand: k, Bound: x.Shape[1]}}
}
