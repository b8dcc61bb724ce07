package llvm_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/cuda"
	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passtest"
)

// hostileNames try to end a comment, start a directive, break a string,
// splice lines (a trailing backslash, the ??/ trigraph) or carry bytes
// that are not UTF-8.
var hostileNames = []string{
	"x */\n#define free(p) exit(1)\n/*",
	"f)\n#include \"/etc/hostname\"\n//",
	`quote"s`, `back\slash\`, "??/", "??=define X", "\xff\xfe\x80", "tab\tand\rreturn",
	"-dash", ".dot", "%per%cent", "/* open", "*/ close", "new\nline", "$dollar", "é ü",
}

// TestHostileNamesCompile: a function, its arguments and its results
// named with every hostile name compile with -Werror as an executable, a
// C header, CUDA kernels and a launch plan, and the names come back intact
// in the plan and the printed module.
func TestHostileNamesCompile(t *testing.T) {
	clang, err := llvm.Clang()
	if err != nil {
		passtest.Missing(t, "%v", err)
	}
	for i, fname := range hostileNames {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			f := &ir.Func{Name: fname}
			var prev *ir.Value
			for j, n := range hostileNames {
				a := &ir.Value{Name: n, Type: ir.TensorOf(ir.F32, 4), Index: j, Arg: &ir.ArgInfo{}, Offset: ir.NoOffset}
				if j%2 == 1 {
					a.Arg.Kind = ir.ArgParam
				}
				f.Args = append(f.Args, a)
				if prev == nil {
					prev = a
					continue
				}
				op, err := f.NewOp("add", []*ir.Value{prev, a}, nil, ir.Location{}, "sum")
				require.NoError(t, err)
				f.Body = append(f.Body, op)
				prev = op.Results[0]
				f.Results = append(f.Results, ir.Result{Name: "r" + n, Value: prev})
			}
			m := &ir.Module{Funcs: []*ir.Func{f}}
			require.NoError(t, ir.Verify(m))
			back, err := parser.Parse("m.kir", m.String())
			require.NoError(t, err, "the printed module reads back")
			require.Equal(t, m.String(), back.String())
			pipelineOn(t, m, "assign")
			p, err := llvm.Lower(f)
			require.NoError(t, err)

			// The executable build (clang on driver.c and the module) takes
			// a second; -short builds it for the first name, which holds
			// every hostile name among its arguments and results.
			if !testing.Short() || i == 0 {
				exe, err := llvm.Build(p, "exe", llvm.Options{})
				require.NoError(t, err, "the executable (driver.c and the LLVM module) compiles with -Werror")
				bin := filepath.Join(t.TempDir(), "step")
				require.NoError(t, os.WriteFile(bin, exe, 0o755))
				help, err := exec.Command(bin, "--help").Output()
				require.NoError(t, err)
				for _, line := range strings.Split(strings.TrimRight(string(help), "\n"), "\n") {
					require.False(t, strings.ContainsFunc(line, func(r rune) bool { return r < 0x20 }), "--help shows a control character of a name: %q", line)
				}
				require.Contains(t, string(help), "new?line", "a name's newline shows as '?'")
			}

			dir := t.TempDir()
			header := llvm.Header(p)
			for _, line := range strings.Split(header, "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "#") {
					require.Regexp(t, `^#(ifndef|define|ifdef|endif|if|else)\b`, line, "a directive in the header")
					require.NotContains(t, line, "free")
					require.NotContains(t, line, "include")
				}
			}
			h := filepath.Join(dir, "prog.h")
			require.NoError(t, os.WriteFile(h, []byte(header), 0o644))
			out, err := exec.Command(clang, "-x", "c", "-fsyntax-only", "-Werror", "-Wall", "-Wextra", "-Wtrigraphs", "-Wcomment", h).CombinedOutput()
			require.NoError(t, err, "the header: %s", out)

			plan, err := cuda.Lower(f, costmodel.Default)
			require.NoError(t, err)
			require.NoError(t, cuda.Write(dir, plan, m, nil, nil))
			out, err = exec.Command(clang, "-x", "cuda", "-nocudainc", "-nocudalib", "--cuda-gpu-arch="+cuda.Arch, "-fsyntax-only",
				"-Werror", "-Wtrigraphs", "-Wcomment", "-Wno-unknown-cuda-version", filepath.Join(dir, "kernels.cu")).CombinedOutput()
			require.NoError(t, err, "kernels.cu: %s", out)
			raw, err := os.ReadFile(filepath.Join(dir, "plan.json"))
			require.NoError(t, err)
			var decoded struct {
				Inputs []struct{ Name string } `json:"inputs"`
			}
			require.NoError(t, json.Unmarshal(raw, &decoded))
		})
	}
}
