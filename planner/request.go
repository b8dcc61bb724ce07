// Package planner turns what a user asks of a training step (train it
// with this loss and optimizer, at this -O level, under these budgets,
// over these devices, allowing these approximations) into the pipeline of
// passes that meets it, and runs it: the budget toolbox (recomputation,
// microbatching, swapping and offloading, tried in turn), the placement of
// the optimizer's updates, and the search over parallel plans live here,
// above the passes, so that the command line and the Python entry get the
// same plan from the same request.
package planner

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-compiler/kiln/costmodel"
	"github.com/kiln-compiler/kiln/diag"
	"github.com/kiln-compiler/kiln/passes"
)

// Request is what the user asks for.
type Request struct {
	// Train differentiates the function first (autodiff{loss=Train}):
	// "sum" or "mean" of the first result; "" plans the function as it is.
	Train string
	// KeepOutputs, with Train, has the step return the forward's results
	// after the loss and gradients (autodiff{keep-outputs=true}): a
	// model's logits beside its loss.
	KeepOutputs bool
	// Optimizer appends its update step after autodiff: "sgd",
	// "momentum", "adam" or "adamw" ("": none). Its updates are placed
	// where the plan needs less memory (UpdatePlacement).
	Optimizer string
	// OptimizerOptions are the optimizer pass's options besides its kind
	// ("lr=0.01,weight-decay=0"), as the pass takes them.
	OptimizerOptions string
	// Precision is the dtype of the step's activations and products,
	// then the precision pass's other options ("bf16", "f16",
	// "bf16,saved=fp8", "f32,saved=bf16"; "": f32, no pass):
	// precision{dtype=...} runs right after autodiff. With a budget,
	// narrower saved values (bf16, fp8) are among the toolbox's mechanisms
	// when Allow names them (bf16-saved, fp8-saved).
	Precision string
	// Microbatches > 1 splits the step into that many slices of its batch
	// (gradient accumulation): exactly, statistics of the whole batch kept
	// in phases where the step has them, unless per-slice statistics are
	// allowed.
	Microbatches int
	// Parallel partitions the step over ranks: the parallel pass's
	// options ("dp=2,zero=2", "tp=2", "pp=2,microbatches=4"), or
	// "devices=N[,device-memory=M]" to search for the fastest plan that
	// fits.
	Parallel string
	// Level is the -O level (0 to 3), or -1 when Passes is the pipeline.
	Level int
	// Passes is a pipeline of the user's own (with Level -1).
	Passes string
	// Budget, with Level 2 or 3, bounds the step's peak: bytes ("512MiB")
	// or a fraction of the peak after autodiff alone ("0.5"). The toolbox
	// recomputes, splits into microbatches, swaps and offloads, in turn.
	Budget string
	// DeviceBudget, with Level 2 or 3, bounds the device memory (the
	// arguments kept on it, the arena and the kernels' workspace): bytes,
	// or a fraction of the step's after autodiff alone.
	DeviceBudget string
	// Allow names the approximations the plan may make
	// (passes.ApproximationNames); none unless named.
	Allow []string
	// Device is what every pass, estimate and report models.
	Device costmodel.Device
	// Need is what the plan's consumer needs when the pipeline ends
	// (arena offsets for compiled code).
	Need []passes.Property
}

// NewRequest is the request of a function planned as it is (Level -1,
// no passes) on the default device.
func NewRequest() Request { return Request{Level: -1, Device: costmodel.Default} }

// RequestError is a request that cannot be planned as asked: a misuse,
// which the command line reports with exit status 2.
type RequestError struct{ Msg string }

func (e *RequestError) Error() string { return e.Msg }

// Optimizers are the optimizer kinds a request may name ("none": no
// update, the gradients returned, the step's state advancing).
var Optimizers = []string{"sgd", "momentum", "adam", "adamw", "none"}

// Check refuses a request that cannot be planned as asked, before any
// input is read: a *RequestError.
func (r Request) Check() error {
	switch {
	case r.Train != "" && r.Train != "sum" && r.Train != "mean":
		return &RequestError{fmt.Sprintf("the loss is sum or mean, not %q", r.Train)}
	case r.KeepOutputs && r.Train == "":
		return &RequestError{"--keep-outputs needs --train"}
	case r.OptimizerOptions != "" && r.Optimizer == "":
		return &RequestError{"--optimizer-options needs --optimizer"}
	case strings.ContainsAny(r.OptimizerOptions, "{}"):
		return &RequestError{fmt.Sprintf("--optimizer-options takes key=value pairs separated by commas, not %q", r.OptimizerOptions)}
	case r.Optimizer != "" && !slices.Contains(Optimizers, r.Optimizer):
		return &RequestError{fmt.Sprintf("--optimizer must be one of %s, not %q%s", strings.Join(Optimizers, ", "), r.Optimizer, diag.DidYouMean(r.Optimizer, Optimizers))}
	case r.Precision != "" && !slices.Contains([]string{"bf16", "f16", "f32"}, r.precisionDType()):
		return &RequestError{fmt.Sprintf("--precision starts with the dtype, bf16, f16 or f32 (then the precision pass's options: bf16,saved=fp8), not %q%s", r.Precision, diag.DidYouMean(r.precisionDType(), []string{"bf16", "f16", "f32"}))}
	case r.narrowsSaved() != "" && !r.allows(r.narrowsSaved()):
		return &RequestError{fmt.Sprintf("--precision %s stores the saved values narrower than the step computes them, an approximation: allow it by name (--allow %s)", r.Precision, r.narrowsSaved())}
	case r.Precision != "" && r.Train == "":
		return &RequestError{"--precision sets the dtypes of a training step: it needs --train"}
	case r.Microbatches < 0 || r.Microbatches > 0 && r.Train == "":
		return &RequestError{fmt.Sprintf("--microbatches takes a count of at least 1 and needs --train (got %d)", r.Microbatches)}
	case r.Parallel != "" && r.Train == "":
		return &RequestError{"--parallel partitions a training step: it needs --train"}
	case r.Level > 3:
		return &RequestError{fmt.Sprintf("there is no -O%d", r.Level)}
	case r.Level >= 0 && r.Passes != "":
		return &RequestError{"give --passes or an -O level, not both"}
	case (r.Budget != "" || r.DeviceBudget != "") && r.Level < 2:
		return &RequestError{"--budget and --device-budget need -O2 or -O3"}
	}
	if r.Train != "" && r.Passes != "" {
		if ps, err := passes.ParsePipeline(r.Passes, nil); err == nil && slices.ContainsFunc(ps, func(s passes.Step) bool { return s.Pass.Name == "autodiff" }) {
			return &RequestError{fmt.Sprintf("--train differentiates the function already (autodiff{loss=%s} runs before --passes): drop autodiff from --passes, or --train", r.Train)}
		}
	}
	if err := passes.CheckAllowed(r.Allow); err != nil {
		return &RequestError{"--allow: " + err.Error()}
	}
	if err := r.Device.Validate(); err != nil {
		return &RequestError{"--device: " + err.Error()}
	}
	for _, b := range []string{r.Budget, r.DeviceBudget} {
		if b == "" {
			continue
		}
		sz, err := passes.ParseSize(b)
		if err != nil {
			return &RequestError{fmt.Sprintf("budget %q: %v", b, err)}
		}
		if sz.IsFrac && (sz.Fraction <= 0 || sz.Fraction > 1) {
			return &RequestError{fmt.Sprintf("a budget fraction is in (0, 1], not %s", b)}
		}
	}
	return nil
}

// allows reports whether the request allows the approximation name.
func (r Request) allows(name string) bool { return slices.Contains(r.Allow, name) }

// precisionDType is the dtype Precision names first.
func (r Request) precisionDType() string {
	d, _, _ := strings.Cut(r.Precision, ",")
	return d
}

// narrowsSaved is the approximation Precision's saved= makes, or "".
func (r Request) narrowsSaved() string {
	d, rest, _ := strings.Cut(r.Precision, ",")
	for _, kv := range strings.Split(rest, ",") {
		v, ok := strings.CutPrefix(kv, "saved=")
		// saved= no narrower than the dtype narrows nothing; an unknown
		// value is the pass option parser's to refuse.
		if ok && (v == "fp8" || (v == "bf16" || v == "f16") && d == "f32") {
			return v + "-saved"
		}
	}
	return ""
}

// precisionStep is the precision pass Precision asks for.
func (r Request) precisionStep() string {
	d, rest, _ := strings.Cut(r.Precision, ",")
	if rest != "" {
		rest = "," + rest
	}
	return "precision{dtype=" + d + rest + "}"
}

// Result is the plan made: the pipeline that ran (as the planner chose its
// steps), what each pass did, and why the planner chose as it did.
type Result struct {
	// Device is the device the plan was made for; Allowed the
	// approximations the request allowed.
	Device   costmodel.Device
	Allowed  []string
	Pipeline passes.Pipeline
	Runs     []passes.PassRun
	// Analyses are what the pipeline's last pass left cached.
	Analyses *passes.Analyses
	// Notes are the planner's decisions, each on the pass it concerns
	// (the update placement on optimizer, the toolbox's choice on the
	// pass that made it work).
	Notes []Note
	// Tries are the pipelines the toolbox ran before the one it kept, and
	// how each ended.
	Tries []Try
}

// Note is one decision of the planner, on the pass it concerns.
type Note struct {
	Pass string
	Text string
}

// Try is one pipeline the toolbox ran, and the error that ended it (nil:
// it met the budget).
type Try struct {
	Pipeline passes.Pipeline
	Err      error
}

// NotesOf returns the notes on the pass called name: the planner's and
// the pass's own (PassRun.Notes), in that order.
func (r *Result) NotesOf(name string) []string {
	var out []string
	for _, n := range r.Notes {
		if n.Pass == name {
			out = append(out, n.Text)
		}
	}
	for _, run := range r.Runs {
		if run.Name == name {
			out = append(out, run.Notes...)
		}
	}
	return out
}

// Approximations lists every approximation the plan's passes made.
func (r *Result) Approximations() []passes.Approximation {
	var out []passes.Approximation
	for _, run := range r.Runs {
		out = append(out, run.Approximations...)
	}
	return out
}
