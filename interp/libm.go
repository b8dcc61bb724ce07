package interp

import "math"

// The interpreter's float64 functions. Go's amd64 assembly for math.Log
// treats subnormal inputs as normal ones (golang/go#56600: log(1e-310)
// gives -709.08, not -713.80), math.Pow inherits that for subnormal bases
// (1e-310^0.1 gives 1.6e-31), and math.Exp overflows to +Inf a little
// below the largest finite result; these wrappers scale the subnormals
// into range so that the reference is right on the whole range.

func logF64(x float64) float64 {
	if x > 0 && x < 0x1p-1022 {
		return math.Log(x*0x1p54) - 54*math.Ln2
	}
	return math.Log(x)
}

func expF64(x float64) float64 {
	if v := math.Exp(x); !math.IsInf(v, 1) || x > 709.8 {
		return v
	}
	return math.Exp(x-1) * math.E
}

func powF64(a, b float64) float64 {
	if a != 0 && math.Abs(a) < 0x1p-1022 {
		return math.Pow(a*0x1p54, b) * math.Pow(2, -54*b)
	}
	return math.Pow(a, b)
}
