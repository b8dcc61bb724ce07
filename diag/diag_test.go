package diag

import (
	"fmt"
	"strings"
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

func TestAmong(t *testing.T) {
	many := []string{}
	for i := range 200 {
		many = append(many, fmt.Sprintf("layer%d.weight", i))
	}
	require.Equal(t, ` (did you mean "w"?)`, Among("W", []string{"x", "w"}))
	require.Equal(t, " (it has x, w)", Among("nosuch", []string{"x", "w"}))
	got := Among("layer7.bias", many)
	require.True(t, strings.HasPrefix(got, " (it has 200; the nearest: layer7.weight, "), got)
	require.Less(t, len(got), 120, "a long list is cut to the nearest names")
}

func TestPrintable(t *testing.T) {
	require.Equal(t, "a?[31mred\tok\n", Printable("a\x1b[31mred\tok\n"))
	d := Diagnostic{File: "m\x1b.kir", Line: 1, Col: 2, Msg: "value %\"\x1b[2J\" is bad"}
	require.NotContains(t, d.String(), "\x1b")
	out := Render(List{d}, map[string]string{"m\x1b.kir": "x \x1b[2J y"})
	require.NotContains(t, out, "\x1b")
	require.Contains(t, out, "x ?[2J y\n ^\n", "the caret stays under the column")
}
