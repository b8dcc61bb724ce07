package onnx

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// randDense is an f32 tensor of shape s with values in [-1, 1).
func randDense(rng *rand.Rand, s ...int64) *ir.Dense {
	d := &ir.Dense{Type: ir.TensorOf(ir.F32, s...)}
	for i := int64(0); i < d.Type.NumElements(); i++ {
		d.Floats = append(d.Floats, float64(float32(2*rng.Float64()-1)))
	}
	return d
}

// runInits imports a model whose inputs are all initializers and runs it.
func runInits(t *testing.T, g tGraph) []*interp.Tensor {
	m, err := Import(encModel(g), Options{Name: "m.onnx"})
	require.NoError(t, err)
	f := m.Funcs[0]
	args := make([]*interp.Tensor, len(f.Args))
	for i, a := range f.Args {
		args[i] = interp.FromDense(a.Arg.Init)
	}
	out, err := interp.Run(f, args, interp.Options{})
	require.NoError(t, err)
	return out
}

// attentionRef is Attention's definition with loops, in float64: q
// [B,Hq,Sq,D], k and v [B,Hkv,T,D] (past included), bias(b,h,i,j) added
// to the scores (-inf masks), softcap applied before it; a row with every
// key masked is 0.
func attentionRef(q, k, v *ir.Dense, scale, softcap float64, bias func(b, h, i, j int64) float64) []float64 {
	qs, ks := q.Type.Shape, k.Type.Shape
	B, Hq, Sq, D, Hkv, T := qs[0], qs[1], qs[2], qs[3], ks[1], ks[2]
	Dv := v.Type.Shape[3]
	at := func(x *ir.Dense, s ir.Shape, i ...int64) float64 {
		return x.Floats[((i[0]*s[1]+i[1])*s[2]+i[2])*s[3]+i[3]]
	}
	y := make([]float64, B*Hq*Sq*Dv)
	for b := int64(0); b < B; b++ {
		for h := int64(0); h < Hq; h++ {
			kh := h / (Hq / Hkv)
			for i := int64(0); i < Sq; i++ {
				s := make([]float64, T)
				top := math.Inf(-1)
				for j := int64(0); j < T; j++ {
					for e := int64(0); e < D; e++ {
						s[j] += at(q, qs, b, h, i, e) * at(k, ks, b, kh, j, e)
					}
					s[j] *= scale
					if softcap > 0 {
						s[j] = softcap * math.Tanh(s[j]/softcap)
					}
					s[j] += bias(b, h, i, j)
					top = max(top, s[j])
				}
				if math.IsInf(top, -1) {
					continue // every key masked: 0
				}
				sum := 0.0
				for j := range s {
					s[j] = math.Exp(s[j] - top)
					sum += s[j]
				}
				for j := int64(0); j < T; j++ {
					for e := int64(0); e < Dv; e++ {
						y[((b*Hq+h)*Sq+i)*Dv+e] += s[j] / sum * at(v, v.Type.Shape, b, kh, j, e)
					}
				}
			}
		}
	}
	return y
}

func concatSeq(a, b *ir.Dense) *ir.Dense {
	as, bs := a.Type.Shape, b.Type.Shape
	out := &ir.Dense{Type: ir.TensorOf(ir.F32, as[0], as[1], as[2]+bs[2], as[3])}
	for i := int64(0); i < as[0]*as[1]; i++ {
		out.Floats = append(out.Floats, a.Floats[i*as[2]*as[3]:(i+1)*as[2]*as[3]]...)
		out.Floats = append(out.Floats, b.Floats[i*bs[2]*bs[3]:(i+1)*bs[2]*bs[3]]...)
	}
	return out
}

// TestAttention23: Attention against its definition computed with loops:
// grouped-query heads (4 query heads over 2 key/value heads, repeat-
// interleaved), a past cache, the causal band offset by the past, an
// additive float mask, softcap before the mask, and present_key; then
// 3-D inputs with a boolean mask that masks one query's every key (its
// output row is 0, not NaN); then opset 24's nonpad_kv_seqlen.
func TestAttention23(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const tol = 1e-5 // f32 products of 8 terms and a softmax of 7: a few ulps
	close := func(want, got []float64) {
		require.Len(t, got, len(want))
		for i := range want {
			require.InDelta(t, want[i], got[i], tol*(1+math.Abs(want[i])), "element %d", i)
		}
	}
	t.Run("gqa-past-causal-softcap", func(t *testing.T) {
		q, k, v := randDense(rng, 2, 4, 3, 8), randDense(rng, 2, 2, 3, 8), randDense(rng, 2, 2, 3, 8)
		pk, pv := randDense(rng, 2, 2, 4, 8), randDense(rng, 2, 2, 4, 8)
		mask := randDense(rng, 3, 7)
		out := runInits(t, tGraph{opset: 23,
			nodes: []tNode{{op: "Attention", name: "/att", inputs: []string{"q", "k", "v", "m", "pk", "pv"}, outputs: []string{"y", "present_k", "present_v", "qk"},
				ints: map[string][]int64{"is_causal": {1}}, floats: map[string]float32{"softcap": 0.5, "scale": 0.3}}},
			inits: [][]byte{encTensorRaw("q", 1, q), encTensorRaw("k", 1, k), encTensorRaw("v", 1, v), encTensorRaw("m", 1, mask), encTensorRaw("pk", 1, pk), encTensorRaw("pv", 1, pv)},
			outputs: [][]byte{encValueInfo("y", 1, []int64{2, 4, 3, 8}), encValueInfo("present_k", 1, []int64{2, 2, 7, 8}),
				encValueInfo("present_v", 1, []int64{2, 2, 7, 8}), encValueInfo("qk", 1, []int64{2, 4, 3, 7})}})
		kk, vv := concatSeq(pk, k), concatSeq(pv, v)
		want := attentionRef(q, kk, vv, float64(float32(0.3)), 0.5, func(b, h, i, j int64) float64 {
			if j > i+4 {
				return math.Inf(-1)
			}
			return mask.Floats[i*7+j]
		})
		close(want, out[0].F)
		require.Equal(t, kk.Floats, out[1].F, "present_key is the past and the new keys")
	})
	t.Run("3d-bool-mask-row-masked", func(t *testing.T) {
		q, k, v := randDense(rng, 1, 2, 6), randDense(rng, 1, 3, 6), randDense(rng, 1, 3, 6)
		mask := &ir.Dense{Type: ir.TensorOf(ir.Bool, 2, 3), Ints: []int64{0, 0, 0, 1, 0, 1}}
		out := runInits(t, tGraph{opset: 23,
			nodes: []tNode{{op: "Attention", name: "/att", inputs: []string{"q", "k", "v", "m"}, outputs: []string{"y"},
				ints: map[string][]int64{"q_num_heads": {2}, "kv_num_heads": {2}}}},
			inits:   [][]byte{encTensorRaw("q", 1, q), encTensorRaw("k", 1, k), encTensorRaw("v", 1, v), encTensorRaw("m", 9, mask)},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 2, 6})}})
		heads := func(x *ir.Dense) *ir.Dense { // [1, S, 2·3] -> [1, 2, S, 3]
			s := x.Type.Shape[1]
			y := &ir.Dense{Type: ir.TensorOf(ir.F32, 1, 2, s, 3), Floats: make([]float64, 2*s*3)}
			for i := int64(0); i < s; i++ {
				for h := int64(0); h < 2; h++ {
					for e := int64(0); e < 3; e++ {
						y.Floats[(h*s+i)*3+e] = x.Floats[i*6+h*3+e]
					}
				}
			}
			return y
		}
		ref := attentionRef(heads(q), heads(k), heads(v), 1/math.Sqrt(3), 0, func(b, h, i, j int64) float64 {
			if mask.Ints[i*3+j] == 0 {
				return math.Inf(-1)
			}
			return 0
		})
		want := make([]float64, 12) // back to [1, S, 2·3]
		for i := 0; i < 2; i++ {
			for h := 0; h < 2; h++ {
				for e := 0; e < 3; e++ {
					want[i*6+h*3+e] = ref[(h*2+i)*3+e]
				}
			}
		}
		close(want, out[0].F)
		require.Equal(t, []float64{0, 0, 0, 0, 0, 0}, out[0].F[:6], "query 0 attends no key")
	})
	t.Run("nonpad-kv-seqlen", func(t *testing.T) {
		q, k, v := randDense(rng, 2, 1, 2, 4), randDense(rng, 2, 1, 5, 4), randDense(rng, 2, 1, 5, 4)
		lens := []int64{3, 5}
		out := runInits(t, tGraph{opset: 24,
			nodes:   []tNode{{op: "Attention", name: "/att", inputs: []string{"q", "k", "v", "", "", "", "lens"}, outputs: []string{"y"}}},
			inits:   [][]byte{encTensorRaw("q", 1, q), encTensorRaw("k", 1, k), encTensorRaw("v", 1, v), encTensorI64("lens", []int64{2}, lens)},
			outputs: [][]byte{encValueInfo("y", 1, []int64{2, 1, 2, 4})}})
		want := attentionRef(q, k, v, 0.5, 0, func(b, h, i, j int64) float64 {
			if j >= lens[b] {
				return math.Inf(-1)
			}
			return 0
		})
		close(want, out[0].F)
	})
}

// TestRotaryEmbedding23: RotaryEmbedding against its definition with
// loops: 4-D input, a partial rotary dimension (4 of 6), position ids
// into the caches, halves and interleaved pairs; and a 3-D input with
// num_heads.
func TestRotaryEmbedding23(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, interleaved := range []int64{0, 1} {
		x := randDense(rng, 1, 2, 3, 6) // [B, H, S, D]
		cosC, sinC := randDense(rng, 5, 2), randDense(rng, 5, 2)
		ids := []int64{4, 0, 2}
		out := runInits(t, tGraph{opset: 23,
			nodes: []tNode{{op: "RotaryEmbedding", name: "/rope", inputs: []string{"x", "c", "s", "p"}, outputs: []string{"y"},
				ints: map[string][]int64{"interleaved": {interleaved}, "rotary_embedding_dim": {4}}}},
			inits:   [][]byte{encTensorRaw("x", 1, x), encTensorRaw("c", 1, cosC), encTensorRaw("s", 1, sinC), encTensorI64("p", []int64{1, 3}, ids)},
			outputs: [][]byte{encValueInfo("y", 1, []int64{1, 2, 3, 6})}})
		want := append([]float64(nil), x.Floats...)
		for h := 0; h < 2; h++ {
			for s := 0; s < 3; s++ {
				row := want[(h*3+s)*6:]
				src := x.Floats[(h*3+s)*6:]
				for i := 0; i < 2; i++ {
					c, sn := cosC.Floats[ids[s]*2+int64(i)], sinC.Floats[ids[s]*2+int64(i)]
					a, b := i, i+2 // halves
					if interleaved == 1 {
						a, b = 2*i, 2*i+1
					}
					row[a] = c*src[a] - sn*src[b]
					row[b] = sn*src[a] + c*src[b]
				}
			}
		}
		for i := range want {
			require.InDelta(t, want[i], out[0].F[i], 1e-6, "interleaved %d, element %d", interleaved, i)
		}
	}
	// 3-D: [B, S, H·D] with num_heads 2 and caches per position [B, S, D/2].
	x := randDense(rng, 1, 2, 8)
	cosC, sinC := randDense(rng, 1, 2, 2), randDense(rng, 1, 2, 2)
	out := runInits(t, tGraph{opset: 23,
		nodes:   []tNode{{op: "RotaryEmbedding", name: "/rope", inputs: []string{"x", "c", "s"}, outputs: []string{"y"}, ints: map[string][]int64{"num_heads": {2}}}},
		inits:   [][]byte{encTensorRaw("x", 1, x), encTensorRaw("c", 1, cosC), encTensorRaw("s", 1, sinC)},
		outputs: [][]byte{encValueInfo("y", 1, []int64{1, 2, 8})}})
	for s := 0; s < 2; s++ {
		for h := 0; h < 2; h++ {
			src := x.Floats[s*8+h*4:]
			for i := 0; i < 2; i++ {
				c, sn := cosC.Floats[s*2+i], sinC.Floats[s*2+i]
				require.InDelta(t, c*src[i]-sn*src[i+2], out[0].F[s*8+h*4+i], 1e-6)
				require.InDelta(t, sn*src[i]+c*src[i+2], out[0].F[s*8+h*4+i+2], 1e-6)
			}
		}
	}
}
