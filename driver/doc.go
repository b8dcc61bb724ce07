// Package driver is the `kiln` command line: it parses flags (before or
// after positional arguments), reads inputs, runs packages and writes
// outputs atomically. cmd/kiln is a one-line main around Main, so that a
// build with extra passes (see docs/plugins.md) is a three-line program.
package driver
