// Command kiln is the Kiln compiler's command line; see `kiln help`.
package main

import "github.com/kiln-compiler/kiln/driver"

func main() { driver.Run() }
