package driver

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"github.com/kiln-compiler/kiln/scratch"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/interp"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/npy"
	"github.com/kiln-compiler/kiln/onnx"
	"github.com/kiln-compiler/kiln/outfile"
	"github.com/kiln-compiler/kiln/parser"
	"github.com/kiln-compiler/kiln/passes"
)

// Version is the kiln release.
const Version = "0.1.0-dev"

// env is one invocation's standard streams.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer // control characters shown as '?' (see printable)
	// terminal is the stderr the caller gave, for the progress line's
	// own escape sequences.
	terminal io.Writer
	// files are the files the command reads and writes: no output
	// replaces an input, and no file is written twice.
	files *outfile.Guard
}

type command struct {
	name    string
	usage   string // the synopsis line
	summary string
	// flags declares the command's flags on fs and returns the function
	// that runs it with the positional arguments.
	flags func(fs *flag.FlagSet) func(e *env, args []string) error
}

var commands []*command

func addCommand(c *command) { commands = append(commands, c) }

// exitError carries an exit status with an already printed message.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// usageError is a misuse of the command line (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// Run is the whole kiln program: a main function that only calls Run
// builds a kiln (with whatever passes its imports register).
//
// SIGINT, SIGTERM and SIGHUP end it at once with status 128 plus the
// signal's number, as a shell reports a process the signal killed, after
// ending the programs it runs and removing its temporary files
// (package scratch).
func Run() {
	scratch.AdoptOrphans()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		scratch.Interrupt()
		fmt.Fprintf(os.Stderr, "kiln: %v: stopped (the programs it ran ended, its temporary files removed)\n", s)
		code := 1
		if n, ok := s.(syscall.Signal); ok {
			code = 128 + int(n)
		}
		os.Exit(code)
	}()
	os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// Main runs the kiln command with the given arguments (without the
// program name) and returns the exit status: 0 on success, 1 on an error
// in the input or a failing pass, 2 on a misuse of the command line.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) (code int) {
	terminal := stderr
	stderr = printable{stderr}
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, terminal: terminal, files: &outfile.Guard{}}
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "kiln: internal error: %v\nplease report this with the input that caused it\n", r)
			if os.Getenv("KILN_TRACEBACK") != "" {
				stderr.Write(debug.Stack())
			}
			code = 1
		}
	}()
	if len(args) == 0 {
		printHelp(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c := findCommand(args[1]); c != nil {
				fmt.Fprint(stdout, commandHelp(c))
				return 0
			}
		}
		printHelp(stdout)
		return 0
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "kiln %s\n", Version)
		return 0
	}
	c := findCommand(name)
	if c == nil {
		fmt.Fprintf(stderr, "kiln: unknown command %q\n\n", name)
		printHelp(stderr)
		return 2
	}
	fs := flag.NewFlagSet("kiln "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := c.flags(fs)
	pos, err := parseInterleaved(fs, joinBoolValues(fs, args[1:]))
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, commandHelp(c))
		return 0
	case err != nil:
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			var names []string
			fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
			msg = fmt.Sprintf("unknown flag --%s%s", name, diag.DidYouMean(name, names))
		}
		err = usageError{msg}
	default:
		err = run(e, pos)
	}
	var ee exitError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kiln %s: %s\nrun 'kiln help %s' for usage\n", c.name, ue.msg, c.name)
		return 2
	}
	fmt.Fprintf(stderr, "%s\n", strings.TrimRight(err.Error(), "\n"))
	return 1
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func printHelp(w io.Writer) {
	fmt.Fprintf(w, "kiln %s: a memory-optimising compiler for deep-learning graphs\n\nUsage:\n", Version)
	sorted := append([]*command{}, commands...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, c := range sorted {
		fmt.Fprintf(w, "  %-52s %s\n", c.usage, c.summary)
	}
	fmt.Fprintf(w, "  %-52s %s\n", "kiln version", "print the version")
	fmt.Fprintf(w, "\nIN is a .kir file, an ONNX model (.onnx, imported as kiln import does; --batch and --data-inputs apply) or - for standard input (either). 'kiln help COMMAND' shows a command's flags.\n")
}

func commandHelp(c *command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s\n\n%s\n", c.usage, c.summary)
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.flags(fs)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		b.WriteString("\nflags:\n")
		fs.VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			dash := "--"
			if len(f.Name) == 1 || f.Name[0] == 'O' {
				dash = "-"
			}
			fmt.Fprintf(&b, "  %s%s", dash, f.Name)
			if name != "" {
				fmt.Fprintf(&b, " %s", name)
			}
			fmt.Fprintf(&b, "\n      %s", usage)
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(&b, " (default %s)", f.DefValue)
			}
			b.WriteString("\n")
		})
	}
	return b.String()
}

// joinBoolValues lets a boolean flag take its value as the next word, as
// other flags do: "--verify-each false" becomes "--verify-each=false"
// (the flag package reads only the joined form for booleans).
func joinBoolValues(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		name := strings.TrimLeft(a, "-")
		if name == a || strings.Contains(name, "=") || i+1 >= len(args) {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			continue
		}
		if v := args[i+1]; v == "true" || v == "false" || v == "interp" && name == "verify-each" {
			out[len(out)-1] = a + "=" + v
			i++
		}
	}
	return out
}

// parseInterleaved parses flags that may come before or after positional
// arguments ("--" ends the flags) and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > 0 && len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// input is a parsed input file with its text kept for diagnostics.
type input struct {
	path   string // "-" for standard input
	name   string // the name used in diagnostics
	text   string
	module *ir.Module
	bound  []string // ONNX graph inputs specialised to their --input values
}

// readModule reads and parses IN (a .kir file, an ONNX model, or - for
// standard input holding either) and verifies it. ONNX is recognised by
// its extension or its content (a ModelProto starts with the byte 0x08,
// which no .kir text does). opt applies to ONNX input only. Diagnostics
// are rendered to stderr and the returned error is an exitError.
func readModule(e *env, path string, opt onnx.Options) (*input, error) {
	in := &input{path: path, name: path}
	e.files.Read(path)
	data, err := readInputFile(e, path)
	if path == "-" {
		in.name = "<stdin>"
	}
	if err != nil {
		return nil, fmt.Errorf("kiln: cannot read input: %v", unwrapPathError(err))
	}
	if strings.HasSuffix(strings.ToLower(path), ".onnx") || len(data) > 0 && data[0] == 0x08 {
		return importData(e, in, data, opt)
	}
	if what := binaryKind(data); what != "" {
		return nil, fmt.Errorf("%s: error: this is not a Kiln text (.kir) or an ONNX model: it looks like %s", in.name, what)
	}
	if opt.Batch != 0 || len(opt.DataInputs) > 0 {
		return nil, usageError{"--batch and --data-inputs apply to ONNX input only"}
	}
	in.text = string(data)
	m, perr := parser.Parse(in.name, in.text)
	verr := ir.Verify(m)
	if perr == nil && verr == nil {
		for _, f := range m.Funcs {
			if err := liveness.CheckOffsets(f); err != nil {
				fmt.Fprintf(e.stderr, "%s: error: invalid buffer assignment: %v\n", at(f.Pos), err)
				return nil, exitError{1}
			}
		}
	}
	if perr != nil || verr != nil {
		var all diag.List
		for _, err := range []error{perr, verr} {
			var dl diag.List
			if errors.As(err, &dl) {
				all = append(all, dl...)
			}
		}
		return nil, in.report(e, all.Sort())
	}
	in.module = m
	return in, nil
}

// inputBytesPerByte is what kiln holds, at most, per byte of an input it
// reads, rewrites and prints back: an ONNX model's weights decoded (8
// bytes an element) and printed as hex, or a .kir text's hex constants
// decoded; measured 2026-12-07 as peak resident bytes over input bytes:
// 12.2 for kiln import of a 47 MB ResNet-18, 9.3 for kiln mem --train of
// it, 8.6 for kiln opt of a 64 MiB constant in hex, 8.0 of the 93 MB
// ResNet-18 text. inputBytesPerNumber is what each number written out in
// a list of a .kir text adds (its tokens and syntax tree): 915 measured
// for a list of a million numbers in 10 MB (1.05 GB resident; a list
// holds at most a million).
const (
	inputBytesPerByte   = 13
	inputBytesPerNumber = 1024
)

// inputBytesNeeded estimates what reading data holds: inputBytesPerByte
// a byte and, for text, inputBytesPerNumber a number outside hex, and a
// quarter more for the Go runtime (as hostBytesNeeded).
func inputBytesNeeded(data []byte, text bool) int64 {
	need := satMul(int64(len(data)), inputBytesPerByte)
	if text {
		need = satAdd(need, satMul(countNumbers(data), inputBytesPerNumber))
	}
	return satAdd(need, need/4)
}

// countNumbers counts the numbers of a text: runs of digits that do not
// continue a name or a number (a hex constant is one).
func countNumbers(data []byte) int64 {
	var numbers int64
	prev := byte(' ')
	for _, c := range data {
		if c >= '0' && c <= '9' && !(prev >= '0' && prev <= '9' || prev >= 'a' && prev <= 'z' || prev >= 'A' && prev <= 'Z' || prev == '_' || prev == '.') {
			numbers++
		}
		prev = c
	}
	return numbers
}

// readInputFile reads an input whole: a regular file or standard input
// ("-"), not a device (/dev/zero never ends), and only while what kiln
// then builds from it (inputBytesNeeded) fits the memory available.
func readInputFile(e *env, path string) ([]byte, error) {
	avail := availableMemory()
	limitHeap(avail)
	limit := avail / inputBytesPerByte
	if limit <= 0 {
		limit = 1 << 40
	}
	name := "standard input"
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(io.LimitReader(e.stdin, limit+1))
	} else {
		name = path
		data, err = readRegular(path, limit+1)
	}
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s holds more than %s, 1/%d of the memory available (%s): kiln reads its input whole and holds up to %d bytes a byte of it", name, diag.Bytes(limit), inputBytesPerByte, diag.Bytes(avail), inputBytesPerByte)
	}
	text := !(strings.HasSuffix(strings.ToLower(path), ".onnx") || len(data) > 0 && data[0] == 0x08)
	if need := inputBytesNeeded(data, text); avail > 0 && need > avail {
		return nil, fmt.Errorf("%s needs about %s to read (%d bytes a byte and %d a number written out in a list, and a quarter more for the Go runtime), more than the %s available", name, diag.Bytes(need), inputBytesPerByte, inputBytesPerNumber, diag.Bytes(avail))
	}
	return data, nil
}

// readRegular reads at most limit bytes of the file path, a regular
// file or a pipe (<(...)): a device (/dev/zero never ends), a folder or
// a socket is refused.
func readRegular(path string, limit int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode()&(os.ModeDevice|os.ModeCharDevice|os.ModeDir|os.ModeSocket) != 0 {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return io.ReadAll(io.LimitReader(fh, limit))
}

// binaryKind says what a binary file that is neither a .kir text nor an
// ONNX model looks like ("" for text): PyTorch's checkpoints are zip
// archives or pickles.
func binaryKind(data []byte) string {
	head := data[:min(len(data), 4096)]
	switch {
	case bytes.HasPrefix(head, []byte("PK\x03\x04")):
		return "a zip archive (a PyTorch checkpoint, torch.save, is one): export the model with torch.onnx.export"
	case len(head) >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5:
		return "a Python pickle (torch.save writes one): export the model with torch.onnx.export"
	case bytes.IndexByte(head, 0) >= 0:
		return "binary data (an ONNX model is read by its .onnx extension or its first byte, 0x08)"
	}
	return ""
}

// report renders err (diagnostics with source lines where it has them)
// to stderr and returns an exitError.
func (in *input) report(e *env, err error) error {
	var dl diag.List
	if errors.As(err, &dl) {
		fmt.Fprint(e.stderr, diag.Render(dl, map[string]string{in.name: in.text}))
		return exitError{1}
	}
	fmt.Fprintf(e.stderr, "%s\n", err)
	return exitError{1}
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %v", pe.Path, pe.Err)
	}
	return err
}

// importData imports an ONNX model read from in.path (external data is
// looked up beside it, or in the working folder for standard input),
// recognises composite chains, and verifies the module.
func importData(e *env, in *input, data []byte, opt onnx.Options) (*input, error) {
	opt.Name = filepath.Base(in.path)
	opt.Dir = filepath.Dir(in.path)
	if in.path == "-" {
		opt.Name, opt.Dir = in.name, "."
	}
	var bound []string
	if value := opt.Value; value != nil {
		opt.Value = func(name string) (*interp.Tensor, error) {
			x, err := value(name)
			if x != nil {
				bound = append(bound, name)
			}
			return x, err
		}
	}
	m, err := onnx.Import(data, opt)
	if err != nil {
		msg := unwrapPathError(err).Error()
		if rest, ok := strings.CutPrefix(msg, opt.Name+": "); ok {
			msg = in.name + ": error: " + rest
		}
		fmt.Fprintf(e.stderr, "%s\n", msg)
		return nil, exitError{1}
	}
	for _, f := range m.Funcs {
		// Exporters write some ops as chains; the ops save less for the
		// backward pass (docs/onnx.md).
		if passes.RecognizeComposites(f) > 0 {
			passes.RemoveDeadOps(f)
		}
	}
	if err := ir.Verify(m); err != nil {
		fmt.Fprintf(e.stderr, "%s: error: the imported module does not verify:\n%v\n", in.name, err)
		return nil, exitError{1}
	}
	in.bound = bound
	in.module = m
	in.text = m.String()
	return in, nil
}

// checkRunningVar refuses a --running-var that is none of its values.
func checkRunningVar(v string) error {
	if v != "" && v != "unbiased" && v != "population" {
		return usageError{fmt.Sprintf("--running-var must be unbiased or population, not %q", v)}
	}
	return nil
}

// runningVarHelp documents --running-var.
const runningVarHelp = "with an ONNX input: how a training-mode BatchNormalization updates its running variance: unbiased (PyTorch's), population (the ONNX spec's), or empty for the producer's (unbiased when PyTorch exported the model)"

// importValues gives the ONNX importer the --input NAME=FILE.npy values
// it asks for: those of graph inputs that a node needs at import time,
// each read when it is asked for.
func importValues(e *env, inputs []string) (func(string) (*interp.Tensor, error), error) {
	if len(inputs) == 0 {
		return nil, nil
	}
	files := map[string]string{}
	for _, spec := range inputs {
		name, file, ok := strings.Cut(spec, "=")
		if !ok || name == "" || file == "" {
			return nil, usageError{fmt.Sprintf("--input %q: want NAME=FILE.npy", spec)}
		}
		if files[name] != "" {
			return nil, usageError{fmt.Sprintf("--input %s is given twice", name)}
		}
		files[name] = file
	}
	return func(name string) (*interp.Tensor, error) {
		file := files[name]
		if file == "" {
			return nil, nil
		}
		e.files.Read(file)
		// Shape operands (axes, sizes, repeats) are small; a graph input
		// that a node reads at run time is not bound, so this bound only
		// keeps a mistaken file from being read whole.
		const limit = 64 << 20
		data, err := readRegular(file, limit+1)
		if err != nil {
			return nil, fmt.Errorf("kiln: --input %s: %v", name, unwrapPathError(err))
		}
		if len(data) > limit {
			return nil, fmt.Errorf("kiln: --input %s: %s holds more than %s", name, file, diag.Bytes(limit))
		}
		t, err := npy.Read(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("kiln: --input %s: %s: %v", name, file, err)
		}
		return t, nil
	}, nil
}

// unbound drops the --input flags whose graph inputs the import bound.
func unbound(inputs []string, bound []string) []string {
	var out []string
	for _, spec := range inputs {
		name, _, _ := strings.Cut(spec, "=")
		if !slices.Contains(bound, name) {
			out = append(out, spec)
		}
	}
	return out
}

func at(p ir.Pos) string {
	if p.IsValid() {
		return p.String()
	}
	return p.File
}

// printable writes to w with each control character but tab and newline
// shown as '?': a name carrying an escape sequence reaches the terminal
// in a message as text.
type printable struct{ w io.Writer }

func (p printable) Write(b []byte) (int, error) {
	if s := diag.Printable(string(b)); len(s) == len(b) && s != string(b) {
		if _, err := io.WriteString(p.w, s); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return p.w.Write(b)
}
