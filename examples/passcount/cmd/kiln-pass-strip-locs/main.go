// Command kiln-pass-strip-locs is an executable Kiln pass written in Go:
// it reads a module on standard input, removes every source location (or,
// with --keep=NAME, every location whose file is not NAME) and prints the
// module on standard output.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

func main() {
	keep := flag.String("keep", "", "keep locations from this file")
	flag.Parse()
	src, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	m, err := parser.Parse("<stdin>", string(src))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, f := range m.Funcs {
		f.Walk(func(op *ir.Op) {
			if *keep == "" || op.Loc.File != *keep {
				op.Loc = ir.Location{}
			}
		})
	}
	fmt.Print(m)
}
