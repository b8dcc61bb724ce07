package parser

import (
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/alecthomas/participle/v2/lexer"
)

// The tokens of the text format. At each position the first rule that
// matches wins, in this order:
//
//	Comment     //[^\n]*
//	Whitespace  [ \t\r\n]+
//	Keyword     (func|return|yield)\b
//	ValueRef    %([A-Za-z0-9_.$-]+|"(\\.|[^"\\\n])*")
//	FuncRef     @([A-Za-z0-9_.$-]+|"(\\.|[^"\\\n])*")
//	Hex         0x[0-9a-fA-F]*
//	Float       [-+]?(\d+\.\d*([eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf\b|nan\b)
//	Int         [-+]?\d+
//	String      "(\\.|[^"\\\n])*"
//	Arrow       ->
//	Ident       [A-Za-z_][A-Za-z0-9_.]*
//	Punct       [(){}\[\],:=<>]
//
// kirLexer scans them by hand: a regular-expression lexer spent most of
// the time of parsing a large module.
const (
	tokComment lexer.TokenType = -(iota + 2)
	tokWhitespace
	tokKeyword
	tokValueRef
	tokFuncRef
	tokHex
	tokFloat
	tokInt
	tokString
	tokArrow
	tokIdent
	tokPunct
)

type kirLexerDef struct{}

var kirLexer kirLexerDef

func (kirLexerDef) Symbols() map[string]lexer.TokenType {
	return map[string]lexer.TokenType{
		"EOF": lexer.EOF, "Comment": tokComment, "Whitespace": tokWhitespace, "Keyword": tokKeyword,
		"ValueRef": tokValueRef, "FuncRef": tokFuncRef, "Hex": tokHex, "Float": tokFloat, "Int": tokInt,
		"String": tokString, "Arrow": tokArrow, "Ident": tokIdent, "Punct": tokPunct,
	}
}

func (d kirLexerDef) Lex(filename string, r io.Reader) (lexer.Lexer, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return d.LexString(filename, string(b))
}

func (kirLexerDef) LexString(filename, input string) (lexer.Lexer, error) {
	return &kirScanner{src: input, pos: lexer.Position{Filename: filename, Line: 1, Column: 1}}, nil
}

type kirScanner struct {
	src string
	i   int
	pos lexer.Position
}

func isDigit(c byte) bool     { return c >= '0' && c <= '9' }
func isLetter(c byte) bool    { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' }
func isWord(c byte) bool      { return isLetter(c) || isDigit(c) }
func isBareChar(c byte) bool  { return isWord(c) || c == '.' || c == '$' || c == '-' }
func isHexDigit(c byte) bool  { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }
func isIdentChar(c byte) bool { return isWord(c) || c == '.' }

// at returns the byte at i, or 0 past the end.
func (s *kirScanner) at(i int) byte {
	if i < len(s.src) {
		return s.src[i]
	}
	return 0
}

// word reports whether the text at i is w followed by a word boundary.
func (s *kirScanner) word(i int, w string) bool {
	return len(s.src)-i >= len(w) && s.src[i:i+len(w)] == w && !isWord(s.at(i+len(w)))
}

// quoted returns the end of a quoted string starting at i (a '"'), or -1.
func (s *kirScanner) quoted(i int) int {
	for j := i + 1; j < len(s.src); j++ {
		switch s.src[j] {
		case '"':
			return j + 1
		case '\n':
			return -1
		case '\\':
			if j+1 >= len(s.src) || s.src[j+1] == '\n' {
				return -1
			}
			_, size := utf8.DecodeRuneInString(s.src[j+1:])
			j += size
		}
	}
	return -1
}

// number returns the end of a Float or Int at i (after an optional sign),
// or -1, and which it is.
func (s *kirScanner) number(i int) (int, lexer.TokenType) {
	j := i
	if c := s.at(j); c == '-' || c == '+' {
		j++
	}
	if s.word(j, "inf") {
		return j + 3, tokFloat
	}
	if s.word(j, "nan") {
		return j + 3, tokFloat
	}
	k := j
	for isDigit(s.at(k)) {
		k++
	}
	if k == j {
		return -1, 0
	}
	exponent := func(e int) int { // [eE][-+]?\d+ at e, or -1
		if c := s.at(e); c != 'e' && c != 'E' {
			return -1
		}
		e++
		if c := s.at(e); c == '-' || c == '+' {
			e++
		}
		d := e
		for isDigit(s.at(e)) {
			e++
		}
		if e == d {
			return -1
		}
		return e
	}
	if s.at(k) == '.' {
		f := k + 1
		for isDigit(s.at(f)) {
			f++
		}
		if e := exponent(f); e >= 0 {
			return e, tokFloat
		}
		return f, tokFloat
	}
	if e := exponent(k); e >= 0 {
		return e, tokFloat
	}
	return k, tokInt
}

// match finds the token at s.i: its type and end.
func (s *kirScanner) match() (lexer.TokenType, int) {
	i := s.i
	c := s.src[i]
	switch {
	case c == '/' && s.at(i+1) == '/':
		j := i
		for j < len(s.src) && s.src[j] != '\n' {
			j++
		}
		return tokComment, j
	case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		j := i
		for j < len(s.src) {
			if c := s.src[j]; c != ' ' && c != '\t' && c != '\r' && c != '\n' {
				break
			}
			j++
		}
		return tokWhitespace, j
	case s.word(i, "func"):
		return tokKeyword, i + 4
	case s.word(i, "return"):
		return tokKeyword, i + 6
	case s.word(i, "yield"):
		return tokKeyword, i + 5
	case c == '%' || c == '@':
		t := tokValueRef
		if c == '@' {
			t = tokFuncRef
		}
		if s.at(i+1) == '"' {
			if e := s.quoted(i + 1); e >= 0 {
				return t, e
			}
		} else {
			j := i + 1
			for isBareChar(s.at(j)) {
				j++
			}
			if j > i+1 {
				return t, j
			}
		}
	case c == '0' && s.at(i+1) == 'x':
		j := i + 2
		for isHexDigit(s.at(j)) {
			j++
		}
		return tokHex, j
	}
	if e, t := s.number(i); e >= 0 {
		return t, e
	}
	switch {
	case c == '"':
		if e := s.quoted(i); e >= 0 {
			return tokString, e
		}
	case c == '-' && s.at(i+1) == '>':
		return tokArrow, i + 2
	case isLetter(c):
		j := i + 1
		for isIdentChar(s.at(j)) {
			j++
		}
		return tokIdent, j
	}
	switch c {
	case '(', ')', '{', '}', '[', ']', ',', ':', '=', '<', '>':
		return tokPunct, i + 1
	}
	return 0, -1
}

// Next returns the next token, skipping whitespace and comments (the
// grammar never sees them).
func (s *kirScanner) Next() (lexer.Token, error) {
	for {
		tok, err := s.next()
		if err != nil || (tok.Type != tokWhitespace && tok.Type != tokComment) {
			return tok, err
		}
	}
}

func (s *kirScanner) next() (lexer.Token, error) {
	if s.i >= len(s.src) {
		return lexer.EOFToken(s.pos), nil
	}
	t, end := s.match()
	if end < 0 {
		sample := []rune(s.src[s.i:min(len(s.src), s.i+64)])
		if len(sample) > 16 {
			sample = append(sample[:16], []rune("...")...)
		}
		return lexer.Token{}, &lexer.Error{Msg: fmt.Sprintf("lexer: invalid input text %q", string(sample)), Pos: s.pos}
	}
	tok := lexer.Token{Type: t, Value: s.src[s.i:end], Pos: s.pos}
	s.pos.Advance(tok.Value)
	s.i = end
	return tok, nil
}
