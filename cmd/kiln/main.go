// Command kiln is the Kiln compiler's command line; see `kiln help`.
package main

import (
	"os"

	"github.com/kiln-compiler/kiln/driver"
)

func main() { os.Exit(driver.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
