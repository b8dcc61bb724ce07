package passes

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

const sample = `func @f(%x: f32[4], %y: f32[4]) -> (f32[4]) {
  %a = add(%x, %y) : f32[4]
  %b = add(%y, %x) : f32[4]
  %c = mul(%a, %b) : f32[4]
  return %c
}
`

func parse(t *testing.T, src string) *ir.Module {
	m, err := parser.Parse("t.kir", src)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m))
	return m
}

func init() {
	MustRegister(&Pass{Name: "test-fail", Summary: "always fails", Run: func(*Context, *ir.Module) error {
		return errors.New("deliberate failure")
	}})
	MustRegister(&Pass{Name: "test-panic", Summary: "always panics", Run: func(*Context, *ir.Module) error {
		var m map[string]int
		m["boom"] = 1
		return nil
	}})
	MustRegister(&Pass{Name: "test-break", Summary: "breaks the IR", Run: func(_ *Context, m *ir.Module) error {
		m.Funcs[0].Body[0].Results[0].Type.Shape = ir.Shape{5}
		return nil
	}})
	MustRegister(&Pass{Name: "test-opts", Summary: "reads every kind of option", Options: []Option{
		{Name: "n", Kind: IntOption, Default: "3"}, {Name: "f", Kind: FloatOption}, {Name: "s", Kind: StringOption},
		{Name: "b", Kind: BoolOption}, {Name: "e", Kind: EnumOption, Enum: []string{"x", "y"}, Default: "x"},
		{Name: "budget", Kind: SizeOption}, {Name: "timeout", Kind: DurationOption, Default: "1s"},
	}, Run: func(ctx *Context, _ *ir.Module) error {
		ctx.Stat("n", ctx.Int("n"))
		ctx.Stat("f", ctx.Float("f"))
		ctx.Stat("s", ctx.String("s"))
		ctx.Stat("b", ctx.Bool("b"))
		ctx.Stat("e", ctx.String("e"))
		ctx.Stat("budget", ctx.Size("budget").Of(1000))
		ctx.Stat("timeout", ctx.Duration("timeout"))
		return nil
	}})
}

func TestPipelineParsing(t *testing.T) {
	p, err := ParsePipeline("dce, cse ,test-opts{n=5,s=\"a,b}\",budget=0.25}", nil)
	require.NoError(t, err)
	require.Equal(t, `dce,cse,test-opts{budget=0.25,n=5,s="a,b}"}`, p.String())
	require.Len(t, p, 3)
	require.Equal(t, "a,b}", p[2].Args["s"])

	for text, want := range map[string]string{
		"nosuch":               `unknown pass "nosuch"`,
		"dce,,cse":             "empty pass name",
		"dce{x=1}":             `pass dce has no option "x" (it takes none)`,
		"test-opts{n=x}":       "option n wants an integer",
		"test-opts{e=z}":       "option e wants one of x|y",
		"test-opts{n=1,n=2}":   "option n given twice",
		"test-opts{n=1":        "missing '}'",
		"test-opts{budget=-1}": "not a size",
		"test-opts{timeout=3}": "wants a duration",
		"dce}":                 "unexpected '}'",
	} {
		_, err := ParsePipeline(text, nil)
		require.ErrorContains(t, err, want, text)
	}
}

func TestOptionsReachThePass(t *testing.T) {
	m := parse(t, sample)
	p, err := ParsePipeline("test-opts{f=2.5,s=hi,b=true,e=y,budget=0.5}", nil)
	require.NoError(t, err)
	mg := &Manager{}
	require.NoError(t, mg.Run(m, p))
	var b bytes.Buffer
	mg.WriteStats(&b)
	require.Equal(t, "test-opts: n = 3\ntest-opts: f = 2.5\ntest-opts: s = hi\ntest-opts: b = true\ntest-opts: e = y\ntest-opts: budget = 500\ntest-opts: timeout = 1s\n", b.String())
}

func TestSizes(t *testing.T) {
	for text, want := range map[string]Size{
		"123": {Bytes: 123, Set: true}, "64KB": {Bytes: 64000, Set: true}, "64KiB": {Bytes: 65536, Set: true},
		"2GB": {Bytes: 2e9, Set: true}, "2GiB": {Bytes: 2 << 30, Set: true}, "512MiB": {Bytes: 512 << 20, Set: true},
		"1.5KiB": {Bytes: 1536, Set: true}, "0.5": {Fraction: 0.5, IsFrac: true, Set: true}, "1e-1": {Fraction: 0.1, IsFrac: true, Set: true},
	} {
		got, err := ParseSize(text)
		require.NoError(t, err, text)
		require.Equal(t, want, got, text)
	}
	for _, bad := range []string{"", "-1", "abc", "12XB", "1e400", "-0.5", "99999999999GiB"} {
		_, err := ParseSize(bad)
		require.Error(t, err, bad)
	}
	s, _ := ParseSize("0.5")
	require.Equal(t, int64(500), s.Of(1000))
}

func failWith(t *testing.T, pipeline string) (*PassError, string) {
	dir := t.TempDir()
	m := parse(t, sample)
	p, err := ParsePipeline(pipeline, nil)
	require.NoError(t, err)
	mg := &Manager{Inst: Instrumentation{VerifyEach: true, ReproducerDir: dir}}
	err = mg.Run(m, p)
	var pe *PassError
	require.ErrorAs(t, err, &pe)
	return pe, dir
}

func TestFailingPassLeavesReproducer(t *testing.T) {
	pe, dir := failWith(t, "cse,test-fail,dce")
	require.Equal(t, "test-fail", pe.Pass)
	require.Contains(t, pe.Error(), "pass test-fail failed: deliberate failure")
	require.Equal(t, filepath.Join(dir, "kiln-reproducer-test-fail.kir"), pe.Reproducer)
	b, err := os.ReadFile(pe.Reproducer)
	require.NoError(t, err)
	text := string(b)
	require.Contains(t, text, "--passes='test-fail,dce'")
	// The reproducer holds the IR the failing pass saw (after cse), and parses.
	m, err := parser.Parse("rep.kir", text)
	require.NoError(t, err)
	require.Len(t, m.Funcs[0].Body, 2)
}

func TestPanickingPassIsReported(t *testing.T) {
	pe, _ := failWith(t, "test-panic")
	require.Contains(t, pe.Error(), "pass test-panic failed: panic: assignment to entry in nil map")
	_, err := os.Stat(pe.Reproducer)
	require.NoError(t, err)
}

func TestVerifyEachCatchesInvalidIR(t *testing.T) {
	pe, _ := failWith(t, "test-break")
	require.Contains(t, pe.Error(), "it produced invalid IR")
	require.Contains(t, pe.Error(), "has type f32[5], but its operands give f32[4]")
	// Without verify-each the broken IR goes through.
	m := parse(t, sample)
	p, _ := ParsePipeline("test-break", nil)
	require.NoError(t, (&Manager{}).Run(m, p))
}

func TestInstrumentationOutput(t *testing.T) {
	m := parse(t, sample)
	p, _ := ParsePipeline("cse,dce", nil)
	var log bytes.Buffer
	mg := &Manager{Inst: Instrumentation{PrintAfterChange: true, Log: &log}}
	require.NoError(t, mg.Run(m, p))
	require.Equal(t, 1, strings.Count(log.String(), "IR Dump After"), "only cse changes the IR")
	require.True(t, mg.Runs[0].Changed)
	require.False(t, mg.Runs[1].Changed)
	var timing bytes.Buffer
	require.NoError(t, mg.WriteTiming(&timing, false))
	require.Contains(t, timing.String(), "total")
}

func TestRegisterRejectsBadPasses(t *testing.T) {
	run := func(*Context, *ir.Module) error { return nil }
	require.Error(t, Register(&Pass{Name: "dce", Summary: "x", Run: run}))
	require.Error(t, Register(&Pass{Name: "a,b", Summary: "x", Run: run}))
	require.Error(t, Register(&Pass{Name: "nosummary", Run: run}))
	require.Error(t, Register(&Pass{Name: "baddefault", Summary: "x", Run: run, Options: []Option{{Name: "n", Kind: IntOption, Default: "x"}}}))
	_ = time.Second
}
