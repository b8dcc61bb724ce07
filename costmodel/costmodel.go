// Package costmodel estimates how long a schedule takes on a device: a
// kernel takes the longer of its FLOPs at the device's peak rate and its
// bytes at the device's memory bandwidth (a roofline), plus a launch
// overhead; a copy between host and device takes its bytes at the host
// link's bandwidth. The swap pass decides with it and the launch-plan
// simulator reports with it, so the two agree.
package costmodel

import (
	"fmt"
	"math"
	"sort"

	"github.com/kiln-compiler/kiln/ir"
)

// Device holds the rates the model uses.
type Device struct {
	FLOPs  float64 `json:"flops"`          // floating-point operations per second
	MemBW  float64 `json:"mem_bw"`         // device memory bytes per second
	LinkBW float64 `json:"link_bw"`        // host link bytes per second, each direction
	Launch float64 `json:"launch_seconds"` // seconds of overhead per kernel launch
	// Links between devices, for collectives (alpha-beta model, ring
	// algorithms): bytes per second each way and seconds of latency per
	// step. Zero takes Default's. Not in plan.json's cost_model (its
	// schema is a contract): launch plans have no collectives yet.
	CommBW      float64 `json:"-"`
	CommLatency float64 `json:"-"`
	// HostBW is the host's memory bytes per second, for optimizer
	// updates that run on the host (ir.OnHost; bandwidth-bound, as
	// ZeRO-Offload's CPU Adam is). Zero takes Default's.
	HostBW float64 `json:"-"`
}

// Default is a current data-centre GPU: 50 TFLOP/s, 2 TB/s of device
// memory bandwidth, 25 GB/s to the host (PCIe 4 x16), 2 µs per launch.
// Devices talk at 100 GB/s each way with 5 µs per step (NVLink-class);
// the host's memory moves 50 GB/s.
var Default = Device{FLOPs: 50e12, MemBW: 2e12, LinkBW: 25e9, Launch: 2e-6, CommBW: 100e9, CommLatency: 5e-6, HostBW: 50e9}

// Validate rejects rates that are not positive.
func (d Device) Validate() error {
	if d.FLOPs <= 0 || d.MemBW <= 0 || d.LinkBW <= 0 || d.Launch < 0 {
		return fmt.Errorf("device rates must be positive (flops %g, memory bandwidth %g, link bandwidth %g, launch %g)", d.FLOPs, d.MemBW, d.LinkBW, d.Launch)
	}
	return nil
}

// KernelSeconds is the roofline time of a kernel doing flops and moving
// bytes, launch included.
func (d Device) KernelSeconds(flops, bytes int64) float64 {
	return max(float64(flops)/d.FLOPs, float64(bytes)/d.MemBW) + d.Launch
}

// CopySeconds is the time of a host-device copy of bytes.
func (d Device) CopySeconds(bytes int64) float64 { return float64(bytes) / d.LinkBW }

// OpSeconds is the time of one top-level op: zero for views and constants
// (no launch), the copy time for swaps, the roofline time otherwise.
func (d Device) OpSeconds(op *ir.Op) float64 {
	if IsCopy(op) {
		return d.CopySeconds(op.Operands[0].Type.SizeBytes())
	}
	if ir.IsCollective(op.Kind) {
		size, _ := ir.CollectiveGroup(op)
		return d.CollectiveSeconds(op.Kind, op.Operands[0].Type.SizeBytes(), size)
	}
	if ir.IsPointToPoint(op.Kind) {
		return d.CollectiveSeconds(op.Kind, ir.P2PBytes(op), 2)
	}
	if ir.OnHost(op) {
		bw := d.HostBW
		if bw <= 0 {
			bw = Default.HostBW
		}
		c := ir.OpCost(op)
		return float64(c.BytesRead+c.BytesWritten) / bw
	}
	if !Launches(op) {
		return 0
	}
	c := ir.OpCost(op)
	return d.KernelSeconds(c.FLOPs, c.BytesRead+c.BytesWritten)
}

// CollectiveSeconds is the time of a collective of kind over p ranks,
// each bringing n bytes, by ring algorithms in the alpha-beta model (α
// per step, n/B per n bytes sent): an all_reduce is a reduce_scatter and
// an all_gather, 2(p−1) steps moving 2(p−1)/p·n; a reduce_scatter of n
// bytes or an all_gather to p·n bytes, p−1 steps moving (p−1)/p·n or
// (p−1)·n; a broadcast pipelined along the ring, p−1 steps and n bytes.
func (d Device) CollectiveSeconds(kind string, n, p int64) float64 {
	if p <= 1 {
		return 0
	}
	bw, alpha := d.CommBW, d.CommLatency
	if bw <= 0 {
		bw = Default.CommBW
	}
	if alpha <= 0 {
		alpha = Default.CommLatency
	}
	steps, bytes := float64(p-1), float64(n)
	frac := steps / float64(p)
	switch kind {
	case "all_reduce":
		return 2*steps*alpha + 2*frac*bytes/bw
	case "reduce_scatter":
		return steps*alpha + frac*bytes/bw
	case "all_gather":
		return steps*alpha + steps*bytes/bw
	}
	return steps*alpha + bytes/bw // a broadcast, or a send or recv (p = 2: α + n/B)
}

// CollectiveBytes is what one rank sends in a collective of kind over p
// ranks, each bringing n bytes, by the ring algorithms of
// CollectiveSeconds.
func CollectiveBytes(kind string, n, p int64) int64 {
	if p <= 1 {
		return 0
	}
	switch kind {
	case "all_reduce":
		return 2 * (p - 1) * n / p
	case "reduce_scatter":
		return (p - 1) * n / p
	case "all_gather":
		return (p - 1) * n
	}
	return n
}

// IsCopy reports whether op is a host-device copy (swap_out, swap_in).
func IsCopy(op *ir.Op) bool { return ir.CopiesToHost(op) || ir.CopiesFromHost(op) }

// Launches reports whether op runs a kernel: not a view and not a
// constant, which take no device time.
func Launches(op *ir.Op) bool {
	if ir.IsConstant(op) {
		return false
	}
	d := op.Def()
	return d == nil || !d.View
}

// Timeline is the simulated time of a schedule on a compute stream and a
// copy stream.
type Timeline struct {
	Seconds        float64 // end of the last op
	ComputeSeconds float64 // busy time of the compute stream
	CopySeconds    float64 // busy time of the copy stream
	StallSeconds   float64 // time the compute stream waits for copies
	CommSeconds    float64 // busy time of the communication stream (collectives)
	HostSeconds    float64 // busy time of the host (updates of offloaded parameters)
}

// Simulate runs f's schedule in the model without knowing offsets:
// collectives run in order on a communication stream; copies
// run on the copy stream, in order, each starting once its operand is
// ready; the compute op after a swap_out waits for it (the memory it
// frees may be written next) and an op reading a swap_in result waits for
// that copy; ops on the host (ir.OnHost) run in order on the host once
// their operands are there.
func (d Device) Simulate(f *ir.Func) Timeline { return d.simulate(f, nil) }

// simulate is Simulate, calling commReady with each collective (or send
// or recv) and the time its operands are ready.
func (d Device) simulate(f *ir.Func, commReady func(op *ir.Op, ready float64)) Timeline {
	var tl Timeline
	ready := map[*ir.Value]float64{}
	copiedAt := map[*ir.Value]float64{} // when the last swap_in of a host value ends
	compute, copyFree, mustWait, commFree, hostFree := 0.0, 0.0, 0.0, 0.0, 0.0
	for _, op := range f.Body {
		start := 0.0
		for _, x := range op.Operands {
			start = max(start, ready[x])
		}
		secs := d.OpSeconds(op)
		if ir.IsCollective(op.Kind) || ir.IsPointToPoint(op.Kind) {
			// Collectives (and sends and recvs) run in order on a stream of
			// their own, each once its operand is ready; compute goes on
			// until it reads a result. A recv's sender is on another rank:
			// one function's timeline takes its tensor as sent at once.
			if commReady != nil {
				commReady(op, start)
			}
			commFree = max(start, commFree) + secs
			tl.CommSeconds += secs
			for _, r := range op.Results {
				ready[r] = commFree
			}
			continue
		}
		if ir.OnHost(op) {
			// It overwrites host memory that copies to the device may
			// still be reading.
			for _, x := range op.Operands {
				start = max(start, copiedAt[x])
			}
			hostFree = max(start, hostFree) + secs
			tl.HostSeconds += secs
			continue
		}
		if IsCopy(op) {
			// A swap_in also waits for the ops before it: its memory is free
			// only once they ran.
			if ir.CopiesFromHost(op) {
				start = max(start, compute)
			}
			start = max(start, copyFree)
			copyFree = start + secs
			tl.CopySeconds += secs
			for _, r := range op.Results {
				ready[r] = copyFree
			}
			if ir.CopiesToHost(op) {
				mustWait = max(mustWait, copyFree)
			} else {
				copiedAt[op.Operands[0]] = copyFree
			}
			continue
		}
		begin := max(compute, start, mustWait)
		if secs > 0 {
			tl.StallSeconds += begin - compute
			compute = begin + secs
			mustWait = 0
		}
		tl.ComputeSeconds += secs
		for _, r := range op.Results {
			ready[r] = max(begin+secs, start)
		}
	}
	tl.Seconds = max(compute, copyFree, commFree, hostFree)
	return tl
}

// ExposedComm is the step time f's collectives add in the model: its
// simulated time less the time with every collective instantaneous. One
// minus its ratio to Timeline.CommSeconds is the share of communication
// that overlaps compute.
func (d Device) ExposedComm(f *ir.Func) float64 {
	return d.Simulate(f).Seconds - d.withFreeComm().Simulate(f).Seconds
}

// HideableComm is the most communication f's schedule, as written, lets
// overlap compute: the collectives' time less what must run past the
// compute. With free links the compute ends at T and each collective's
// operands are ready at some r; in the real step they are ready no
// earlier, so the communication stream, serial, ends no earlier than it
// would running each collective (taking its real time) from its r on in
// the order of r, the earliest finish of that stream. What of it runs
// past T is exposed. The bound is for f's ops as they are: another order
// (or other buckets) has other ready times. A recv's sender is on another
// rank; as in Simulate, its tensor counts as sent at once.
func (d Device) HideableComm(f *ir.Func) float64 {
	type comm struct{ ready, secs float64 }
	var comms []comm
	total := 0.0
	free := d.withFreeComm().simulate(f, func(op *ir.Op, ready float64) {
		secs := d.OpSeconds(op)
		comms = append(comms, comm{ready, secs})
		total += secs
	})
	sort.SliceStable(comms, func(i, j int) bool { return comms[i].ready < comms[j].ready })
	end := 0.0
	for _, c := range comms {
		end = max(end, c.ready) + c.secs
	}
	return max(0, total-max(0, end-free.Seconds))
}

// withFreeComm is d with instantaneous collectives.
func (d Device) withFreeComm() Device {
	d.CommBW, d.CommLatency = math.Inf(1), math.SmallestNonzeroFloat64
	return d
}
