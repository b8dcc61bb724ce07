package zoo

import (
	"testing"
	"time"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes/swap"
)

// BenchmarkSwapZoo plans the full-size zoo training steps (SGD, fused,
// reordered) with the device budget at half their arena, swapping and
// recomputing, and reports the cost model's step time against the
// unconstrained plan's (target: within 20%).
func BenchmarkSwapZoo(b *testing.B) {
	for _, name := range Models {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				m, _, _ := TrainingStep(b, name)
				run(b, m, "optimizer{kind=sgd,lr=0.01},fuse,reorder")
				f := m.Funcs[0]
				arena := swap.ArenaBytes(f)
				before := costmodel.Default.Simulate(f)
				start := time.Now()
				res, err := swap.Swap(f, arena/2, swap.Options{Device: costmodel.Default, Recompute: true})
				if err != nil {
					b.Fatal(err)
				}
				if err := ir.Verify(m); err != nil {
					b.Fatal(err)
				}
				if res.Arena > arena/2 {
					b.Fatalf("arena %d over half of %d", res.Arena, arena)
				}
				b.Logf("%s: %d ops, arena %.0f -> %.0f MiB, %d swapped (%.0f MiB), %d recomputed, step %.1f -> %.1f ms (%.3fx), planned in %.0f s",
					name, len(f.Body), mib(arena), mib(res.Arena), res.Swapped, mib(res.SwappedBytes), res.Recomputed,
					before.Seconds*1e3, res.After.Seconds*1e3, res.After.Seconds/before.Seconds, time.Since(start).Seconds())
				b.ReportMetric(res.After.Seconds/before.Seconds, "slowdown")
			}
		})
	}
}
