package parser

import (
	"github.com/alecthomas/participle/v2"
	"github.com/alecthomas/participle/v2/lexer"
)

var kirParser = participle.MustBuild[fileAST](
	participle.Lexer(kirLexer),
	participle.UseLookahead(2),
)

type fileAST struct {
	Funcs []*funcAST `parser:"@@*"`
}

type funcAST struct {
	Pos     lexer.Position
	Name    string         `parser:"'func' @FuncRef"`
	Args    []*argAST      `parser:"'(' (@@ (',' @@)*)? ')'"`
	Results []*resultAST   `parser:"Arrow '(' (@@ (',' @@)*)? ')'"`
	Attrs   *attrDictAST   `parser:"('attributes' @@)?"`
	Body    []*opAST       `parser:"'{' @@*"`
	Return  *terminatorAST `parser:"'return' @@ '}'"`
}

// terminatorAST is the value list of a return or yield.
type terminatorAST struct {
	Pos    lexer.Position
	Values []*refAST `parser:"(@@ (',' @@)*)?"`
}

type refAST struct {
	Pos  lexer.Position
	Name string `parser:"@ValueRef"`
}

type argAST struct {
	Pos   lexer.Position
	Name  string        `parser:"@ValueRef ':'"`
	Type  *typeAST      `parser:"@@"`
	Attrs []*argAttrAST `parser:"('{' @@ (',' @@)* '}')?"`
}

type argAttrAST struct {
	Pos   lexer.Position
	Key   string    `parser:"@(Ident | String)"`
	Value *valueAST `parser:"('=' @@)?"`
}

type resultAST struct {
	Pos   lexer.Position
	Name  *string      `parser:"(@(Ident | String) ':')?"`
	Type  *typeAST     `parser:"@@"`
	Attrs *attrDictAST `parser:"@@?"`
}

type typeAST struct {
	Pos   lexer.Position
	DType string   `parser:"@Ident"`
	Dims  []string `parser:"'[' (@Int (',' @Int)*)? ']'"`
}

type opAST struct {
	Pos      lexer.Position
	Results  []*refAST        `parser:"(@@ (',' @@)* '=')?"`
	Kind     string           `parser:"@Ident"`
	Operands []*refAST        `parser:"'(' (@@ (',' @@)*)? ')'"`
	Attrs    *attrDictAST     `parser:"@@?"`
	Types    []*resultTypeAST `parser:"(':' @@ (',' @@)*)?"`
	Loc      *locAST          `parser:"('loc' '(' @@ ')')?"`
	Region   *regionAST       `parser:"@@?"`
}

type resultTypeAST struct {
	Type   *typeAST `parser:"@@"`
	Offset *string  `parser:"('at' @Int)?"`
}

type regionAST struct {
	Pos   lexer.Position
	Args  []*paramAST    `parser:"'region' '(' (@@ (',' @@)*)? ')'"`
	Body  []*opAST       `parser:"'{' @@*"`
	Yield *terminatorAST `parser:"'yield' @@ '}'"`
}

type paramAST struct {
	Pos  lexer.Position
	Name string   `parser:"@ValueRef ':'"`
	Type *typeAST `parser:"@@"`
}

type attrDictAST struct {
	Entries []*attrEntryAST `parser:"'{' (@@ (',' @@)*)? '}'"`
}

type attrEntryAST struct {
	Pos   lexer.Position
	Key   string    `parser:"@(Ident | String) '='"`
	Value *valueAST `parser:"@@"`
}

type valueAST struct {
	Pos   lexer.Position
	Float *string   `parser:"  @Float"`
	Int   *string   `parser:"| @Int"`
	Str   *string   `parser:"| @String"`
	Bool  *string   `parser:"| @('true' | 'false')"`
	Dense *denseAST `parser:"| 'dense' '<' @@ '>'"`
	List  *listAST  `parser:"| @@"`
	DType *string   `parser:"| @Ident"`
}

type listAST struct {
	Elems []*valueAST `parser:"'[' (@@ (',' @@)*)? ']'"`
}

type denseAST struct {
	Type  *typeAST  `parser:"@@ ':'"`
	Hex   *string   `parser:"(  @Hex"`
	List  *listAST  `parser:" | @@"`
	Splat *valueAST `parser:" | @@)"`
}

type locAST struct {
	Pos   lexer.Position
	Fused []*locAST `parser:"  'fused' '[' (@@ (',' @@)*)? ']'"`
	File  *string   `parser:"| @String"`
	Line  *string   `parser:"  (':' ( @Int"`
	Col   *string   `parser:"         ':' @Int"`
	Name  *string   `parser:"       | @String))?"`
}
