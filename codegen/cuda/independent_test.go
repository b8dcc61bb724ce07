package cuda

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/loops"
)

// TestIndependentAccesses: a launch joins a merge only if it neither
// reads nor writes bytes a launch of the merge writes, nor writes bytes
// one reads; reads of the same bytes, and bytes of another slot or
// space, do not conflict.
func TestIndependentAccesses(t *testing.T) {
	node := func(space string, slot int, off, size int64, mode string) Node {
		return Node{Args: []KArg{{Kind: "pointer", Pointer: &Access{Space: space, Slot: slot, Offset: off, SizeBytes: size, Mode: mode}}, {Kind: "scalar", Value: 3}}}
	}
	for _, c := range []struct {
		name       string
		earlier, n Node
		want       bool
	}{
		{"read after write", node("device", 0, 0, 64, "write"), node("device", 0, 32, 64, "read"), false},
		{"write after read", node("device", 0, 32, 64, "read"), node("device", 0, 0, 64, "write"), false},
		{"write after write", node("device", 0, 0, 64, "write"), node("device", 0, 63, 1, "write"), false},
		{"readwrite after read", node("device", 0, 0, 64, "read"), node("device", 0, 0, 8, "readwrite"), false},
		{"reads of the same bytes", node("device", 0, 0, 64, "read"), node("device", 0, 0, 64, "read"), true},
		{"adjacent bytes", node("device", 0, 0, 64, "write"), node("device", 0, 64, 64, "write"), true},
		{"another slot", node("param", 1, 0, 64, "write"), node("param", 2, 0, 64, "write"), true},
		{"another space", node("device", 0, 0, 64, "write"), node("input", 0, 0, 64, "read"), true},
	} {
		require.Equal(t, c.want, independent([]Node{c.earlier}, c.n), c.name)
		require.Equal(t, c.want, independent([]Node{node("device", 5, 0, 8, "write"), c.earlier}, c.n), "%s, second in the merge", c.name)
	}
}

// TestMergedGridStaysLaunchable: independent launches whose grids would
// add up past 2^31-1 blocks are not one merged launch (combine makes
// them a cooperative one, whose grid is the largest stage's).
func TestMergedGridStaysLaunchable(t *testing.T) {
	launch := func(off int64, grid int) Node {
		return Node{Kind: "kernel", stage: &stageKernel{name: "k"}, Grid: &[3]int{grid, 1, 1},
			Args: []KArg{{Kind: "pointer", Pointer: &Access{Space: "device", Offset: off, SizeBytes: 8, Mode: "write"}}}}
	}
	require.True(t, mergeable([]Node{launch(0, 1<<30), launch(8, 1<<30-1)}), "2^31-1 blocks")
	require.False(t, mergeable([]Node{launch(0, 1<<30), launch(8, 1<<30)}), "2^31 blocks are not one merged launch")
}

// TestCombinedSharedMemoryFits: a combined kernel declares at most 48 KiB
// of static shared memory: five f32 tiled products (8,256 bytes of tiles
// each) and folds of f32 and f64 (1 and 2 KiB, once per type however
// many stages fold) fit; a sixth product does not.
func TestCombinedSharedMemoryFits(t *testing.T) {
	product := func(name string) *stageKernel {
		return &stageKernel{name: name, tile: &tiling{}, stage: &loops.Stage{Matmul: &loops.Matmul{A: loops.Float{K: loops.F32}}}}
	}
	fold := func(k loops.Kind) *stageKernel {
		return &stageKernel{name: "f", fold: []*loops.Reduce{{Acc: k}}}
	}
	s := newSharedSet()
	for i := 0; i < 5; i++ {
		require.True(t, s.add(product(fmt.Sprint("p", i))), "product %d", i)
	}
	require.True(t, s.add(product("p0")), "a product already counted")
	for i := 0; i < 3; i++ {
		require.True(t, s.add(fold(loops.F32)), "f32 folds share one array")
	}
	require.True(t, s.add(fold(loops.F64)))
	require.Equal(t, int64(5*8256+1024+2048), s.bytes)
	require.False(t, s.add(product("p5")), "a sixth product's tiles pass 48 KiB")
	require.Equal(t, int64(5*8256+1024+2048), s.bytes, "a refused stage adds nothing")
}
