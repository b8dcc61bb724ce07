package interp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

// ranksRun parses src and runs its function on n ranks, rank r's only
// argument filled with 100·r + element index.
func ranksRun(t *testing.T, src string, n int) ([][]*Tensor, error) {
	t.Helper()
	m, err := parser.Parse("t.kir", src)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	f := m.Funcs[0]
	args := make([][]*Tensor, n)
	for r := range args {
		x := New(f.Args[0].Type)
		for j := range x.F {
			x.F[j] = float64(100*r + j)
		}
		args[r] = []*Tensor{x}
	}
	res, _, err := RunRanks(f, args, Options{})
	return res, err
}

// TestCollectivesOnFourRanks: each collective's result on every rank,
// on the whole world and on the axes of a 2×2 mesh.
func TestCollectivesOnFourRanks(t *testing.T) {
	res, err := ranksRun(t, `func @f(%x: f32[4,2]) -> (f32[4,2], f32[4,2], f32[4,2], f32[1,2], f32[4,8], f32[4,2], f32[4,2]) {
  %s = all_reduce(%x) {size = 4} : f32[4,2]
  %p = all_reduce(%x) {size = 2} : f32[4,2]
  %q = all_reduce(%x) {size = 2, stride = 2, op = "max"} : f32[4,2]
  %rs = reduce_scatter(%x) {size = 4, axis = 0} : f32[1,2]
  %g = all_gather(%x) {size = 4, axis = 1} : f32[4,8]
  %b = broadcast(%x) {size = 4, root = 2} : f32[4,2]
  %one = all_reduce(%x) : f32[4,2]
  return %s, %p, %q, %rs, %g, %b, %one
}`, 4)
	require.NoError(t, err)
	for r := 0; r < 4; r++ {
		out := res[r]
		for j := 0; j < 8; j++ {
			require.Equal(t, float64(600+4*j), out[0].F[j], "all_reduce over 4, rank %d", r)
			pair := r / 2 * 2 // {0,1} and {2,3}
			require.Equal(t, float64(100*pair+100*(pair+1)+2*j), out[1].F[j], "all_reduce along the mesh's inner axis, rank %d", r)
			require.Equal(t, float64(100*(r%2+2)+j), out[2].F[j], "max along the outer axis ({0,2} and {1,3}), rank %d", r)
			require.Equal(t, float64(100*2+j), out[5].F[j], "broadcast from rank 2, rank %d", r)
			require.Equal(t, float64(100*r+j), out[6].F[j], "a group of one is a copy")
		}
		// Rank r gets row r of the sum.
		require.Equal(t, []float64{float64(600 + 4*2*r), float64(600 + 4*(2*r+1))}, out[3].F)
		// Row i of the gather is rank 0's row i, then rank 1's, ...
		for i := 0; i < 4; i++ {
			for k := 0; k < 4; k++ {
				require.Equal(t, []float64{float64(100*k + 2*i), float64(100*k + 2*i + 1)}, out[4].F[i*8+2*k:i*8+2*k+2])
			}
		}
	}
}

// TestCollectiveErrors: a group larger than the run (or of 2^40 ranks:
// no allocation of that size), a run of one rank and a failing rank are
// errors, never a hang.
func TestCollectiveErrors(t *testing.T) {
	_, err := ranksRun(t, `func @f(%x: f32[2]) -> (f32[2]) {
  %s = all_reduce(%x) {size = 1099511627776, stride = 1099511627776} : f32[2]
  return %s
}`, 2)
	require.ErrorContains(t, err, "do not tile a run of 2 ranks")

	_, err = ranksRun(t, `func @f(%x: f32[2]) -> (f32[2]) {
  %s = all_reduce(%x) {size = 4} : f32[2]
  return %s
}`, 2)
	require.ErrorContains(t, err, "groups of 4 ranks, 1 apart, do not tile a run of 2 ranks")

	m, err := parser.Parse("t.kir", `func @f(%x: f32[2]) -> (f32[2]) {
  %s = all_reduce(%x) {size = 2} : f32[2]
  return %s
}`)
	require.NoError(t, err)
	_, err = Run(m.Funcs[0], []*Tensor{New(m.Funcs[0].Args[0].Type)}, Options{})
	require.ErrorContains(t, err, "needs a run of as many ranks")

	// Rank 1 fails in its gather (an index out of range) while rank 0
	// waits in the all_reduce after it.
	m, err = parser.Parse("t.kir", `func @f(%x: f32[2], %i: i64[1]) -> (f32[1]) {
  %g = gather(%x, %i) {axis = 0} : f32[1]
  %s = all_reduce(%g) {size = 2} : f32[1]
  return %s
}`)
	require.NoError(t, err)
	f := m.Funcs[0]
	args := [][]*Tensor{
		{New(f.Args[0].Type), FromInts(f.Args[1].Type, []int64{0})},
		{New(f.Args[0].Type), FromInts(f.Args[1].Type, []int64{7})},
	}
	_, _, err = RunRanks(f, args, Options{})
	require.ErrorContains(t, err, "rank 1:")
	require.ErrorContains(t, err, "out of range")
}

// TestSendRecv: rank 0 sends two tensors to rank 1 with different tags
// and rank 1 takes them in the other order; rank 1 sends back the
// product. A rank that receives what nobody sends, or a different type,
// is an error, never a hang.
func TestSendRecv(t *testing.T) {
	parse := func(src string) *ir.Func {
		m, err := parser.Parse("t.kir", src)
		require.NoError(t, err)
		require.NoError(t, ir.Verify(m))
		return m.Funcs[0]
	}
	first := parse(`func @first(%x: f32[3]) -> (f32[3]) {
  %y = neg(%x) : f32[3]
  send(%x) {offset = 1, tag = 1}
  send(%y) {offset = 1, tag = 2}
  %p = recv() {offset = 1, tag = 3, shape = [3], dtype = f32} : f32[3]
  return %p
}`)
	second := parse(`func @second(%x: f32[3]) -> (f32[3]) {
  %b = recv() {offset = -1, tag = 2, shape = [3], dtype = f32} : f32[3]
  %a = recv() {offset = -1, tag = 1, shape = [3], dtype = f32} : f32[3]
  %p = mul(%a, %b) : f32[3]
  send(%p) {offset = -1, tag = 3}
  return %a
}`)
	x := New(first.Args[0].Type)
	copy(x.F, []float64{1, 2, 3})
	res, _, err := RunPrograms([]*ir.Func{first, second}, [][]*Tensor{{x}, {New(x.Type)}}, Options{})
	require.NoError(t, err)
	require.Equal(t, []float64{-1, -4, -9}, res[0][0].F)
	require.Equal(t, []float64{1, 2, 3}, res[1][0].F)

	// Both wait for the other: a deadlock.
	lonely := parse(`func @lonely(%x: f32[3]) -> (f32[3]) {
  %p = recv() {offset = 1, tag = 3, shape = [3], dtype = f32} : f32[3]
  return %p
}`)
	_, _, err = RunPrograms([]*ir.Func{lonely, second}, [][]*Tensor{{x}, {New(x.Type)}}, Options{})
	require.ErrorContains(t, err, "deadlock")
	// A recv of another type than was sent.
	wrong := parse(`func @wrong(%x: f32[3]) -> (f32[3]) {
  %b = recv() {offset = -1, tag = 2, shape = [1, 3], dtype = f32} : f32[1,3]
  return %x
}`)
	_, _, err = RunPrograms([]*ir.Func{first, wrong}, [][]*Tensor{{x}, {New(x.Type)}}, Options{})
	require.ErrorContains(t, err, "which sent f32[3]")
	// A send that no recv takes.
	deaf := parse(`func @deaf(%x: f32[3]) -> (f32[3]) {
  %a = recv() {offset = -1, tag = 1, shape = [3], dtype = f32} : f32[3]
  %p = recv() {offset = -1, tag = 2, shape = [3], dtype = f32} : f32[3]
  send(%p) {offset = -1, tag = 3}
  send(%p) {offset = -1, tag = 4}
  return %a
}`)
	_, _, err = RunPrograms([]*ir.Func{first, deaf}, [][]*Tensor{{x}, {New(x.Type)}}, Options{})
	require.ErrorContains(t, err, "rank 1 sent 1 tensors with tag 4 to rank 0 that no recv took")
	// A peer outside the run.
	_, _, err = RunRanks(first, [][]*Tensor{{x}}, Options{})
	require.ErrorContains(t, err, "not in this run of 1 ranks")
}
