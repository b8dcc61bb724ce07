package ir

import (
	"fmt"
	"strings"

	"github.com/kiln-compiler/kiln/diag"
)

// Verify checks the module's structural invariants and returns every
// problem found, or nil:
//   - function names are unique; value names are unique within a function;
//   - every operand is defined before its use (a region sees only its
//     arguments and its own ops);
//   - every op kind is registered, its operand count and attributes are
//     valid and its result types equal the inferred ones;
//   - every tensor's byte size fits in int64; offsets are not negative.
func Verify(m *Module) error {
	var errs diag.List
	funcs := map[string]bool{}
	for _, f := range m.Funcs {
		if funcs[f.Name] {
			errs = append(errs, at(f.Pos, f, nil, fmt.Sprintf("function @%s is defined twice", QuoteName(f.Name))))
		}
		funcs[f.Name] = true
		errs = append(errs, verifyFunc(f)...)
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// at builds a diagnostic at p, falling back to the op's location or the
// function's position when p is unknown (ops made by passes).
func at(p Pos, f *Func, op *Op, msg string) diag.Diagnostic {
	if !p.IsValid() && op != nil && op.Loc.Line > 0 {
		return diag.Diagnostic{File: op.Loc.File, Line: op.Loc.Line, Col: op.Loc.Col, Msg: msg}
	}
	if !p.IsValid() {
		p = f.Pos
		if op != nil {
			msg = fmt.Sprintf("in @%s, op %s: %s", QuoteName(f.Name), op.Kind, msg)
		} else {
			msg = fmt.Sprintf("in @%s: %s", QuoteName(f.Name), msg)
		}
	}
	return diag.Diagnostic{File: p.File, Line: p.Line, Col: p.Col, Msg: msg}
}

type verifier struct {
	f     *Func
	names map[string]bool
	errs  diag.List
	total int64 // bytes of the values defined so far
}

// MaxFuncBytes bounds the bytes of all of a function's values together, so
// that no memory figure (live bytes, arena offsets, reports) overflows.
const MaxFuncBytes = 1 << 62

func verifyFunc(f *Func) diag.List {
	v := &verifier{f: f, names: map[string]bool{}}
	scope := map[*Value]bool{}
	if r, ok := f.Attrs["ranks"]; ok && (r.Kind != AttrInt || r.Int < 1 || r.Int > MaxRanks) {
		v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("attribute ranks must be a count of ranks from 1 to %d, not %s", MaxRanks, r)))
	}
	for i, a := range f.Args {
		if a.Arg == nil {
			v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("argument %d has no argument info", i)))
			continue
		}
		if _, err := ShardLevels(f, a); err != nil {
			v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("argument %s: %v", a.Ref(), err)))
		}
		if h, ok := a.Arg.Attrs["host"]; ok && h.Kind != AttrBool {
			v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("argument %s: host must be true or false, not %s", a.Ref(), h)))
		}
		v.define(a, f.Pos, nil)
		scope[a] = true
		if a.Arg.Init != nil {
			if err := a.Arg.Init.Validate(); err != nil {
				v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("initial value of %s: %v", a.Ref(), err)))
			} else if want := InitType(f, a); !a.Arg.Init.Type.Equal(want) {
				v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("initial value of %s has type %s, want %s", a.Ref(), a.Arg.Init.Type, want)))
			}
		}
	}
	v.block(f.Body, scope)
	v.writes(f)
	resultNames := map[string]int{}
	for i, r := range f.Results {
		name := f.ResultName(i)
		if j, dup := resultNames[name]; dup {
			v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("results %d and %d are both named %q (results are written and looked up by name)", j, i, name)))
		}
		resultNames[name] = i
		if err := checkResultAttrs(f, r); err != nil {
			v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("result %d: %v", i, err)))
		}
		if r.Value == nil || !scope[r.Value] {
			name := "<nil>"
			if r.Value != nil {
				name = r.Value.Ref()
			}
			v.errs = append(v.errs, at(f.Pos, f, nil, fmt.Sprintf("result %d uses undefined value %s", i, name)))
		}
	}
	return v.errs
}

func (v *verifier) define(val *Value, p Pos, op *Op) {
	if v.names[val.Name] {
		v.errs = append(v.errs, at(p, v.f, op, fmt.Sprintf("value %s is defined twice", val.Ref())))
	}
	v.names[val.Name] = true
	if n, ok := val.Type.Bytes(); !ok {
		v.errs = append(v.errs, at(p, v.f, op, fmt.Sprintf("type %s of %s is too large: its size in bytes overflows int64", val.Type, val.Ref())))
	} else if v.total <= MaxFuncBytes {
		if n > MaxFuncBytes-v.total {
			v.errs = append(v.errs, at(p, v.f, op, fmt.Sprintf("with %s the values of @%s add up to more than %d bytes (2^62), beyond what memory figures can count", val.Ref(), v.f.Name, int64(MaxFuncBytes))))
		}
		v.total += min(n, MaxFuncBytes+1-v.total)
	}
	if val.Type.DType == Invalid {
		v.errs = append(v.errs, at(p, v.f, op, fmt.Sprintf("value %s has no dtype", val.Ref())))
	}
	if val.Offset < NoOffset {
		v.errs = append(v.errs, at(p, v.f, op, fmt.Sprintf("value %s has negative offset %d", val.Ref(), val.Offset)))
	}
}

func (v *verifier) block(body []*Op, scope map[*Value]bool) {
	for _, op := range body {
		v.op(op, scope)
		for _, r := range op.Results {
			scope[r] = true
		}
	}
}

func (v *verifier) op(op *Op, scope map[*Value]bool) {
	ok := true
	for i, x := range op.Operands {
		if x == nil || !scope[x] {
			name := "<nil>"
			if x != nil {
				name = x.Ref()
			}
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("operand %d of %s uses undefined value %s", i, op.Kind, name)))
			ok = false
		}
	}
	for i, r := range op.Results {
		if r.Def != op || r.Index != i {
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("result %s is not linked to its op", r.Ref())))
		}
		v.define(r, op.Pos, op)
	}
	if op.Region != nil {
		v.region(op, scope)
	}
	d := op.Def()
	if d == nil {
		v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("unknown op %q", op.Kind)))
		return
	}
	if d.HasRegion != (op.Region != nil) {
		if d.HasRegion {
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("op %s needs a region", op.Kind)))
		} else {
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("op %s takes no region", op.Kind)))
		}
		return
	}
	if d.HasRegion {
		if err := d.CheckAttrs(op.Attrs); err != nil {
			v.errs = append(v.errs, at(op.Pos, v.f, op, err.Error()))
		}
		return
	}
	if !ok {
		return
	}
	in := op.OperandTypes()
	want, err := d.InferTypes(in, op.Attrs)
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "op ") {
			msg = op.Kind + ": " + msg
		}
		v.errs = append(v.errs, at(op.Pos, v.f, op, msg))
		return
	}
	if len(want) != len(op.Results) {
		v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("%s has %d results, want %d", op.Kind, len(op.Results), len(want))))
		return
	}
	for i, r := range op.Results {
		if !r.Type.Equal(want[i]) {
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("%s result %s has type %s, but its operands give %s", op.Kind, r.Ref(), r.Type, want[i])))
		}
	}
}

// region checks a kernel body: it sees only its own arguments, which match
// the op's operands, and it yields values matching the op's results.
func (v *verifier) region(op *Op, _ map[*Value]bool) {
	r := op.Region
	inner := map[*Value]bool{}
	if len(r.Args) != len(op.Operands) {
		v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("region has %d arguments for %d operands", len(r.Args), len(op.Operands))))
	}
	for i, a := range r.Args {
		v.define(a, op.Pos, op)
		inner[a] = true
		if i < len(op.Operands) && op.Operands[i] != nil && !a.Type.Equal(op.Operands[i].Type) {
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("region argument %s has type %s, operand has %s", a.Ref(), a.Type, op.Operands[i].Type)))
		}
	}
	v.block(r.Body, inner)
	if len(r.Yield) != len(op.Results) {
		v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("region yields %d values for %d results", len(r.Yield), len(op.Results))))
		return
	}
	for i, y := range r.Yield {
		if y == nil || !inner[y] {
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("region yields a value not defined in it (result %d)", i)))
			continue
		}
		if !y.Type.Equal(op.Results[i].Type) {
			v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("region yields %s for result of type %s", y.Type, op.Results[i].Type)))
		}
	}
}

// writes checks ops that overwrite operands: each written operand is an
// inout argument, written once, and not read afterwards or returned.
func (v *verifier) writes(f *Func) {
	writer := map[*Value]int{}
	for i, op := range f.Body {
		d := op.Def()
		onHost := OnHost(op)
		for _, x := range op.Operands {
			if InHost(x) != (op.Kind == "swap_in") && !onHost {
				if op.Kind == "swap_in" {
					v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("swap_in reads %s, which is not in host memory (a swap_out result or a host argument)", x.Ref())))
				} else {
					v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("%s reads %s, which is in host memory (swap it in first)", op.Kind, x.Ref())))
				}
			}
			if w, ok := writer[x]; ok && w < i {
				v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("%s reads %s after op %d overwrote it", op.Kind, x.Ref(), w)))
			}
		}
		if d == nil {
			continue
		}
		for _, k := range d.Writes {
			if k >= len(op.Operands) || op.Operands[k] == nil {
				continue
			}
			x := op.Operands[k]
			if x.Arg == nil || !x.Arg.InOut {
				v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("%s overwrites %s, which is not an inout argument", op.Kind, x.Ref())))
				continue
			}
			if _, dup := writer[x]; dup {
				v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("%s is overwritten twice", x.Ref())))
			}
			writer[x] = i
			if f.IsResult(x) {
				v.errs = append(v.errs, at(op.Pos, v.f, op, fmt.Sprintf("%s is returned and overwritten", x.Ref())))
			}
		}
	}
}

// checkResultAttrs checks a result's role: a known one, and for a
// gradient the param it belongs to.
func checkResultAttrs(f *Func, r Result) error {
	role, ok := r.Attrs["role"]
	if !ok {
		return nil
	}
	switch role.Str {
	case RoleLoss, RoleGradsFinite:
	case RoleGrad:
		p := r.Attrs.String("param", "")
		for _, a := range f.Args {
			if a.Name == p && a.Arg != nil && a.Arg.Kind == ArgParam {
				return nil
			}
		}
		return fmt.Errorf("the gradient's attribute param = %q names no param argument", p)
	default:
		return fmt.Errorf("role must be %q, %q or %q, not %q", RoleLoss, RoleGrad, RoleGradsFinite, role.Str)
	}
	return nil
}

// MaxRanks bounds the ranks a function may say it runs on (attribute
// ranks), so that a runner never allocates for more.
const MaxRanks = 4096
