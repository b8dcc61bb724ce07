package passes

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
)

// Step is one pass of a pipeline with its option text.
type Step struct {
	Pass *Pass
	Args map[string]string
}

// String prints the step in pipeline syntax with options sorted.
func (s Step) String() string {
	if len(s.Args) == 0 {
		return s.Pass.Name
	}
	keys := make([]string, 0, len(s.Args))
	for k := range s.Args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var kv []string
	for _, k := range keys {
		v := s.Args[k]
		if strings.ContainsAny(v, ",{}= ") {
			v = `"` + v + `"`
		}
		kv = append(kv, k+"="+v)
	}
	return s.Pass.Name + "{" + strings.Join(kv, ",") + "}"
}

// Pipeline is a parsed pipeline string.
type Pipeline []Step

func (p Pipeline) String() string {
	parts := make([]string, len(p))
	for i, s := range p {
		parts[i] = s.String()
	}
	return strings.Join(parts, ",")
}

// Resolver finds passes that are not in the registry (such as external
// ext:NAME passes); it returns nil, nil when it does not know the name.
type Resolver func(name string) (*Pass, error)

// ParsePipeline reads "a,b{key=value,key=value},c". Option values may be
// double-quoted to hold commas or braces. Every pass must be registered
// (or found by resolve) and every option must be valid for it.
func ParsePipeline(text string, resolve Resolver) (Pipeline, error) {
	var out Pipeline
	s := strings.TrimSpace(text)
	if s == "" {
		return nil, nil
	}
	i := 0
	for i < len(s) {
		j := i
		for j < len(s) && s[j] != ',' && s[j] != '{' {
			if s[j] == '}' || s[j] == '=' {
				return nil, fmt.Errorf("pipeline %q: unexpected %q at offset %d", text, s[j], j)
			}
			j++
		}
		name := strings.TrimSpace(s[i:j])
		if name == "" {
			return nil, fmt.Errorf("pipeline %q: empty pass name at offset %d", text, i)
		}
		args := map[string]string{}
		if j < len(s) && s[j] == '{' {
			k, err := parseArgs(s, j+1, args)
			if err != nil {
				return nil, fmt.Errorf("pipeline %q: %v", text, err)
			}
			j = k
		}
		p := Lookup(name)
		if p == nil && resolve != nil {
			var err error
			if p, err = resolve(name); err != nil {
				return nil, err
			}
		}
		if p == nil {
			return nil, fmt.Errorf("unknown pass %q%s (kiln passes lists them)", name, diag.DidYouMean(name, passNames()))
		}
		if _, err := NewContext(p, args); err != nil {
			return nil, err
		}
		out = append(out, Step{Pass: p, Args: args})
		for j < len(s) && s[j] == ' ' {
			j++
		}
		if j < len(s) {
			if s[j] != ',' {
				return nil, fmt.Errorf("pipeline %q: expected ',' at offset %d", text, j)
			}
			j++
			if j == len(s) {
				return nil, fmt.Errorf("pipeline %q ends with ','", text)
			}
		}
		i = j
	}
	return out, nil
}

// parseArgs reads key=value pairs up to the closing brace, returning the
// offset after it.
func parseArgs(s string, i int, args map[string]string) (int, error) {
	for {
		for i < len(s) && s[i] == ' ' {
			i++
		}
		if i < len(s) && s[i] == '}' && len(args) == 0 {
			return i + 1, nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return 0, fmt.Errorf("option at offset %d has no '='", i)
		}
		key := strings.TrimSpace(s[i : i+eq])
		if key == "" || strings.ContainsAny(key, ",{}") {
			return 0, fmt.Errorf("bad option name %q at offset %d", key, i)
		}
		i += eq + 1
		var val string
		if i < len(s) && s[i] == '"' {
			end := strings.IndexByte(s[i+1:], '"')
			if end < 0 {
				return 0, fmt.Errorf("unterminated quote at offset %d", i)
			}
			val = s[i+1 : i+1+end]
			i += end + 2
		} else {
			j := i
			for j < len(s) && s[j] != ',' && s[j] != '}' {
				j++
			}
			val = strings.TrimSpace(s[i:j])
			i = j
		}
		if _, dup := args[key]; dup {
			return 0, fmt.Errorf("option %s given twice", key)
		}
		args[key] = val
		if i >= len(s) {
			return 0, fmt.Errorf("missing '}'")
		}
		if s[i] == '}' {
			return i + 1, nil
		}
		if s[i] != ',' {
			return 0, fmt.Errorf("expected ',' or '}' at offset %d", i)
		}
		i++
	}
}

// passNames lists the registered passes' names.
func passNames() []string {
	var out []string
	for _, p := range All() {
		out = append(out, p.Name)
	}
	return out
}
