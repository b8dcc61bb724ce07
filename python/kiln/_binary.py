"""The Kiln binary: found on $KILN or PATH, or built from the source tree this package came from, and run
with its phases timed for a progress report."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from ._errors import KilnError

_built = None
_build_lock = threading.Lock()


def _source_root():
    """The Kiln source tree the package was installed from (recorded at installation), or the one it sits
    in (python/kiln inside the tree), or None."""
    try:
        from . import _source
        root = _source.ROOT
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root and os.path.isfile(os.path.join(root, "go.mod")) and os.path.isdir(os.path.join(root, "cmd", "kiln")):
        return root
    return None


def binary(report=None):
    """The path of the kiln binary: $KILN, else kiln on PATH, else one built with `go build` from the
    source tree on first use (said on stderr by report), kept in the user's cache for later processes."""
    global _built
    path = os.environ.get("KILN") or shutil.which("kiln")
    if path:
        return path
    with _build_lock:
        if _built:
            return _built
        root = _source_root()
        go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
        if root is None or go is None:
            raise KilnError("no Kiln binary: set $KILN or put kiln on PATH (go build -o kiln ./cmd/kiln in Kiln's "
                            "source tree)" + ("" if go else "; Go is not installed to build one"))
        cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kiln")
        os.makedirs(cache, exist_ok=True)
        out = os.path.join(cache, "kiln")
        # Said even where progress is off: the build takes a while (a minute with a cold Go cache).
        say = report or (lambda line: print(line, file=sys.stderr, flush=True))
        say(f"kiln: building the kiln binary from {root} with go build (once per process; set $KILN to use another)")
        start = time.monotonic()
        fd, tmp = tempfile.mkstemp(prefix=".kiln-", dir=cache)
        os.close(fd)
        try:
            proc = subprocess.run([go, "build", "-o", tmp, "./cmd/kiln"], cwd=root, capture_output=True, text=True)
            if proc.returncode != 0:
                raise KilnError(f"go build of kiln in {root} failed:\n{proc.stderr.strip()}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, out)
            say(f"kiln: built {out} in {time.monotonic() - start:.0f} s")
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        _built = out
        return out


def run(args, report=None, phase=None):
    """Runs kiln with args and returns its standard output and error; a failure raises KilnError with
    Kiln's message. While it runs longer than two seconds, report hears phase and the seconds so far,
    every two seconds."""
    proc = subprocess.Popen([binary(report)] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = threading.Event()
    if report and phase:
        start = time.monotonic()

        def beat():
            while not done.wait(2.0):
                report(f"kiln: {phase}: {time.monotonic() - start:.0f} s")

        threading.Thread(target=beat, daemon=True).start()
    try:
        out, err = proc.communicate()
    finally:
        done.set()
    if proc.returncode != 0:
        raise KilnError(err.strip() or f"kiln exited with {proc.returncode}")
    return out, err


class Phases:
    """Times the phases of a compile (export, import, compile) and, once the whole has taken two
    seconds, tells them on stderr as they end; silent when quiet."""

    def __init__(self, what, quiet=False):
        self.what, self.quiet = what, quiet
        self.start = time.monotonic()
        self.done = []

    def report(self, line):
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)

    def time(self, name, fn, *args, **kwargs):
        t = time.monotonic()
        out = fn(*args, **kwargs)
        self.done.append((name, time.monotonic() - t))
        if time.monotonic() - self.start >= 2:
            self.report(f"kiln: {self.what}: " + ", ".join(f"{n} {s:.1f} s" for n, s in self.done))
        return out
