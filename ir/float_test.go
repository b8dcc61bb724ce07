package ir

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFloat16Rounding(t *testing.T) {
	cases := []struct {
		in   float64
		bits uint16
	}{
		{1, 0x3C00}, {-2, 0xC000}, {65504, 0x7BFF}, {65520, 0x7C00}, {math.Inf(1), 0x7C00},
		{5.960464477539063e-08, 0x0001}, {2.9802322387695312e-08, 0x0000}, // tie to even: 0
		{1 + 1.0/2048, 0x3C00}, {1 + 3.0/2048, 0x3C02}, {0.333251953125, 0x3555},
	}
	for _, c := range cases {
		require.Equal(t, c.bits, Float16Bits(c.in), "f16(%v)", c.in)
	}
	require.True(t, math.IsNaN(Float16FromBits(Float16Bits(math.NaN()))))
	for b := 0; b < 0x7C00; b++ { // every finite positive value survives a round trip
		require.Equal(t, uint16(b), Float16Bits(Float16FromBits(uint16(b))))
	}
}

func TestBFloat16Rounding(t *testing.T) {
	require.Equal(t, uint16(0x3F80), BFloat16Bits(1))
	require.Equal(t, uint16(0x3F80), BFloat16Bits(1+1.0/256)) // tie to even
	require.Equal(t, uint16(0x3F82), BFloat16Bits(1+3.0/256)) // tie to even, upwards
	require.Equal(t, uint16(0x4049), BFloat16Bits(math.Pi))   // 3.140625
	require.Equal(t, uint16(0x7F80), BFloat16Bits(math.Inf(1)))
	require.Equal(t, 3.140625, RoundTo(BF16, math.Pi))
}

func TestFloat8(t *testing.T) {
	require.Equal(t, 448.0, RoundTo(F8E4M3, 1e6), "e4m3 saturates")
	require.Equal(t, uint8(0x7E), Float8E4M3Bits(448))
	require.True(t, math.IsNaN(Float8E4M3FromBits(0x7F)))
	require.Equal(t, 57344.0, Float8E5M2FromBits(0x7B))
	require.True(t, math.IsInf(Float8E5M2FromBits(0x7C), 1))
	require.Equal(t, math.Ldexp(1, -9), Float8E4M3FromBits(0x01), "smallest e4m3 subnormal")
	for b := 0; b < 0x7F; b++ {
		require.Equal(t, uint8(b), Float8E4M3Bits(Float8E4M3FromBits(uint8(b))))
	}
}
