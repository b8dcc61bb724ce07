// Package interp is Kiln's reference interpreter: it runs a function on
// concrete tensors, op by op in schedule order, and is the oracle every
// pass is checked against (translation validation). Floating values are
// computed in float64 and rounded to the value's dtype on every store
// (round to nearest even), so f32, f16 and bf16 results are those of a
// machine that stores in that dtype. Matmul and convolution use blocked,
// parallel loops so that real models run in seconds.
package interp
