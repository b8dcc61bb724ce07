package parser

import (
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/golden"
	"github.com/kiln-compiler/kiln/ir"
)

// kirSources returns every .kir file in the repository and every valid
// .kir input inside a golden case, keyed by a readable name.
func kirSources(t *testing.T) map[string]string {
	out := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		switch {
		case strings.HasSuffix(path, ".kir"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out[path] = string(b)
		case strings.HasSuffix(path, ".txtar"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, f := range golden.Parse(b).Files {
				if strings.HasSuffix(f.Name, ".kir") || f.Name == "stdout" && strings.HasPrefix(string(f.Data), "func ") {
					out[path+"#"+f.Name] = string(f.Data)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// TestRoundTrip: every valid module prints to a canonical text that parses
// back to an equal module and prints to the same bytes.
func TestRoundTrip(t *testing.T) {
	srcs := kirSources(t)
	require.Greater(t, len(srcs), 20)
	valid := 0
	for name, src := range srcs {
		m, err := Parse(name, src)
		if err != nil || ir.Verify(m) != nil {
			continue // diagnostics cases
		}
		valid++
		text := m.String()
		m2, err := Parse(name, text)
		require.NoError(t, err, "%s: printed text does not parse:\n%s", name, text)
		require.Empty(t, ir.Diff(m, m2), "%s: parse(print(m)) differs from m", name)
		require.Equal(t, text, m2.String(), "%s: printing is not stable", name)
	}
	require.Greater(t, valid, 20)
}

// TestCanonicalFilesAreCanonical: the standalone .kir files are written in
// canonical form, so printing them reproduces them byte for byte.
func TestCanonicalFilesAreCanonical(t *testing.T) {
	for name, src := range kirSources(t) {
		if strings.Contains(name, "#") {
			continue
		}
		m, err := Parse(name, src)
		require.NoError(t, err, name)
		require.NoError(t, ir.Verify(m), name)
		canon := m.String()
		// A leading comment block is not part of the module.
		body := src
		for strings.HasPrefix(body, "//") {
			body = body[strings.IndexByte(body, '\n')+1:]
		}
		require.Equal(t, body, canon, "%s is not canonical", name)
	}
}

// randomModule builds a valid module exercising every printable feature:
// quoted names, named results, argument kinds and initial values, every
// attribute kind, locations, offsets and regions.
func randomModule(r *rand.Rand) *ir.Module {
	m := &ir.Module{}
	for fi := 0; fi < 1+r.Intn(3); fi++ {
		f := &ir.Func{Name: pick(r, "f", "main", "a/b c", "train.step") + string(rune('0'+fi))}
		shape := ir.Shape{int64(1 + r.Intn(3)), int64(1 + r.Intn(4))}
		dt := []ir.DType{ir.F32, ir.F64, ir.F16, ir.BF16}[r.Intn(4)]
		ty := ir.Type{DType: dt, Shape: shape}
		var vals []*ir.Value
		for ai := 0; ai < 1+r.Intn(3); ai++ {
			a := &ir.Value{Name: pick(r, "x", "w", "/conv1/Conv_output_0", "onnx::Gemm_12", "9") + string(rune('a'+ai)), Type: ty, Index: ai, Arg: &ir.ArgInfo{Kind: ir.ArgKind(r.Intn(3))}, Offset: ir.NoOffset}
			if r.Intn(3) == 0 {
				d := &ir.Dense{Type: ty}
				n := ty.NumElements()
				if r.Intn(2) == 0 {
					n = 1
				}
				for i := int64(0); i < n; i++ {
					d.Floats = append(d.Floats, ir.RoundTo(dt, r.NormFloat64()*1e3))
				}
				a.Arg.Init = d
			}
			if r.Intn(4) == 0 {
				a.Arg.Attrs = ir.Attrs{"user.tag": ir.StringAttr("a \"quoted\" tag")}
			}
			f.Args = append(f.Args, a)
			vals = append(vals, a)
		}
		for oi := 0; oi < r.Intn(8); oi++ {
			x := vals[r.Intn(len(vals))]
			y := vals[r.Intn(len(vals))]
			var op *ir.Op
			var err error
			loc := []ir.Location{{}, {File: "m.onnx", Name: "/layer/Add"}, {File: "m.py", Line: 3, Col: 7},
				{Name: "just a name"}, {Fused: []ir.Location{{File: "a", Name: "b"}, {File: "c", Line: 1, Col: 2}}}}[r.Intn(5)]
			switch r.Intn(5) {
			case 0:
				op, err = f.NewOp(pick(r, "add", "mul", "max"), []*ir.Value{x, y}, nil, loc, pick(r, "t", "out/x", "%"))
			case 1:
				op, err = f.NewOp("relu", []*ir.Value{x}, ir.Attrs{"remat": ir.StringAttr("never"), "user.n": ir.IntAttr(-3),
					"user.f": ir.FloatAttr([]float64{0.1, 1e-300, math.Inf(-1), 2, -0.0}[r.Intn(5)]),
					"user.l": {Kind: ir.AttrList, List: []ir.Attr{ir.IntAttr(1), ir.BoolAttr(true), ir.TypeAttr(ir.I8)}}}, loc, "r")
			case 2:
				c := &ir.Dense{Type: ty}
				for i := int64(0); i < ty.NumElements(); i++ {
					c.Floats = append(c.Floats, ir.RoundTo(dt, r.Float64()))
				}
				op, err = f.NewOp("constant", nil, ir.Attrs{"value": ir.DenseAttr(c)}, loc, "c")
			case 3:
				op, err = f.NewOp("reduce_sum", []*ir.Value{x}, ir.Attrs{"axes": ir.IntsAttr(1), "keepdims": ir.BoolAttr(true)}, loc, "s")
				if err == nil {
					op2, err2 := f.NewOp("add", []*ir.Value{x, op.Results[0]}, nil, loc, "b")
					if err2 != nil {
						panic(err2)
					}
					f.Body = append(f.Body, op)
					op = op2
				}
			case 4:
				p0 := &ir.Value{Name: f.UniqueName("p"), Type: ty, Offset: ir.NoOffset}
				p1 := &ir.Value{Name: f.UniqueName("p"), Type: ty, Index: 1, Offset: ir.NoOffset}
				inner, err2 := f.NewOp("add", []*ir.Value{p0, p1}, nil, loc, "in")
				if err2 != nil {
					panic(err2)
				}
				op = &ir.Op{Kind: "kernel", Operands: []*ir.Value{x, y}, Attrs: ir.Attrs{"name": ir.StringAttr("k")},
					Region: &ir.Region{Args: []*ir.Value{p0, p1}, Body: []*ir.Op{inner}, Yield: inner.Results}}
				op.Results = []*ir.Value{{Name: f.UniqueName("k"), Type: ty, Def: op, Offset: ir.NoOffset}}
			}
			if err != nil {
				panic(err)
			}
			for _, res := range op.Results {
				if r.Intn(3) == 0 {
					res.Offset = int64(64 * r.Intn(100))
				}
			}
			f.Body = append(f.Body, op)
			vals = append(vals, op.Results...)
		}
		named := map[string]bool{}
		for ri := 0; ri < 1+r.Intn(2); ri++ {
			name := pick(r, "", "loss", "grad.w", "out put")
			if named[name] {
				name = "" // two results may not share a name
			}
			named[name] = name != ""
			f.Results = append(f.Results, ir.Result{Name: name, Value: vals[r.Intn(len(vals))]})
		}
		if r.Intn(2) == 0 {
			f.Attrs = ir.Attrs{"arena": ir.IntAttr(4096), "alignment": ir.IntAttr(64)}
		}
		m.Funcs = append(m.Funcs, f)
	}
	return m
}

func pick(r *rand.Rand, xs ...string) string { return xs[r.Intn(len(xs))] }

// TestRandomRoundTrip: for random valid modules m, parse(print(m)) equals m.
func TestRandomRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 500; i++ {
		m := randomModule(r)
		require.NoError(t, ir.Verify(m), "generator made an invalid module:\n%s", m)
		text := m.String()
		m2, err := Parse("random.kir", text)
		require.NoError(t, err, text)
		require.Empty(t, ir.Diff(m, m2), text)
		require.Equal(t, text, m2.String())
	}
}

// TestAnyNameRoundTrips: every name an imported model can carry (ONNX
// names are arbitrary strings: "3", "onnx::Add_12", "a-b", "$x", quotes,
// newlines, non-UTF-8 bytes) prints in a form the parser reads back to the
// same name, for functions, arguments, values and named results.
func TestAnyNameRoundTrips(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	alphabet := []string{"a", "Z", "_", "0", "9", ".", "-", "$", ":", "/", " ", "\"", "\\", "\n", "\t", "%", "@", "{", "}", "*/", "??/", "é", "\xff", "\x00", "func", "return"}
	name := func() string {
		var b strings.Builder
		for n := 1 + rng.Intn(6); n > 0; n-- {
			b.WriteString(alphabet[rng.Intn(len(alphabet))])
		}
		return b.String()
	}
	fixed := []string{"3", "978", "onnx::Add_12", "a-b", "$x", "-1", ".5", "1e3", "func", "return", "yield"}
	for i := 0; i < 2000; i++ {
		names := make([]string, 4)
		for j := range names {
			names[j] = name()
			if i < len(fixed) {
				names[j] = fixed[i] + names[j][:0]
			}
		}
		if names[1] == names[2] {
			names[2] += "b"
		}
		f := &ir.Func{Name: names[0]}
		x := &ir.Value{Name: names[1], Type: ir.TensorOf(ir.F32, 2), Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
		f.Args = []*ir.Value{x}
		op, err := f.NewOp("relu", []*ir.Value{x}, nil, ir.Location{}, names[2])
		require.NoError(t, err)
		f.Body = []*ir.Op{op}
		f.Results = []ir.Result{{Name: names[3], Value: op.Results[0]}}
		m := &ir.Module{Funcs: []*ir.Func{f}}
		text := m.String()
		back, err := Parse("names.kir", text)
		require.NoError(t, err, "names %q print as:\n%s", names, text)
		g := back.Funcs[0]
		require.Equal(t, names[0], g.Name, text)
		require.Equal(t, names[1], g.Args[0].Name, text)
		require.Equal(t, op.Results[0].Name, g.Body[0].Results[0].Name, text)
		require.Equal(t, names[3], g.Results[0].Name, text)
		require.Equal(t, text, back.String())
	}
}

// TestBoolConstantsKeepTheirValues: bool constants, listed and splat,
// parse to the values they print (true was read as false, so every
// printed and reparsed mask inverted or cleared).
func TestBoolConstantsKeepTheirValues(t *testing.T) {
	src := `func @f() -> (bool[4], bool[2,3], bool[2]) {
  %a = constant() {value = dense<bool[4]: [true, false, true, true]>} : bool[4]
  %b = constant() {value = dense<bool[2,3]: true>} : bool[2,3]
  %c = constant() {value = dense<bool[2]: [1, 0]>} : bool[2]
  return %a, %b, %c
}
`
	m, err := Parse("b.kir", src)
	require.NoError(t, err)
	want := map[string][]int64{"a": {1, 0, 1, 1}, "b": {1}, "c": {1, 0}}
	for _, op := range m.Funcs[0].Body {
		require.Equal(t, want[op.Results[0].Name], op.Attrs["value"].Dense.Ints, op.Results[0].Name)
	}
	require.Equal(t, strings.Replace(src, "[1, 0]", "[true, false]", 1), m.String(), "printed canonically")
}
