// Package golden runs Kiln's golden-file tests: each case is a txtar
// archive holding the command to run, its input files and the expected
// standard output, standard error, exit status and output files. Setting
// KILN_UPDATE=1 rewrites the expectations in place; a mismatch prints a
// line diff. An input file named NAME.b64 holds base64 text and is written
// as the binary file NAME (ONNX models). Out-of-tree passes can use the
// same harness (docs/plugins.md).
package golden
