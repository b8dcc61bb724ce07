// Package parser reads Kiln's text format (docs/langref.md) into an
// ir.Module. The grammar is declared with participle; lowering resolves
// value names into SSA and reports each problem as a diagnostic at its
// file:line:col. Parsing resumes at the next function after a syntax
// error, so one run reports errors in several functions.
package parser
