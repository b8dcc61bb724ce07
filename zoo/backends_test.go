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
	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
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
				p, err := loops.Lower(f)
				if err != nil {
					b.Fatal(err)
				}
				var compiled float64
				if _, _, err := llvm.Run(p, args, llvm.RunOptions{Repeat: 5, Seconds: &compiled}); err != nil {
					b.Fatal(err)
				}
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
