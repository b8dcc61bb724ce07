package parser

import (
	"testing"

	"github.com/kiln-compiler/kiln/ir"
)

// FuzzParseVerify: no input makes parsing or verification panic, and any
// input that parses and verifies prints to text that parses back to the
// same module.
func FuzzParseVerify(f *testing.F) {
	f.Add("func @f(%x: f32[4]) -> (f32[4]) {\n  return %x\n}\n")
	f.Add("func @f(%x: f32[2,2] {param, init = dense<f32[2,2]: 0x0000803f000000400000404000008040>}) -> (y: f32[2,2]) {\n  %k = kernel(%x) : f32[2,2] at 64 loc(fused[\"a\":\"b\", \"c\":1:2]) region(%p: f32[2,2]) {\n    %q = relu(%p) : f32[2,2]\n    yield %q\n  }\n  return %k\n}\n")
	f.Add("func @f(%x: f32[2]) -> (f32[2]) {\n  %y = relu(%x) : f32[2] loc(fused[\"\":1:2, \"\":0:3, \"f\":0:0])\n  return %y\n}\n")
	for _, src := range seedSources() {
		f.Add(src)
	}
	f.Fuzz(func(t *testing.T, src string) {
		m, err := Parse("fuzz.kir", src)
		if verr := ir.Verify(m); err != nil || verr != nil {
			return
		}
		text := m.String()
		m2, err := Parse("fuzz.kir", text)
		if err != nil {
			t.Fatalf("printed module does not parse: %v\n%s", err, text)
		}
		if d := ir.Diff(m, m2); d != "" {
			t.Fatalf("round trip changed the module: %s\n%s", d, text)
		}
	})
}
