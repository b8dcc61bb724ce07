// Command gpucheck prepares the one-shot device check (scripts/gpu_check.sh
// prepare DIR runs it): on this machine, which has Go and no GPU, it writes
// into DIR everything the GPU machine, which has nvcc and PyTorch and no
// Go, needs to check Kiln's CUDA programs there:
//
//   - correctness cases: the forward pass and training step of a CNN and
//     of a transformer (and, without -small, GPT-2's CI step), each a
//     CUDA program (NAME/, kiln compile --target cuda
//     --emit exe), its arguments (NAME/in/*.npy), the interpreter's
//     results and updated arguments (NAME/ref/*.npy) and, per output, the
//     bound of the f32 error model (passtest.F32Bound and F32Resolution,
//     plus cpuFactor times the distance of the CPU program of the same
//     step);
//   - timing cases (without -small): ResNet-50 at batch 32 and the
//     GPT-2-small-shaped step (batch 8, 512 tokens), strict f32 and bf16,
//     as programs without weights (their driver's --seed fills them);
//     scripts/models.py builds the same models in PyTorch there;
//   - manifest.json, which scripts/gpu_check_run.py reads.
//
// It refuses to leave more than 60 MiB in DIR.
//
//	go run ./scripts/gpucheck prepare DIR [-small] [-kiln PATH]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/fuse"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	_ "github.com/kiln-compiler/kiln/passes/reorder"
	"github.com/kiln-compiler/kiln/passtest"
)

// MaxBytes is the most the prepared folder may hold.
const MaxBytes = 60 << 20

// cpuFactor scales the CPU program's distance from the interpreter in a
// bound. F32Bound is relative to the sums' magnitudes, which a step whose
// gradients cancel makes far larger than the result; the CPU program's
// distance measures that step's sensitivity to f32 evaluation, and cuBLAS
// (split-K, tensor-core tiles) and atomics sum in orders farther from the
// interpreter's than the CPU program's sequential ones, but within a
// small factor of the same error: 4.
const cpuFactor = 4

// Output is one file a correctness case checks: a result, or an updated
// argument whose update (updated − initial) is compared.
type Output struct {
	File    string  `json:"file"`              // under out/ and ref/
	Initial string  `json:"initial,omitempty"` // under in/, for an update
	Bound   float64 `json:"bound"`             // the largest relative (normwise) error allowed
}

// Correctness is a program checked against the interpreter.
type Correctness struct {
	Name     string   `json:"name"`
	Model    string   `json:"model"`
	Pipeline string   `json:"pipeline"`
	Outputs  []Output `json:"outputs"`
}

// Timing is a program timed against PyTorch eager on the same model.
type Timing struct {
	Name      string `json:"name"`
	Torch     string `json:"torch"` // the scripts/models.py ZOO entry
	Batch     int    `json:"batch"`
	Precision string `json:"precision"` // "f32" (TF32 off on both sides) or "bf16" (PyTorch: autocast)
}

// Manifest is DIR/manifest.json.
type Manifest struct {
	Prepared    string        `json:"prepared"`
	Correctness []Correctness `json:"correctness"`
	Timing      []Timing      `json:"timing"`
}

func main() {
	if len(os.Args) < 3 || os.Args[1] != "prepare" {
		fmt.Fprintln(os.Stderr, "usage: gpucheck prepare DIR [-small] [-kiln PATH]")
		os.Exit(2)
	}
	dir := os.Args[2]
	fs := flag.NewFlagSet("prepare", flag.ContinueOnError)
	small := fs.Bool("small", false, "the CNN and transformer cases only (no CI-size ResNet-50 and GPT-2, no timing)")
	kiln := fs.String("kiln", "", "the kiln binary that compiles the timing programs (default: go run ./cmd/kiln)")
	if err := fs.Parse(os.Args[3:]); err != nil {
		os.Exit(2)
	}
	if err := prepare(dir, *small, *kiln); err != nil {
		fmt.Fprintf(os.Stderr, "gpucheck: %v\n", err)
		os.Exit(1)
	}
}

func prepare(dir string, small bool, kiln string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	const (
		cnn  = "testdata/models/small_cnn/model.onnx"
		tfm  = "testdata/models/one_layer_transformer/model.onnx"
		step = "autodiff,optimizer{kind=momentum,lr=0.01},fuse,reorder,assign"
	)
	cases := []Correctness{
		{Name: "cnn_forward", Model: cnn, Pipeline: "fuse,reorder,assign"},
		{Name: "cnn_step", Model: cnn, Pipeline: step},
		{Name: "transformer_forward", Model: tfm, Pipeline: "fuse,reorder,assign"},
		{Name: "transformer_step", Model: tfm, Pipeline: step},
	}
	if !small {
		// GPT-2's CI step (causal attention, GELU, dropout); ResNet-50's CI
		// step would not fit: its weights, momenta and references are 400 MB.
		cases = append(cases, Correctness{Name: "gpt2_small_ci_step", Model: "testdata/models/ci/gpt2_small_ci.onnx", Pipeline: step})
	}
	man := Manifest{Prepared: time.Now().UTC().Format(time.RFC3339), Correctness: []Correctness{}, Timing: []Timing{}}
	for _, c := range cases {
		if err := correctness(filepath.Join(dir, c.Name), &c); err != nil {
			return fmt.Errorf("%s: %v", c.Name, err)
		}
		man.Correctness = append(man.Correctness, c)
	}
	if !small {
		for _, tc := range []struct {
			model string
			t     Timing
		}{
			{"testdata/models/resnet50.onnx", Timing{Name: "resnet50_f32", Torch: "resnet50", Batch: 32, Precision: "f32"}},
			{"testdata/models/resnet50.onnx", Timing{Name: "resnet50_bf16", Torch: "resnet50", Batch: 32, Precision: "bf16"}},
			{"testdata/models/gpt2_small.onnx", Timing{Name: "gpt2_small_f32", Torch: "gpt2_small", Batch: 8, Precision: "f32"}},
			{"testdata/models/gpt2_small.onnx", Timing{Name: "gpt2_small_bf16", Torch: "gpt2_small", Batch: 8, Precision: "bf16"}},
		} {
			args := []string{"compile", tc.model, "--train", "--optimizer", "sgd", "--target", "cuda", "--emit", "exe", "-o", filepath.Join(dir, tc.t.Name)}
			if tc.t.Precision == "bf16" {
				args = append(args, "--precision", "bf16")
			}
			cmd := exec.Command("go", append([]string{"run", "./cmd/kiln"}, args...)...)
			if kiln != "" {
				cmd = exec.Command(kiln, args...)
			}
			if msg, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%s: kiln %v: %v\n%s", tc.t.Name, args, err, msg)
			}
			man.Timing = append(man.Timing, tc.t)
		}
	}
	js, err := json.MarshalIndent(man, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	total := int64(0)
	err = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			total += info.Size()
		}
		return err
	})
	if err != nil {
		return err
	}
	if total > MaxBytes {
		return fmt.Errorf("%s holds %d bytes, above the %d the device check may carry", dir, total, MaxBytes)
	}
	fmt.Printf("prepared %s: %d correctness cases, %d timing cases, %.1f MiB\n", dir, len(man.Correctness), len(man.Timing), float64(total)/(1<<20))
	return nil
}

// correctness writes c's program, arguments and references into dir and
// fills in its outputs.
func correctness(dir string, c *Correctness) error {
	m, err := onnx.ImportFile(c.Model, onnx.Options{})
	if err != nil {
		return err
	}
	if err := passtest.RunErr(m, c.Pipeline); err != nil {
		return err
	}
	f := m.Funcs[0]
	out, err := cuda.Lower(f, costmodel.Default)
	if err != nil {
		return err
	}
	files, err := out.Executable(0)
	if err != nil {
		return err
	}
	if err := cuda.Write(dir, out, m, files, nil); err != nil {
		return err
	}
	// The model's own weights where it has them, random values elsewhere.
	args := interp.RandomArgs(f, 5)
	for i, a := range f.Args {
		if a.Arg.Init != nil && a.Arg.Init.Type.Equal(a.Type) {
			args[i] = interp.FromDense(a.Arg.Init)
		}
	}
	want, wantArgs, err := interp.RunWithUpdates(f, interp.CloneAll(args), interp.Options{})
	if err != nil {
		return err
	}
	p, err := llvm.Lower(f)
	if err != nil {
		return err
	}
	cpu, cpuArgs, err := llvm.Run(p, interp.CloneAll(args))
	if err != nil {
		return err
	}
	for i, a := range f.Args {
		if err := writeNpy(filepath.Join(dir, "in", llvm.FileName(a.Name)+".npy"), args[i]); err != nil {
			return err
		}
	}
	acc := passtest.F32Bound(f)
	for i := range f.Results {
		if d := f.Results[i].Value.Type.DType; d != ir.F32 {
			return fmt.Errorf("result %s is %s: the device check compares f32 results", f.ResultName(i), d)
		}
		file := llvm.FileName(f.ResultName(i)) + ".npy"
		if err := writeNpy(filepath.Join(dir, "ref", file), want[i]); err != nil {
			return err
		}
		c.Outputs = append(c.Outputs, Output{File: file, Bound: passtest.OrderBound(0) + acc + cpuFactor*passtest.RelErr(cpu[i], want[i])})
	}
	for i, a := range f.Args {
		if !a.Arg.InOut {
			continue
		}
		file := llvm.FileName("updated."+a.Name) + ".npy"
		if err := writeNpy(filepath.Join(dir, "ref", file), wantArgs[i]); err != nil {
			return err
		}
		bound := passtest.OrderBound(0) + acc + passtest.F32Resolution(wantArgs[i], args[i]) + cpuFactor*passtest.UpdateErr(cpuArgs[i], wantArgs[i], args[i])
		c.Outputs = append(c.Outputs, Output{File: file, Initial: llvm.FileName(a.Name) + ".npy", Bound: bound})
	}
	return nil
}

func writeNpy(path string, t *interp.Tensor) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	w, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := npy.Write(w, t); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}
