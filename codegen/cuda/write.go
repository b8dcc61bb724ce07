package cuda

import (
	_ "embed"
	"encoding/json"
	"os"
	"path/filepath"

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
// was made from (which plan-check replays) in dir, each file atomically,
// through g: none of them replaces a file the command read. It checks
// every file before it writes any.
func Write(dir string, out *Output, m *ir.Module, g *outfile.Guard) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plan, err := out.Plan.JSON()
	if err != nil {
		return err
	}
	files := map[string][]byte{"plan.json": plan, "kernels.cu": []byte(out.Kernels), "kiln_cuda.h": []byte(Header), "module.kir": []byte(m.String())}
	for _, name := range Files {
		if err := g.Check(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	for _, name := range Files {
		if err := g.Write(filepath.Join(dir, name), files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}
