package llvm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// CacheLimit bounds the bytes an object cache keeps: past it, the end of
// a build removes the least recently used objects until three quarters
// remain.
const CacheLimit = 1 << 30

// objectCache keeps objects clang compiled, in a directory, under the
// hash of everything that determines them: clang's identity (its path,
// size and modification time, and the target CPU and features it takes
// -march=native to mean on this machine), its arguments and the source. A later
// build of the same source (the same model's kernels with other weights,
// which live in program.c; the runtime's fixed source in a new process)
// links the object instead of compiling it again. Entries are written
// under a temporary name and renamed into place, so concurrent builds
// never read a partial object; an unreadable entry, or one that is not
// an ELF object, is a miss.
type objectCache struct{ dir string }

// nativeTargets holds, per clang path, what -march=native means to it on
// this machine (its -### lines: the version, -target-cpu and
// -target-feature), so that a cache shared between machines never hands
// one CPU's object to another.
var nativeTargets sync.Map // clang path -> string

func nativeTarget(clang string) string {
	if v, ok := nativeTargets.Load(clang); ok {
		return v.(string)
	}
	out, _ := exec.Command(clang, "-###", "-march=native", "-c", "-x", "c", os.DevNull, "-o", os.DevNull).CombinedOutput()
	v, _ := nativeTargets.LoadOrStore(clang, string(out))
	return v.(string)
}

// cacheKey is the key of an object compiled by clang with args from src.
func cacheKey(clang string, args []string, src []byte) string {
	h := sha256.New()
	if st, err := os.Stat(clang); err == nil {
		fmt.Fprintf(h, "%s:%d:%d;", clang, st.Size(), st.ModTime().UnixNano())
	} else {
		fmt.Fprintf(h, "%s;", clang)
	}
	target := nativeTarget(clang)
	fmt.Fprintf(h, "%d:%s", len(target), target)
	for _, a := range args {
		fmt.Fprintf(h, "%d:%s", len(a), a)
	}
	fmt.Fprintf(h, "%d:", len(src))
	h.Write(src)
	return hex.EncodeToString(h.Sum(nil))
}

func (c objectCache) path(key string) string {
	return filepath.Join(c.dir, key[:2], key+".o")
}

// get returns the cached object of key, or nil. A hit marks the entry as
// used now (eviction removes the least recently used).
func (c objectCache) get(key string) []byte {
	if c.dir == "" {
		return nil
	}
	p := c.path(key)
	b, err := os.ReadFile(p)
	if err != nil || !bytes.HasPrefix(b, []byte("\x7fELF")) {
		return nil
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now)
	return b
}

// put stores obj under key, synced before it is renamed into place
// (errors are ignored: the cache only saves time).
func (c objectCache) put(key string, obj []byte) {
	if c.dir == "" || len(obj) == 0 {
		return
	}
	p := c.path(key)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*.o")
	if err != nil {
		return
	}
	_, werr := f.Write(obj)
	serr := f.Sync()
	cerr := f.Close()
	if werr != nil || serr != nil || cerr != nil || os.Chmod(f.Name(), 0o644) != nil || os.Rename(f.Name(), p) != nil {
		os.Remove(f.Name())
	}
}

// keep stores obj under key unless the cache holds it already.
func (c objectCache) keep(key string, obj []byte) {
	if c.dir == "" {
		return
	}
	if _, err := os.Stat(c.path(key)); err == nil {
		return
	}
	c.put(key, obj)
}

// evict removes the least recently used objects while the cache holds
// more than limit bytes, down to three quarters of it. An entry another
// build removed meanwhile counts as removed. Temporary files
// of builds in flight are left alone unless an hour old.
func (c objectCache) evict(limit int64) {
	if c.dir == "" {
		return
	}
	type entry struct {
		path string
		size int64
		used time.Time
	}
	var entries []entry
	var total int64
	_ = filepath.WalkDir(c.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if filepath.Ext(p) != ".o" {
			return nil
		}
		if name := d.Name(); len(name) > 5 && name[:5] == ".tmp-" && time.Since(info.ModTime()) < time.Hour {
			return nil
		}
		entries = append(entries, entry{p, info.Size(), info.ModTime()})
		total += info.Size()
		return nil
	})
	if total <= limit {
		return
	}
	slices.SortFunc(entries, func(a, b entry) int { return a.used.Compare(b.used) })
	for _, e := range entries {
		if total <= limit/4*3 {
			break
		}
		if err := os.Remove(e.path); err == nil || errors.Is(err, fs.ErrNotExist) {
			total -= e.size
		}
	}
}
