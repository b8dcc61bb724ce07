package progress

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOnlyTerminalsOrForced(t *testing.T) {
	var b bytes.Buffer
	t.Setenv("KILN_PROGRESS", "")
	require.Nil(t, For(&b), "a buffer is not a terminal")
	For(&b).Step("nothing %d", 1) // a nil Reporter is silent
	For(&b).Done()
	require.Empty(t, b.String())
	t.Setenv("KILN_PROGRESS", "1")
	r := For(&b)
	r.Step("pass %d/%d: %s", 1, 3, "fuse")
	r.Step("throttled")
	r.Done()
	require.Equal(t, "\r\033[Kpass 1/3: fuse\r\033[K", b.String())
}
