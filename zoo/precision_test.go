package zoo

import (
	"testing"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/memreport"
	_ "github.com/kiln-compiler/kiln/passes/precision"
)

// plannedRatio is planned memory with precision{dtype=bf16} over f32, both
// through autodiff, an SGD step, fuse (broadcasts may be read as matmul
// prologues), reorder and assign.
func plannedRatio(tb testing.TB, name string) (f32, bf16 int64) {
	for i, p := range []string{"", "precision{dtype=bf16},"} {
		m, _, _ := TrainingStep(tb, name)
		run(tb, m, p+"optimizer{kind=sgd},fuse{prologue-flops=0.01},reorder,assign")
		planned := memreport.Build(m.Funcs[0], nil, costmodel.Default).PlannedBytes
		if i == 0 {
			f32 = planned
		} else {
			bf16 = planned
		}
	}
	return f32, bf16
}

// BenchmarkPrecisionMemory reports the planned memory of each zoo training
// step in bf16 against f32 (target: at most 0.55).
func BenchmarkPrecisionMemory(b *testing.B) {
	for _, name := range Models {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				f32, bf16 := plannedRatio(b, name)
				b.ReportMetric(float64(f32)/(1<<20), "f32-MiB")
				b.ReportMetric(float64(bf16)/(1<<20), "bf16-MiB")
				b.ReportMetric(float64(bf16)/float64(f32), "bf16/f32")
			}
		})
	}
}

// TestPrecisionShrinksCIModels: at CI sizes the bf16 step plans less than
// the f32 one, within the measured ratios (parameters, their gradients
// and dropout masks do not shrink, and weigh far more at CI sizes: the
// CI ResNet keeps ResNet-50's weights on 32x32 images).
func TestPrecisionShrinksCIModels(t *testing.T) {
	bound := map[string]float64{"resnet50_ci": 0.96, "bert_base_ci": 0.73, "gpt2_small_ci": 0.73}
	for _, name := range CIModels {
		f32, bf16 := plannedRatio(t, name)
		r := float64(bf16) / float64(f32)
		t.Logf("%s: f32 %d bytes, bf16 %d bytes, ratio %.3f", name, f32, bf16, r)
		if r > bound[name] {
			t.Errorf("%s: bf16 plans %.3f of f32, more than the %.2f measured", name, r, bound[name])
		}
	}
}
