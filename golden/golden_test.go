package golden

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestArchiveRoundTrip(t *testing.T) {
	text := "comment line\n-- a.kir --\nfunc\n-- empty --\n-- b --\nno newline"
	a := Parse([]byte(text))
	require.Equal(t, "comment line\n", string(a.Comment))
	require.Len(t, a.Files, 3)
	require.Equal(t, "func\n", string(a.Files[0].Data))
	require.Empty(t, a.Files[1].Data)
	require.Equal(t, "no newline\n", string(a.Files[2].Data))
	require.Equal(t, "comment line\n-- a.kir --\nfunc\n-- empty --\n-- b --\nno newline\n", string(Format(a)))
	a.Set("c", []byte("x\n"))
	a.Delete("empty")
	data, ok := a.Get("c")
	require.True(t, ok)
	require.Equal(t, "x\n", string(data))
	_, ok = a.Get("empty")
	require.False(t, ok)
}

func TestDiff(t *testing.T) {
	require.Empty(t, Diff("a\nb\n", "a\nb\n"))
	d := Diff("a\nb\nc\n", "a\nB\nc\n")
	require.Equal(t, "  a\n- b\n+ B\n  c\n", d)
}

func TestSplitWords(t *testing.T) {
	w, err := SplitWords(`kiln opt --passes='a{x=1,y=2}' "two words" a\ b`)
	require.NoError(t, err)
	require.Equal(t, []string{"kiln", "opt", "--passes=a{x=1,y=2}", "two words", "a b"}, w)
	_, err = SplitWords(`kiln 'open`)
	require.Error(t, err)
}
