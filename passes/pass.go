package passes

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/ir"
)

// Pass is a transformation (or analysis) of a module.
type Pass struct {
	Name    string
	Summary string // one line
	Options []Option
	// Run rewrites m in place. It reads its options and records statistics
	// through ctx, and returns an error when it cannot do its job.
	Run func(ctx *Context, m *ir.Module) error
	// AnyOptions accepts options not declared in Options (external passes
	// receive them as text through Context.Args).
	AnyOptions bool
}

var registry = map[string]*Pass{}

// Register adds a pass. A second pass with the same name, or one without a
// name, summary or Run function, is an error.
func Register(p *Pass) error {
	switch {
	case p.Name == "" || strings.ContainsAny(p.Name, ",{}= "):
		return fmt.Errorf("pass name %q is not valid", p.Name)
	case p.Summary == "" || p.Run == nil:
		return fmt.Errorf("pass %s needs a summary and a Run function", p.Name)
	case registry[p.Name] != nil:
		return fmt.Errorf("pass %s is already registered", p.Name)
	}
	for _, o := range p.Options {
		if o.Default != "" {
			if _, err := o.parse(o.Default); err != nil {
				return fmt.Errorf("pass %s: default of %v", p.Name, err)
			}
		}
	}
	registry[p.Name] = p
	return nil
}

// MustRegister is Register for passes built into Kiln; it panics on error.
func MustRegister(p *Pass) {
	if err := Register(p); err != nil {
		panic(err)
	}
}

// Lookup returns the registered pass called name, or nil.
func Lookup(name string) *Pass { return registry[name] }

// All returns every registered pass, sorted by name.
func All() []*Pass {
	out := make([]*Pass, 0, len(registry))
	for _, p := range registry {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Stat is one named statistic of a pass run.
type Stat struct {
	Name  string
	Value any
}

// Context is what a pass sees while it runs: its options and a place for
// its statistics.
type Context struct {
	pass  *Pass
	args  map[string]string
	opts  map[string]any
	stats []Stat
	// Deadline, when not zero, is a hint for passes with time budgets.
	Deadline time.Time
}

// NewContext builds a context for running p directly with the given
// option text (tests and passes that run other passes use it).
func NewContext(p *Pass, args map[string]string) (*Context, error) {
	c := &Context{pass: p, opts: map[string]any{}, args: args}
	for _, o := range p.Options {
		c.opts[o.Name] = o.zero()
		if o.Default != "" {
			v, _ := o.parse(o.Default)
			c.opts[o.Name] = v
		}
	}
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var opt *Option
		for i := range p.Options {
			if p.Options[i].Name == k {
				opt = &p.Options[i]
			}
		}
		if opt == nil && p.AnyOptions {
			continue
		}
		if opt == nil {
			return nil, fmt.Errorf("pass %s has no option %q%s", p.Name, k, optionList(p))
		}
		v, err := opt.parse(args[k])
		if err != nil {
			return nil, fmt.Errorf("pass %s: %v", p.Name, err)
		}
		c.opts[k] = v
	}
	return c, nil
}

func optionList(p *Pass) string {
	if len(p.Options) == 0 {
		return " (it takes none)"
	}
	names := make([]string, len(p.Options))
	for i, o := range p.Options {
		names[i] = o.Name
	}
	return " (options: " + strings.Join(names, ", ") + ")"
}

func (c *Context) get(name string) any {
	v, ok := c.opts[name]
	if !ok {
		panic(fmt.Sprintf("pass %s reads undeclared option %q", c.pass.Name, name))
	}
	return v
}

// Args returns the options as given in the pipeline, as text.
func (c *Context) Args() map[string]string { return c.args }

// Int returns an int option.
func (c *Context) Int(name string) int64 { return c.get(name).(int64) }

// Float returns a float option.
func (c *Context) Float(name string) float64 { return c.get(name).(float64) }

// String returns a string or enum option.
func (c *Context) String(name string) string { return c.get(name).(string) }

// Bool returns a bool option.
func (c *Context) Bool(name string) bool { return c.get(name).(bool) }

// Size returns a size option.
func (c *Context) Size(name string) Size { return c.get(name).(Size) }

// Duration returns a duration option.
func (c *Context) Duration(name string) time.Duration { return c.get(name).(time.Duration) }

// Stat records a statistic; recording a name again replaces its value.
func (c *Context) Stat(name string, value any) {
	for i := range c.stats {
		if c.stats[i].Name == name {
			c.stats[i].Value = value
			return
		}
	}
	c.stats = append(c.stats, Stat{Name: name, Value: value})
}

// AddStat adds n to an integer statistic.
func (c *Context) AddStat(name string, n int64) {
	for i := range c.stats {
		if c.stats[i].Name == name {
			c.stats[i].Value = c.stats[i].Value.(int64) + n
			return
		}
	}
	c.stats = append(c.stats, Stat{Name: name, Value: n})
}

// Stats returns the statistics recorded so far, in recording order.
func (c *Context) Stats() []Stat { return c.stats }
