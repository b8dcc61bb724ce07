package driver

import (
	"testing"

	"github.com/kiln-compiler/kiln/alloc"
)

// FuzzAllocCSV: no CSV makes reading it panic, and every problem it reads
// is solved by the allocators into a packing the checker accepts.
func FuzzAllocCSV(f *testing.F) {
	f.Add([]byte("id,lower,upper,size\n1,0,3,10\n2,1,4,20\n"))
	f.Add([]byte("size,upper,lower,id\n8,9,0,a\n"))
	f.Add([]byte("id,lower,upper,size\n1,0,9223372036854775807,9223372036854775807\n2,0,1,1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, _, _, err := readAllocCSV("in.csv", data)
		if err != nil || len(p.Buffers) > 500 {
			return
		}
		for name, s := range map[string]*alloc.Solution{
			"time-order": alloc.TimeOrdered(p), "best-fit": alloc.GreedyBestFit(p), "coloring": alloc.Coloring(p),
		} {
			if err := alloc.Check(p, s, 0); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	})
}
