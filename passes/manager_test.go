package passes

import (
	"bytes"
	"errors"
	"os"
	"regexp"
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
	MustRegister(Define(Pass{Name: "test-opts", Summary: "reads every kind of option"}, func(ctx *Context, _ *ir.Module, o *testOptions) error {
		ctx.Stat("n", o.N)
		ctx.Stat("f", o.F)
		ctx.Stat("s", o.S)
		ctx.Stat("b", o.B)
		ctx.Stat("e", o.E)
		ctx.Stat("budget", o.Budget.Of(1000))
		ctx.Stat("timeout", o.Timeout)
		if o.Opt != nil {
			ctx.Stat("opt", *o.Opt)
		}
		return nil
	}))
}

type testOptions struct {
	N       int64         `opt:"n" default:"3" range:"[1,10]"`
	F       float64       `opt:"f" range:"(0,inf)"`
	S       string        `opt:"s"`
	B       bool          `opt:"b"`
	E       string        `opt:"e" enum:"x|y" default:"x"`
	Budget  Size          `opt:"budget" range:"(0,1]"`
	Timeout time.Duration `opt:"timeout" default:"1s"`
	Opt     *float64      `opt:"opt" range:"[0,1]"`
	ignored int
}

func TestOptionDeclarations(t *testing.T) {
	for name, fn := range map[string]func(){
		"no range": func() {
			type o struct {
				X float64 `opt:"x"`
			}
			Define(Pass{Name: "p"}, func(*Context, *ir.Module, *o) error { return nil })
		},
		"bad default": func() {
			type o struct {
				X int64 `opt:"x" default:"11" range:"[0,10]"`
			}
			Define(Pass{Name: "p"}, func(*Context, *ir.Module, *o) error { return nil })
		},
		"bad range": func() {
			type o struct {
				X int64 `opt:"x" range:"[0,10"`
			}
			Define(Pass{Name: "p"}, func(*Context, *ir.Module, *o) error { return nil })
		},
		"bad type": func() {
			type o struct {
				X []int `opt:"x"`
			}
			Define(Pass{Name: "p"}, func(*Context, *ir.Module, *o) error { return nil })
		},
	} {
		require.Panics(t, fn, name)
	}
}

func TestPipelineParsing(t *testing.T) {
	p, err := ParsePipeline("dce, cse ,test-opts{n=5,s=\"a,b}\",budget=0.25}", nil)
	require.NoError(t, err)
	require.Equal(t, `dce,cse,test-opts{budget=0.25,n=5,s="a,b}"}`, p.String())
	require.Len(t, p, 3)
	require.Equal(t, "a,b}", p[2].Args["s"])

	for text, want := range map[string]string{
		"nosuch":                `unknown pass "nosuch"`,
		"dce,,cse":              "empty pass name",
		"dce{x=1}":              `pass dce has no option "x" (it takes none)`,
		"test-opts{n=x}":        "option n wants an integer",
		"test-opts{e=z}":        "option e wants one of x|y",
		"test-opts{n=1,n=2}":    "option n given twice",
		"test-opts{n=1":         "missing '}'",
		"test-opts{budget=-1}":  "not a size",
		"test-opts{timeout=3}":  "wants a duration",
		"dce}":                  "unexpected '}'",
		"test-opts{n=0}":        "option n must lie in [1,10]",
		"test-opts{n=11}":       "option n must lie in [1,10]",
		"test-opts{f=0}":        "option f must lie in (0,inf)",
		"test-opts{f=NaN}":      "option f must lie in (0,inf)",
		"test-opts{f=-inf}":     "option f must lie in (0,inf)",
		"test-opts{budget=1.5}": "a fraction must lie in (0,1]",
		"test-opts{opt=2}":      "option opt must lie in [0,1]",
		"test-opts{tmeout=1s}":  `no option "tmeout" (did you mean "timeout"?)`,
	} {
		_, err := ParsePipeline(text, nil)
		require.ErrorContains(t, err, want, text)
	}
}

func TestOptionsReachThePass(t *testing.T) {
	m := parse(t, sample)
	p, err := ParsePipeline("test-opts{f=2.5,s=hi,b=true,e=y,budget=0.5,opt=0.25}", nil)
	require.NoError(t, err)
	mg := &Manager{}
	require.NoError(t, mg.Run(m, p))
	var b bytes.Buffer
	mg.WriteStats(&b)
	require.Equal(t, "test-opts: n = 3\ntest-opts: f = 2.5\ntest-opts: s = hi\ntest-opts: b = true\ntest-opts: e = y\ntest-opts: budget = 500\ntest-opts: timeout = 1s\ntest-opts: opt = 0.25\n", b.String())
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
	require.Regexp(t, `^`+regexp.QuoteMeta(dir)+`/kiln-reproducer-test-fail-\d+\.kir$`, pe.Reproducer)
	st, err := os.Stat(pe.Reproducer)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "a reproducer holds the model's weights: its owner's alone")
	b, err := os.ReadFile(pe.Reproducer)
	require.NoError(t, err)
	text := string(b)
	require.Contains(t, text, "// run: kiln opt '"+pe.Reproducer+"' --passes='test-fail,dce'", "the run line names the file by its absolute path")
	pipe, err := ParsePipeline("test-fail", nil)
	require.NoError(t, err)
	err = (&Manager{Inst: Instrumentation{ReproducerDir: dir}}).Run(parse(t, sample), pipe)
	var pe2 *PassError
	require.ErrorAs(t, err, &pe2)
	require.NotEqual(t, pe.Reproducer, pe2.Reproducer, "every failure gets a file of its own")
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

// TestEstablishedIsChecked: under verify-each, a pass that claims to
// establish a property it does not make fails, naming the property.
func TestEstablishedIsChecked(t *testing.T) {
	liar := &Pass{Name: "test-claims-offsets", Summary: "claims arena offsets and makes none", Establishes: []Property{Assigned},
		Run: func(*Context, *ir.Module) error { return nil }}
	m := parse(t, sample)
	err := (&Manager{Inst: Instrumentation{VerifyEach: true}}).Run(m, Pipeline{{Pass: liar}})
	require.ErrorContains(t, err, "it claims to make arena offsets, but @f: %a has no arena offset")
	loss := &Pass{Name: "test-claims-step", Summary: "claims a training step and makes none", Establishes: []Property{TrainingStep},
		Run: func(*Context, *ir.Module) error { return nil }}
	err = (&Manager{Inst: Instrumentation{VerifyEach: true}}).Run(parse(t, sample), Pipeline{{Pass: loss}})
	require.ErrorContains(t, err, "it claims to make a training step, but @f returns no loss")
}

// TestInvalidatedIsCleared: after a pass that undoes arena offsets, none
// is left (nor the arena's size), whatever the pass did with them.
func TestInvalidatedIsCleared(t *testing.T) {
	m := parse(t, `func @f(%x: f32[4]) -> (f32[4]) attributes {alignment = 64, arena = 32} {
  %a = neg(%x) : f32[4] at 0
  %b = neg(%a) : f32[4] at 16
  return %b
}
`)
	undo := &Pass{Name: "test-undoes-offsets", Summary: "moves values", Invalidates: []Property{Assigned},
		Run: func(*Context, *ir.Module) error { return nil }}
	require.NoError(t, (&Manager{Inst: Instrumentation{VerifyEach: true}}).Run(m, Pipeline{{Pass: undo}}))
	require.NotContains(t, m.String(), " at ")
	require.NotContains(t, m.String(), "arena")
}

// TestNeedIsChecked: a pipeline that cannot end with what its consumer
// needs is refused before any pass runs.
func TestNeedIsChecked(t *testing.T) {
	m := parse(t, sample)
	pipe, err := ParsePipeline("dce", nil)
	require.NoError(t, err)
	err = (&Manager{Need: []Property{Assigned}}).Run(m, pipe)
	var ce *ContractError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Msg, "the pipeline must end with arena offsets")
}
