// Package ir defines Kiln's intermediate representation: modules of
// functions whose single block of ops is the schedule, SSA tensor values
// with a dtype and a static shape, attributes, source locations, regions
// (fused kernels) and arena offsets (the memory level).
//
// Every op kind is declared once in the registry (see Register): its arity,
// attributes, shape and dtype inference, cost model, fusion class and
// memory behaviour. Adding an op is one Register call.
package ir
