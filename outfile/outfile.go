// Package outfile writes Kiln's output files atomically: the bytes go to
// a temporary file in the destination folder, which is then renamed over
// the destination, so a reader never sees a half-written file. It also
// refuses to write over any of the inputs it is given.
package outfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write stores data at path atomically (mode 0644). It fails when path
// names the same file as one of inputs.
func Write(path string, data []byte, inputs ...string) error {
	return WriteMode(path, data, 0o644, inputs...)
}

// WriteMode is Write with the file mode given (0755 for executables).
func WriteMode(path string, data []byte, mode os.FileMode, inputs ...string) error {
	for _, in := range inputs {
		if Same(path, in) {
			return fmt.Errorf("refusing to overwrite the input file %s", in)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		os.Remove(tmp.Name())
		if werr != nil {
			return werr
		}
		return cerr
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// Same reports whether a and b name the same file (by identity when both
// exist, by cleaned absolute path otherwise). "-" is never a file.
func Same(a, b string) bool {
	if a == "-" || b == "-" || a == "" || b == "" {
		return false
	}
	sa, ea := os.Stat(a)
	sb, eb := os.Stat(b)
	if ea == nil && eb == nil {
		return os.SameFile(sa, sb)
	}
	aa, _ := filepath.Abs(a)
	ab, _ := filepath.Abs(b)
	return aa == ab
}
