package loops

// FP8C is the C source of the fp8 conversions that compiled code calls
// (kiln_f32_to_f8e4m3, kiln_f32_to_f8e5m2, kiln_f8e4m3_to_f32,
// kiln_f8e5m2_to_f32), which both backends include: the LLVM runtime in
// runtime.c, CUDA kernels in kernels.cu. KILN_F8_FN qualifies them
// (empty in C; __host__ __device__ static inline under CUDA). They use
// integer operations on a float's bits only (no math library, so the
// same source compiles for the device) and compute what ir's encoder
// does: round to nearest even, e4m3 saturating at 448 (it has no
// infinity), e5m2 overflowing to infinity, NaN without its sign. Whether
// a cast saturates is decided before, in the cast's expression.
const FP8C = `
KILN_F8_FN unsigned int kiln_f8_bits(float f) { union { float f; unsigned int u; } c; c.f = f; return c.u; }
KILN_F8_FN float kiln_f8_float(unsigned int u) { union { float f; unsigned int u; } c; c.u = u; return c.f; }

KILN_F8_FN unsigned char kiln_f32_to_f8(float f, int ebits, int mbits, int finite, unsigned int nan) {
	unsigned int u = kiln_f8_bits(f), a = u & 0x7fffffffu;
	unsigned int sign = (u >> 31) << (ebits + mbits);
	unsigned int maxbits = finite ? nan - 1 : ((((1u << ebits) - 2) << mbits) | ((1u << mbits) - 1));
	int bias = (1 << (ebits - 1)) - 1, minexp = 1 - bias;
	if (a > 0x7f800000u) return (unsigned char)nan;
	if (a == 0x7f800000u) return (unsigned char)(sign | (finite ? maxbits : ((1u << ebits) - 1) << mbits));
	if (a < 0x00800000u) return (unsigned char)sign; /* f32 subnormals are far below fp8's smallest value */
	int e = (int)(a >> 23) - 127, shift = 23 - mbits + (e < minexp ? minexp - e : 0);
	if (shift > 24) return (unsigned char)sign; /* below half the smallest subnormal */
	unsigned int m = (a & 0x7fffffu) | 0x800000u, q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
	if (rest > half || (rest == half && (q & 1u))) q++;
	unsigned int bits;
	if (e < minexp) {
		bits = q; /* 2^mbits here is the smallest normal, as encoded */
	} else {
		if (q >= (2u << mbits)) { q >>= 1; e++; }
		int biased = e + bias;
		if (biased >= (1 << ebits) - 1 && !finite) return (unsigned char)(sign | ((1u << ebits) - 1) << mbits);
		if (biased > (1 << ebits) - 1) return (unsigned char)(sign | maxbits);
		bits = ((unsigned int)biased << mbits) | (q - (1u << mbits));
	}
	if (finite && bits > maxbits) bits = maxbits;
	return (unsigned char)(sign | bits);
}

KILN_F8_FN float kiln_f8_to_f32(unsigned char b, int ebits, int mbits, int finite, unsigned int nan) {
	unsigned int sign = (b >> (ebits + mbits)) & 1u, exp = (b >> mbits) & ((1u << ebits) - 1), mant = b & ((1u << mbits) - 1);
	int bias = (1 << (ebits - 1)) - 1;
	if (finite ? (b & ~(1u << (ebits + mbits))) == nan : exp == (1u << ebits) - 1 && mant != 0) return kiln_f8_float(0x7fc00000u);
	if (!finite && exp == (1u << ebits) - 1) return kiln_f8_float(sign << 31 | 0x7f800000u);
	/* m · 2^k with k = (exp or 1) - bias - mbits, at least -126 here. */
	int k = (exp ? (int)exp : 1) - bias - mbits;
	float v = (float)(exp ? (mant | (1u << mbits)) : mant) * kiln_f8_float((unsigned int)(127 + k) << 23);
	return sign ? -v : v;
}

KILN_F8_FN unsigned char kiln_f32_to_f8e4m3(float x) { return kiln_f32_to_f8(x, 4, 3, 1, 0x7f); }
KILN_F8_FN unsigned char kiln_f32_to_f8e5m2(float x) { return kiln_f32_to_f8(x, 5, 2, 0, 0x7e); }
KILN_F8_FN float kiln_f8e4m3_to_f32(unsigned char b) { return kiln_f8_to_f32(b, 4, 3, 1, 0x7f); }
KILN_F8_FN float kiln_f8e5m2_to_f32(unsigned char b) { return kiln_f8_to_f32(b, 5, 2, 0, 0x7e); }
`
