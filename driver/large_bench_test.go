package driver

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/outfile"
)

// largeForward writes a residual chain of layers (matmul, tanh, add,
// square: four ops a layer) and returns its path.
func largeForward(b *testing.B, dir string, layers int) string {
	var s strings.Builder
	s.WriteString("func @big(%x: f32[4,8]")
	for i := 0; i < layers; i++ {
		fmt.Fprintf(&s, ", %%w%d: f32[8,8] {param}", i)
	}
	s.WriteString(") -> (f32[4,8]) {\n")
	prev := "%x"
	for i := 0; i < layers; i++ {
		fmt.Fprintf(&s, "  %%m%d = matmul(%s, %%w%d) : f32[4,8]\n  %%t%d = tanh(%%m%d) : f32[4,8]\n", i, prev, i, i, i)
		fmt.Fprintf(&s, "  %%r%d = add(%%t%d, %s) : f32[4,8]\n  %%s%d = mul(%%r%d, %%r%d) : f32[4,8]\n", i, i, prev, i, i, i)
		prev = fmt.Sprintf("%%s%d", i)
	}
	fmt.Fprintf(&s, "  return %s\n}\n", prev)
	path := filepath.Join(dir, "fwd.kir")
	if err := os.WriteFile(path, []byte(s.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkLargeStep times every command on a training step of about
// 100k ops (8,300 layers: 33k forward ops, their gradients and the
// optimizer): each must finish in seconds. Run with -benchtime 1x.
func BenchmarkLargeStep(b *testing.B) {
	dir := b.TempDir()
	fwd := largeForward(b, dir, 8300)
	step := filepath.Join(dir, "step.kir")
	if _, stderr, code := runKiln("opt", fwd, "--passes", "autodiff,optimizer", "-o", step); code != 0 {
		b.Fatal(stderr)
	}
	grads := filepath.Join(dir, "grads.kir") // precision runs before the optimizer
	if _, stderr, code := runKiln("opt", fwd, "--passes", "autodiff", "-o", grads); code != 0 {
		b.Fatal(stderr)
	}
	csv := filepath.Join(dir, "buffers.csv")
	var rows strings.Builder
	rows.WriteString("id,lower,upper,size\n")
	for i := 0; i < 100_000; i++ {
		fmt.Fprintf(&rows, "%d,%d,%d,%d\n", i, i, i+1+(i*7919)%50, 64*(1+(i*104729)%16))
	}
	if err := os.WriteFile(csv, []byte(rows.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		// mayFail: a clean error (exit 1) is an acceptable outcome; only
		// its time is measured. swap cannot reach 0.9 of this chain's
		// peak within its work budget and says so.
		mayFail bool
	}{
		{"parse-verify", []string{"opt", step}, false},
		{"autodiff", []string{"opt", fwd, "--passes", "autodiff"}, false},
		{"dce-cse-canonicalize", []string{"opt", step, "--passes", "dce,cse,canonicalize"}, false},
		{"fuse", []string{"opt", step, "--passes", "fuse"}, false},
		{"reorder", []string{"opt", step, "--passes", "reorder"}, false},
		{"remat", []string{"opt", step, "--passes", "remat{budget=0.9}"}, false},
		{"saveset", []string{"opt", step, "--passes", "saveset"}, false},
		{"swap", []string{"opt", step, "--passes", "swap{device-budget=0.9}"}, true},
		{"precision", []string{"opt", grads, "--passes", "precision"}, false},
		{"assign", []string{"opt", step, "--passes", "assign"}, false},
		{"mem", []string{"mem", step}, false},
		{"compile-llvm", []string{"compile", step, "--target", "llvm", "--passes", "fuse,assign", "-o", filepath.Join(dir, "step.ll")}, false},
		{"compile-cuda", []string{"compile", step, "--target", "cuda", "--passes", "fuse,assign", "-o", filepath.Join(dir, "plan")}, false},
		{"alloc-100k", []string{"alloc", "--capacity", "0", csv, "-o", filepath.Join(dir, "out.csv")}, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if _, stderr, code := runKiln(c.args...); code != 0 && !(c.mayFail && code == 1) {
					b.Fatalf("exit %d: %s", code, stderr)
				}
				b.ReportMetric(time.Since(start).Seconds(), "s/run")
			}
		})
	}
}

func runKiln(args ...string) (string, string, int) {
	var errb strings.Builder
	code := Main(args, strings.NewReader(""), io.Discard, &errb)
	return "", errb.String(), code
}

// BenchmarkPassesOnResNet50WithWeights times dce,cse,reorder on ResNet-50
// exported with its weights (scripts/export_resnet50_weights.py, the path
// in $KILN_RESNET50_WEIGHTS): reading the model, the pipeline as kiln opt
// runs it (verified after each pass, nothing printed) and printing it are
// reported apart, in seconds. The pipeline's share must stay under 1 s.
// Run with -benchtime 1x.
func BenchmarkPassesOnResNet50WithWeights(b *testing.B) {
	path := os.Getenv("KILN_RESNET50_WEIGHTS")
	if path == "" {
		b.Skip("set KILN_RESNET50_WEIGHTS to ResNet-50 exported with its weights (scripts/export_resnet50_weights.py)")
	}
	e := &env{stdout: io.Discard, stderr: io.Discard, stdin: strings.NewReader(""), files: &outfile.Guard{}}
	for i := 0; i < b.N; i++ {
		start := time.Now()
		in, err := readModule(e, path, onnx.Options{})
		if err != nil {
			b.Fatal(err)
		}
		read := time.Since(start)
		start = time.Now()
		pf := pipelineFlags{passes: "dce,cse,reorder", verifyEach: true, timingFormat: "text"}
		req, err := pf.request()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pf.plan(e, in, req); err != nil {
			b.Fatal(err)
		}
		passes := time.Since(start)
		start = time.Now()
		_ = in.module.String()
		printed := time.Since(start)
		b.ReportMetric(read.Seconds(), "read-s")
		b.ReportMetric(passes.Seconds(), "passes-s")
		b.ReportMetric(printed.Seconds(), "print-s")
		if passes > time.Second {
			b.Errorf("dce,cse,reorder took %v beyond reading and printing (at most 1 s)", passes)
		}
	}
}
