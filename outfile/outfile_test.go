package outfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteIsAtomicAndSparesInputs(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.kir")
	require.NoError(t, os.WriteFile(in, []byte("input"), 0o644))
	out := filepath.Join(dir, "out.kir")
	require.NoError(t, Write(out, []byte("one"), in))
	require.NoError(t, Write(out, []byte("two"), in))
	b, _ := os.ReadFile(out)
	require.Equal(t, "two", string(b))
	require.ErrorContains(t, Write(in, []byte("x"), in), "refusing to overwrite")
	require.ErrorContains(t, Write(filepath.Join(dir, ".", "in.kir"), []byte("x"), in), "refusing")
	link := filepath.Join(dir, "link.kir")
	require.NoError(t, os.Symlink(in, link))
	require.ErrorContains(t, Write(link, []byte("x"), in), "refusing")
	b, _ = os.ReadFile(in)
	require.Equal(t, "input", string(b))
	entries, _ := os.ReadDir(dir)
	require.Len(t, entries, 3, "no temporary files left behind")
	require.Error(t, Write(filepath.Join(dir, "nodir", "x"), []byte("x")))
}
