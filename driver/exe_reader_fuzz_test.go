package driver

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	fuzzExeOnce sync.Once
	fuzzExeDir  string
	fuzzExeErr  error
)

// fuzzExecutable compiles, once per process, the step y = -x over
// x: f32[2] as an executable and kiln text, in a folder that lives as
// long as the process (TestMain removes it; a test's temporary folder
// goes with the test).
func fuzzExecutable(t testing.TB) (dir, src, exe string) {
	fuzzExeOnce.Do(func() {
		fuzzExeDir, fuzzExeErr = os.MkdirTemp("", "kiln-fuzz-exe-")
		if fuzzExeErr != nil {
			return
		}
		src := filepath.Join(fuzzExeDir, "g.kir")
		if fuzzExeErr = os.WriteFile(src, []byte("func @g(%x: f32[2]) -> (f32[2]) {\n  %y = neg(%x) : f32[2]\n  return %y\n}\n"), 0o644); fuzzExeErr != nil {
			return
		}
		var out, errb bytes.Buffer
		if Main([]string{"compile", src, "-O1", "--emit", "exe", "-o", filepath.Join(fuzzExeDir, "g")}, nil, &out, &errb) != 0 {
			fuzzExeErr = os.ErrInvalid
			t.Log(errb.String())
		}
	})
	if fuzzExeErr != nil {
		t.Fatalf("building the executable: %v", fuzzExeErr)
	}
	return fuzzExeDir, filepath.Join(fuzzExeDir, "g.kir"), filepath.Join(fuzzExeDir, "g")
}

// FuzzExecutableReader: a compiled executable reads any bytes given as
// its argument's .npy (--input) or .npz (--inputs) file without crashing
// (exit 0 or 1, never a signal), and by kiln run's rules: both accept the
// same files, and then compute the same result.
func FuzzExecutableReader(f *testing.F) {
	good := `{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }`
	f.Add(npyImage(good, 1, 1, 2), false)
	f.Add(npyImage(good, 2, 1, 2), false)
	f.Add(npyImage(`{'descr': '<i8', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }`, 1, 1, 2), false)
	f.Add(append(npyImage(good, 1, 1, 2), 0, 0), false)
	f.Add(npyImage(`{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }`, 1, 1, 2, 3), false)
	f.Add([]byte("\x93NUMPY\x01\x00\xff\xff{"), false)
	f.Add([]byte("PK\x05\x06\x00\x00\x00\x00\x01\x00\x01\x00\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00"), true)
	f.Fuzz(func(t *testing.T, data []byte, archive bool) {
		_, src, exe := fuzzExecutable(t)
		work := t.TempDir()
		in := filepath.Join(work, "x.npy")
		flag := []string{"--input", "x=" + in}
		if archive {
			in = filepath.Join(work, "x.npz")
			flag = []string{"--inputs", in}
		}
		if err := os.WriteFile(in, data, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, append(flag, "--output-dir", filepath.Join(work, "exe"))...)
		out, err := cmd.CombinedOutput()
		code := cmd.ProcessState.ExitCode()
		if code != 0 && code != 1 {
			t.Fatalf("the executable ended with %v (exit %d): %s", err, code, out)
		}
		var stdout, stderr bytes.Buffer
		runCode := Main(append([]string{"run", src, "--output-dir", filepath.Join(work, "run")}, flag...), nil, &stdout, &stderr)
		if (code == 0) != (runCode == 0) {
			t.Fatalf("the executable exits %d, kiln run %d:\nexecutable: %s\nkiln run: %s", code, runCode, out, stderr.String())
		}
		if code == 0 {
			a, errA := os.ReadFile(filepath.Join(work, "exe", "result0.npy"))
			b, errB := os.ReadFile(filepath.Join(work, "run", "result0.npy"))
			if errA != nil || errB != nil || !bytes.Equal(a, b) {
				t.Fatalf("the executable and kiln run disagree on the result (%v, %v)", errA, errB)
			}
		}
	})
}
