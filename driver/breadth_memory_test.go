package driver

import (
	"encoding/json"
	"fmt"
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
// model). Run with -benchtime 1x; the table goes to the log (-v).
func BenchmarkBreadthMemory(b *testing.B) {
	dirs, _ := filepath.Glob("../testdata/models/breadth/*/torch_memory.json")
	if len(dirs) == 0 {
		b.Skip("no torch_memory.json: run scripts/torch_memory.py")
	}
	sort.Strings(dirs)
	var rows []string
	worst := 0.0
	for _, path := range dirs {
		dir := filepath.Dir(path)
		var torch struct{ Params, Input, Default, Mincut int64 }
		raw, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(raw, &torch); err != nil {
			b.Fatal(err)
		}
		var kiln struct {
			Planned int64 `json:"planned_bytes"`
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
		best := min(torch.Default, torch.Mincut)
		ratio := float64(kiln.Planned) / float64(best)
		worst = max(worst, ratio)
		rows = append(rows, fmt.Sprintf("%-26s %10d %10d %10d %6.3f", filepath.Base(dir), kiln.Planned, torch.Default, torch.Mincut, ratio))
	}
	b.ReportMetric(worst, "worst-ratio")
	b.Logf("\n%-26s %10s %10s %10s %6s\n%s", "model", "kiln", "aot-dflt", "aot-mincut", "ratio", strings.Join(rows, "\n"))
}
