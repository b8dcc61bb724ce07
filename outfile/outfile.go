// Package outfile writes Kiln's output files. A regular file is replaced
// atomically: the bytes go to a temporary file in the destination folder,
// which is then renamed over the destination, so a reader never sees a
// half-written file. A symbolic link is followed (its target is
// replaced); a target that is not a regular file (a device such as
// /dev/null, a FIFO) is written through, never replaced. A Guard refuses
// to write over any input of the command and to write one file twice.
package outfile

import (
	"fmt"
	"github.com/kiln-compiler/kiln/scratch"
	"os"
	"path/filepath"
	"sync"
)

// Write stores data at path (mode 0644). It fails when path names the
// same file as one of inputs.
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
	path = followLinks(path)
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		if st.IsDir() {
			return fmt.Errorf("%s is a directory", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return err
		}
		_, werr := f.Write(data)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		return werr
	}
	tmp, err := scratch.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if !renamed {
			scratch.Remove(tmp.Name())
		}
	}()
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		if werr != nil {
			return werr
		}
		return cerr
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	renamed = true
	scratch.Forget(tmp.Name())
	return nil
}

// Same reports whether a and b name the same file (by device and inode
// when both exist, by cleaned absolute path otherwise). "-" is never a
// file.
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

// Guard records the files one command reads and writes. Writes through
// it never replace an input and never write one file twice (two outputs
// that map to the same name). The zero Guard is ready to use; a nil
// Guard guards nothing.
type Guard struct {
	mu      sync.Mutex
	inputs  []string
	written []string
}

// Read records files the command reads.
func (g *Guard) Read(paths ...string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range paths {
		if p != "" && p != "-" {
			g.inputs = append(g.inputs, p)
		}
	}
}

// Check reports why path may not be written, or nil.
func (g *Guard) Check(path string) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, in := range g.inputs {
		if Same(path, in) {
			return fmt.Errorf("refusing to overwrite the input file %s", in)
		}
	}
	for _, w := range g.written {
		if Same(path, w) {
			return fmt.Errorf("two outputs are written to %s", path)
		}
	}
	return nil
}

// Write checks path and writes data there (WriteMode).
func (g *Guard) Write(path string, data []byte, mode os.FileMode) error {
	if err := g.Check(path); err != nil {
		return err
	}
	if err := WriteMode(path, data, mode); err != nil {
		return err
	}
	if g != nil {
		g.mu.Lock()
		g.written = append(g.written, path)
		g.mu.Unlock()
	}
	return nil
}

// followLinks resolves symbolic links at path, a dangling one included
// (its target is created), up to 40 levels as the kernel allows.
func followLinks(path string) string {
	for i := 0; i < 40; i++ {
		st, err := os.Lstat(path)
		if err != nil || st.Mode()&os.ModeSymlink == 0 {
			return path
		}
		target, err := os.Readlink(path)
		if err != nil {
			return path
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	return path
}
