package passes

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/liveness"
)

// Pass is a transformation (or analysis) of a module.
type Pass struct {
	Name    string
	Summary string // one line
	// Options lists what the pass accepts; Define derives it from the
	// options struct.
	Options []Option
	// Run rewrites m in place. It records statistics through ctx, and
	// returns an error when it cannot do its job. Define sets it.
	Run func(ctx *Context, m *ir.Module) error
	// AnyOptions accepts options not declared in Options (external passes
	// receive them as text through Context.Args).
	AnyOptions bool
	// The pass's contract with the passes around it: what must hold and
	// must not hold before it runs, and what holds after it (Establishes)
	// or may no longer hold (Invalidates). The pass manager checks a
	// pipeline against these before it runs any pass.
	Requires, Excludes, Establishes, Invalidates []Property
	// Preserves lists the analyses still valid after the pass: the
	// manager keeps them cached (and checks them under verify-each);
	// every other analysis is dropped.
	Preserves []Analysis

	newOptions func() reflect.Value // a pointer to the options struct with its defaults
}

// Define makes a pass whose options are the tagged fields of O (see
// optionsOf): run receives them typed, with their defaults where the
// pipeline gives none. When *O has a method Validate() error, it checks
// the options together once they are parsed. It panics on a malformed options struct (found
// when Kiln starts).
func Define[O any](p Pass, run func(ctx *Context, m *ir.Module, opts *O) error) *Pass {
	t := reflect.TypeFor[O]()
	opts, err := optionsOf(t)
	if err != nil {
		panic(fmt.Sprintf("pass %s: %v", p.Name, err))
	}
	p.Options = opts
	p.newOptions = func() reflect.Value {
		v := reflect.New(t)
		for _, o := range opts {
			if o.Default != "" && t.Field(o.field).Type.Kind() != reflect.Pointer {
				x, _ := o.parse(o.Default)
				o.set(v.Elem(), x)
			}
		}
		return v
	}
	p.Run = func(ctx *Context, m *ir.Module) error { return run(ctx, m, ctx.options.Interface().(*O)) }
	return &p
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
	if len(p.Options) > 0 && p.newOptions == nil {
		return fmt.Errorf("pass %s declares options but was not made with Define", p.Name)
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
	pass    *Pass
	args    map[string]string
	options reflect.Value // *O of Define
	stats   []Stat
	allow   map[string]bool
	approx  []Approximation
	notes   []string
	device  *costmodel.Device
	// workspace sizes the kernels' workspace (Manager.Workspace).
	workspace func(*ir.Func) (int64, error)
	analyses  *Analyses
	// Deadline, when not zero, is a hint for passes with time budgets.
	Deadline time.Time
}

// NewContext builds a context for running p directly with the given
// option text (tests and passes that run other passes use it). An
// unknown option or a value out of its range is an error.
func NewContext(p *Pass, args map[string]string) (*Context, error) {
	c := &Context{pass: p, args: args}
	if p.newOptions != nil {
		c.options = p.newOptions()
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
			return nil, fmt.Errorf("pass %s has no option %q%s%s", p.Name, k, diag.DidYouMean(k, optionNames(p)), optionList(p))
		}
		v, err := opt.parse(args[k])
		if err != nil {
			return nil, fmt.Errorf("pass %s: %v", p.Name, err)
		}
		opt.set(c.options.Elem(), v)
	}
	if c.options.IsValid() {
		if v, ok := c.options.Interface().(interface{ Validate() error }); ok {
			if err := v.Validate(); err != nil {
				return nil, fmt.Errorf("pass %s: %v", p.Name, err)
			}
		}
	}
	return c, nil
}

func optionNames(p *Pass) []string {
	names := make([]string, len(p.Options))
	for i, o := range p.Options {
		names[i] = o.Name
	}
	return names
}

func optionList(p *Pass) string {
	if len(p.Options) == 0 {
		return " (it takes none)"
	}
	return " (options: " + strings.Join(optionNames(p), ", ") + ")"
}

// Args returns the options as given in the pipeline, as text.
func (c *Context) Args() map[string]string { return c.args }

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

// Allows reports whether the user allowed the approximation name.
func (c *Context) Allows(name string) bool { return c.allow[name] }

// Allow lets the passes run with ctx make the named approximations.
func (c *Context) Allow(names ...string) {
	if c.allow == nil {
		c.allow = map[string]bool{}
	}
	for _, n := range names {
		c.allow[n] = true
	}
}

// Approximate records that the pass made the approximation name (which
// must be allowed), saying what it changed.
func (c *Context) Approximate(name, what string) {
	if !c.allow[name] {
		panic(fmt.Sprintf("pass %s made approximation %s, which was not allowed", c.pass.Name, name))
	}
	c.approx = append(c.approx, Approximation{Name: name, What: what})
}

// Approximations returns what Approximate recorded.
func (c *Context) Approximations() []Approximation { return c.approx }

// Note records something the pass wants the reader of a report to know
// (a choice it made, and why).
func (c *Context) Note(text string) { c.notes = append(c.notes, text) }

// Liveness is f's liveness as the pass starts, cached across passes that
// preserve it (Pass.Preserves). A pass that changes f and reads its
// liveness again calls liveness.Analyze.
func (c *Context) Liveness(f *ir.Func) *liveness.Info { return c.analyses.Liveness(f) }

// Notes returns what Note recorded.
func (c *Context) Notes() []string { return c.notes }

// Device is the device the passes plan for: every cost estimate of a
// pipeline uses this one description (costmodel.Default unless the
// manager was given another).
func (c *Context) Device() costmodel.Device {
	if c.device == nil {
		return costmodel.Default
	}
	return *c.device
}

// SetDevice makes the passes run with c plan for d.
func (c *Context) SetDevice(d costmodel.Device) { c.device = &d }

// Workspace is the workspace the backend's kernels of f need, in bytes:
// the passes that bound device memory (swap) count it. It is an error
// when the pass manager was given no backend to ask.
func (c *Context) Workspace(f *ir.Func) (int64, error) {
	if c.workspace == nil {
		return 0, fmt.Errorf("pass %s needs the kernels' workspace, and no backend was given to size it", c.pass.Name)
	}
	return c.workspace(f)
}

// SetWorkspace gives the passes run with c the backend's workspace sizes.
func (c *Context) SetWorkspace(w func(*ir.Func) (int64, error)) { c.workspace = w }
