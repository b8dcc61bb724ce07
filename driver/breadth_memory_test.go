package driver

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// BenchmarkBreadthMemory reports, for each breadth-zoo model's training
// step (--train=sum -O2: the default plan; loss = sum of the output), Kiln's
// planned bytes beside PyTorch's best: the lower of AOTAutograd's default
// and min-cut partitions, replayed with every tensor freed after its last
// use (scripts/torch_memory.py writes torch_memory.json beside each
// model). Two comparisons: planned bytes (Kiln's 64-byte aligned arena)
// against PyTorch's peak with every storage rounded to 512 bytes, as its
// caching allocator rounds each block ("ratio"); and Kiln's peak, an exact
// byte sum, against PyTorch's exact byte sum ("exact"), a best case no
// allocator reaches. Run with -benchtime 1x -v; the table goes to the log.
func BenchmarkBreadthMemory(b *testing.B) {
	compareWithTorch(b, "../testdata/models/breadth", "scripts/torch_memory.py")
}

// BenchmarkTorchvisionMemory is BenchmarkBreadthMemory on torchvision
// classifiers at batch 32 and 224x224 (scripts/torchvision_memory.py),
// the kind of step issue 24 measured on held-back models.
func BenchmarkTorchvisionMemory(b *testing.B) {
	compareWithTorch(b, "../testdata/models/torchvision", "scripts/torchvision_memory.py")
}

// compareWithTorch reports, for each DIR/NAME holding model.onnx and the
// torch_memory.json that script wrote, Kiln's default training-step plan
// against PyTorch's best, and the worst and geometric-mean ratios.
func compareWithTorch(b *testing.B, root, script string) {
	dirs, _ := filepath.Glob(root + "/*/torch_memory.json")
	if len(dirs) == 0 {
		b.Skip("no torch_memory.json: run " + script)
	}
	sort.Strings(dirs)
	var rows []string
	worst, worstExact, logSum, logSumExact := 0.0, 0.0, 0.0, 0.0
	for _, path := range dirs {
		dir := filepath.Dir(path)
		var torch struct {
			Params, Input, Default, Mincut int64
			Default512                     int64 `json:"default_512"`
			Mincut512                      int64 `json:"mincut_512"`
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(raw, &torch); err != nil {
			b.Fatal(err)
		}
		var kiln struct {
			Planned int64 `json:"planned_bytes"`
			Peak    int64 `json:"peak_bytes"`
		}
		args := []string{"mem", filepath.Join(dir, "model.onnx"), "--train=sum", "-O2", "--json"}
		if strings.HasSuffix(dir, "_dynamic") {
			args = append(args, "--batch", "3")
		}
		var out strings.Builder
		var errb strings.Builder
		for i := 0; i < b.N; i++ {
			out.Reset()
			if code := Main(args, strings.NewReader(""), &out, &errb); code != 0 {
				b.Fatalf("%s: %s", dir, errb.String())
			}
		}
		if err := json.Unmarshal([]byte(out.String()), &kiln); err != nil {
			b.Fatal(err)
		}
		best, best512 := min(torch.Default, torch.Mincut), min(torch.Default512, torch.Mincut512)
		ratio, exact := float64(kiln.Planned)/float64(best512), float64(kiln.Peak)/float64(best)
		worst, worstExact = max(worst, ratio), max(worstExact, exact)
		logSum, logSumExact = logSum+math.Log(ratio), logSumExact+math.Log(exact)
		rows = append(rows, fmt.Sprintf("%-26s %10d %10d %6.3f %10d %10d %6.3f", filepath.Base(dir), kiln.Planned, best512, ratio, kiln.Peak, best, exact))
	}
	n := float64(len(rows))
	b.ReportMetric(worst, "worst-ratio")
	b.ReportMetric(math.Exp(logSum/n), "geomean-ratio")
	b.ReportMetric(worstExact, "worst-exact")
	b.ReportMetric(math.Exp(logSumExact/n), "geomean-exact")
	b.Logf("\n%-26s %10s %10s %6s %10s %10s %6s\n%s", "model", "planned", "torch-512", "ratio", "peak", "torch", "exact", strings.Join(rows, "\n"))
}
