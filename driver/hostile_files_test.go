package driver

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// npyImage is a .npy file of f32 values with the header dict given
// (padded as numpy pads it), version major.0.
func npyImage(dict string, major byte, values ...float32) []byte {
	var b bytes.Buffer
	b.WriteString("\x93NUMPY")
	b.WriteByte(major)
	b.WriteByte(0)
	pad := (64 - (10+len(dict)+1)%64) % 64
	h := dict
	for range pad {
		h += " "
	}
	h += "\n"
	binary.Write(&b, binary.LittleEndian, uint16(len(h)))
	b.WriteString(h)
	binary.Write(&b, binary.LittleEndian, values)
	return b.Bytes()
}

// exitCode runs cmd and returns its exit status and output.
func exitCode(t *testing.T, cmd *exec.Cmd) (int, string) {
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err, "%s", out)
	return 0, string(out)
}

// TestHostileFilesRefusedAlike: kiln run and a compiled executable read
// arguments by one set of rules: each hostile .npy or .npz below is
// refused by both (exit 1, naming the file), never read as something
// else; numpy's choice (the last of two members with one name) is taken
// by both. The executable also refuses what kiln run refuses on its
// command line (exit 2): an --input naming no argument, one naming an
// argument twice, an empty --output-dir; and it never writes a result over
// a file it read, nor two results to one file.
func TestHostileFilesRefusedAlike(t *testing.T) {
	needClang(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "f.kir")
	require.NoError(t, os.WriteFile(src, []byte(`func @f(%x: f32[2]) -> (x: f32[2], "a/b": f32[2], a_b: f32[2]) {
  %y = neg(%x) : f32[2]
  %z = relu(%x) : f32[2]
  %w = exp(%x) : f32[2]
  return %y, %z, %w
}
`), 0o644))
	good := `{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }`
	files := map[string][]byte{
		"two-descr":     npyImage(`{'descr': '<i8', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }`, 1, 1, 2),
		"trailing":      append(npyImage(good, 1, 1, 2), 0, 0, 0, 0),
		"version-9":     npyImage(good, 9, 1, 2),
		"unknown-key":   npyImage(`{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1, }`, 1, 1, 2),
		"short":         npyImage(good, 1, 1),
		"wrong-shape":   npyImage(`{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }`, 1, 1, 2, 3),
		"fortran-order": npyImage(`{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }`, 1, 1, 2),
	}
	// The executable: results x, a/b and a_b would collide, so it is
	// compiled from the one-result form for the file checks.
	one := filepath.Join(dir, "g.kir")
	require.NoError(t, os.WriteFile(one, []byte("func @g(%x: f32[2]) -> (f32[2]) {\n  %y = neg(%x) : f32[2]\n  return %y\n}\n"), 0o644))
	exe := filepath.Join(dir, "g")
	_, stderr, code := kiln(t, "compile", one, "-O1", "--emit", "exe", "-o", exe)
	require.Equal(t, 0, code, stderr)
	for name, b := range files {
		path := filepath.Join(dir, name+".npy")
		require.NoError(t, os.WriteFile(path, b, 0o644))
		_, stderr, code := kiln(t, "run", one, "--input", "x="+path, "--output-dir", filepath.Join(dir, "run-"+name))
		require.Equal(t, 1, code, "kiln run took %s: %s", name, stderr)
		c, out := exitCode(t, exec.Command(exe, "--input", "x="+path, "--output-dir", filepath.Join(dir, "exe-"+name)))
		require.Equal(t, 1, c, "the executable took %s: %s", name, out)
		require.Contains(t, out, path)
		if name == "wrong-shape" {
			require.Contains(t, out, "x wants f32[2]; the file's shape is (3,)", "the executable names both shapes")
			require.Contains(t, stderr, "holds f32[3], but argument %x is f32[2]", "kiln run names both shapes")
		}
	}
	// A device and a missing folder: refused by both, never read.
	for _, args := range [][]string{
		{"--input", "x=/dev/zero"},
		{"--inputs", "/dev/zero"},
		{"--inputs", filepath.Join(dir, "no-such-folder")},
	} {
		_, stderr, code := kiln(t, append([]string{"run", one, "--output-dir", filepath.Join(dir, "run-dev")}, args...)...)
		require.Equal(t, 1, code, "kiln run took %v: %s", args, stderr)
		c, out := exitCode(t, exec.Command(exe, append(args, "--output-dir", filepath.Join(dir, "exe-dev"))...))
		require.Equal(t, 1, c, "the executable took %v: %s", args, out)
	}
	// .npz: a member whose CRC is wrong; two members with one name.
	zipOf := func(members ...[2]string) []byte {
		var b bytes.Buffer
		w := zip.NewWriter(&b)
		for _, m := range members {
			f, err := w.CreateHeader(&zip.FileHeader{Name: m[0], Method: zip.Store})
			require.NoError(t, err)
			_, err = f.Write([]byte(m[1]))
			require.NoError(t, err)
		}
		require.NoError(t, w.Close())
		return b.Bytes()
	}
	first, last := string(npyImage(good, 1, 1, 2)), string(npyImage(good, 1, 5, 6))
	twice := filepath.Join(dir, "twice.npz")
	require.NoError(t, os.WriteFile(twice, zipOf([2]string{"x.npy", first}, [2]string{"x.npy", last}), 0o644))
	c, out := exitCode(t, exec.Command(exe, "--inputs", twice, "--output-dir", filepath.Join(dir, "exe-twice")))
	require.Equal(t, 0, c, out)
	_, stderr, code = kiln(t, "run", one, "--inputs", twice, "--output-dir", filepath.Join(dir, "run-twice"))
	require.Equal(t, 0, code, stderr)
	for _, d := range []string{"exe-twice", "run-twice"} {
		got := readNpy(t, filepath.Join(dir, d, "result0.npy"))
		require.Equal(t, []float64{-5, -6}, got.F, "%s reads the last member, as numpy does", d)
	}
	bad := zipOf([2]string{"x.npy", first})
	i := bytes.Index(bad, []byte(first))
	bad[i+len(first)-1] ^= 0xff // a data byte: the stored CRC no longer matches
	crc := filepath.Join(dir, "crc.npz")
	require.NoError(t, os.WriteFile(crc, bad, 0o644))
	c, out = exitCode(t, exec.Command(exe, "--inputs", crc, "--output-dir", filepath.Join(dir, "exe-crc")))
	require.Equal(t, 1, c, out)
	require.Contains(t, out, "CRC")
	_, _, code = kiln(t, "run", one, "--inputs", crc, "--output-dir", filepath.Join(dir, "run-crc"))
	require.Equal(t, 1, code)
	// The command line.
	okFile := filepath.Join(dir, "ok.npy")
	require.NoError(t, os.WriteFile(okFile, npyImage(good, 1, 1, 2), 0o644))
	for _, args := range [][]string{
		{"--input", "X=" + okFile, "--input", "x=" + okFile, "--output-dir", filepath.Join(dir, "o1")},
		{"--input", "x=" + okFile, "--input", "x=" + okFile, "--output-dir", filepath.Join(dir, "o2")},
		{"--input", "x=" + okFile, "--output-dir", ""},
	} {
		c, out := exitCode(t, exec.Command(exe, args...))
		require.Equal(t, 2, c, "%v: %s", args, out)
	}
	// Results over inputs, and two results in one file.
	clash := filepath.Join(dir, "clash")
	exe2 := filepath.Join(dir, "f")
	_, stderr, code = kiln(t, "compile", src, "-O1", "--emit", "exe", "-o", exe2)
	require.Equal(t, 0, code, stderr)
	require.NoError(t, os.MkdirAll(clash, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(clash, "x.npy"), npyImage(good, 1, 1, 2), 0o644))
	c, out = exitCode(t, exec.Command(exe2, "--inputs", clash, "--output-dir", filepath.Join(dir, "o3")))
	require.Equal(t, 1, c, out)
	require.Contains(t, out, "would both be written to one file")
	h := filepath.Join(dir, "h.kir")
	require.NoError(t, os.WriteFile(h, []byte("func @h(%x: f32[2]) -> (x: f32[2]) {\n  %y = neg(%x) : f32[2]\n  return %y\n}\n"), 0o644))
	exe3 := filepath.Join(dir, "h")
	_, stderr, code = kiln(t, "compile", h, "-O1", "--emit", "exe", "-o", exe3)
	require.Equal(t, 0, code, stderr)
	c, out = exitCode(t, exec.Command(exe3, "--inputs", clash, "--output-dir", clash))
	require.Equal(t, 1, c, out)
	require.Contains(t, out, "would overwrite")
	x := readNpy(t, filepath.Join(clash, "x.npy"))
	require.Equal(t, []float64{1, 2}, x.F, "the input is untouched")
}
