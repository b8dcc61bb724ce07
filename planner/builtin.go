package planner

// The passes built into kiln register themselves when imported: every
// -O level and toolbox step the planner builds names them.
import (
	_ "github.com/kiln-compiler/kiln/passes/assign"
	_ "github.com/kiln-compiler/kiln/passes/autodiff"
	_ "github.com/kiln-compiler/kiln/passes/fuse"
	_ "github.com/kiln-compiler/kiln/passes/microbatch"
	_ "github.com/kiln-compiler/kiln/passes/optimizer"
	_ "github.com/kiln-compiler/kiln/passes/parallel"
	_ "github.com/kiln-compiler/kiln/passes/precision"
	_ "github.com/kiln-compiler/kiln/passes/remat"
	_ "github.com/kiln-compiler/kiln/passes/reorder"
	_ "github.com/kiln-compiler/kiln/passes/swap"
)
