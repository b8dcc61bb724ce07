package llvm

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-compiler/kiln/passtest"
	"github.com/stretchr/testify/require"
)

// TestObjectCacheEvictsLeastRecentlyUsed: past the limit, a store removes
// the objects used longest ago until three quarters of the limit remain;
// a hit counts as a use; a young temporary file of a build in flight
// stays.
func TestObjectCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := objectCache{dir: t.TempDir()}
	obj := append([]byte("\x7fELF"), make([]byte, 96)...)
	keys := []string{"aa01", "bb02", "cc03", "dd04"}
	for i, k := range keys {
		c.put(k, obj)
		old := time.Now().Add(time.Duration(i-10) * time.Minute)
		require.NoError(t, os.Chtimes(c.path(k), old, old))
	}
	require.NotNil(t, c.get("aa01"), "a hit marks aa01 as used now")
	inFlight := filepath.Join(c.dir, "aa", ".tmp-123.o")
	require.NoError(t, os.WriteFile(inFlight, obj, 0o644))
	c.evict(300) // 400 bytes held: down to 225, so the two used longest ago go
	for k, want := range map[string]bool{"aa01": true, "bb02": false, "cc03": false, "dd04": true} {
		_, err := os.Stat(c.path(k))
		require.Equal(t, want, err == nil, k)
	}
	require.FileExists(t, inFlight)
	require.Nil(t, c.get("bb02"))
	require.Nil(t, objectCache{}.get("aa01"), "no directory: no cache")
}

// TestCacheKey: the key changes with the arguments and the source, and
// with clang's identity.
func TestCacheKey(t *testing.T) {
	base := cacheKey("/no/such/clang", []string{"-O3", "-c"}, []byte("src"))
	require.Equal(t, base, cacheKey("/no/such/clang", []string{"-O3", "-c"}, []byte("src")))
	require.NotEqual(t, base, cacheKey("/no/such/clang", []string{"-O3", "-fPIC", "-c"}, []byte("src")))
	require.NotEqual(t, base, cacheKey("/no/such/clang", []string{"-O3", "-c"}, []byte("src2")))
	require.NotEqual(t, base, cacheKey("/no/such/clang2", []string{"-O3", "-c"}, []byte("src")))
	require.NotEqual(t, cacheKey("/no/such/clang", []string{"-O3c"}, nil), cacheKey("/no/such/clang", []string{"-O3", "c"}, nil))
}

// TestObjectCacheMissesWhatIsNotAnObject: an entry that is not an ELF
// object (a torn or foreign file) is a miss, not a link failure.
func TestObjectCacheMissesWhatIsNotAnObject(t *testing.T) {
	c := objectCache{dir: t.TempDir()}
	c.put("ee05", append([]byte("\x7fELF"), 1, 2, 3))
	require.NotNil(t, c.get("ee05"))
	require.NoError(t, os.WriteFile(c.path("ee05"), make([]byte, 64), 0o644))
	require.Nil(t, c.get("ee05"), "zeros left by a crash")
}

// TestCacheKeyNamesTheNativeTarget: the key covers what -march=native
// means on this machine, so a cache shared with another CPU misses.
func TestCacheKeyNamesTheNativeTarget(t *testing.T) {
	clang, err := Clang()
	if err != nil {
		passtest.Missing(t, "clang is not installed (.ci/run installs clang-14)")
	}
	require.Contains(t, nativeTarget(clang), "-target-cpu", "clang -### names the CPU -march=native chose")
	k := cacheKey(clang, []string{"-O3"}, []byte("x"))
	nativeTargets.Store(clang, "-target-cpu other")
	defer nativeTargets.Delete(clang)
	require.NotEqual(t, k, cacheKey(clang, []string{"-O3"}, []byte("x")))
}
