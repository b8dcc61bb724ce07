package interp

import "github.com/kiln-compiler/kiln/ir"

// Convolutions run as matrix products over im2col buffers, one image and
// group at a time, images in parallel.

// im2col fills col[(c*KH+kh)*KW+kw][oh*OW+ow] with the input pixel under
// each kernel tap (0 in the padding) for channels [c0, c0+cs) of image x.
func im2col(col, x []float64, g ir.ConvGeometry, c0, cs int64) {
	ohw := g.OH * g.OW
	for c := int64(0); c < cs; c++ {
		plane := x[(c0+c)*g.H*g.W:]
		for kh := int64(0); kh < g.KH; kh++ {
			for kw := int64(0); kw < g.KW; kw++ {
				row := col[((c*g.KH+kh)*g.KW+kw)*ohw:]
				for oh := int64(0); oh < g.OH; oh++ {
					ih := oh*g.SH - g.PT + kh*g.DH
					dst := row[oh*g.OW : (oh+1)*g.OW]
					if ih < 0 || ih >= g.H {
						clear(dst)
						continue
					}
					src := plane[ih*g.W:]
					for ow := range dst {
						iw := int64(ow)*g.SW - g.PL + kw*g.DW
						if iw < 0 || iw >= g.W {
							dst[ow] = 0
						} else {
							dst[ow] = src[iw]
						}
					}
				}
			}
		}
	}
}

// col2im adds col back into the image dx (the adjoint of im2col).
func col2im(dx, col []float64, g ir.ConvGeometry, c0, cs int64) {
	ohw := g.OH * g.OW
	for c := int64(0); c < cs; c++ {
		plane := dx[(c0+c)*g.H*g.W:]
		for kh := int64(0); kh < g.KH; kh++ {
			for kw := int64(0); kw < g.KW; kw++ {
				row := col[((c*g.KH+kh)*g.KW+kw)*ohw:]
				for oh := int64(0); oh < g.OH; oh++ {
					ih := oh*g.SH - g.PT + kh*g.DH
					if ih < 0 || ih >= g.H {
						continue
					}
					for ow := int64(0); ow < g.OW; ow++ {
						iw := ow*g.SW - g.PL + kw*g.DW
						if iw >= 0 && iw < g.W {
							plane[ih*g.W+iw] += row[oh*g.OW+ow]
						}
					}
				}
			}
		}
	}
}

// isPointwise reports whether im2col would copy the input unchanged.
func isPointwise(g ir.ConvGeometry) bool {
	return g.KH == 1 && g.KW == 1 && g.SH == 1 && g.SW == 1 && g.PT == 0 && g.PL == 0 && g.PB == 0 && g.PR == 0
}

func init() {
	kernels["conv2d"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		x, w := in[0], in[1]
		g, _ := ir.ConvGeometryOf(x.Type.Shape, w.Type.Shape, op.Attr())
		y := New(out[0])
		cg, mg := g.C/g.Groups, g.M/g.Groups
		kdim, ohw := cg*g.KH*g.KW, g.OH*g.OW
		parallelFor(int(g.N), func(n int) {
			xn := x.F[int64(n)*g.C*g.H*g.W:]
			col := make([]float64, kdim*ohw)
			for gr := int64(0); gr < g.Groups; gr++ {
				src := col
				if isPointwise(g) {
					src = xn[gr*cg*ohw : (gr+1)*cg*ohw]
				} else {
					im2col(col, xn, g, gr*cg, cg)
				}
				yg := y.F[(int64(n)*g.M+gr*mg)*ohw : (int64(n)*g.M+(gr+1)*mg)*ohw]
				matmulInto(yg, w.F[gr*mg*kdim:(gr+1)*mg*kdim], src, int(mg), int(ohw), int(kdim), false)
			}
			if len(in) == 3 {
				for m := int64(0); m < g.M; m++ {
					bias := in[2].F[m]
					row := y.F[(int64(n)*g.M+m)*ohw : (int64(n)*g.M+m+1)*ohw]
					for i := range row {
						row[i] += bias
					}
				}
			}
		})
		return []*Tensor{y}, nil
	}
	kernels["conv2d_grad_input"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dy, w := in[0], in[1]
		g, _ := ir.ConvGeometryOf(out[0].Shape, w.Type.Shape, op.Attr())
		dx := New(out[0])
		cg, mg := g.C/g.Groups, g.M/g.Groups
		kdim, ohw := cg*g.KH*g.KW, g.OH*g.OW
		// wt[g] is the transpose of the group's weight matrix [mg×kdim].
		wt := make([]float64, len(w.F))
		for gr := int64(0); gr < g.Groups; gr++ {
			transposeInto(wt[gr*mg*kdim:(gr+1)*mg*kdim], w.F[gr*mg*kdim:(gr+1)*mg*kdim], int(mg), int(kdim))
		}
		parallelFor(int(g.N), func(n int) {
			col := make([]float64, kdim*ohw)
			dxn := dx.F[int64(n)*g.C*g.H*g.W:]
			for gr := int64(0); gr < g.Groups; gr++ {
				dyg := dy.F[(int64(n)*g.M+gr*mg)*ohw : (int64(n)*g.M+(gr+1)*mg)*ohw]
				if isPointwise(g) {
					matmulInto(dxn[gr*cg*ohw:(gr+1)*cg*ohw], wt[gr*mg*kdim:(gr+1)*mg*kdim], dyg, int(kdim), int(ohw), int(mg), false)
					continue
				}
				matmulInto(col, wt[gr*mg*kdim:(gr+1)*mg*kdim], dyg, int(kdim), int(ohw), int(mg), false)
				col2im(dxn, col, g, gr*cg, cg)
			}
		})
		return []*Tensor{dx}, nil
	}
	kernels["conv2d_grad_weight"] = func(op *ir.Op, in []*Tensor, out []ir.Type, _ *runtime) ([]*Tensor, error) {
		dy, x := in[0], in[1]
		g, _ := ir.ConvGeometryOf(x.Type.Shape, out[0].Shape, op.Attr())
		cg, mg := g.C/g.Groups, g.M/g.Groups
		kdim, ohw := cg*g.KH*g.KW, g.OH*g.OW
		// Each image contributes dy_n · col_nᵀ; images sum in a fixed order.
		parts := make([][]float64, g.N)
		parallelFor(int(g.N), func(n int) {
			part := make([]float64, g.M*kdim)
			col := make([]float64, kdim*ohw)
			colT := make([]float64, ohw*kdim)
			xn := x.F[int64(n)*g.C*g.H*g.W:]
			for gr := int64(0); gr < g.Groups; gr++ {
				if isPointwise(g) {
					copy(col, xn[gr*cg*ohw:(gr+1)*cg*ohw])
				} else {
					im2col(col, xn, g, gr*cg, cg)
				}
				transposeInto(colT, col, int(kdim), int(ohw))
				dyg := dy.F[(int64(n)*g.M+gr*mg)*ohw : (int64(n)*g.M+(gr+1)*mg)*ohw]
				matmulInto(part[gr*mg*kdim:(gr+1)*mg*kdim], dyg, colT, int(mg), int(kdim), int(ohw), false)
			}
			parts[n] = part
		})
		dw := New(out[0])
		for _, p := range parts {
			for i, v := range p {
				dw.F[i] += v
			}
		}
		return []*Tensor{dw}, nil
	}
}
