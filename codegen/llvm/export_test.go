package llvm

import "github.com/kiln-compiler/kiln/codegen/loops"

// SplitText is the modules Build compiles p's kernels as.
func SplitText(p *loops.Program, opt Options) ([]string, error) {
	m, err := Emit(p, opt)
	if err != nil {
		return nil, err
	}
	return splitModule(m, opt), nil
}
