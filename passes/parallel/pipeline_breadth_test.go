package parallel_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/passes/microbatch"
	"github.com/kiln-compiler/kiln/passes/parallel"
	"github.com/kiln-compiler/kiln/passtest"
)

// TestPipelineOnTheBreadthZoo: every model of the breadth zoo (CNNs,
// RNNs, transformers, gathers and scatters, dynamic shapes) as a training
// step with momentum, in 2 stages of 1 and 2 microbatches, equals the
// one-device step split into the same microbatches, exactly (the four
// steps microbatch refuses, the pipeline refuses with its error).
func TestPipelineOnTheBreadthZoo(t *testing.T) {
	dir := "../../testdata/models/breadth"
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	for _, e := range entries {
		for _, m := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/m=%d", e.Name(), m), func(t *testing.T) {
				opt := onnx.Options{}
				if strings.HasSuffix(e.Name(), "_dynamic") {
					opt.Batch = 2 // as the breadth benchmark binds it
				}
				mod, err := onnx.ImportFile(dir+"/"+e.Name()+"/model.onnx", opt)
				require.NoError(t, err)
				passtest.Run(t, mod, "autodiff{loss=sum},optimizer{kind=momentum}")
				ref := passtest.Clone(t, mod).Funcs[0]
				if m > 1 {
					if _, err := microbatch.Split(ref, m); err != nil {
						// A step the microbatch pass refuses (a batch in
						// another dimension, as the RNNs') the pipeline
						// refuses alike.
						_, _, perr := parallel.PipelinePlan(mod.Funcs[0], parallel.Plan{DP: 1, PP: 2, Microbatches: m})
						why := err.Error()[strings.Index(err.Error(), "microbatch: "):] // the reparsed reference names its lines
						require.ErrorContains(t, perr, why)
						return
					}
				}
				pipelineEquals(t, mod.Funcs[0], ref, parallel.Plan{DP: 1, PP: 2, Microbatches: m}, 0)
			})
		}
	}
}
