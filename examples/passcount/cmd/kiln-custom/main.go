// Command kiln-custom is kiln with the count-ops pass built in.
package main

import (
	_ "example.com/passcount/opcount"

	"github.com/kiln-compiler/kiln/driver"
)

func main() { driver.Run() }
