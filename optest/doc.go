// Package optest holds the tests that run over every registered op
// (ir.OpNames): that each op record's derived implementations exist (an
// interpreter kernel, a loop lowering for the LLVM and CUDA backends, a
// gradient decision), that the interpreter, constant folding and compiled
// code agree on random and edge inputs within a stated error model, and
// that gradients match finite differences. It has no code of its own.
package optest
