package passes

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// seen records the liveness each test-look pass was handed.
var seen []*liveness.Info

func init() {
	look := func(ctx *Context, m *ir.Module) error {
		seen = append(seen, ctx.Liveness(m.Funcs[0]))
		return nil
	}
	MustRegister(&Pass{Name: "test-look", Summary: "reads liveness, changes nothing", Preserves: []Analysis{Liveness}, Run: look})
	MustRegister(&Pass{Name: "test-look-undeclared", Summary: "reads liveness, declares nothing", Run: look})
	// test-lie drops the last op's use of %a and claims liveness holds.
	MustRegister(&Pass{Name: "test-lie", Summary: "changes liveness, claims it does not", Preserves: []Analysis{Liveness}, Run: func(ctx *Context, m *ir.Module) error {
		f := m.Funcs[0]
		ctx.Liveness(f)
		last := f.Body[len(f.Body)-1]
		last.Operands[0] = last.Operands[1]
		return nil
	}})
}

// TestAnalysesCachedWhilePreserved: a pass that preserves liveness hands
// the next one the same result; one that does not declare it makes the
// next compute afresh; a pass that claims to preserve it and does not is
// caught under verify-each.
func TestAnalysesCachedWhilePreserved(t *testing.T) {
	seen = nil
	m := parse(t, sample)
	pipe, err := ParsePipeline("test-look,test-look,test-look-undeclared,test-look", nil)
	require.NoError(t, err)
	mg := &Manager{Inst: Instrumentation{VerifyEach: true}}
	require.NoError(t, mg.Run(m, pipe))
	require.Len(t, seen, 4)
	require.Same(t, seen[0], seen[1], "kept across a pass that preserves it")
	require.Same(t, seen[1], seen[2], "still valid as the undeclared pass starts")
	require.NotSame(t, seen[2], seen[3], "dropped after a pass that does not declare it")
	require.Equal(t, seen[0].Peak, seen[3].Peak)
	require.Same(t, seen[3], mg.Analyses.Liveness(m.Funcs[0]), "the manager hands on what the last pass left")

	m = parse(t, sample)
	pipe, err = ParsePipeline("test-lie", nil)
	require.NoError(t, err)
	err = (&Manager{Inst: Instrumentation{VerifyEach: true}}).Run(m, pipe)
	require.ErrorContains(t, err, "claims to preserve liveness")
}
