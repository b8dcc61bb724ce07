package cuda

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kiln-compiler/kiln/ir"
	"github.com/kiln-compiler/kiln/outfile"
)

// Header is kiln_cuda.h, written next to kernels.cu.
//
//go:embed kiln_cuda.h
var Header string

// Schema is the JSON schema of plan.json (format kiln.launch-plan,
// version 1).
//
//go:embed plan.schema.json
var Schema string

// Files are the names Write creates in the plan directory.
var Files = []string{"plan.json", "kernels.cu", "kiln_cuda.h", "module.kir"}

// JSON is the plan's canonical text (indented, newline-terminated).
func (p *Plan) JSON() ([]byte, error) {
	b, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Write puts the plan, its kernels, the header and the module the plan
// was made from (which plan-check replays) in dir, and the files of extra
// (an Executable's), each file atomically, through g: none of them
// replaces a file the command read. It checks every file before it
// writes any.
func Write(dir string, out *Output, m *ir.Module, extra map[string][]byte, g *outfile.Guard) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plan, err := out.Plan.JSON()
	if err != nil {
		return err
	}
	files := map[string][]byte{"plan.json": plan, "kernels.cu": []byte(out.Kernels), "kiln_cuda.h": []byte(Header), "module.kir": []byte(m.String())}
	names := append([]string{}, Files...)
	for name, b := range extra {
		if _, ok := files[name]; ok {
			return fmt.Errorf("two files named %s", name)
		}
		files[name] = b
		names = append(names, name)
	}
	sort.Strings(names[len(Files):])
	for _, name := range names {
		if err := g.Check(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	for _, name := range names {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := g.Write(filepath.Join(dir, name), files[name], mode); err != nil {
			return err
		}
	}
	return nil
}
