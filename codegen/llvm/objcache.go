package llvm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// CacheLimit bounds the bytes an object cache keeps: past it, a store
// removes the least recently used objects until three quarters remain.
const CacheLimit = 1 << 30

// objectCache keeps objects clang compiled, in a directory, under the
// hash of everything that determines them: clang's identity (its path,
// size and modification time), its arguments and the source. A later
// build of the same source (the same model's kernels with other weights,
// which live in program.c; the runtime's fixed source in a new process)
// links the object instead of compiling it again. Entries are written
// under a temporary name and renamed into place, so concurrent builds
// never read a partial object; a corrupt or unreadable entry is a miss.
type objectCache struct{ dir string }

// cacheKey is the key of an object compiled by clang with args from src.
func cacheKey(clang string, args []string, src []byte) string {
	h := sha256.New()
	if st, err := os.Stat(clang); err == nil {
		fmt.Fprintf(h, "%s:%d:%d;", clang, st.Size(), st.ModTime().UnixNano())
	} else {
		fmt.Fprintf(h, "%s;", clang)
	}
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
	if err != nil || len(b) == 0 {
		return nil
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now)
	return b
}

// put stores obj under key (errors are ignored: the cache only saves
// time), then evicts past CacheLimit.
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
	cerr := f.Close()
	if werr != nil || cerr != nil || os.Rename(f.Name(), p) != nil {
		os.Remove(f.Name())
		return
	}
	c.evict(CacheLimit)
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
// more than limit bytes, down to three quarters of it. Temporary files
// of builds in flight are left alone unless an hour old.
func (c objectCache) evict(limit int64) {
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
		if os.Remove(e.path) == nil {
			total -= e.size
		}
	}
}
