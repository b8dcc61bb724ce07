// Command soplugin is a Kiln pass built as a shared object:
//
//	go build -buildmode=plugin -o countkinds.so ./examples/soplugin
//	kiln opt in.kir --load-pass-plugin countkinds.so --passes=count-kinds --stats
//
// Its init function registers the pass when kiln loads it. A plugin needs
// the same Go version and module versions as the kiln that loads it.
package main

import (
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes"
)

func init() {
	passes.MustRegister(&passes.Pass{
		Name:    "count-kinds",
		Summary: "count the distinct op kinds (an example shared-object plugin)",
		Run: func(ctx *passes.Context, m *ir.Module) error {
			kinds := map[string]bool{}
			for _, f := range m.Funcs {
				f.Walk(func(op *ir.Op) { kinds[op.Kind] = true })
			}
			ctx.Stat("kinds", int64(len(kinds)))
			return nil
		},
	})
}

// main is unused: the package is built with -buildmode=plugin.
func main() {}
