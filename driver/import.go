package driver

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-compiler/kiln/onnx"
)

func init() {
	addCommand(&command{
		name:    "import",
		usage:   "kiln import MODEL.onnx|- [-o OUT.kir] [--batch N] [--data-inputs a,b] [--trainable-file F] [--eval]",
		summary: "convert an ONNX model to Kiln IR",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			out := fs.String("o", "-", "output file (- for standard output)")
			batch := fs.Int64("batch", 0, "replace the first dimension of the data inputs")
			dataInputs := fs.String("data-inputs", "", "comma-separated graph inputs that are data (default: the first input)")
			trainable := fs.String("trainable-file", "", "a file naming, one per line, the float initializers and inputs that are parameters, each optionally followed by a tab and its optimizer parameter group (a number: the optimizer's groups option); the others become state (default: all are parameters, in group 0)")
			runningVar := fs.String("running-var", "", runningVarHelp)
			eval := fs.Bool("eval", false, "read a graph exported in training mode as its module's eval mode: batch norms use their running statistics, dropout is off (the parameters keep their names; an export in eval mode folds batch norms away)")
			var inputs inputFlags
			fs.Var(&inputs, "input", "NAME=FILE.npy: the value of a graph input that a node needs when the model is imported, such as a Reduce's axes; the graph is specialised to it (repeatable)")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usageError{"want exactly one ONNX model (or - for standard input)"}
				}
				if *batch < 0 {
					return usageError{fmt.Sprintf("--batch must be positive (0 keeps the model's), not %d", *batch)}
				}
				if err := checkRunningVar(*runningVar); err != nil {
					return err
				}
				values, err := importValues(e, inputs)
				if err != nil {
					return err
				}
				opt := onnx.Options{Batch: *batch, RunningVar: *runningVar, Value: values, Eval: *eval}
				for _, d := range strings.Split(*dataInputs, ",") {
					if d = strings.TrimSpace(d); d != "" {
						opt.DataInputs = append(opt.DataInputs, d)
					}
				}
				if *trainable != "" {
					b, err := os.ReadFile(*trainable)
					if err != nil {
						return err
					}
					if opt.Trainable, opt.Groups, err = parseTrainable(*trainable, string(b)); err != nil {
						return err
					}
				}
				in, err := readModule(e, args[0], opt)
				if err != nil {
					return err
				}
				for _, spec := range inputs {
					if name, _, _ := strings.Cut(spec, "="); !slices.Contains(in.bound, name) {
						return fmt.Errorf("kiln: --input %s: no node of the model needs it when the model is imported", name)
					}
				}
				return writeOutput(e, *out, []byte(in.module.String()))
			}
		},
	})
}

// parseTrainable reads a --trainable-file: one parameter per line, NAME or
// NAME, a tab and its parameter group (0 when not given).
func parseTrainable(path, text string) ([]string, map[string]int64, error) {
	names, groups := []string{}, map[string]int64{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, "\r")
		name, group, grouped := strings.Cut(line, "\t")
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		names = append(names, name)
		if grouped {
			k, err := strconv.ParseInt(strings.TrimSpace(group), 10, 64)
			if err != nil || k < 0 {
				return nil, nil, fmt.Errorf("%s:%d:%d: error: parameter %s's group is %q, not a number at least 0", path, i+1, len(name)+2, name, group)
			}
			groups[name] = k
		}
	}
	return names, groups, nil
}
