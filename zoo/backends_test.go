package zoo

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/memreport"
	"github.com/kiln-compiler/kiln/onnx"
)

// torchSeconds times PyTorch eager on the same model, batch and threads
// with scripts/bench_torch.py, when Debian's python3-torch is installed.
func torchSeconds(b *testing.B, name string, batch, threads int) (float64, bool) {
	py := "/usr/bin/python3"
	script, _ := filepath.Abs(filepath.Join("..", "scripts", "bench_torch.py"))
	cmd := exec.Command(py, script, name, strconv.Itoa(batch), strconv.Itoa(threads))
	cmd.Dir = filepath.Dir(script)
	out, err := cmd.Output()
	if err != nil {
		b.Logf("PyTorch timing unavailable (%v): install python3-torch python3-torchvision", err)
		return 0, false
	}
	s, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	return s, err == nil
}

// BenchmarkBackends times one training-mode forward pass of each zoo
// model at batch 1, compiled at -O2 (all cores), interpreted, and in
// PyTorch eager with the same number of threads; it reports seconds per
// run of each and the compiled/PyTorch ratio (the target is at most 2).
func BenchmarkBackends(b *testing.B) {
	threads := runtime.NumCPU()
	// The transformers bake batch x heads into reshapes: they are exported
	// at batch 1 (scripts/export_zoo.py --batch 1); ResNet-50 re-batches.
	files := map[string]string{"resnet50": "resnet50", "bert_base": "bert_base_b1", "gpt2_small": "gpt2_small_b1"}
	for _, name := range Models {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				m, err := onnx.ImportFile(modelPath(files[name]), onnx.Options{Batch: 1})
				if err != nil {
					b.Fatal(err)
				}
				run(b, m, "canonicalize,dce,cse,fuse,reorder,assign")
				f := m.Funcs[0]
				args := interp.RandomArgs(f, 1)
				p, err := llvm.Lower(f)
				if err != nil {
					b.Fatal(err)
				}
				var compiled float64
				var rss, binary int64
				if _, _, err := llvm.Run(p, args, llvm.RunOptions{Repeat: 5, Seconds: &compiled, MaxRSS: &rss, Binary: &binary}); err != nil {
					b.Fatal(err)
				}
				planned := memreport.Build(f, nil, costmodel.Default).PlannedBytes
				b.ReportMetric(float64(rss)/float64(planned+binary), "rss/(planned+binary)")
				b.ReportMetric(float64(rss-planned-binary)/(1<<20), "rss-over-plan-MiB")
				start := time.Now()
				if _, err := interp.Run(f, args, interp.Options{}); err != nil {
					b.Fatal(err)
				}
				interpreted := time.Since(start).Seconds()
				b.ReportMetric(compiled, "compiled-s")
				b.ReportMetric(interpreted, "interp-s")
				b.ReportMetric(interpreted/compiled, "interp/compiled")
				if torch, ok := torchSeconds(b, name, 1, threads); ok {
					b.ReportMetric(torch, "torch-s")
					b.ReportMetric(compiled/torch, "compiled/torch")
				}
			}
		})
	}
}

// BenchmarkCompiledTrainingStep runs a ResNet-50 training step (batch 8,
// forward, backward and an SGD update in place) compiled at -O2 and
// reports its time and its peak resident memory against the plan (one
// run: repeating would keep a copy of the parameters it updates).
func BenchmarkCompiledTrainingStep(b *testing.B) {
	for i := 0; i < b.N; i++ {
		m, err := onnx.ImportFile(modelPath("resnet50"), onnx.Options{Batch: 8})
		if err != nil {
			b.Fatal(err)
		}
		run(b, m, "autodiff,optimizer{kind=sgd,lr=0.01},canonicalize,dce,cse,fuse,reorder,assign")
		f := m.Funcs[0]
		p, err := llvm.Lower(f)
		if err != nil {
			b.Fatal(err)
		}
		var seconds float64
		var rss, binary int64
		if _, _, err := llvm.Run(p, interp.RandomArgs(f, 1), llvm.RunOptions{Repeat: 1, Seconds: &seconds, MaxRSS: &rss, Binary: &binary}); err != nil {
			b.Fatal(err)
		}
		planned := memreport.Build(f, nil, costmodel.Default).PlannedBytes
		b.ReportMetric(seconds, "step-s")
		b.ReportMetric(float64(planned)/(1<<20), "planned-MiB")
		b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")
		b.ReportMetric(float64(rss)/float64(planned+binary), "rss/(planned+binary)")
	}
}
