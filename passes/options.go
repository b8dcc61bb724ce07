package passes

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// OptionKind is the type of a pass option.
type OptionKind uint8

// The option kinds.
const (
	IntOption      OptionKind = iota + 1
	FloatOption               // a real number
	StringOption              // free text
	BoolOption                // true or false
	EnumOption                // one of Option.Enum
	SizeOption                // bytes (123, 64KB, 2GiB) or a fraction (0.5)
	DurationOption            // a Go duration (500ms, 10s)
)

func (k OptionKind) String() string {
	switch k {
	case IntOption:
		return "int"
	case FloatOption:
		return "float"
	case StringOption:
		return "string"
	case BoolOption:
		return "bool"
	case EnumOption:
		return "enum"
	case SizeOption:
		return "size"
	case DurationOption:
		return "duration"
	}
	return "unknown"
}

// Option describes one option of a pass: what `kiln passes` lists. For a
// pass made with Define it is derived from the options struct's tags.
type Option struct {
	Name    string
	Kind    OptionKind
	Default string // in the option's text form; "" means unset
	Enum    []string
	Range   string // valid values of a number, as an interval: [0,1), (0,inf)
	Doc     string

	field int   // index of the struct field (Define)
	rng   *span // parsed Range
}

// Size is a byte count or a fraction of some reference amount.
type Size struct {
	Bytes    int64
	Fraction float64
	IsFrac   bool
	Set      bool // false when the option was not given and has no default
}

// Of resolves the size against a reference amount (used for fractions).
func (s Size) Of(ref int64) int64 {
	if s.IsFrac {
		return int64(math.Floor(s.Fraction * float64(ref)))
	}
	return s.Bytes
}

func (s Size) String() string {
	if !s.Set {
		return ""
	}
	if s.IsFrac {
		return strconv.FormatFloat(s.Fraction, 'g', -1, 64)
	}
	return strconv.FormatInt(s.Bytes, 10)
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// ParseSize reads a size as the design notes' Contracts define it: an
// integer is bytes, a number with a unit (KB, MB, GB, TB decimal; KiB, MiB,
// GiB, TiB binary; B) is bytes, and a number with a decimal point and no
// unit is a fraction.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
			if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*float64(u.mult) > math.MaxInt64 {
				return Size{}, fmt.Errorf("%q is not a size (try 512MiB, 2GB, 1000 or 0.5)", s)
			}
			return Size{Bytes: int64(math.Round(f * float64(u.mult))), Set: true}, nil
		}
	}
	if strings.ContainsAny(t, ".eE") {
		f, err := strconv.ParseFloat(t, 64)
		if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return Size{}, fmt.Errorf("%q is not a size (try 512MiB, 2GB, 1000 or 0.5)", s)
		}
		return Size{Fraction: f, IsFrac: true, Set: true}, nil
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return Size{}, fmt.Errorf("%q is not a size (try 512MiB, 2GB, 1000 or 0.5)", s)
	}
	return Size{Bytes: n, Set: true}, nil
}

// span is an interval of valid numbers; NaN is never in one.
type span struct {
	lo, hi         float64
	loOpen, hiOpen bool
}

// parseSpan reads [a,b], (a,b), [a,b) or (a,b] with inf for infinity.
func parseSpan(s string) (*span, error) {
	bad := fmt.Errorf("range %q is not an interval such as [0,1) or (0,inf)", s)
	if len(s) < 5 || !strings.ContainsRune("[(", rune(s[0])) || !strings.ContainsRune("])", rune(s[len(s)-1])) {
		return nil, bad
	}
	lo, hi, ok := strings.Cut(s[1:len(s)-1], ",")
	if !ok {
		return nil, bad
	}
	num := func(t string) (float64, error) {
		switch strings.TrimSpace(t) {
		case "inf":
			return math.Inf(1), nil
		case "-inf":
			return math.Inf(-1), nil
		}
		return strconv.ParseFloat(strings.TrimSpace(t), 64)
	}
	sp := &span{loOpen: s[0] == '(', hiOpen: s[len(s)-1] == ')'}
	var err1, err2 error
	sp.lo, err1 = num(lo)
	sp.hi, err2 = num(hi)
	if err1 != nil || err2 != nil || sp.lo > sp.hi {
		return nil, bad
	}
	return sp, nil
}

func (sp *span) contains(x float64) bool {
	if math.IsNaN(x) {
		return false
	}
	if x < sp.lo || x == sp.lo && sp.loOpen || x > sp.hi || x == sp.hi && sp.hiOpen {
		return false
	}
	return true
}

// parse converts text to the option's value (an int64, float64, bool,
// string, Size or time.Duration), or explains why not.
func (o Option) parse(text string) (any, error) {
	var v any
	var num float64 // for the range check
	switch o.Kind {
	case IntOption:
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("option %s wants an integer, got %q", o.Name, text)
		}
		v, num = n, float64(n)
	case FloatOption:
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return nil, fmt.Errorf("option %s wants a number, got %q", o.Name, text)
		}
		v, num = f, f
	case BoolOption:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return nil, fmt.Errorf("option %s wants true or false, got %q", o.Name, text)
		}
		return b, nil
	case EnumOption:
		for _, e := range o.Enum {
			if e == text {
				return text, nil
			}
		}
		return nil, fmt.Errorf("option %s wants one of %s, got %q", o.Name, strings.Join(o.Enum, "|"), text)
	case SizeOption:
		s, err := ParseSize(text)
		if err != nil {
			return nil, fmt.Errorf("option %s: %v", o.Name, err)
		}
		if o.rng != nil && s.IsFrac && !o.rng.contains(s.Fraction) {
			return nil, fmt.Errorf("option %s: a fraction must lie in %s, got %q", o.Name, o.Range, text)
		}
		return s, nil
	case DurationOption:
		d, err := time.ParseDuration(text)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("option %s wants a duration such as 500ms or 10s, got %q", o.Name, text)
		}
		return d, nil
	default:
		return text, nil
	}
	if o.rng != nil && !o.rng.contains(num) {
		return nil, fmt.Errorf("option %s must lie in %s, got %q", o.Name, o.Range, text)
	}
	return v, nil
}

var (
	sizeType     = reflect.TypeFor[Size]()
	durationType = reflect.TypeFor[time.Duration]()
)

// optionsOf reads the options a struct type declares. Each exported
// field with an `opt:"name"` tag is an option; `default`, `enum` (a|b|c),
// `range` (an interval) and `doc` tags describe it. A *float64 field is an
// option without a default (nil when not given), whose `default` tag is
// only text for listings.
func optionsOf(t reflect.Type) ([]Option, error) {
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("options must be a struct, not %s", t)
	}
	var out []Option
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, ok := f.Tag.Lookup("opt")
		if !ok {
			continue
		}
		o := Option{Name: name, Default: f.Tag.Get("default"), Doc: f.Tag.Get("doc"), Range: f.Tag.Get("range"), field: i}
		switch {
		case f.Type == sizeType:
			o.Kind = SizeOption
		case f.Type == durationType:
			o.Kind = DurationOption
		case f.Type.Kind() == reflect.Int64, f.Type.Kind() == reflect.Int:
			o.Kind = IntOption
		case f.Type.Kind() == reflect.Float64, f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Float64:
			o.Kind = FloatOption
		case f.Type.Kind() == reflect.Bool:
			o.Kind = BoolOption
		case f.Type.Kind() == reflect.String:
			o.Kind = StringOption
			if e := f.Tag.Get("enum"); e != "" {
				o.Kind, o.Enum = EnumOption, strings.Split(e, "|")
			}
		default:
			return nil, fmt.Errorf("option %s has type %s, which options cannot have", name, f.Type)
		}
		if o.Range != "" {
			sp, err := parseSpan(o.Range)
			if err != nil {
				return nil, fmt.Errorf("option %s: %v", name, err)
			}
			o.rng = sp
		} else if o.Kind == IntOption || o.Kind == FloatOption {
			return nil, fmt.Errorf("option %s is a number without a range tag", name)
		}
		if o.Default != "" && f.Type.Kind() != reflect.Pointer {
			if _, err := o.parse(o.Default); err != nil {
				return nil, fmt.Errorf("default of %v", err)
			}
		}
		out = append(out, o)
	}
	return out, nil
}

// set stores the option's value v (from parse) into the struct value s.
func (o Option) set(s reflect.Value, v any) {
	f := s.Field(o.field)
	if f.Kind() == reflect.Pointer {
		x := v.(float64)
		f.Set(reflect.ValueOf(&x))
		return
	}
	f.Set(reflect.ValueOf(v).Convert(f.Type()))
}
