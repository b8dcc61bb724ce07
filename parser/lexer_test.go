package parser

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/participle/v2/lexer"
	"github.com/stretchr/testify/require"
)

// regexLexer is the token definition in its regular-expression form, the
// specification kirLexer implements by hand.
var regexLexer = lexer.MustSimple([]lexer.SimpleRule{
	{Name: "Comment", Pattern: `//[^\n]*`},
	{Name: "Whitespace", Pattern: `[ \t\r\n]+`},
	{Name: "Keyword", Pattern: `(?:func|return|yield)\b`},
	{Name: "ValueRef", Pattern: `%(?:[A-Za-z0-9_.$-]+|"(?:\\.|[^"\\\n])*")`},
	{Name: "FuncRef", Pattern: `@(?:[A-Za-z0-9_.$-]+|"(?:\\.|[^"\\\n])*")`},
	{Name: "Hex", Pattern: `0x[0-9a-fA-F]*`},
	{Name: "Float", Pattern: `[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf\b|nan\b)`},
	{Name: "Int", Pattern: `[-+]?\d+`},
	{Name: "String", Pattern: `"(?:\\.|[^"\\\n])*"`},
	{Name: "Arrow", Pattern: `->`},
	{Name: "Ident", Pattern: `[A-Za-z_][A-Za-z0-9_.]*`},
	{Name: "Punct", Pattern: `[(){}\[\],:=<>]`},
})

// tokens lexes src with def into "Name:value@line:col" strings, ending
// with the error, if any.
func tokens(t testing.TB, def lexer.Definition, src string) []string {
	names := lexer.SymbolsByRune(def)
	l, err := def.(lexer.StringDefinition).LexString("f", src)
	require.NoError(t, err)
	var out []string
	for {
		tok, err := l.Next()
		if err != nil {
			return append(out, "error: "+err.Error())
		}
		if tok.EOF() {
			return out
		}
		if n := names[tok.Type]; n == "Whitespace" || n == "Comment" {
			continue // kirLexer skips them
		}
		out = append(out, names[tok.Type]+":"+tok.Value+"@"+tok.Pos.String())
	}
}

func checkSameTokens(t testing.TB, src string) {
	require.Equal(t, tokens(t, regexLexer, src), tokens(t, kirLexer, src), "%q", src)
}

// TestLexerMatchesItsSpecification: the hand-written lexer gives the
// tokens, positions and errors of the regular-expression rules on every
// .kir text in testdata and on random strings of the format's characters.
func TestLexerMatchesItsSpecification(t *testing.T) {
	err := filepath.WalkDir("../testdata", func(path string, d os.DirEntry, err error) error {
		if err == nil && (strings.HasSuffix(path, ".kir") || strings.HasSuffix(path, ".txtar")) {
			b, rerr := os.ReadFile(path)
			require.NoError(t, rerr)
			checkSameTokens(t, string(b))
		}
		return err
	})
	require.NoError(t, err)
	alphabet := []string{"func", "return", "yield", "%", "@", "\"", "\\", "0x", "1", "0", "9", ".", "e", "E", "-", "+", "inf", "nan",
		"x", "_", "$", "->", ">", "<", "(", ")", "{", "}", "[", "]", ",", ":", "=", " ", "\n", "\t", "/", "//", "é", "\xff", "infx", "a.b"}
	rng := rand.New(rand.NewPCG(1, 1))
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := rng.IntN(12); n >= 0; n-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		checkSameTokens(t, b.String())
	}
}

func FuzzLexer(f *testing.F) {
	f.Add("func @f(%x: f32[4]) -> (f32[4]) {\n  return %x\n}\n")
	f.Add(`%"a\"b" 0x1f -1.5e+3 inf -nan "s" // c`)
	f.Fuzz(func(t *testing.T, src string) { checkSameTokens(t, src) })
}
