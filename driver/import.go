package driver

import (
	"flag"
	"fmt"
	"strings"

	"github.com/kiln-compiler/kiln/onnx"
)

func init() {
	addCommand(&command{
		name:    "import",
		usage:   "kiln import MODEL.onnx|- [-o OUT.kir] [--batch N] [--data-inputs a,b]",
		summary: "convert an ONNX model to Kiln IR",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			out := fs.String("o", "-", "output file (- for standard output)")
			batch := fs.Int64("batch", 0, "replace the first dimension of the data inputs")
			dataInputs := fs.String("data-inputs", "", "comma-separated graph inputs that are data (default: the first input)")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usageError{"want exactly one ONNX model (or - for standard input)"}
				}
				if *batch < 0 {
					return usageError{fmt.Sprintf("--batch must be positive (0 keeps the model's), not %d", *batch)}
				}
				opt := onnx.Options{Batch: *batch}
				for _, d := range strings.Split(*dataInputs, ",") {
					if d = strings.TrimSpace(d); d != "" {
						opt.DataInputs = append(opt.DataInputs, d)
					}
				}
				in, err := readModule(e, args[0], opt)
				if err != nil {
					return err
				}
				return writeOutput(e, *out, []byte(in.module.String()))
			}
		},
	})
}
