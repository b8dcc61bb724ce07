// Package passes is Kiln's pass manager and its public pass API: a Pass
// has a name, a one-line summary, typed options and statistics, and a Run
// function over an ir.Module. Register adds a pass to the registry that
// pipeline strings ("dce,cse,reorder{algo=best}") and `kiln passes` use.
// The Manager runs a pipeline with instrumentation: IR printing, verifying
// after each pass, timing, statistics, dumps and crash reproducers.
package passes
