// Package passtest is the translation-validation helper every pass's tests
// use: it runs a function before and after a pipeline with the reference
// interpreter on seeded random inputs and compares all outputs.
package passtest

import (
	"math"
	"os"
	"testing"

	"github.com/kiln-compiler/kiln/codegen/loops"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes"
)

// LoadNpy reads the .npy file at path; any error fails the test.
func LoadNpy(t testing.TB, path string) *interp.Tensor {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	x, err := npy.Read(fh)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return x
}

// RelErr is the relative error ‖a − b‖ / ‖b‖ over whole tensors (the
// design notes' definition); two all-zero tensors have error 0.
func RelErr(a, b *interp.Tensor) float64 {
	num, den := 0.0, 0.0
	for i := 0; i < b.Len(); i++ {
		if math.IsNaN(a.At(i)) && math.IsNaN(b.At(i)) {
			continue // NaN in both places agrees
		}
		d := a.At(i) - b.At(i)
		num += d * d
		den += b.At(i) * b.At(i)
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// Equivalent runs before and after (which must have the same arguments
// and results) on inputs drawn from each seed and fails the test when an
// output differs by more than tol in relative error (0: bit for bit).
func Equivalent(t testing.TB, before, after *ir.Func, tol float64, seeds ...uint64) {
	t.Helper()
	if len(seeds) == 0 {
		seeds = []uint64{1, 2}
	}
	if len(before.Args) != len(after.Args) || len(before.Results) != len(after.Results) {
		t.Fatalf("signatures differ: %d/%d arguments, %d/%d results", len(before.Args), len(after.Args), len(before.Results), len(after.Results))
	}
	for _, seed := range seeds {
		args := interp.RandomArgs(before, seed)
		// Each run gets its own arguments: in-place updates (an optimizer
		// step) write them, and their new values are compared too.
		wantArgs, gotArgs := interp.CloneAll(args), interp.CloneAll(args)
		want, err := interp.Run(before, wantArgs, interp.Options{})
		if err != nil {
			t.Fatalf("before: %v", err)
		}
		got, err := interp.Run(after, gotArgs, interp.Options{})
		if err != nil {
			t.Fatalf("after: %v", err)
		}
		names := make([]string, len(want))
		for i := range want {
			names[i] = "result " + before.ResultName(i)
		}
		for i, a := range before.Args {
			if a.Arg.InOut {
				want, got = append(want, wantArgs[i]), append(got, gotArgs[i])
				names = append(names, "updated argument "+a.Ref())
			}
		}
		for i := range want {
			name := names[i]
			if !got[i].Type.Equal(want[i].Type) {
				t.Fatalf("seed %d: %s has type %s, want %s", seed, name, got[i].Type, want[i].Type)
			}
			if tol == 0 {
				for j := 0; j < want[i].Len(); j++ {
					a, b := got[i].At(j), want[i].At(j)
					if math.Float64bits(a) != math.Float64bits(b) && !(math.IsNaN(a) && math.IsNaN(b)) {
						t.Fatalf("seed %d: %s[%d] = %v, want exactly %v", seed, name, j, a, b)
					}
				}
				continue
			}
			if e := RelErr(got[i], want[i]); e > tol || math.IsNaN(e) {
				t.Fatalf("seed %d: %s differs: relative error %g > %g", seed, name, e, tol)
			}
		}
	}
}

// Parse reads and verifies a module, failing the test on error.
func Parse(t testing.TB, src string) *ir.Module {
	t.Helper()
	m, err := parser.Parse("test.kir", src)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if err := ir.Verify(m); err != nil {
		t.Fatalf("verify: %v", err)
	}
	return m
}

// Clone copies a module through its text form.
func Clone(t testing.TB, m *ir.Module) *ir.Module {
	t.Helper()
	return Parse(t, m.String())
}

// Run runs pipeline on m, verifying the module after each pass; any
// error fails the test.
func Run(t testing.TB, m *ir.Module, pipeline string) {
	t.Helper()
	if err := RunErr(m, pipeline); err != nil {
		t.Fatal(err)
	}
}

// RunErr runs pipeline on m, verifying the module after each pass, and
// returns its error. The passes may make the approximations allow names.
func RunErr(m *ir.Module, pipeline string, allow ...string) error {
	pipe, err := passes.ParsePipeline(pipeline, nil)
	if err != nil {
		return err
	}
	return (&passes.Manager{Inst: passes.Instrumentation{VerifyEach: true}, Allow: allow, Workspace: loops.Workspace}).Run(m, pipe)
}

// RunAllowing is Run letting the passes make the approximations allow
// names.
func RunAllowing(t testing.TB, m *ir.Module, pipeline string, allow ...string) {
	t.Helper()
	if err := RunErr(m, pipeline, allow...); err != nil {
		t.Fatal(err)
	}
}

// CheckPipeline runs pipeline on src (with verification after each pass)
// and checks every function against its original with Equivalent. It
// returns the rewritten module.
func CheckPipeline(t testing.TB, src, pipeline string, tol float64) *ir.Module {
	t.Helper()
	before := Parse(t, src)
	after := Clone(t, before)
	Run(t, after, pipeline)
	for i := range before.Funcs {
		Equivalent(t, before.Funcs[i], after.Funcs[i], tol)
	}
	return after
}

// ReadFile returns the text of a test's data file, and panics when it
// cannot (package-level tables of test models read them).
func ReadFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
}
