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

func TestCheck(t *testing.T) {
	out := "func @f() {\n  %a = add(%x, %y)\n  %b = mul(%a, %a)\n  return %b\n}\n"
	require.Empty(t, Check("CHECK: func @f\nCHECK-NEXT: add(\nCHECK-SAME: %y\nCHECK-NOT: sub(\nCHECK: return %b", out))
	require.Contains(t, Check("CHECK: mul(\nCHECK: add(", out), "not found")
	require.Contains(t, Check("CHECK: func\nCHECK-NEXT: mul(", out), "CHECK-NEXT")
	require.Contains(t, Check("CHECK: func\nCHECK-NOT: mul(\nCHECK: return", out), "CHECK-NOT")
	require.Contains(t, Check("CHECK: add(\nCHECK-SAME: mul", out), "CHECK-SAME")
	require.Contains(t, Check("CHECK-NOT: add(", out), "CHECK-NOT")
	require.Empty(t, Check("just a comment\nCHECK: }", out))
}

// Timings come out in whichever form strconv picks: JSON writes 6e-7 for
// durations under a microsecond. Integers (byte counts) stay as they are.
func TestNumberNormalization(t *testing.T) {
	in := `"seconds": 6e-7, "s": 0.000123, "t": 1.5e+03, "bytes": 1804, 12.5%`
	want := `"seconds": N, "s": N, "t": N, "bytes": 1804, N%`
	if got := numberRE.ReplaceAllString(in, "N"); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
