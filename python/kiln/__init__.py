"""Kiln from Python: plan a PyTorch model's training-step memory, and run it compiled, without leaving
Python.

    import kiln
    report = kiln.memory(model, (x,), budget=0.5, optimizer="adam")
    print(report.planned_bytes, report.peak_bytes)

    step = kiln.compile(model, (x, y), optimizer="adamw", lr=1e-3)   # model(x, y) returns the loss
    for x, y in batches:
        out = step(x, y)                            # forward, backward and update, in this process
    model.load_state_dict(step.state_dict())

The model is exported with torch.onnx.export (training mode, opset 17, constants not folded), imported
with every example input as data, and planned by the Kiln binary ($KILN if set, else `kiln` on PATH) as
`kiln mem --train -O2` plans it from the same arguments: differentiated (loss = the sum of the first
output), optionally given an optimizer step and a memory budget, fused, reordered and assigned into one
arena. kiln.compile builds it into a shared library (clang) and runs it in this process through its C
ABI with ctypes. Only torch (and onnx, which torch.onnx uses) and numpy are needed.
"""
import dataclasses
import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import uuid

__all__ = ["MemoryReport", "KilnError", "memory", "compile", "load", "Step"]


class KilnError(RuntimeError):
    """The Kiln binary refused the model or the request; the message is Kiln's own."""


@dataclasses.dataclass
class MemoryReport:
    """Bytes of one training step as Kiln plans it (`kiln mem --json`).

    planned_bytes: parameters + state + inputs + the arena, what the step needs on the device.
    peak_bytes: the most bytes live at once in the schedule (planned minus allocator slack).
    arena_bytes: the one buffer every intermediate value is placed in.
    """
    planned_bytes: int
    peak_bytes: int
    arena_bytes: int
    params_bytes: int
    state_bytes: int
    inputs_bytes: int
    flops: int
    recompute_flops: int
    pipeline: str
    raw: dict = dataclasses.field(repr=False)


def _binary():
    path = os.environ.get("KILN") or shutil.which("kiln")
    if not path:
        raise KilnError("no Kiln binary: set $KILN or put kiln on PATH (go build -o kiln ./cmd/kiln)")
    return path


def _run(args):
    return _run_both(args)[0]


def _run_both(args):
    proc = subprocess.run([_binary()] + args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KilnError(proc.stderr.strip() or f"kiln exited with {proc.returncode}")
    return proc.stdout, proc.stderr


def _export(model, example_inputs, tmp, training):
    """Exports model to tmp/model.onnx and imports it as tmp/model.kir; returns the kir path, the input
    names and the example inputs as a tuple."""
    import torch  # imported here so that `import kiln` works without torch

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    names = [f"input{i}" for i in range(len(example_inputs))]
    onnx_path = os.path.join(tmp, "model.onnx")
    was_training = model.training
    # Tracing runs the model once: in training mode that moves batch-norm
    # statistics and counts; the module keeps the state it had.
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model.train(training)
    try:
        mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(model, example_inputs, onnx_path, export_params=True, opset_version=17,
                          training=mode, do_constant_folding=False, input_names=names, output_names=["output"])
    finally:
        model.train(was_training)
        model.load_state_dict(saved)
    kir = os.path.join(tmp, "model.kir")
    args = ["import", onnx_path, "--data-inputs", ",".join(names), "-o", kir]
    # What torch trains is trainable; other float tensors of the graph (a loss's class weights, buffers)
    # are state. Only when the export kept every parameter's name: a renamed one would be frozen.
    import onnx
    initializers = {t.name for t in onnx.load(onnx_path, load_external_data=False).graph.initializer}
    params = [name for name, p in model.named_parameters() if p.requires_grad]
    if all(name in initializers for name in params):
        trainable = os.path.join(tmp, "trainable.txt")
        with open(trainable, "w") as f:
            f.write("".join(name + "\n" for name in params))
        args += ["--trainable-file", trainable]
    _run(args)
    return kir, names, example_inputs


def _plan_args(budget, optimizer, allow, microbatches, device, precision=None):
    """The flags of a training-step request, as `kiln mem` and `kiln compile` take them: the same
    request gives the same plan from Python and from the command line."""
    args = ["--train", "-O2"]
    if precision is not None:
        args += ["--precision", str(precision)]
    if optimizer is not None:
        args += ["--optimizer", optimizer]
    if budget is not None:
        args += ["--budget", str(budget)]
    if microbatches is not None:
        args += ["--microbatches", str(int(microbatches))]
    if device is not None:
        args += ["--device", device]
    if isinstance(allow, str):
        allow = [allow]
    for name in allow or ():
        args += ["--allow", name]
    return args


def memory(model, example_inputs, budget=None, optimizer=None, allow=(), microbatches=None, device=None,
           precision=None):
    """Plan the memory of one training step of model on example_inputs (a tensor or a tuple of them)
    and return a MemoryReport: the plan `kiln mem --train -O2` makes with the same arguments.
    budget: bound the peak (a fraction of the step's peak after autodiff alone, such as 0.5, or bytes
    such as "2GiB"), by recomputation, microbatches, swapping and offloading in turn; optimizer: add its
    update step ("sgd", "momentum", "adam" or "adamw"); microbatches: split the step into that many
    slices of the batch; device: the device the plan models ("h100", or rates); allow: the names of the
    approximations the plan may make ("per-slice-bn", "per-rank-dropout", "ste", "bf16-saved", "fp8-saved"; none
    unless named); precision: "bf16" or "f16" mixed precision (f32 master weights), optionally with the
    precision pass's options ("bf16,saved=fp8", which needs allow=("fp8-saved",))."""
    args = _plan_args(budget, optimizer, allow, microbatches, device, precision)
    with tempfile.TemporaryDirectory(prefix="kiln-") as tmp:
        kir, _, _ = _export(model, example_inputs, tmp, training=True)
        out, err = _run_both(["mem", kir, *args, "--json", "--print-pipeline"])
    raw = json.loads(out)
    pipes = [line[len("pipeline: "):] for line in err.splitlines() if line.startswith("pipeline: ")]
    return MemoryReport(
        planned_bytes=raw["planned_bytes"], peak_bytes=raw["peak_bytes"], arena_bytes=raw["arena_bytes"],
        params_bytes=raw["params_bytes"], state_bytes=raw["state_bytes"], inputs_bytes=raw["inputs_bytes"],
        flops=raw["flops"], recompute_flops=raw["recompute_flops"], pipeline=pipes[-1] if pipes else "",
        raw=raw)


_NP_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "i64": "int64", "i32": "int32", "i16": "int16",
              "i8": "int8", "u8": "uint8", "u16": "uint16", "u32": "uint32",
              "u64": "uint64", "bool": "bool"}


def _open_regular(path):
    """A read-only descriptor of path, which must be a regular file: opened without blocking (a FIFO
    would wait for a writer forever) and checked before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise KilnError(f"cannot open {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise KilnError(f"{path} is not a regular file")
    return fd


def _read_regular(path, limit=1 << 24):
    """The bytes of the regular file path, at most limit of them."""
    fd = _open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise KilnError(f"{path} is larger than {limit} bytes")
    return data


def _runtime(so_fd, origin):
    """Loads the compiled step's library open at so_fd (a regular file) and declares its C ABI
    (kiln_runtime.h).

    The dynamic loader hands back a library already loaded under the same file name, whatever the
    file holds now, so the library is loaded through a name of its own: a hard link (a copy across file
    systems) in a fresh temporary folder, named by a random token, removed once loaded (the mapping
    stays). Two steps of two models never share code, even when one's folder replaced the other's. The
    temporary folder lies beside the step's folder where it can (the same file system for the hard link;
    a temporary folder mounted noexec could not map the library), else in the temporary folder."""
    import ctypes

    # Beside the step's folder (one file system, so the hard link works, and not a noexec /tmp), else in
    # the temporary folder.
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


# The files of a saved step (Step.save): nothing else is ever written into, or removed from, its folder.
_CHECKPOINT_FILES = ("step.so", "checkpoint.npz", "kiln.json")


def _is_checkpoint(path):
    """Whether the folder path holds exactly a saved step's files, each a regular file."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return sorted(names) == sorted(_CHECKPOINT_FILES) and all(
        stat.S_ISREG(os.lstat(os.path.join(path, n)).st_mode) for n in names)


def _renameat2(a, b, flags):
    """renameat2(a, b, flags): True when it renamed, False where the system has no renameat2 (or the file
    system refuses the flags); other failures raise OSError."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _remove_checkpoint_dir(path):
    """Removes the folder path holding a saved step's files (or a failed save's), best effort: only those
    files, through a descriptor of the folder itself (never through a symbolic link), then the folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for n in os.listdir(fd):
            if n in _CHECKPOINT_FILES or n.startswith("checkpoint.npz"):
                try:
                    os.unlink(n, dir_fd=fd)
                except OSError:
                    pass
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Step:
    """A compiled step, run in this process through its C ABI (ctypes; kiln_runtime.h). Made by
    kiln.compile or kiln.load; call it with the inputs (numpy arrays or torch tensors, in the order of
    the example inputs). Parameters, optimizer state, batch-norm statistics, the step count and the
    learning rate live in the step and advance in place with every call.

    A step is safe to use from several threads: its calls take turns (a lock serialises them), so each
    call's results are its own. A call that fails (a label or gather index outside its dimension, say)
    raises and changes no state. close() (or the end of a with block) frees it; any use after that
    raises ValueError."""

    def __init__(self, folder, meta, owned):
        import numpy as np

        self._np = np
        self._lock = threading.RLock()
        self._s = None
        self._folder, self._owned, self._meta = folder, owned, meta
        self._so_fd = _open_regular(os.path.join(folder, "step.so"))
        try:
            self._lib = _runtime(self._so_fd, os.path.join(folder, "step.so"))
            try:
                self.descriptor = json.loads(self._lib.kiln_descriptor())
                self._tensors = self.descriptor["tensors"]
                self._by_name = {t["name"]: t for t in self._tensors if t["kind"] != "result"}
                by_name = {t["name"]: t for t in self._tensors if t["kind"] == "input"}
                self._inputs = [by_name[n] for n in meta["inputs"]]
            except (ValueError, KeyError, TypeError) as e:
                raise KilnError(f"{folder}: the library and kiln.json do not describe one step ({e!r})") from None
            self._s = self._lib.kiln_create(0)
            if not self._s:
                raise MemoryError("the step's arena and arguments do not fit in memory")
        except BaseException:
            os.close(self._so_fd)
            self._so_fd = None
            raise
        # Tied tensors (one parameter under two module names, as a language model's head that is its
        # embedding): the export keeps one; every name of the group reads and writes it.
        self._alias = {}
        for group in meta.get("tied", []):
            held = [n for n in group if n in self._by_name]
            if held:
                for n in group:
                    self._alias[n] = held[0]
        self._bound = {}

    def _open(self):
        if not self._s:
            raise ValueError("the step is closed")

    def _check(self, rc):
        if rc != 0:
            raise KilnError(self._lib.kiln_error(self._s).decode(errors="replace"))

    def _array(self, t):
        """A copy of tensor t (a descriptor entry) as a numpy array."""
        np = self._np
        out = np.empty(t["shape"], dtype=_NP_DTYPES[t["dtype"]])
        self._check(self._lib.kiln_get(self._s, t["index"], out.ctypes.data, out.nbytes))
        return out

    def _set(self, t, a):
        """Sets argument t from a, an array of t's shape (converted to its dtype)."""
        np = self._np
        a = np.ascontiguousarray(a, dtype=_NP_DTYPES[t["dtype"]])
        self._check(self._lib.kiln_set(self._s, t["index"], a.ctypes.data, a.nbytes))

    def __call__(self, *inputs):
        np = self._np
        if len(inputs) != len(self._inputs):
            raise TypeError(f"the step takes {len(self._inputs)} inputs, not {len(inputs)}")
        as_torch = False
        arrays = []
        for t, x in zip(self._inputs, inputs):
            if hasattr(x, "detach"):  # a torch tensor: its memory, when it lies on the CPU
                as_torch = True
                x = x.detach().cpu().numpy()
            a = np.asarray(x)
            want = np.dtype(_NP_DTYPES[t["dtype"]])
            if list(a.shape) != list(t["shape"]):
                raise ValueError(f"input {t['name']} has shape {list(a.shape)}, the step was compiled for {t['shape']}")
            if want.kind in "iub" and a.dtype.kind not in "iub":
                raise TypeError(f"input {t['name']} holds {t['dtype']} values (labels or indices), not {a.dtype}: "
                                "convert it (y.long()) rather than let Kiln truncate it")
            if a.dtype != want or not a.flags.c_contiguous:
                a = np.ascontiguousarray(a, dtype=want)  # a copy only where the layout or type differs
            arrays.append((t, a))
        with self._lock:
            self._open()
            for t, a in arrays:
                self._bound[t["name"]] = a  # kept alive while the step reads it
                self._check(self._lib.kiln_bind(self._s, t["index"], a.ctypes.data))
            self._check(self._lib.kiln_run(self._s))
            results = {}
            for t in self._tensors:
                if t["kind"] != "result":
                    continue
                if self._meta.get("optimizer") and t["role"] != "loss":
                    continue
                results[t["name"]] = self._array(t)
        if as_torch:
            import torch
            results = {k: torch.from_numpy(v) for k, v in results.items()}
        return results

    def profile(self, on=True):
        """Starts (clearing it) or stops timing every kernel of the runs that follow."""
        with self._lock:
            self._open()
            self._lib.kiln_profile(1 if on else 0)

    def kernel_profile(self):
        """The kernels' profile since profile(): a list of {"kernel", "calls", "seconds", "bytes", "flops"}
        (bytes read and written and FLOPs per call by Kiln's cost model), the slowest first."""
        import ctypes
        out = []
        with self._lock:
            self._open()
            for k in range(self._lib.kiln_kernels()):
                name, b, fl, c, sec = ctypes.c_char_p(), ctypes.c_longlong(), ctypes.c_longlong(), ctypes.c_longlong(), ctypes.c_double()
                self._lib.kiln_kernel(k, ctypes.byref(name), ctypes.byref(b), ctypes.byref(fl), ctypes.byref(c), ctypes.byref(sec))
                out.append({"kernel": name.value.decode(errors="replace"), "calls": c.value, "seconds": sec.value, "bytes": b.value, "flops": fl.value})
        return sorted(out, key=lambda r: -r["seconds"])

    def _steps(self):
        t = self._by_name.get("optimizer.step")
        return int(self._array(t)) if t else 0

    def _updates(self, tracked):
        """How many times a step updates the batch norm whose num_batches_tracked is named tracked (the
        descriptor's "updates" of its running mean: one per application, PyTorch's forward calls)."""
        t = self._by_name.get(tracked[: -len("num_batches_tracked")] + "running_mean")
        return int(t.get("updates") or 1) if t else 1

    def state_dict(self):
        """Copies of the module's tensors, {name: torch.Tensor}, named as module.state_dict() names them
        (parameters and buffers, num_batches_tracked included: the module's count when compiled plus, per
        step, the number of times the step updates its statistics, as PyTorch counts forward calls).
        Tied names share one tensor, as in the module's state_dict()."""
        import torch

        out, read = {}, {}
        with self._lock:
            self._open()
            for name in self._meta["state_names"]:
                held = self._alias.get(name, name)
                if held in self._by_name:
                    if held not in read:
                        read[held] = torch.from_numpy(self._array(self._by_name[held]))
                    out[name] = read[held]
                elif name.endswith("num_batches_tracked"):
                    out[name] = torch.tensor(self._meta["tracked"].get(name, 0) + self._steps() * self._updates(name), dtype=torch.int64)
        return out

    def load_state_dict(self, state_dict):
        """Sets the module's tensors that state_dict holds (as state_dict() names them). Each tensor must
        have the shape the step holds (its dtype is converted); every entry is checked before any is set,
        so a refused state_dict changes nothing. Unknown names raise KeyError, shapes RuntimeError
        (PyTorch's "size mismatch for NAME")."""
        np = self._np
        staged, tracked, mismatched = [], {}, []
        with self._lock:
            self._open()
            steps = None
            for name, value in state_dict.items():
                held = self._alias.get(name, name)
                if held in self._by_name and (name in self._meta["state_names"] or held != name):
                    t = self._by_name[held]
                    if hasattr(value, "detach"):
                        value = value.detach().cpu().numpy()
                    a = np.asarray(value)
                    if list(a.shape) != list(t["shape"]):
                        mismatched.append(f"size mismatch for {name}: copying a tensor of shape {list(a.shape)}, "
                                          f"the shape in the step is {list(t['shape'])}")
                        continue
                    staged.append((t, a))
                elif name.endswith("num_batches_tracked"):
                    if steps is None:
                        steps = self._steps()
                    tracked[name] = int(value) - steps * self._updates(name)
                else:
                    raise KeyError(f"the step holds no tensor {name!r}")
            if mismatched:
                raise RuntimeError("Error(s) in loading state_dict:\n\t" + "\n\t".join(mismatched))
            for t, a in staged:
                self._set(t, a)
            self._meta["tracked"].update(tracked)

    def set_lr(self, lr):
        """Sets the learning rate of the next steps."""
        with self._lock:
            self._open()
            t = self._by_name.get("optimizer.lr")
            if t is None:
                raise KilnError("the step has no optimizer (compile it with optimizer=...)")
            self._set(t, self._np.asarray(float(lr)))

    def save(self, path):
        """Writes a folder that kiln.load reopens: step.so (the compiled library), checkpoint.npz (every
        parameter and state tensor: module tensors, optimizer state, the step count, the learning rate;
        numpy.savez's format, which numpy and torch users open with numpy.load) and kiln.json.

        The folder is written whole beside path under a temporary name and renamed into place, so path
        holds either the old checkpoint or the new one. An existing path is replaced only when it is a
        folder holding exactly a saved step's three files; anything else there raises FileExistsError
        and nothing is removed or written."""
        path = os.fspath(path)
        target = os.path.abspath(path.rstrip("/") or "/")
        parent, base = os.path.split(target)
        with self._lock:
            self._open()
            replacing = os.path.lexists(target)
            if replacing and (os.path.islink(target) or not os.path.isdir(target) or not _is_checkpoint(target)):
                raise FileExistsError(f"{path} exists and is not a checkpoint that Step.save wrote; "
                                      "save refuses to replace it (choose a new path)")
            tmp = tempfile.mkdtemp(prefix=f".{base}.kiln-save-", dir=parent)
            try:
                with os.fdopen(os.dup(self._so_fd), "rb") as src, open(os.path.join(tmp, "step.so"), "xb") as dst:
                    src.seek(0)
                    shutil.copyfileobj(src, dst, 1 << 20)
                    dst.flush()
                    os.fsync(dst.fileno())
                self._check(self._lib.kiln_save(self._s, os.fsencode(os.path.join(tmp, "checkpoint.npz"))))
                with open(os.path.join(tmp, "kiln.json"), "x") as f:
                    json.dump(self._meta, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o777 & ~_umask())
                if not replacing:
                    # Never over anything that appeared there meanwhile (a plain rename would replace an
                    # empty folder).
                    if not _renameat2(tmp, target, _RENAME_NOREPLACE):
                        os.rename(tmp, target)
                    tmp = None
                elif not _renameat2(tmp, target, _RENAME_EXCHANGE):
                    # No exchange here: the old checkpoint aside, the new one in, the old one back if
                    # that fails. A crash between the two renames leaves the old one under old's name.
                    old = tmp + ".old"
                    os.rename(target, old)
                    try:
                        os.rename(tmp, target)
                    except BaseException:
                        os.rename(old, target)
                        raise
                    tmp = old
                # Else tmp holds the old checkpoint now.
                _fsync_dir(parent)
            finally:
                if tmp is not None:
                    _remove_checkpoint_dir(tmp)

    def close(self):
        """Frees the step; any use after this raises ValueError. Closing twice does nothing."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if getattr(self, "_s", None):
                self._lib.kiln_destroy(self._s)
                self._s = None
            if getattr(self, "_so_fd", None) is not None:
                os.close(self._so_fd)
                self._so_fd = None
            if getattr(self, "_owned", False):
                shutil.rmtree(self._folder, ignore_errors=True)
                self._owned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter shutdown shutil may be gone already
            pass


def _umask():
    """The process's umask, read without setting it (another thread may be creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _check_meta(meta, path):
    """meta is what Step.save writes to kiln.json, or a KilnError naming path."""
    ok = (isinstance(meta, dict) and isinstance(meta.get("inputs"), list) and all(isinstance(n, str) for n in meta["inputs"])
          and isinstance(meta.get("state_names"), list) and all(isinstance(n, str) for n in meta["state_names"])
          and isinstance(meta.get("tracked"), dict) and all(isinstance(k, str) and isinstance(v, int) for k, v in meta["tracked"].items())
          and meta.get("optimizer") in (None, "sgd", "momentum", "adam", "adamw")
          and isinstance(meta.get("tied", []), list) and all(isinstance(g, list) and all(isinstance(n, str) for n in g) for g in meta.get("tied", [])))
    if not ok:
        raise KilnError(f"{path} is not the kiln.json of a saved step")
    return meta


def load(path):
    """Reopens a step that Step.save wrote: the same library, its state from the checkpoint; training
    continues bit for bit, with no module and no recompilation. Only regular files are read."""
    path = os.fspath(path)
    meta_path = os.path.join(path, "kiln.json")
    try:
        meta = json.loads(_read_regular(meta_path))
    except ValueError as e:
        raise KilnError(f"{meta_path} is not the kiln.json of a saved step: {e}") from None
    step = Step(path, _check_meta(meta, meta_path), owned=False)
    try:
        step._check(step._lib.kiln_load(step._s, os.fsencode(os.path.join(path, "checkpoint.npz"))))
    except BaseException:
        step.close()
        raise
    return step


def _optimizer_options(optimizer, lr, momentum, betas, eps, weight_decay):
    """The optimizer pass's kind and options for torch.optim's defaults and keywords."""
    if optimizer not in ("sgd", "momentum", "adam", "adamw"):
        raise ValueError(f"optimizer must be None, 'sgd', 'momentum', 'adam' or 'adamw', not {optimizer!r}")
    if optimizer == "momentum" and not momentum:
        momentum = 0.9
    kind = optimizer
    if optimizer in ("sgd", "momentum"):
        kind = "momentum" if momentum else "sgd"
    if weight_decay is None:
        weight_decay = 0.01 if optimizer == "adamw" else 0.0
    opts = [f"lr={float(lr)!r}", f"weight-decay={float(weight_decay)!r}"]
    if kind == "momentum":
        opts.append(f"momentum={float(momentum)!r}")
    if kind in ("adam", "adamw"):
        opts += [f"beta1={float(betas[0])!r}", f"beta2={float(betas[1])!r}", f"eps={float(eps)!r}"]
    return kind, ",".join(opts)


def _tied(module):
    """The groups of names under which module.state_dict() holds one tensor (a head tied to its
    embedding), each in the state_dict's order."""
    groups = {}
    for name, v in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(v), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def compile(module, example_inputs, train=True, loss="sum", optimizer=None, lr=1e-3, momentum=0.0, betas=(0.9, 0.999),
            eps=1e-8, weight_decay=None, budget=None, microbatches=None, allow=(), device=None, precision=None):
    """Compile module for example_inputs (a tensor or a tuple; their shapes and dtypes are fixed) into a
    Step run in this process. train=True: module(*inputs) returns the loss (a scalar as it is, a tensor
    reduced by loss, "sum" or "mean"); with optimizer None the step returns {"loss", "grad.NAME"...} and
    updates no parameter (each call is still a forward and backward in training mode: new dropout masks,
    batch-norm statistics updated, as in PyTorch); with "sgd" (momentum > 0: its momentum form), "momentum" (sgd, momentum 0.9 unless
    given), "adam" or "adamw" it runs forward, backward and the update in place (torch.optim's formulas
    and defaults; weight_decay None: torch's default) and returns {"loss"}. train=False compiles the
    forward (eval mode) and returns its outputs. budget, microbatches and allow are the planner's
    request, as --budget, --microbatches and --allow; device and precision are kiln.memory's (precision:
    "bf16" trains in bf16 with f32 master weights, as --precision)."""
    if not train and (optimizer is not None or microbatches is not None or precision is not None):
        raise ValueError("an optimizer, microbatches or precision need train=True")
    if loss not in ("sum", "mean"):
        raise ValueError(f"loss must be 'sum' or 'mean', not {loss!r}")
    tmp = tempfile.mkdtemp(prefix="kiln-compile-")
    try:
        kir, names, _ = _export(module, example_inputs, tmp, training=train)
        args = ["compile", kir, "--target", "llvm", "--emit", "lib", "-o", os.path.join(tmp, "step.so")]
        meta = {"inputs": names, "optimizer": optimizer, "train": bool(train),
                "state_names": list(module.state_dict().keys()),
                "tracked": {k: int(v) for k, v in module.state_dict().items() if k.endswith("num_batches_tracked")},
                "tied": _tied(module)}
        if train:
            args += _plan_args(budget, None, allow, microbatches, device, precision)
            args[args.index("--train")] = f"--train={loss}"
            if optimizer is not None:
                kind, opts = _optimizer_options(optimizer, lr, momentum, betas, eps, weight_decay)
                args += ["--optimizer", kind, "--optimizer-options", opts]
            else:
                # Gradients only: no update, but each call is a new forward and backward in training
                # mode (new dropout masks, running statistics updated, as PyTorch's).
                args += ["--optimizer", "none"]
        else:
            args.append("-O2")
            if budget is not None:
                args += ["--budget", str(budget)]
            if device is not None:
                args += ["--device", device]
        _run(args)
        for f in os.listdir(tmp):
            if f != "step.so":
                os.remove(os.path.join(tmp, f))
        step = Step(tmp, meta, owned=True)
        step.load_state_dict({k: v for k, v in module.state_dict().items() if k in step._by_name})
        return step
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
