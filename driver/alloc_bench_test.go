package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-compiler/kiln/alloc"
)

// BenchmarkPublishedAllocation packs the published static-allocation
// benchmarks (MiniMalloc's A to K, ASPLOS 2023: id,lower,upper,size CSV
// files named NAME.CAPACITY.csv) into their capacity, as kiln alloc
// --capacity does, and checks each packing. The files are not in this
// repository; point KILN_ALLOC_BENCHMARKS at a folder holding them (for
// example benchmarks/challenging of github.com/google/minimalloc):
//
//	KILN_ALLOC_BENCHMARKS=DIR go test ./driver -run '^$' -bench Published -benchtime 1x
func BenchmarkPublishedAllocation(b *testing.B) {
	dir := os.Getenv("KILN_ALLOC_BENCHMARKS")
	if dir == "" {
		b.Skip("KILN_ALLOC_BENCHMARKS is not set")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.csv"))
	if len(files) == 0 {
		b.Fatalf("no .csv files in %s", dir)
	}
	for i := 0; i < b.N; i++ {
		solved := 0
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				b.Fatal(err)
			}
			p, _, _, err := readAllocCSV(file, data)
			if err != nil {
				b.Fatal(err)
			}
			base := strings.TrimSuffix(filepath.Base(file), ".csv")
			capacity := alloc.MaxLive(p)
			if dot := strings.LastIndexByte(base, '.'); dot >= 0 {
				if c, err := strconv.ParseInt(base[dot+1:], 10, 64); err == nil {
					capacity = c
				}
			}
			start := time.Now()
			sol := alloc.Search(p, alloc.SearchOptions{Capacity: capacity, Timeout: time.Minute})
			took := time.Since(start)
			if sol.Size > 0 {
				if err := alloc.Check(p, sol, capacity); err != nil {
					b.Fatalf("%s: %v", base, err)
				}
				solved++
			}
			fmt.Printf("%s: %d buffers, capacity %d (max-live %d): %s in %.2fs\n", base, len(p.Buffers), capacity, alloc.MaxLive(p),
				map[bool]string{true: "packed", false: "NOT packed"}[sol.Size > 0], took.Seconds())
		}
		fmt.Printf("%d of %d packed within capacity\n", solved, len(files))
	}
}
