package golden

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// MainFunc runs a command line (without the program name) and returns its
// exit status; driver.Main is one.
type MainFunc func(args []string, stdin io.Reader, stdout, stderr io.Writer) int

// Sections of a case archive with a special meaning; every other file is
// written into the case's working folder before the commands run.
const (
	sectionCmd    = "cmd"    // one command per line, each starting with the program name
	sectionStdin  = "stdin"  // standard input of every command
	sectionStdout = "stdout" // expected standard output (all commands together)
	sectionStderr = "stderr" // expected standard error
	sectionExit   = "exit"   // expected exit status of each command, one per line; absent means all 0
	wantPrefix    = "want/"  // want/PATH: expected content of PATH after the commands
	// check/NAME: FileCheck directives (see Check) that stdout, stderr or
	// the file NAME must satisfy. A checked output has no exact section:
	// the case names the lines that matter, and updating leaves it alone.
	checkPrefix = "check/"
)

// Updating reports whether expectations are being rewritten
// (KILN_UPDATE=1).
func Updating() bool { return os.Getenv("KILN_UPDATE") == "1" }

var (
	numberRE = regexp.MustCompile(`\d+(\.\d+)?e[-+]?\d+|\d+\.\d+`)
	// reproducerRE matches the unique part of a reproducer's file name.
	reproducerRE = regexp.MustCompile(`(kiln-reproducer-[A-Za-z0-9_.-]*?)-\d+\.kir`)
	spacesRE     = regexp.MustCompile(` +`)
)

// Run runs every *.txtar case below dir as a subtest named by its path.
// A case whose comment contains "normalize-numbers" has every decimal
// number (with a point or an exponent, as JSON writes 6e-7) in its outputs
// replaced by N and runs of spaces squeezed (for
// timings).
func Run(t *testing.T, dir string, program string, main MainFunc) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".txtar") {
			cases = append(cases, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(cases)
	if len(cases) == 0 {
		t.Fatalf("no golden cases below %s", dir)
	}
	for _, path := range cases {
		rel, _ := filepath.Rel(dir, path)
		t.Run(strings.TrimSuffix(rel, ".txtar"), func(t *testing.T) { runCase(t, path, program, main) })
	}
}

func runCase(t *testing.T, path, program string, main MainFunc) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ar := Parse(data)
	cmdText, ok := ar.Get(sectionCmd)
	if !ok {
		t.Fatalf("%s: no -- cmd -- section", path)
	}
	work := t.TempDir()
	stdin, _ := ar.Get(sectionStdin)
	for _, f := range ar.Files {
		switch {
		case f.Name == sectionCmd || f.Name == sectionStdin || f.Name == sectionStdout ||
			f.Name == sectionStderr || f.Name == sectionExit || strings.HasPrefix(f.Name, wantPrefix) ||
			strings.HasPrefix(f.Name, checkPrefix):
			continue
		}
		p := filepath.Join(work, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(f.Name, "bin/") {
			mode = 0o755 // programs the case runs, such as external passes
		}
		body := f.Data
		if strings.HasSuffix(p, ".b64") {
			// Binary inputs (ONNX models) are kept as base64 text.
			dec, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(body)), ""))
			if err != nil {
				t.Fatalf("%s: %s: %v", path, f.Name, err)
			}
			p, body = strings.TrimSuffix(p, ".b64"), dec
		}
		if err := os.WriteFile(p, body, mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(work)
	var stdout, stderr bytes.Buffer
	var exits []string
	for _, line := range strings.Split(string(cmdText), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		args, err := SplitWords(line)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(args) == 0 || args[0] != program {
			t.Fatalf("%s: command %q must start with %s", path, line, program)
		}
		code := main(args[1:], bytes.NewReader(stdin), &stdout, &stderr)
		exits = append(exits, strconv.Itoa(code))
	}
	normalize := func(s string) string {
		s = strings.ReplaceAll(s, work, "$WORK")
		s = strings.ReplaceAll(s, filepath.Join(os.TempDir(), "kiln-reproducer"), "$TMP/kiln-reproducer")
		s = reproducerRE.ReplaceAllString(s, "$1-N.kir")
		if bytes.Contains(ar.Comment, []byte("normalize-numbers")) {
			s = numberRE.ReplaceAllString(s, "N")
			s = spacesRE.ReplaceAllString(s, " ")
		}
		return s
	}
	got := map[string]string{
		sectionStdout: normalize(stdout.String()),
		sectionStderr: normalize(stderr.String()),
		sectionExit:   strings.Join(exits, "\n") + "\n",
	}
	if strings.Trim(got[sectionExit], "0\n") == "" {
		got[sectionExit] = ""
	}
	for _, f := range ar.Files {
		if name, ok := strings.CutPrefix(f.Name, wantPrefix); ok {
			b, err := os.ReadFile(filepath.Join(work, filepath.FromSlash(name)))
			if err != nil {
				got[f.Name] = fmt.Sprintf("<missing: %v>\n", err)
			} else {
				got[f.Name] = normalize(string(b))
			}
		}
	}
	for _, f := range ar.Files {
		name, ok := strings.CutPrefix(f.Name, checkPrefix)
		if !ok {
			continue
		}
		text, isStd := got[name]
		if !isStd {
			b, err := os.ReadFile(filepath.Join(work, filepath.FromSlash(name)))
			if err != nil {
				t.Errorf("%s: %s: %v", path, f.Name, err)
				continue
			}
			text = normalize(string(b))
		}
		if msg := Check(string(f.Data), text); msg != "" {
			t.Errorf("%s: %s: %s\n%s:\n%s", path, f.Name, msg, name, text)
		}
		delete(got, name) // checked, not compared
	}
	if Updating() {
		for _, name := range sortedKeys(got) {
			if got[name] == "" && !strings.HasPrefix(name, wantPrefix) {
				ar.Delete(name)
			} else {
				ar.Set(name, []byte(got[name]))
			}
		}
		if err := os.WriteFile(path, Format(ar), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, name := range sortedKeys(got) {
		want, _ := ar.Get(name)
		if d := Diff(string(want), got[name]); d != "" {
			t.Errorf("%s: %s differs (-want +got); KILN_UPDATE=1 go test rewrites it:\n%s", path, name, d)
		}
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// SplitWords splits a command line into words, honouring single and double
// quotes and backslash escapes outside single quotes.
func SplitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ' in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated \" in %q", s)
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
