package zoo

import (
	"testing"
	"time"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes/swap"
)

// BenchmarkSwapZoo plans the full-size zoo training steps (SGD, fused,
// reordered) with the device budget at their parameters and half their
// arena, swapping and recomputing with the parameters kept on the device,
// and reports the cost model's step time against the unconstrained
// plan's (target: within 20%).
func BenchmarkSwapZoo(b *testing.B) {
	for _, name := range Models {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				m, _, _ := TrainingStep(b, name)
				run(b, m, "optimizer{kind=sgd,lr=0.01},fuse,reorder")
				f := m.Funcs[0]
				arena := swap.ArenaBytes(f)
				device, err := swap.DeviceBytes(f, loops.Workspace)
				if err != nil {
					b.Fatal(err)
				}
				budget := device - arena/2
				before := costmodel.Default.Simulate(f)
				start := time.Now()
				res, err := swap.Swap(f, budget, swap.Options{Device: costmodel.Default, Workspace: loops.Workspace, Recompute: true})
				if err != nil {
					b.Fatal(err)
				}
				if err := ir.Verify(m); err != nil {
					b.Fatal(err)
				}
				if res.Arena > budget {
					b.Fatalf("device memory %d over the parameters and half the arena of %d", res.Arena, device)
				}
				b.Logf("%s: %d ops, device %.0f -> %.0f MiB (arena %.0f MiB before), %d swapped (%.0f MiB), %d recomputed, step %.1f -> %.1f ms (%.3fx), planned in %.0f s",
					name, len(f.Body), mib(device), mib(res.Arena), mib(arena), res.Swapped, mib(res.SwappedBytes), res.Recomputed,
					before.Seconds*1e3, res.After.Seconds*1e3, res.After.Seconds/before.Seconds, time.Since(start).Seconds())
				b.ReportMetric(res.After.Seconds/before.Seconds, "slowdown")
			}
		})
	}
}
