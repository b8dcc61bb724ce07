package reorder

import (
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/passes/autodiff"
)

func autodiffForTest(f *ir.Func) error {
	_, err := autodiff.Differentiate(f, "sum", false)
	return err
}
