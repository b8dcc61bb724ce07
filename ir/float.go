package ir

import "math"

// smallFloat describes a narrow binary floating-point format.
type smallFloat struct {
	ebits, mbits uint
	finite       bool   // no infinities: overflow saturates (fp8 e4m3fn)
	nan          uint32 // the canonical NaN encoding without sign
}

var (
	fmtF16    = smallFloat{ebits: 5, mbits: 10, nan: 0x7E00}
	fmtBF16   = smallFloat{ebits: 8, mbits: 7, nan: 0x7FC0}
	fmtF8E4M3 = smallFloat{ebits: 4, mbits: 3, finite: true, nan: 0x7F}
	fmtF8E5M2 = smallFloat{ebits: 5, mbits: 2, nan: 0x7E}
)

func (f smallFloat) bias() int { return 1<<(f.ebits-1) - 1 }

// encode rounds x to the nearest representable value (ties to even) and
// returns its bit pattern.
func (f smallFloat) encode(x float64) uint32 {
	signBit := uint32(1) << (f.ebits + f.mbits)
	var sign uint32
	if math.Signbit(x) {
		sign = signBit
		x = -x
	}
	if math.IsNaN(x) {
		return f.nan
	}
	maxBits := f.maxFinite()
	if math.IsInf(x, 0) {
		if f.finite {
			return sign | maxBits
		}
		return sign | uint32((1<<f.ebits)-1)<<f.mbits
	}
	if x == 0 {
		return sign
	}
	_, k := math.Frexp(x)
	e := k - 1
	minExp := 1 - f.bias()
	var bits uint32
	if e < minExp {
		q := math.RoundToEven(math.Ldexp(x, int(f.mbits)-minExp))
		bits = uint32(q)
	} else {
		q := math.RoundToEven(math.Ldexp(x, int(f.mbits)-e))
		if q >= float64(uint64(2)<<f.mbits) {
			q /= 2
			e++
		}
		biased := e + f.bias()
		if biased >= (1<<f.ebits)-1 && !f.finite {
			return sign | uint32((1<<f.ebits)-1)<<f.mbits
		}
		if biased > (1<<f.ebits)-1 {
			return sign | maxBits
		}
		bits = uint32(biased)<<f.mbits | (uint32(q) - 1<<f.mbits)
	}
	if f.finite && bits > maxBits {
		bits = maxBits
	}
	return sign | bits
}

// maxFinite is the bit pattern of the largest finite value.
func (f smallFloat) maxFinite() uint32 {
	if f.finite {
		return f.nan - 1
	}
	return uint32((1<<f.ebits)-2)<<f.mbits | (1<<f.mbits - 1)
}

func (f smallFloat) decode(bits uint32) float64 {
	sign := 1.0
	if bits>>(f.ebits+f.mbits)&1 == 1 {
		sign = -1
	}
	exp := int(bits>>f.mbits) & (1<<f.ebits - 1)
	mant := bits & (1<<f.mbits - 1)
	if f.finite {
		if bits&^(1<<(f.ebits+f.mbits)) == f.nan {
			return math.NaN()
		}
	} else if exp == 1<<f.ebits-1 {
		if mant != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	}
	if exp == 0 {
		return sign * math.Ldexp(float64(mant), 1-f.bias()-int(f.mbits))
	}
	return sign * math.Ldexp(float64(mant|1<<f.mbits), exp-f.bias()-int(f.mbits))
}

// Float16Bits rounds x to IEEE half precision and returns its bits.
func Float16Bits(x float64) uint16 { return uint16(fmtF16.encode(x)) }

// Float16FromBits decodes IEEE half precision bits.
func Float16FromBits(b uint16) float64 { return fmtF16.decode(uint32(b)) }

// BFloat16Bits rounds x to bfloat16 and returns its bits.
func BFloat16Bits(x float64) uint16 { return uint16(fmtBF16.encode(float64(float32(x)))) }

// BFloat16FromBits decodes bfloat16 bits.
func BFloat16FromBits(b uint16) float64 { return fmtBF16.decode(uint32(b)) }

// Float8E4M3Bits rounds x, first to f32, to fp8 e4m3 (no infinities;
// overflow saturates to 448).
func Float8E4M3Bits(x float64) uint8 { return uint8(fmtF8E4M3.encode(float64(float32(x)))) }

// Float8E4M3FromBits decodes fp8 e4m3 bits.
func Float8E4M3FromBits(b uint8) float64 { return fmtF8E4M3.decode(uint32(b)) }

// Float8E5M2Bits rounds x, first to f32, to fp8 e5m2 and returns its
// bits.
func Float8E5M2Bits(x float64) uint8 { return uint8(fmtF8E5M2.encode(float64(float32(x)))) }

// Float8E5M2FromBits decodes fp8 e5m2 bits.
func Float8E5M2FromBits(b uint8) float64 { return fmtF8E5M2.decode(uint32(b)) }

// RoundTo rounds x to the nearest value representable in d (ties to even)
// and returns it as a float64; integer dtypes truncate toward zero and
// bool maps nonzero to 1. bf16 and fp8 round from x's f32 value, as
// compiled code computes their results in f32 and then converts them: an
// op whose result_dtype is fp8 equals the same op in f32 and a cast.
func RoundTo(d DType, x float64) float64 {
	switch d {
	case F64:
		return x
	case F32:
		return float64(float32(x))
	case F16:
		return Float16FromBits(Float16Bits(x))
	case BF16:
		return BFloat16FromBits(BFloat16Bits(x))
	case F8E4M3:
		return Float8E4M3FromBits(Float8E4M3Bits(x))
	case F8E5M2:
		return Float8E5M2FromBits(Float8E5M2Bits(x))
	case Bool:
		if x != 0 {
			return 1
		}
		return 0
	}
	return math.Trunc(x)
}

// MaxFinite is the largest finite value of a floating-point dtype.
func MaxFinite(d DType) float64 {
	switch d {
	case F64:
		return math.MaxFloat64
	case F32:
		return math.MaxFloat32
	case F16:
		return fmtF16.decode(fmtF16.maxFinite())
	case BF16:
		return fmtBF16.decode(fmtBF16.maxFinite())
	case F8E4M3:
		return fmtF8E4M3.decode(fmtF8E4M3.maxFinite())
	case F8E5M2:
		return fmtF8E5M2.decode(fmtF8E5M2.maxFinite())
	}
	return math.NaN()
}
