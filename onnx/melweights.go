package onnx

import (
	"math"

	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
)

// MelWeightMatrix (opset 17) is a constant [dft_length/2 + 1,
// num_mel_bins] of triangular filters, computed at import from its
// inputs (which must be known then) as ONNX's reference computes it: the
// band from lower to upper edge hertz split evenly on the mel scale
// (2595·log10(1 + f/700)) into num_mel_bins + 2 points, each point's
// frequency mapped to a spectrogram bin ⌊(dft_length + 1)·f /
// sample_rate⌋, and filter i rising linearly from point i to point i+1
// and falling to point i+2.
func init() {
	arity["MelWeightMatrix"] = [2]int{5, 5}
	introduced["MelWeightMatrix"] = 17
	converters["MelWeightMatrix"] = func(im *importer, n *node, in []entry) ([]entry, error) {
		var ints [3][]int64
		for j, what := range []string{"num_mel_bins", "dft_length", "sample_rate"} {
			v, err := im.constInts(in, j, what)
			if err != nil {
				return nil, err
			}
			if len(v) != 1 {
				return nil, im.errorf("%s must be one integer", what)
			}
			ints[j] = v
		}
		var edges [2]float64
		for j, what := range []string{"lower_edge_hertz", "upper_edge_hertz"} {
			v, err := im.constFloats(in, 3+j, what)
			if err != nil {
				return nil, err
			}
			if len(v) != 1 {
				return nil, im.errorf("%s must be one number", what)
			}
			edges[j] = v[0]
		}
		mels, dft, rate := ints[0][0], ints[1][0], ints[2][0]
		bins := dft/2 + 1
		switch {
		case mels < 1 || dft < 1 || rate < 1:
			return nil, im.errorf("num_mel_bins %d, dft_length %d and sample_rate %d must be positive", mels, dft, rate)
		case mels > foldLimit/bins:
			return nil, im.errorf("a %d×%d matrix is beyond the fold limit of %d elements", bins, mels, foldLimit)
		case !(edges[0] >= 0 && edges[1] >= edges[0]):
			return nil, im.errorf("the edges %g and %g hertz must satisfy 0 <= lower <= upper", edges[0], edges[1])
		}
		dt, ok := dtypeOf(attrInt(n, "output_datatype", 1))
		if !ok || !dt.IsFloat() {
			return nil, im.errorf("output_datatype %s: Kiln writes the matrix in a floating-point type", onnxTypeName(attrInt(n, "output_datatype", 1)))
		}
		mel := func(f float64) float64 { return 2595 * math.Log10(1+f/700) }
		lo, hi := mel(edges[0]), mel(edges[1])
		step := (hi - lo) / float64(mels+2)
		point := make([]int64, mels+2)
		for i := range point {
			f := 700 * (math.Pow(10, (float64(i)*step+lo)/2595) - 1)
			point[i] = int64(math.Floor(float64(dft+1) * f / float64(rate)))
			if point[i] < 0 || point[i] >= bins {
				return nil, im.errorf("the band reaches spectrogram bin %d of %d (upper_edge_hertz beyond sample_rate/2)", point[i], bins)
			}
		}
		w := interp.New(ir.TensorOf(dt, bins, mels))
		for i := int64(0); i < mels; i++ {
			left, centre, right := point[i], point[i+1], point[i+2]
			if centre == left {
				w.F[centre*mels+i] = 1
			} else {
				for j := left; j <= centre; j++ {
					w.F[j*mels+i] = float64(j-left) / float64(centre-left)
				}
			}
			for j := centre; j < right; j++ {
				w.F[j*mels+i] = float64(right-j) / float64(right-centre)
			}
		}
		return []entry{{k: interp.FromFloats(w.Type, w.F)}}, nil
	}
}
