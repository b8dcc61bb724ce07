package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMessagesOfHostileText: inputs whose bytes are not plain text give
// messages a terminal shows as text. Two names that differ only in bytes
// that are not UTF-8 stay two names (each byte stands for itself, and
// prints as a \x escape); an escape sequence in a name reaches stderr as
// '?'; a PyTorch checkpoint, a pickle or other binary data is named as
// such rather than echoed; a device is not read.
func TestMessagesOfHostileText(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
		return p
	}

	out, stderr, code := kiln(t, "opt", write("bytes.kir", "func @f(%\"a\xff\": f32[2], %\"a\xfe\": f32[2]) -> (f32[2]) {\n  %y = add(%\"a\xff\", %\"a\xfe\") : f32[2]\n  return %y\n}\n"))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `%"a\xff": f32[2], %"a\xfe": f32[2]`)

	_, stderr, code = kiln(t, "opt", write("escape.kir", "func @f(%\"a\x1b[31mred\": f32[2]) -> (f32[2]) {\n  %y = add(%\"a\x1b[31mred\", %q) : f32[2]\n  return %y\n}\n"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "use of undefined value %q")
	require.Contains(t, stderr, `add(%"a?[31mred", %q)`)
	require.NotContains(t, stderr, "\x1b")

	for _, c := range []struct{ name, data, want string }{
		{"model.pt", "PK\x03\x04\x14\x00\x00\x00\x08\x00archive/data.pkl\x80\x02}q\x00", "a zip archive (a PyTorch checkpoint"},
		{"weights.pkl", "\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94.", "a Python pickle"},
		{"blob.bin", "junk\x00\x01\x02", "binary data"},
	} {
		_, stderr, code := kiln(t, "mem", write(c.name, c.data))
		require.Equal(t, 1, code, c.name)
		require.Contains(t, stderr, "is not a Kiln text (.kir) or an ONNX model: it looks like "+c.want, c.name)
		require.Less(t, len(stderr), 300, "%s: the file is not echoed", c.name)
		require.False(t, strings.ContainsFunc(stderr, func(r rune) bool { return r < 0x20 && r != '\n' }), c.name)
	}

	_, stderr, code = kiln(t, "opt", "/dev/zero")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "/dev/zero is not a regular file")
}
