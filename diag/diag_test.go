package diag

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRender(t *testing.T) {
	l := List{
		{File: "b.kir", Line: 2, Col: 3, Msg: "second"},
		{File: "b.kir", Line: 1, Col: 5, Msg: "first"},
		{File: "b.kir", Line: 1, Col: 5, Msg: "first"},
		{File: "other", Msg: "no position"},
	}.Sort()
	require.Len(t, l, 3)
	got := Render(l, map[string]string{"b.kir": "abcdefg\n\tx y\n"})
	require.Equal(t, "b.kir:1:5: error: first\nabcdefg\n    ^\nb.kir:2:3: error: second\n\tx y\n\t ^\nother: error: no position\n", got)
}

func TestDidYouMean(t *testing.T) {
	require.Equal(t, ` (did you mean "canonicalize"?)`, DidYouMean("canonicalise", []string{"cse", "canonicalize", "dce"}))
	require.Equal(t, ` (did you mean "budget"?)`, DidYouMean("budgt", []string{"budget", "solver"}))
	require.Empty(t, DidYouMean("zzz", []string{"budget", "solver"}))
	require.Empty(t, DidYouMean("cse", []string{"cse"}))
}
