package passes

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
	"github.com/kiln-compiler/kiln/outfile"
	"github.com/kiln-compiler/kiln/progress"
)

// Instrumentation says what the Manager reports around each pass.
type Instrumentation struct {
	PrintBefore      map[string]bool // pass names
	PrintAfter       map[string]bool
	PrintAfterAll    bool
	PrintAfterChange bool
	PrintConstants   bool // dumps print large constants whole (else elided)
	VerifyEach       bool
	// ValidateExternal checks each external pass (ext:NAME) by
	// translation validation: every function it keeps the signature of
	// runs in the interpreter before and after, on the same random
	// arguments, and the results must agree (see validateRewrite).
	ValidateExternal bool
	DumpDir          string    // one numbered file per pass when set
	ReproducerDir    string    // where a failing pass leaves its reproducer (none when empty)
	Log              io.Writer // IR printing goes here (stderr in the CLI)
	// Files guards the dump files: none replaces an input of the command
	// or another output (nil: no guard).
	Files *outfile.Guard
	// Progress shows which pass runs (nil: nothing).
	Progress *progress.Reporter
	// Observe, when set, sees the module before the first pass (pass "")
	// and after each pass that succeeds.
	Observe func(pass string, m *ir.Module, a *Analyses)
}

// forPeople is printed IR as the dumps show it: large constants elided
// unless PrintConstants is set.
func (in Instrumentation) forPeople(text string) string {
	if in.PrintConstants {
		return text
	}
	return ir.ElideConstants(text)
}

// PassRun records one pass execution.
type PassRun struct {
	Name    string
	Seconds float64
	Stats   []Stat
	Changed bool // known only under PrintAfterChange (false otherwise)
	// Approximations the pass made (each allowed by Manager.Allow).
	Approximations []Approximation
	// Notes are what the pass wants a report's reader to know.
	Notes []string
}

// Manager runs pipelines.
type Manager struct {
	Inst Instrumentation
	// Allow names the approximations the passes may make (CheckAllowed).
	Allow []string
	// Need lists what must hold when the pipeline ends (a backend's
	// needs: arena offsets); a pipeline that cannot give it is refused
	// before any pass runs.
	Need []Property
	// Device is what the passes plan for (nil: costmodel.Default).
	Device *costmodel.Device
	// Workspace sizes the kernels' workspace of a function, as the
	// backend will lower it (Context.Workspace).
	Workspace func(*ir.Func) (int64, error)
	Runs      []PassRun // filled by Run
	// Analyses are the pipeline's cached analyses (filled by Run): what
	// the last pass left valid.
	Analyses *Analyses
}

// PassError is a pass that failed, panicked or produced invalid IR.
type PassError struct {
	Pass       string
	Err        error
	Reproducer string // path of the reproducer file, if one was written
}

func (e *PassError) Error() string {
	msg := fmt.Sprintf("pass %s failed: %v", e.Pass, e.Err)
	if e.Reproducer != "" {
		msg += "\nreproducer: " + e.Reproducer
	}
	return msg
}

func (e *PassError) Unwrap() error { return e.Err }

// Run applies the pipeline to m in order. A pipeline that breaks a pass's
// contract on m (or cannot end with Need) is a *ContractError, and no pass
// runs. After each pass, what it undoes is cleared (arena offsets), and
// under VerifyEach the IR is verified, every buffer offset checked, and
// what the pass claims to establish checked (Established). On a pass's
// failure the module is left as the pass left it, and the error is a
// *PassError. The IR is printed only where the instrumentation asks.
func (mg *Manager) Run(m *ir.Module, pipe Pipeline) error {
	if err := CheckContracts(m, pipe, mg.Need...); err != nil {
		return err
	}
	in := mg.Inst
	log := in.Log
	if log == nil {
		log = io.Discard
	}
	if in.DumpDir != "" {
		if err := os.MkdirAll(in.DumpDir, 0o755); err != nil {
			return err
		}
		if err := in.Files.Write(filepath.Join(in.DumpDir, "00-input.kir"), []byte(m.String()), 0o644); err != nil {
			return err
		}
	}
	defer in.Progress.Done()
	if mg.Analyses == nil {
		mg.Analyses = &Analyses{}
	}
	if in.Observe != nil {
		in.Observe("", m, mg.Analyses)
	}
	for i, step := range pipe {
		name := step.Pass.Name
		in.Progress.Step("pass %d/%d: %s", i+1, len(pipe), name)
		// The text before the pass, only for what reads it: a dump, the
		// change test, a reproducer.
		var reference []*ir.Func
		if in.ValidateExternal && strings.HasPrefix(name, ExternalPrefix) {
			for _, f := range m.Funcs {
				reference = append(reference, f.Clone())
			}
		}
		before := ""
		if in.PrintAfterChange || in.PrintBefore[name] || in.ReproducerDir != "" {
			before = m.String()
		}
		if in.PrintBefore[name] {
			fmt.Fprintf(log, "// -----// IR Dump Before %s //----- //\n%s\n", name, in.forPeople(before))
		}
		ctx, err := NewContext(step.Pass, step.Args)
		if err != nil {
			return &PassError{Pass: name, Err: err}
		}
		ctx.Allow(mg.Allow...)
		if mg.Device != nil {
			ctx.SetDevice(*mg.Device)
		}
		ctx.workspace = mg.Workspace
		ctx.analyses = mg.Analyses
		start := time.Now()
		err = runGuarded(step.Pass, ctx, m)
		secs := time.Since(start).Seconds()
		if err == nil && !step.Pass.AnyOptions {
			for _, q := range step.Pass.Invalidates {
				clear(m, q)
			}
		}
		mg.Analyses.invalidate(step.Pass)
		if err == nil && in.VerifyEach {
			err = verifyAfter(m, step.Pass)
		}
		if err == nil && in.VerifyEach {
			err = mg.Analyses.check(m)
		}
		if err == nil && reference != nil {
			err = validateRewrite(reference, m)
		}
		if err != nil {
			pe := &PassError{Pass: name, Err: err}
			if in.ReproducerDir != "" {
				pe.Reproducer = mg.writeReproducer(name, before, pipe[i:])
			}
			return pe
		}
		run := PassRun{Name: name, Seconds: secs, Stats: ctx.Stats(), Approximations: ctx.Approximations(), Notes: ctx.Notes()}
		after := ""
		if in.PrintAfterChange || in.PrintAfterAll || in.PrintAfter[name] || in.DumpDir != "" {
			after = m.String()
			run.Changed = in.PrintAfterChange && after != before
		}
		mg.Runs = append(mg.Runs, run)
		if in.Observe != nil {
			in.Observe(name, m, mg.Analyses)
		}
		if in.PrintAfterAll || in.PrintAfter[name] || in.PrintAfterChange && run.Changed {
			fmt.Fprintf(log, "// -----// IR Dump After %s //----- //\n%s\n", name, in.forPeople(after))
		}
		if in.DumpDir != "" {
			file := filepath.Join(in.DumpDir, fmt.Sprintf("%02d-%s.kir", i+1, sanitize(name)))
			if err := in.Files.Write(file, []byte(after), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// verifyAfter checks m after pass p ran: the IR, every buffer offset,
// and each property p claims to establish.
func verifyAfter(m *ir.Module, p *Pass) error {
	if err := ir.Verify(m); err != nil {
		return fmt.Errorf("it produced invalid IR:\n%v", err)
	}
	for _, f := range m.Funcs {
		if err := liveness.CheckOffsets(f); err != nil {
			return fmt.Errorf("it produced an invalid buffer assignment: %v", err)
		}
	}
	for _, q := range p.Establishes {
		if err := Established(m, q); err != nil {
			return fmt.Errorf("it claims to make %s, but %v", q, err)
		}
	}
	return nil
}

// runGuarded runs a pass and turns a panic into an error with its stack.
func runGuarded(p *Pass, ctx *Context, m *ir.Module) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return p.Run(ctx, m)
}

// writeReproducer leaves the input of a failing pass in a new file of
// its own in the reproducer folder (readable by its owner alone: it holds
// the model's weights), whose run line works from any folder. It returns
// the file's path, or "" when it could not write one.
func (mg *Manager) writeReproducer(pass, input string, rest Pipeline) string {
	f, err := os.CreateTemp(mg.Inst.ReproducerDir, "kiln-reproducer-"+sanitize(pass)+"-*.kir")
	if err != nil {
		return ""
	}
	path, _ := filepath.Abs(f.Name())
	text := fmt.Sprintf("// kiln reproducer: pass %s failed on this input.\n// run: kiln opt %s --passes=%s\n%s",
		pass, shellQuote(path), shellQuote(rest.String()), input)
	_, werr := f.WriteString(text)
	if cerr := f.Close(); werr != nil || cerr != nil {
		os.Remove(f.Name())
		return ""
	}
	return path
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, name)
}

// WriteTiming prints the wall time of each pass as a table, or as JSON when
// asJSON is set.
func (mg *Manager) WriteTiming(w io.Writer, asJSON bool) error {
	total := 0.0
	for _, r := range mg.Runs {
		total += r.Seconds
	}
	if asJSON {
		type entry struct {
			Name    string  `json:"name"`
			Seconds float64 `json:"seconds"`
		}
		out := struct {
			Passes       []entry `json:"passes"`
			TotalSeconds float64 `json:"total_seconds"`
		}{Passes: []entry{}, TotalSeconds: total}
		for _, r := range mg.Runs {
			out.Passes = append(out.Passes, entry{r.Name, r.Seconds})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "seconds\t%\tpass\t")
	for _, r := range mg.Runs {
		pct := 0.0
		if total > 0 {
			pct = 100 * r.Seconds / total
		}
		fmt.Fprintf(tw, "%.6f\t%.1f\t%s\t\n", r.Seconds, pct, r.Name)
	}
	fmt.Fprintf(tw, "%.6f\t100.0\ttotal\t\n", total)
	return tw.Flush()
}

// WriteStats prints each pass's statistics, one per line: "pass: name = value".
func (mg *Manager) WriteStats(w io.Writer) {
	for _, r := range mg.Runs {
		if len(r.Stats) == 0 {
			fmt.Fprintf(w, "%s: (no statistics)\n", r.Name)
		}
		for _, s := range r.Stats {
			fmt.Fprintf(w, "%s: %s = %v\n", r.Name, s.Name, s.Value)
		}
	}
}
