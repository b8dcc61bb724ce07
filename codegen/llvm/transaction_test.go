package llvm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/codegen/llvm"
	"github.com/kiln-compiler/kiln/parser"
)

// harness runs a step library through the C ABI: it sets the state s to
// 1 2 3 4, x to 0 1 2 X (X from the command line) and e, runs once, and
// prints the status, s afterwards, and whether the result is readable.
const harness = `#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "kiln_runtime.h"
int main(int argc, char **argv) {
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	kiln_step *(*create)(int) = dlsym(h, "kiln_create");
	int (*find)(const char *) = dlsym(h, "kiln_find");
	int (*set)(kiln_step *, int, const void *, long long) = dlsym(h, "kiln_set");
	int (*get)(kiln_step *, int, void *, long long) = dlsym(h, "kiln_get");
	int (*run)(kiln_step *) = dlsym(h, "kiln_run");
	kiln_step *s = create(1);
	float st[4] = {1, 2, 3, 4}, x[4] = {0, 1, 2, (float)atof(argv[2])}, e[15], out[4], g[12];
	for (int i = 0; i < 15; i++) e[i] = (float)i;
	set(s, find("s"), st, sizeof st);
	set(s, find("x"), x, sizeof x);
	set(s, find("e"), e, sizeof e);
	int rc = run(s);
	get(s, find("s"), out, sizeof out);
	int readable = get(s, find("result0"), g, sizeof g) == 0;
	printf("%d %g %g %g %g %d\n", rc, out[0], out[1], out[2], out[3], readable);
	return 0;
}
`

// TestFailedRunRestoresArguments: a step that writes its state before an
// index computed after the write is checked backs the state up, and a run
// whose index is out of range returns -1 with the state as it was, its
// result unreadable; an in-range run updates the state (s + x).
func TestFailedRunRestoresArguments(t *testing.T) {
	requireClang(t)
	m, err := parser.Parse("t.kir", `func @f(%s: f32[4] {state, inout}, %x: f32[4], %e: f32[5,3]) -> (f32[4,3]) {
  %n = add(%s, %x) : f32[4]
  overwrite(%s, %n)
  %i = cast(%x) {to = i64} : i64[4]
  %g = gather(%e, %i) : f32[4,3]
  return %g
}
`)
	require.NoError(t, err)
	pipelineOn(t, m, "assign")
	p, err := llvm.Lower(m.Funcs[0])
	require.NoError(t, err)
	require.NotEmpty(t, p.Restore, "the state is backed up")
	lib, err := llvm.Build(p, "lib", llvm.Options{})
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "step.so"), lib, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kiln_runtime.h"), []byte(llvm.RuntimeHeader), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "harness.c"), []byte(harness), 0o644))
	clang, err := llvm.Clang()
	require.NoError(t, err)
	bin := filepath.Join(dir, "harness")
	out, err := exec.Command(clang, "-o", bin, filepath.Join(dir, "harness.c"), "-ldl").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, c := range []struct{ x, want string }{
		{"3", "0 1 3 5 7 1"},  // index 3 in range: s + x, the result readable
		{"7", "-1 1 2 3 4 0"}, // index 7 of 5: nothing changed, no result
		{"-1", "0 1 3 5 3 1"}, // -1 counts from the end (gather's negative)
		{"-6", "-1 1 2 3 4 0"},
	} {
		got, err := exec.Command(bin, filepath.Join(dir, "step.so"), c.x).CombinedOutput()
		require.NoError(t, err, "%s", got)
		require.Equal(t, c.want, strings.TrimSpace(string(got)), "x[3] = %s", c.x)
	}
}
