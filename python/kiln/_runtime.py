"""One compiled step's library, loaded and made into a runtime object through its C ABI
(kiln_runtime.h), with ctypes."""
import ctypes
import json
import os
import shutil
import tempfile
import uuid

from ._errors import KilnError

NP_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "i64": "int64", "i32": "int32", "i16": "int16",
             "i8": "int8", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "bool": "bool"}


def load_library(so_fd, origin):
    """Loads the compiled step's library open at so_fd (a regular file) and declares its C ABI.

    The dynamic loader hands back a library already loaded under the same file name, whatever the
    file holds now, so the library is loaded through a name of its own: a hard link (a copy across file
    systems) in a fresh temporary folder, named by a random token, removed once loaded (the mapping
    stays). Two steps of two models never share code, even when one's folder replaced the other's. The
    temporary folder lies beside the step's folder where it can (the same file system for the hard link;
    a temporary folder mounted noexec could not map the library), else in the temporary folder."""
    try:
        tmp = tempfile.mkdtemp(prefix=".kiln-lib-", dir=os.path.dirname(os.path.dirname(os.path.abspath(origin))))
    except OSError:
        tmp = tempfile.mkdtemp(prefix="kiln-lib-")
    try:
        private = os.path.join(tmp, f"step-{uuid.uuid4().hex}.so")
        try:
            os.link(f"/proc/self/fd/{so_fd}", private, follow_symlinks=True)
            linked = os.stat(private).st_ino == os.fstat(so_fd).st_ino
        except OSError:
            linked = False
        if not linked:
            if os.path.lexists(private):
                os.remove(private)
            with os.fdopen(os.dup(so_fd), "rb") as src, open(private, "xb") as dst:
                src.seek(0)
                shutil.copyfileobj(src, dst, 1 << 20)
        try:
            lib = ctypes.CDLL(private)
        except OSError as e:
            raise KilnError(f"{origin} is not a step library Kiln built: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    try:
        for name, res, args in [("kiln_descriptor", ctypes.c_char_p, []), ("kiln_create", p, [i]), ("kiln_destroy", None, [p]),
                                ("kiln_run", i, [p]), ("kiln_data", p, [p, i]), ("kiln_set", i, [p, i, p, ll]),
                                ("kiln_get", i, [p, i, p, ll]), ("kiln_bind", i, [p, i, p]), ("kiln_save", i, [p, ctypes.c_char_p]),
                                ("kiln_load", i, [p, ctypes.c_char_p]), ("kiln_error", ctypes.c_char_p, [p]),
                                ("kiln_profile", None, [i]), ("kiln_kernels", i, []),
                                ("kiln_kernel", i, [i, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ll), ctypes.POINTER(ll),
                                                    ctypes.POINTER(ll), ctypes.POINTER(ctypes.c_double)])]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
    except AttributeError as e:
        raise KilnError(f"{origin} is not a step library Kiln built: {e}") from None
    return lib


class Runtime:
    """One runtime object (kiln_create) of a loaded library: its descriptor, its tensors by name, and
    the calls of the C ABI. Not locked: its owner (a Step) serialises the calls."""

    def __init__(self, so_fd, origin, threads=0):
        import numpy as np

        self.np = np
        self.lib = load_library(so_fd, origin)
        try:
            self.descriptor = json.loads(self.lib.kiln_descriptor())
            self.tensors = self.descriptor["tensors"]
            self.by_name = {t["name"]: t for t in self.tensors if t["kind"] != "result"}
            self.results = [t for t in self.tensors if t["kind"] == "result"]
        except (ValueError, KeyError, TypeError) as e:
            raise KilnError(f"{origin}: the library's descriptor is not a step's ({e!r})") from None
        self.s = self.lib.kiln_create(int(threads or 0))
        if not self.s:
            raise MemoryError("the step's arena and arguments do not fit in memory")
        self.bound = {}  # the arrays data inputs read, kept alive while the step may read them

    def check(self, rc):
        if rc != 0:
            raise KilnError(self.lib.kiln_error(self.s).decode(errors="replace"))

    def array(self, t):
        """A copy of tensor t (a descriptor entry) as a numpy array."""
        out = self.np.empty(t["shape"], dtype=NP_DTYPES[t["dtype"]])
        self.check(self.lib.kiln_get(self.s, t["index"], out.ctypes.data, out.nbytes))
        return out

    def set(self, t, a):
        """Sets argument t from a, an array of t's shape (converted to its dtype)."""
        a = self.np.ascontiguousarray(a, dtype=NP_DTYPES[t["dtype"]])
        self.check(self.lib.kiln_set(self.s, t["index"], a.ctypes.data, a.nbytes))

    def address(self, t):
        """The address of argument t's memory (its own, or the memory it shares)."""
        p = self.lib.kiln_data(self.s, t["index"])
        if not p:
            raise KilnError(f"{t['name']} has no memory")
        return p

    def view(self, t):
        """Argument t's memory as a numpy array (no copy): valid while the runtime lives and t stays
        bound where it is."""
        buf = (ctypes.c_char * t["bytes"]).from_address(self.address(t))
        return self.np.frombuffer(buf, dtype=NP_DTYPES[t["dtype"]]).reshape(t["shape"])

    def share(self, t, other, u):
        """Makes argument t read and update argument u of the runtime other (same dtype and shape)."""
        if t["dtype"] != u["dtype"] or list(t["shape"]) != list(u["shape"]):
            raise KilnError(f"{t['name']} is {t['dtype']}{t['shape']} in one step and {u['dtype']}{u['shape']} in the other")
        self.check(self.lib.kiln_bind(self.s, t["index"], other.address(u)))

    def run(self, inputs):
        """Binds inputs (descriptor entry, contiguous array of its dtype and shape) and runs once."""
        for t, a in inputs:
            self.bound[t["name"]] = a
            self.check(self.lib.kiln_bind(self.s, t["index"], a.ctypes.data))
        self.check(self.lib.kiln_run(self.s))

    def close(self):
        if self.s:
            self.lib.kiln_destroy(self.s)
            self.s = None
