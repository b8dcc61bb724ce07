package passes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/kiln-compiler/kiln/scratch"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/parser"
)

// ExternalPrefix marks an executable plugin in a pipeline: ext:NAME runs
// the program kiln-pass-NAME.
const ExternalPrefix = "ext:"

// ExternalResolver returns a Resolver for ext:NAME passes. The program
// kiln-pass-NAME is looked up in dir (when set), then on PATH. It receives
// the whole module as text on standard input and its options as
// --key=value arguments, and must print the whole rewritten module on
// standard output; the output is parsed and verified. A run longer than
// timeout is killed.
func ExternalResolver(dir string, timeout time.Duration) Resolver {
	return func(name string) (*Pass, error) {
		plugin, ok := strings.CutPrefix(name, ExternalPrefix)
		if !ok {
			return nil, nil
		}
		if plugin == "" || strings.ContainsAny(plugin, "/\\") {
			return nil, fmt.Errorf("external pass name %q is not valid", name)
		}
		prog := "kiln-pass-" + plugin
		path := ""
		if dir != "" {
			p := filepath.Join(dir, prog)
			if st, err := os.Stat(p); err == nil {
				if st.IsDir() || st.Mode()&0o111 == 0 {
					return nil, fmt.Errorf("external pass %s: %s is not an executable file (chmod +x it, or remove it to use one on PATH)", name, p)
				}
				path = p
			}
		}
		if path == "" {
			p, err := exec.LookPath(prog)
			if err != nil {
				where := "on PATH"
				if dir != "" {
					where = "in " + dir + " or on PATH"
				}
				return nil, fmt.Errorf("external pass %s: no executable %s %s", name, prog, where)
			}
			path = p
		}
		return &Pass{
			Name:       name,
			Summary:    "external pass " + path,
			AnyOptions: true,
			Run: func(ctx *Context, m *ir.Module) error {
				return runExternal(ctx, m, prog, path, timeout)
			},
		}, nil
	}
}

// Signature is f's interface as callers see it: each argument's name,
// type, kind and whether it is updated in place, and each result's name
// and type (not initial values or other attributes).
func Signature(f *ir.Func) string {
	var b strings.Builder
	b.WriteString("@" + ir.QuoteName(f.Name) + "(")
	for i, a := range f.Args {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %s", a.Ref(), a.Type)
		if a.Arg != nil && a.Arg.Kind != ir.ArgData {
			b.WriteString(" " + a.Arg.Kind.String())
		}
		if a.Arg != nil && a.Arg.InOut {
			b.WriteString(" inout")
		}
	}
	b.WriteString(") -> (")
	for i, r := range f.Results {
		if i > 0 {
			b.WriteString(", ")
		}
		if r.Name != "" {
			b.WriteString(ir.QuoteKey(r.Name) + ": ")
		}
		b.WriteString(r.Value.Type.String())
	}
	b.WriteString(")")
	return b.String()
}

// stderrTail is how much of a failing plugin's standard error is shown.
const stderrTail = 2000

// Output limits of a plugin: its standard output may hold the module
// several times over (a rewrite may add ops), but not without bound; its
// standard error is kept to its last part.
const (
	stdoutSlack = 64 << 20
	stderrLimit = 1 << 20
)

// capped keeps at most limit bytes; past that it records the overflow
// and calls over (once), which stops the plugin.
type capped struct {
	buf      bytes.Buffer
	limit    int
	overflow bool
	over     func()
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.limit - c.buf.Len(); len(p) > room {
		c.buf.Write(p[:max(room, 0)])
		if !c.overflow {
			c.overflow = true
			c.over()
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

// ChangeSignature is the option of an ext:NAME step that lets the
// plugin change its functions' signatures (Kiln's own; the plugin does
// not see it): ext:NAME{change-signature=true}.
const ChangeSignature = "change-signature"

func runExternal(ctx *Context, m *ir.Module, prog, path string, timeout time.Duration) error {
	var args []string
	keys := make([]string, 0, len(ctx.Args()))
	for k := range ctx.Args() {
		if k == ChangeSignature {
			continue
		}
		keys = append(keys, k)
	}
	freeSignature := ctx.Args()[ChangeSignature] == "true"
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--"+k+"="+ctx.Args()[k])
	}
	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	if timeout > 0 {
		c, cancel = context.WithTimeout(c, timeout)
		defer cancel()
	}
	text := m.String()
	cmd := exec.CommandContext(c, path, args...)
	cmd.Stdin = strings.NewReader(text)
	stdout := &capped{limit: 4*len(text) + stdoutSlack, over: cancel}
	stderr := &capped{limit: stderrLimit, over: cancel}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second
	ownProcessGroup(cmd)
	err := scratch.Run(cmd)
	killProcessGroup(cmd) // children a plugin left behind go with it
	scratch.KillStrays()  // and those that left its group (setsid), once adopted
	tail := stderr.buf.String()
	if len(tail) > stderrTail {
		tail = "..." + tail[len(tail)-stderrTail:]
	}
	describe := func(what string) error {
		msg := fmt.Sprintf("plugin %s %s", prog, what)
		if t := strings.TrimSpace(tail); t != "" {
			msg += "; its standard error ends with:\n" + t
		}
		return errors.New(msg)
	}
	switch {
	case stdout.overflow:
		return describe(fmt.Sprintf("printed more than %d bytes (4 times its input and 64 MiB) and was stopped", stdout.limit))
	case stderr.overflow:
		return describe(fmt.Sprintf("printed more than %d bytes of standard error and was stopped", stderrLimit))
	case c.Err() == context.DeadlineExceeded:
		return describe(fmt.Sprintf("timed out after %s (--plugin-timeout)", timeout))
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		return describe("exited, but a process it started kept its standard output or error open (that process was stopped); the output is not used")
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return describe(fmt.Sprintf("failed with exit status %d", ee.ExitCode()))
		}
		return describe(fmt.Sprintf("could not run: %v", err))
	}
	out, perr := parser.Parse(prog+" output", stdout.buf.String())
	if perr == nil {
		perr = ir.Verify(out)
	}
	if perr != nil {
		return describe(fmt.Sprintf("printed invalid IR (exit status 0):\n%v", perr))
	}
	for _, f := range m.Funcs {
		g := out.Func(f.Name)
		if g == nil {
			return describe(fmt.Sprintf("printed a module without @%s (exit status 0): a pass returns every function it was given", f.Name))
		}
		if a, b := Signature(f), Signature(g); a != b && !freeSignature {
			return describe(fmt.Sprintf("changed the signature of @%s (exit status 0) from\n  %s\nto\n  %s\n(give %s%s{%s=true} if it may)", f.Name, a, b, ExternalPrefix, strings.TrimPrefix(prog, "kiln-pass-"), ChangeSignature))
		}
	}
	for _, g := range out.Funcs {
		if m.Func(g.Name) == nil {
			return describe(fmt.Sprintf("printed @%s, which it was not given (exit status 0): a pass returns the functions it was given, no others", g.Name))
		}
	}
	*m = *out
	return nil
}
