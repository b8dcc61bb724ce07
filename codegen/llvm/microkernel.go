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
	return loops.LowerWith(f, loops.Options{Im2colBytes: im2colBytes, TransposeNarrowWeightGrads: true, ConvPanels: true, Transactional: true})
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
	if mm.Taps != nil {
		return e.packTaps(s, panel, jb, k0, kn)
	}
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

// packTaps is packPanel for a B read under a convolution's kernel taps
// (loops.Taps): for each row k = (c, kh, kw), the panel's columns are
// runs of output positions along one output row of one image, and a run
// reads the input row ih = oh·SH - PT + kh·DH at columns iw = ow·SW - PL
// + kw·DW: zeros before and after the columns inside the input, a
// strided (for SW = 1, contiguous) copy between them. The divisions are
// per run and per k, not per element.
func (e *fn) packTaps(s *loops.Stage, panel, jb, k0, kn value.Value) (j0, jn value.Value) {
	t := s.Matmul.Taps
	g := t.Geometry
	w := panelWidth(s.Extents[1])
	j0, jn = e.panelColumns(s, jb)
	zero := constant.NewFloat(types.Float, 0)
	zeros := func(at, from, to value.Value) {
		e.loopFrom(from, to, func(j value.Value) {
			e.cur.NewStore(zero, e.cur.NewGetElementPtr(types.Float, panel, e.cur.NewAdd(at, j)))
		})
	}
	clamp := func(v, lo, hi value.Value) value.Value {
		v = e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, v, lo), lo, v)
		return e.cur.NewSelect(e.cur.NewICmp(enum.IPredSGT, v, hi), hi, v)
	}
	// direct: the input is a plain f32 buffer read along its rows at
	// stride 1 or 2, so that a run is a masked vector copy.
	rowBuf, rowIndex, direct := t.Row()
	direct = direct && (g.SW == 1 || g.SW == 2) && rowBuf.Type.DType == kir.F32
	// The panel's columns cover the output rows R = image·OH + oh from
	// j0/OW to (j0+jn-1)/OW.
	firstRow := e.cur.NewSDiv(j0, i64(g.OW))
	rowsSpanned := e.cur.NewAdd(e.cur.NewSub(e.cur.NewSDiv(e.cur.NewAdd(j0, e.cur.NewSub(jn, i64(1))), i64(g.OW)), firstRow), i64(1))
	e.loop(kn, func(kv value.Value) {
		k := e.cur.NewAdd(k0, kv)
		c := e.cur.NewSDiv(k, i64(g.KH*g.KW))
		kh := e.cur.NewSRem(e.cur.NewSDiv(k, i64(g.KW)), i64(g.KH))
		kw := e.cur.NewSRem(k, i64(g.KW))
		dh := e.cur.NewSub(e.cur.NewMul(kh, i64(g.DH)), i64(g.PT))
		dw := e.cur.NewSub(e.cur.NewMul(kw, i64(g.DW)), i64(g.PL))
		// Output columns [owLo, owHi) read inside the input: ow·SW + dw
		// in [0, W).
		lead := e.cur.NewSub(i64(0), dw)
		owLo := e.cur.NewSelect(e.cur.NewICmp(enum.IPredSGT, lead, i64(0)),
			e.cur.NewSDiv(e.cur.NewAdd(lead, i64(g.SW-1)), i64(g.SW)), i64(0))
		last := e.cur.NewSub(i64(g.W-1), dw)
		owHi := e.cur.NewSelect(e.cur.NewICmp(enum.IPredSGE, last, i64(0)),
			e.cur.NewAdd(e.cur.NewSDiv(last, i64(g.SW)), i64(1)), i64(0))
		row := e.cur.NewMul(kv, i64(w))
		if direct {
			// Zero the row first; runs then copy only what the input holds.
			for j := int64(0); j < w; j += vw {
				st := e.cur.NewStore(constant.NewZeroInitializer(vecT), e.cur.NewBitCast(e.cur.NewGetElementPtr(types.Float, panel, e.cur.NewAdd(row, i64(j))), vecPtr))
				st.Align = 4
			}
		}
		e.loop(rowsSpanned, func(ri value.Value) {
			R := e.cur.NewAdd(firstRow, ri)
			img := e.cur.NewSDiv(R, i64(g.OH))
			oh := e.cur.NewSRem(R, i64(g.OH))
			rowStart := e.cur.NewMul(R, i64(g.OW))
			// This run's columns [qs, qe) of the product and its first ow.
			qs := e.cur.NewSelect(e.cur.NewICmp(enum.IPredSGT, rowStart, j0), rowStart, j0)
			end := e.cur.NewAdd(j0, jn)
			rowEnd := e.cur.NewAdd(rowStart, i64(g.OW))
			qe := e.cur.NewSelect(e.cur.NewICmp(enum.IPredSLT, rowEnd, end), rowEnd, end)
			ow0 := e.cur.NewSub(qs, rowStart)
			n := e.cur.NewSub(qe, qs)
			at := e.cur.NewAdd(row, e.cur.NewSub(qs, j0))
			ih := e.cur.NewAdd(e.cur.NewMul(oh, i64(g.SH)), dh)
			inside := e.cur.NewAnd(e.cur.NewICmp(enum.IPredSGE, ih, i64(0)), e.cur.NewICmp(enum.IPredSLT, ih, i64(g.H)))
			lo := clamp(e.cur.NewSub(owLo, ow0), i64(0), n)
			hi := clamp(e.cur.NewSub(owHi, ow0), lo, n)
			lo = e.cur.NewSelect(inside, lo, n)
			hi = e.cur.NewSelect(inside, hi, n)
			e.push()
			e.bound[t.N], e.bound[t.C], e.bound[t.H] = img, c, ih
			if direct {
				e.bound[t.W] = e.cur.NewAdd(e.cur.NewMul(e.cur.NewAdd(ow0, lo), i64(g.SW)), dw)
				src := e.cur.NewGetElementPtr(types.Float, e.base(rowBuf), e.flat(rowBuf, rowIndex))
				e.copyFloats(e.cur.NewGetElementPtr(types.Float, panel, e.cur.NewAdd(at, lo)), src, e.cur.NewSub(hi, lo), g.SW)
				e.pop()
				return
			}
			zeros(at, i64(0), lo)
			e.loopFrom(lo, hi, func(j value.Value) {
				e.bound[t.W] = e.cur.NewAdd(e.cur.NewMul(e.cur.NewAdd(ow0, j), i64(g.SW)), dw)
				v := e.convert(e.expr(t.X), t.X.Kind(), loops.F32)
				e.cur.NewStore(v, e.cur.NewGetElementPtr(types.Float, panel, e.cur.NewAdd(at, j)))
			})
			e.pop()
			zeros(at, hi, n)
		})
		zeros(row, jn, i64(w))
	})
	return j0, jn
}

// copyFloats copies n floats from src, stride apart (1 or 2), to dst
// (contiguous; they do not overlap), 16 at a time: masked loads of the
// lanes up to the last element read (never past it), for stride 2 two of
// them and a shuffle keeping the even lanes, and a masked store of the
// lanes below n.
func (e *fn) copyFloats(dst, src, n value.Value, stride int64) {
	maskT := types.NewVector(vw, types.I1)
	load := e.md.declare("llvm.masked.load.v16f32.p0v16f32", vecT, vecPtr, types.I32, maskT, vecT)
	store := e.md.declare("llvm.masked.store.v16f32.p0v16f32", types.Void, vecT, vecPtr, types.I32, maskT)
	idxT := types.NewVector(vw, types.I64)
	lanes := func(from, step int64) constant.Constant {
		c := make([]constant.Constant, vw)
		for i := range c {
			c[i] = constant.NewInt(types.I64, from+int64(i)*step)
		}
		return constant.NewVector(idxT, c...)
	}
	below := func(v constant.Constant, bound value.Value) value.Value {
		splat := e.cur.NewShuffleVector(
			e.cur.NewInsertElement(constant.NewUndef(idxT), bound, constant.NewInt(types.I32, 0)),
			constant.NewUndef(idxT), constant.NewZeroInitializer(types.NewVector(vw, types.I32)))
		return e.cur.NewICmp(enum.IPredSLT, v, splat)
	}
	loadAt := func(at, bound value.Value, from int64) value.Value {
		p := e.cur.NewBitCast(e.cur.NewGetElementPtr(types.Float, src, e.cur.NewAdd(at, i64(from))), vecPtr)
		return e.cur.NewCall(load, p, constant.NewInt(types.I32, 4), below(lanes(from, 1), bound), constant.NewZeroInitializer(vecT))
	}
	e.loop(e.cur.NewSDiv(e.cur.NewAdd(n, i64(vw-1)), i64(vw)), func(b value.Value) {
		i := e.cur.NewMul(b, i64(vw))
		left := e.cur.NewSub(n, i)
		at := e.cur.NewMul(i, i64(stride))
		// The elements read are src[at + stride·j] for j < left: offsets
		// below stride·(left-1) + 1 from at.
		reach := e.cur.NewAdd(e.cur.NewMul(e.cur.NewSub(left, i64(1)), i64(stride)), i64(1))
		v := loadAt(at, reach, 0)
		if stride == 2 {
			even := make([]constant.Constant, vw)
			for j := range even {
				even[j] = constant.NewInt(types.I32, int64(2*j))
			}
			v = e.cur.NewShuffleVector(v, loadAt(at, reach, vw), constant.NewVector(types.NewVector(vw, types.I32), even...))
		}
		to := e.cur.NewBitCast(e.cur.NewGetElementPtr(types.Float, dst, i), vecPtr)
		e.cur.NewCall(store, v, to, constant.NewInt(types.I32, 4), below(lanes(0, 1), left))
	})
}
