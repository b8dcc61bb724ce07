// Package zoo holds the benchmarks over the model zoo (testdata/models):
// `go test ./zoo -bench . -run ^$` imports each model, builds its training
// step and reports operations, bytes, peaks and time per stage.
package zoo
