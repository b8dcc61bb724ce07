package costmodel

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
)

// Presets are the devices ParseDevice knows by name. Their rates are the
// vendors' published peaks for f32 arithmetic without tensor cores (the
// kernels Kiln generates), device memory, the host link (each direction)
// and the links between devices (each direction).
var Presets = map[string]Device{
	"default": Default,
	// NVIDIA H100 SXM5: 67 TFLOP/s f32, 3.35 TB/s HBM3, PCIe 5 x16
	// (64 GB/s), NVLink 4 (450 GB/s each way).
	"h100": {FLOPs: 67e12, MemBW: 3.35e12, LinkBW: 64e9, Launch: 2e-6, CommBW: 450e9, CommLatency: 5e-6, HostBW: 100e9},
	// NVIDIA A100 SXM4 80GB: 19.5 TFLOP/s f32, 2.04 TB/s HBM2e, PCIe 4
	// x16 (32 GB/s), NVLink 3 (300 GB/s each way).
	"a100": {FLOPs: 19.5e12, MemBW: 2.04e12, LinkBW: 32e9, Launch: 2e-6, CommBW: 300e9, CommLatency: 5e-6, HostBW: 50e9},
}

// deviceKeys are the rates a device spec may set, with where each goes.
var deviceKeys = []string{"flops", "mem-bw", "link-bw", "launch", "comm-bw", "comm-latency", "host-bw"}

// ParseDevice reads a device description: a preset's name (Presets), or
// rates (flops=67e12,mem-bw=3.35e12,link-bw=64e9,launch=2e-6,
// comm-bw=450e9,comm-latency=5e-6,host-bw=100e9), or a preset followed by
// the rates that differ (h100,link-bw=25e9). Rates not given are the
// preset's, or Default's. "" is Default.
func ParseDevice(spec string) (Device, error) {
	d := Default
	for i, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		key, val, isRate := strings.Cut(part, "=")
		if !isRate {
			p, ok := Presets[key]
			if !ok || i > 0 {
				names := make([]string, 0, len(Presets))
				for n := range Presets {
					names = append(names, n)
				}
				slices.Sort(names)
				return Device{}, fmt.Errorf("%q is not a device (a preset first, %s, then rates KEY=VALUE)%s", key, strings.Join(names, ", "), diag.DidYouMean(key, names))
			}
			d = p
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			return Device{}, fmt.Errorf("device rate %s takes a finite number of at least 0, not %q", key, val)
		}
		switch key {
		case "flops":
			d.FLOPs = x
		case "mem-bw":
			d.MemBW = x
		case "link-bw":
			d.LinkBW = x
		case "launch":
			d.Launch = x
		case "comm-bw":
			d.CommBW = x
		case "comm-latency":
			d.CommLatency = x
		case "host-bw":
			d.HostBW = x
		default:
			return Device{}, fmt.Errorf("a device has no rate %q (it has %s)%s", key, strings.Join(deviceKeys, ", "), diag.DidYouMean(key, deviceKeys))
		}
	}
	return d, d.Validate()
}
