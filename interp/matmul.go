package interp

import (
	goruntime "runtime"
	"sync"
)

// Block sizes of the matrix product: a panel of kBlock rows of B and
// nBlock columns stays in cache while every row of A streams past it.
const (
	kBlock = 128
	nBlock = 512
)

// matmulInto computes C[m×n] (+)= A[m×k] · B[k×n], all row-major. With
// accumulate false, C is overwritten.
func matmulInto(c, a, b []float64, m, n, k int, accumulate bool) {
	if !accumulate {
		clear(c[:m*n])
	}
	parallelRows(m, 2*n*k, func(lo, hi int) {
		for j0 := 0; j0 < n; j0 += nBlock {
			j1 := min(j0+nBlock, n)
			for p0 := 0; p0 < k; p0 += kBlock {
				p1 := min(p0+kBlock, k)
				for i := lo; i < hi; i++ {
					ci := c[i*n+j0 : i*n+j1]
					ai := a[i*k : i*k+k]
					for p := p0; p < p1; p++ {
						av := ai[p]
						if av == 0 {
							continue
						}
						bp := b[p*n+j0 : p*n+j1]
						for j := range ci {
							ci[j] += av * bp[j]
						}
					}
				}
			}
		}
	})
}

// transposeInto writes the transpose of a[rows×cols] into t[cols×rows].
func transposeInto(t, a []float64, rows, cols int) {
	const blk = 32
	for i0 := 0; i0 < rows; i0 += blk {
		for j0 := 0; j0 < cols; j0 += blk {
			for i := i0; i < min(i0+blk, rows); i++ {
				for j := j0; j < min(j0+blk, cols); j++ {
					t[j*rows+i] = a[i*cols+j]
				}
			}
		}
	}
}

// parallelRows splits [0, rows) into chunks run on all cores when the
// work (flops per row times rows) is large enough to pay for it.
func parallelRows(rows int, flopsPerRow int, fn func(lo, hi int)) {
	workers := goruntime.GOMAXPROCS(0)
	if workers < 2 || rows < 2 || rows*flopsPerRow < 1<<18 {
		fn(0, rows)
		return
	}
	chunk := (rows + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < rows; lo += chunk {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, min(lo+chunk, rows))
	}
	wg.Wait()
}

// parallelFor runs fn(i) for i in [0, n) on all cores.
func parallelFor(n int, fn func(i int)) {
	workers := min(goruntime.GOMAXPROCS(0), n)
	if workers < 2 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
