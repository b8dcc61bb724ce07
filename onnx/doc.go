// Package onnx imports ONNX models (default domain, opsets 6 to 28:
// minOpset and maxOpset) into Kiln IR. The protobuf is decoded with
// protowire into the few messages Kiln needs; shape-computation subgraphs
// are folded at import from the static shapes (with the interpreter's
// kernels), node names become locations, and value and argument names
// keep their ONNX spelling.
package onnx
