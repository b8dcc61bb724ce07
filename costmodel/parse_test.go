package costmodel

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseDevice(t *testing.T) {
	d, err := ParseDevice("")
	require.NoError(t, err)
	require.Equal(t, Default, d)
	d, err = ParseDevice("h100")
	require.NoError(t, err)
	require.Equal(t, Presets["h100"], d)
	d, err = ParseDevice("h100, link-bw=25e9")
	require.NoError(t, err)
	want := Presets["h100"]
	want.LinkBW = 25e9
	require.Equal(t, want, d)
	d, err = ParseDevice("flops=1e12,launch=0")
	require.NoError(t, err)
	require.Equal(t, 1e12, d.FLOPs)
	require.Zero(t, d.Launch)
	require.Equal(t, Default.MemBW, d.MemBW)
	for spec, msg := range map[string]string{
		"h200":         `"h200" is not a device`,
		"flops=1,h100": `"h100" is not a device`,
		"flop=1":       `a device has no rate "flop"`,
		"flops=-1":     "takes a finite number",
		"flops=NaN":    "takes a finite number",
		"mem-bw=inf":   "takes a finite number",
		"flops=0":      "must be positive",
		"launch=abc":   "takes a finite number",
	} {
		_, err := ParseDevice(spec)
		require.ErrorContains(t, err, msg, spec)
	}
}
