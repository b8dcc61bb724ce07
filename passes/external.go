package passes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
			if p := filepath.Join(dir, prog); isExecutable(p) {
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

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// stderrTail is how much of a failing plugin's standard error is shown.
const stderrTail = 2000

func runExternal(ctx *Context, m *ir.Module, prog, path string, timeout time.Duration) error {
	var args []string
	keys := make([]string, 0, len(ctx.Args()))
	for k := range ctx.Args() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--"+k+"="+ctx.Args()[k])
	}
	c := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		c, cancel = context.WithTimeout(c, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(c, path, args...)
	cmd.Stdin = strings.NewReader(m.String())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	tail := stderr.String()
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
	if c.Err() == context.DeadlineExceeded {
		return describe(fmt.Sprintf("timed out after %s (--plugin-timeout)", timeout))
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return describe(fmt.Sprintf("failed with exit status %d", ee.ExitCode()))
		}
		return describe(fmt.Sprintf("could not run: %v", err))
	}
	out, perr := parser.Parse(prog+" output", stdout.String())
	if perr == nil {
		perr = ir.Verify(out)
	}
	if perr != nil {
		return describe(fmt.Sprintf("printed invalid IR (exit status 0):\n%v", perr))
	}
	*m = *out
	return nil
}
