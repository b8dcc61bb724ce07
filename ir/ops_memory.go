package ir

import "fmt"

// Memory-space copies, made by the swap pass: swap_out copies a device
// tensor to host memory (its result lives in the host arena, not the
// device arena) and swap_in copies it back to a new device tensor. The
// stream attribute names the stream the copy runs on (1, the copy
// stream, by default; 0 is the compute stream). Both are pure copies: the
// interpreter and the LLVM backend run them as plain copies.

// HostResult reports whether v is a swap_out result, in the host arena.
func HostResult(v *Value) bool {
	return v != nil && v.Def != nil && v.Def.Def() != nil && v.Def.Def().Host
}

// HostArg reports whether v is an argument the caller holds in host
// memory (attribute host = true): a parameter or optimizer state that the
// swap pass offloaded, as ZeRO-Offload does, or a data input it left on
// the host. The device reads it through swap_in; an optimizer update
// that reads only host values runs on the host (OnHost).
func HostArg(v *Value) bool {
	return v != nil && v.Arg != nil && v.Arg.Attrs["host"].Kind == AttrBool && v.Arg.Attrs["host"].Bool
}

// InHost reports whether v lives in host memory: a swap_out result or a
// host argument.
func InHost(v *Value) bool { return HostResult(v) || HostArg(v) }

// OnHost reports whether op runs on the host: an op that overwrites
// operands in place (an optimizer update) and reads only values in host
// memory. Every other op but swap_in reads device values only.
func OnHost(op *Op) bool {
	d := op.Def()
	if d == nil || len(d.Writes) == 0 || len(op.Operands) == 0 {
		return false
	}
	for _, x := range op.Operands {
		if !InHost(x) {
			return false
		}
	}
	return true
}

func init() {
	stream := []AttrSpec{{Name: "stream", Kind: AttrInt, Default: IntAttr(1)}}
	copyType := func(in []Type, a AttrValues) ([]Type, error) {
		if s := a.Int("stream"); s < 0 {
			return nil, fmt.Errorf("stream must not be negative, got %d", s)
		}
		return []Type{in[0]}, nil
	}
	Register(&OpDef{
		Name: "swap_out", Summary: "copy a device tensor to host memory (the result lives on the host)",
		MinOperands: 1, MaxOperands: 1, Attrs: stream, Infer: copyType, FLOPs: zeroFLOPs, Fusion: Opaque, Host: true, Grad: NoGrad,
		Axes: broadcastAxes, Linear: linearIn([]int{0}),
	})
	Register(&OpDef{
		Name: "swap_in", Summary: "copy a host tensor (a swap_out result) back to device memory",
		MinOperands: 1, MaxOperands: 1, Attrs: stream, Infer: copyType, FLOPs: zeroFLOPs, Fusion: Opaque, Grad: NoGrad, FromHost: true,
		Axes: broadcastAxes, Linear: linearIn([]int{0}),
	})
}
