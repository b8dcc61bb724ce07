package outfile

import (
	"os"
	"path/filepath"
	"syscall"
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

// TestWriteThroughSpecialFiles: a FIFO (like /dev/null, not a regular
// file) is written through, never replaced by a regular file, and a
// symbolic link is followed: its target gets the bytes, the link stays.
func TestWriteThroughSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	got := make(chan []byte)
	go func() {
		b, _ := os.ReadFile(fifo)
		got <- b
	}()
	require.NoError(t, Write(fifo, []byte("through the pipe")))
	require.Equal(t, "through the pipe", string(<-got))
	st, err := os.Lstat(fifo)
	require.NoError(t, err)
	require.Equal(t, os.ModeNamedPipe, st.Mode().Type(), "still a FIFO")

	target := filepath.Join(dir, "target.kir")
	require.NoError(t, os.WriteFile(target, []byte("old"), 0o644))
	link := filepath.Join(dir, "link.kir")
	require.NoError(t, os.Symlink(target, link))
	require.NoError(t, Write(link, []byte("new")))
	st, err = os.Lstat(link)
	require.NoError(t, err)
	require.Equal(t, os.ModeSymlink, st.Mode().Type(), "the link stays a link")
	b, _ := os.ReadFile(target)
	require.Equal(t, "new", string(b))

	// A dangling relative link: its target is created, the link stays.
	dangling := filepath.Join(dir, "dangling.kir")
	require.NoError(t, os.Symlink("made.kir", dangling))
	require.NoError(t, Write(dangling, []byte("made")))
	st, err = os.Lstat(dangling)
	require.NoError(t, err)
	require.Equal(t, os.ModeSymlink, st.Mode().Type(), "the dangling link stays a link")
	b, _ = os.ReadFile(filepath.Join(dir, "made.kir"))
	require.Equal(t, "made", string(b))
}

func TestGuard(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.kir")
	require.NoError(t, os.WriteFile(in, []byte("input"), 0o644))
	hard := filepath.Join(dir, "hard.kir")
	require.NoError(t, os.Link(in, hard))
	g := &Guard{}
	g.Read(in)
	require.ErrorContains(t, g.Write(hard, []byte("x"), 0o644), "refusing to overwrite the input file", "a hard link is the same file")
	out := filepath.Join(dir, "out.kir")
	require.NoError(t, g.Write(out, []byte("one"), 0o644))
	require.ErrorContains(t, g.Write(filepath.Join(dir, ".", "out.kir"), []byte("two"), 0o644), "two outputs")
	b, _ := os.ReadFile(out)
	require.Equal(t, "one", string(b))
	var none *Guard
	require.NoError(t, none.Write(filepath.Join(dir, "free.kir"), []byte("x"), 0o644))
}
