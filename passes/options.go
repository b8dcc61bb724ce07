package passes

import (
	"fmt"
	"math"
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

// Option declares one option of a pass.
type Option struct {
	Name    string
	Kind    OptionKind
	Default string // in the option's text form; "" means unset
	Enum    []string
	Doc     string
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

// parseOption converts text to the option's value, or explains why not.
func (o Option) parse(text string) (any, error) {
	switch o.Kind {
	case IntOption:
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("option %s wants an integer, got %q", o.Name, text)
		}
		return n, nil
	case FloatOption:
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return nil, fmt.Errorf("option %s wants a number, got %q", o.Name, text)
		}
		return f, nil
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
		return s, nil
	case DurationOption:
		d, err := time.ParseDuration(text)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("option %s wants a duration such as 500ms or 10s, got %q", o.Name, text)
		}
		return d, nil
	}
	return text, nil
}

func (o Option) zero() any {
	switch o.Kind {
	case IntOption:
		return int64(0)
	case FloatOption:
		return 0.0
	case BoolOption:
		return false
	case SizeOption:
		return Size{}
	case DurationOption:
		return time.Duration(0)
	}
	return ""
}
