package llvm

import (
	"github.com/kiln-compiler/kiln/codegen/loops"
	kir "github.com/kiln-compiler/kiln/ir"
	"github.com/llir/llvm/ir"
	"github.com/llir/llvm/ir/constant"
	"github.com/llir/llvm/ir/enum"
	"github.com/llir/llvm/ir/types"
	"github.com/llir/llvm/ir/value"
)

// The f32 matmul kernel packs a panel of B (all K rows, pb columns or the
// product's columns in whole tiles when fewer, zero padded) into
// contiguous workspace, then computes tiles of mrv rows by
// nr columns with the accumulators in vector registers: per k, two
// vector loads of the panel, mrv broadcasts of A and 2·mrv fused
// multiply-adds. Any B expression (transposed, strided, im2col) is
// read once per panel by the packing loop.
const (
	mrv = 8      // rows of a tile
	vw  = 16     // lanes of a vector (one AVX-512 register, two AVX2 ones)
	nr  = 2 * vw // columns of a tile
	pb  = 4 * nr // columns of a packed panel
)

var (
	vecT   = types.NewVector(vw, types.Float)
	vecPtr = types.NewPointer(vecT)
)

// smallMatmul is the multiply-adds below which an f32 matmul runs as the
// plain loop nest of matmul.go: packing a panel and a register tile of
// mrv x nr cost more than they save there, and the microkernel's code
// (about 800 lines of LLVM IR per stage) would dominate a program of
// many small products.
const smallMatmul = 16384

// kc is the rows of B packed at a time when a product's K is longer (a
// weight gradient's K is every output position of an image, thousands):
// a panel block of kc x pb floats (256 KiB) stays in L2 while every row
// block of A runs over it, the tiles' accumulators kept between blocks in
// a buffer of the product's rows by the panel's width (accumulatorBytes at
// most; longer products pack the whole K as before).
const (
	kc               = 512
	accumulatorBytes = 1 << 20
)

// kBlocked reports whether a packed matmul stage packs B kc rows at a
// time, keeping its accumulators in a buffer between blocks.
func kBlocked(s *loops.Stage) bool {
	return s.Matmul.Extent > kc && accBufBytes(s) <= accumulatorBytes
}

// accBufBytes is the accumulator buffer of a K-blocked stage: its rows
// rounded up to whole tiles, by the panel's width.
func accBufBytes(s *loops.Stage) int64 {
	return (s.Extents[0] + mrv - 1) / mrv * mrv * panelWidth(s.Extents[1]) * 4
}

// packedRows is the rows of B a stage's panel holds: all of K, or kc.
func packedRows(s *loops.Stage) int64 {
	if kBlocked(s) {
		return kc
	}
	return s.Matmul.Extent
}

// threadPanelBytes is one thread's share of a packed stage's workspace:
// its panel and, K-blocked, its accumulator buffer after it.
func threadPanelBytes(s *loops.Stage) int64 {
	n := alignUp(packedRows(s)*panelWidth(s.Extents[1])*4, wsAlign)
	if kBlocked(s) {
		n += alignUp(accBufBytes(s), wsAlign)
	}
	return n
}

// packed reports whether a matmul stage runs on the packed f32
// microkernel.
func packed(s *loops.Stage) bool {
	return s.Matmul.A.Kind() == loops.F32 && s.Extents[0]*s.Extents[1]*s.Matmul.Extent >= smallMatmul
}

// im2colBytes bounds the im2col of a convolution's product over several
// images (loops.Options.Im2colBytes): ResNet-18's 14² and 7² convolutions
// at batch 16 run 1.3-1.8x faster over 4 and 8 images than one image at
// a time, their products 196 and 49 columns wide.
const im2colBytes = 8 << 20

// Lower lowers f, whose values carry arena offsets, for this backend.
func Lower(f *kir.Func) (*loops.Program, error) {
	return loops.LowerWith(f, loops.Options{Im2colBytes: im2colBytes, TransposeNarrowWeightGrads: true})
}

// panelWidth is the columns of a packed panel for a matmul of n columns:
// pb, or n rounded up to whole tiles when that is less.
func panelWidth(n int64) int64 {
	if n >= pb {
		return pb
	}
	return (n + nr - 1) / nr * nr
}

// matmulChunks says how a matmul stage splits across threads: by panels
// of columns when there are enough of them (each thread packs only its
// own), otherwise by blocks of rows of each panel, packed once and shared;
// n is the number of chunks.
func matmulChunks(s *loops.Stage) (byColumns bool, n int64) {
	if !packed(s) {
		return false, (s.Extents[0] + mr - 1) / mr
	}
	w := panelWidth(s.Extents[1])
	if panels := (s.Extents[1] + w - 1) / w; panels >= 4 {
		return true, panels
	}
	return false, (s.Extents[0] + mrv - 1) / mrv
}

// matmulF32 emits the stage for the chunks [lo, hi) of matmulChunks (all
// of them when lo is nil) on this thread's panel.
func (e *fn) matmulF32(s *loops.Stage, lo, hi value.Value) {
	M, N := s.Extents[0], s.Extents[1]
	w := panelWidth(N)
	byColumns, chunks := matmulChunks(s)
	if lo == nil {
		lo, hi = i64(0), i64(chunks)
	}
	panelLo, panelHi, rowLo, rowHi := value.Value(i64(0)), value.Value(i64((N+w-1)/w)), lo, hi
	if byColumns {
		panelLo, panelHi, rowLo, rowHi = lo, hi, i64(0), i64((M+mrv-1)/mrv)
	}
	panel := e.panel()
	e.loopFrom(panelLo, panelHi, func(jb value.Value) {
		if !kBlocked(s) {
			j0, jn := e.packPanel(s, panel, jb, i64(0), i64(s.Matmul.Extent))
			e.panelTiles(s, panel, nil, j0, jn, rowLo, rowHi, i64(0), i64(s.Matmul.Extent))
			return
		}
		acc := e.accBuf(s, panel)
		e.zeroAccRows(s, acc, rowLo, rowHi)
		j0, jn := e.panelColumns(s, jb)
		e.kBlocks(s, func(k0, kn value.Value) {
			e.packPanel(s, panel, jb, k0, kn)
			e.panelTiles(s, panel, acc, j0, jn, rowLo, rowHi, k0, kn)
		})
		e.storeAccRows(s, acc, j0, jn, rowLo, rowHi)
	})
}

// kBlocks runs body for each block [k0, k0+kn) of kc rows of K.
func (e *fn) kBlocks(s *loops.Stage, body func(k0, kn value.Value)) {
	K := s.Matmul.Extent
	e.loop(i64((K+kc-1)/kc), func(kb value.Value) {
		k0 := e.cur.NewMul(kb, i64(kc))
		rem := e.cur.NewSub(i64(K), k0)
		body(k0, e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, rem, i64(kc)), rem, i64(kc)))
	})
}

// accBuf is the accumulator buffer after a thread's panel.
func (e *fn) accBuf(s *loops.Stage, panel value.Value) value.Value {
	return e.cur.NewGetElementPtr(types.Float, panel, i64(alignUp(packedRows(s)*panelWidth(s.Extents[1])*4, wsAlign)/4))
}

// zeroAccRows clears the accumulators of row blocks [rowLo, rowHi).
func (e *fn) zeroAccRows(s *loops.Stage, acc, rowLo, rowHi value.Value) {
	w := panelWidth(s.Extents[1])
	start := e.cur.NewMul(rowLo, i64(mrv*w))
	e.loop(e.cur.NewMul(e.cur.NewSub(rowHi, rowLo), i64(mrv*w)), func(i value.Value) {
		e.cur.NewStore(constant.NewFloat(types.Float, 0), e.cur.NewGetElementPtr(types.Float, acc, e.cur.NewAdd(start, i)))
	})
}

// storeAccRows stores the accumulated row blocks [rowLo, rowHi) of the
// panel holding columns [j0, j0+jn) through the epilogue.
func (e *fn) storeAccRows(s *loops.Stage, acc, j0, jn, rowLo, rowHi value.Value) {
	w := panelWidth(s.Extents[1])
	e.loopFrom(rowLo, rowHi, func(ib value.Value) {
		m0 := e.cur.NewMul(ib, i64(mrv))
		for r := 0; r < mrv; r++ {
			row := e.cur.NewMul(e.cur.NewAdd(m0, i64(int64(r))), i64(w))
			e.storeRow(s, m0, r, j0, jn, func(j value.Value) value.Value {
				return e.cur.NewLoad(types.Float, e.cur.NewGetElementPtr(types.Float, acc, e.cur.NewAdd(row, j)))
			})
		}
	})
}

// panelColumns is the first column of panel jb and how many it holds.
func (e *fn) panelColumns(s *loops.Stage, jb value.Value) (j0, jn value.Value) {
	N, w := s.Extents[1], panelWidth(s.Extents[1])
	j0 = e.cur.NewMul(jb, i64(w))
	rem := e.cur.NewSub(i64(N), j0)
	return j0, e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, rem, i64(w)), rem, i64(w))
}

// packPanel packs rows [k0, k0+kn) of panel jb of B: panel[k][j] =
// B(k0 + k, j0 + j) for j < jn, zero up to the panel's width. It returns
// j0 and jn.
func (e *fn) packPanel(s *loops.Stage, panel, jb, k0, kn value.Value) (j0, jn value.Value) {
	mm := s.Matmul
	w := panelWidth(s.Extents[1])
	nv := s.Vars[1]
	j0, jn = e.panelColumns(s, jb)
	e.loop(kn, func(kv value.Value) {
		e.bound[mm.K] = e.cur.NewAdd(k0, kv)
		row := e.cur.NewMul(kv, i64(w))
		e.loop(jn, func(j value.Value) {
			e.bound[nv] = e.cur.NewAdd(j0, j)
			v := e.convert(e.expr(mm.B), mm.B.Kind(), loops.F32)
			e.cur.NewStore(v, e.cur.NewGetElementPtr(types.Float, panel, e.cur.NewAdd(row, j)))
		})
		e.loopFrom(jn, i64(w), func(j value.Value) {
			e.cur.NewStore(constant.NewFloat(types.Float, 0), e.cur.NewGetElementPtr(types.Float, panel, e.cur.NewAdd(row, j)))
		})
	})
	return j0, jn
}

// panelTiles computes the row blocks [rowLo, rowHi) of mrv rows against
// a packed panel holding rows [k0, k0+kn) of K and columns [j0, j0+jn):
// through the epilogue, or, with acc (a K-blocked stage), adding to the
// accumulators kept there.
func (e *fn) panelTiles(s *loops.Stage, panel, acc, j0, jn, rowLo, rowHi, k0, kn value.Value) {
	mm := s.Matmul
	M, w := s.Extents[0], panelWidth(s.Extents[1])
	mv := s.Vars[0]
	fma := e.md.declare("llvm.fmuladd.v16f32", vecT, vecT, vecT, vecT)
	tileT := types.NewArray(mrv*nr, types.Float)
	tile := e.entry.NewAlloca(tileT)
	tile.Align = 64
	accs := make([]*ir.InstAlloca, 2*mrv)
	for i := range accs {
		accs[i] = e.entry.NewAlloca(vecT)
		accs[i].Align = 64
	}
	tiles := e.cur.NewSDiv(e.cur.NewAdd(jn, i64(nr-1)), i64(nr))
	e.loopFrom(rowLo, rowHi, func(ib value.Value) {
		m0 := e.cur.NewMul(ib, i64(mrv))
		rows := make([]value.Value, mrv)
		for r := range rows {
			m := e.cur.NewAdd(m0, i64(int64(r)))
			rows[r] = e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, m, i64(M)), m, i64(M-1))
		}
		e.loop(tiles, func(jt value.Value) {
			zero := constant.NewZeroInitializer(vecT)
			for _, a := range accs {
				e.cur.NewStore(zero, a)
			}
			c0 := e.cur.NewMul(jt, i64(nr))
			// accAt is where row r's accumulators of this tile are kept.
			accAt := func(r, h int) value.Value {
				at := e.cur.NewAdd(e.cur.NewMul(e.cur.NewAdd(m0, i64(int64(r))), i64(w)), e.cur.NewAdd(c0, i64(int64(h*vw))))
				return e.cur.NewGetElementPtr(types.Float, acc, at)
			}
			if acc != nil {
				for i, a := range accs {
					e.cur.NewStore(e.vload(accAt(i/2, i%2)), a)
				}
			}
			e.loop(kn, func(kv value.Value) {
				e.bound[mm.K] = e.cur.NewAdd(k0, kv)
				at := e.cur.NewAdd(e.cur.NewMul(kv, i64(w)), c0)
				b0 := e.vload(e.cur.NewGetElementPtr(types.Float, panel, at))
				b1 := e.vload(e.cur.NewGetElementPtr(types.Float, panel, e.cur.NewAdd(at, i64(vw))))
				for r := 0; r < mrv; r++ {
					e.push()
					e.bound[mv] = rows[r]
					a := e.convert(e.expr(mm.A), mm.A.Kind(), loops.F32)
					e.pop()
					splat := e.cur.NewShuffleVector(
						e.cur.NewInsertElement(constant.NewUndef(vecT), a, constant.NewInt(types.I32, 0)),
						constant.NewUndef(vecT), constant.NewZeroInitializer(types.NewVector(vw, types.I32)))
					for h, b := range []value.Value{b0, b1} {
						acc := accs[2*r+h]
						next := e.cur.NewCall(fma, splat, b, e.cur.NewLoad(vecT, acc))
						e.cur.NewStore(next, acc)
					}
				}
			})
			if acc != nil {
				for i, a := range accs {
					st := e.cur.NewStore(e.cur.NewLoad(vecT, a), e.cur.NewBitCast(accAt(i/2, i%2), vecPtr))
					st.Align = 4
				}
				return
			}
			for i, a := range accs {
				p := e.cur.NewGetElementPtr(tileT, tile, i64(0), i64(int64(i*vw)))
				st := e.cur.NewStore(e.cur.NewLoad(vecT, a), e.cur.NewBitCast(p, vecPtr))
				st.Align = 64
			}
			// Store the tile through the epilogue, inside the matrix.
			left := e.cur.NewSub(jn, c0)
			cn := e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, left, i64(nr)), left, i64(nr))
			for r := 0; r < mrv; r++ {
				e.storeRow(s, m0, r, e.cur.NewAdd(j0, c0), cn, func(j value.Value) value.Value {
					return e.cur.NewLoad(types.Float, e.cur.NewGetElementPtr(tileT, tile, i64(0), e.cur.NewAdd(j, i64(int64(r*nr)))))
				})
			}
		})
	})
}

func (e *fn) vload(p value.Value) value.Value {
	l := e.cur.NewLoad(vecT, e.cur.NewBitCast(p, vecPtr))
	l.Align = 4
	return l
}
