"""Step: a compiled training step (or forward) run in this process, its eval step, its steps for other
batches, and the module whose tensors it trains in place."""
import json
import os
import shutil
import tempfile
import threading

from . import _binary, _export, _files, _optim
from ._errors import KilnError
from ._runtime import NP_DTYPES, Runtime


class Step:
    """A compiled step, run in this process through its C ABI (kiln_runtime.h). Made by kiln.compile or
    kiln.load; call it with the inputs (numpy arrays or torch tensors, in the order of the example inputs).

    State: parameters, optimizer state, batch-norm statistics, the step count and the learning rate live
    in the step and advance in place with every call. A step compiled from a module shares the module's
    parameters and buffers: they are views of the step's memory, so after step(x, y) the module holds the
    trained values under its own names (and module.load_state_dict writes into the step), until close(),
    which gives the module copies of its own.

    The optimizer (step.optimizer, a torch.optim.SGD, Adam or AdamW): its param_groups' lr, momentum and
    betas are the step's from its next call on, so a torch.optim.lr_scheduler made on it drives the
    step, and each call counts as its step(); its state is views of the step's moments and count, so
    step.optimizer.state_dict() and load_state_dict() are torch.optim's. Weight decay and eps are
    compiled in: changing them raises.

    Batches: a batch smaller than the compiled one (an epoch's last) runs as that batch, on a step compiled
    for it the first time it comes (cached, sharing this step's memory); a larger one is refused.

    A step is safe to use from several threads: its calls take turns (a lock serialises them), so each
    call's results are its own. A call that fails (a label or gather index outside its dimension, say)
    raises and changes no state. close() (or the end of a with block) frees it; any use after that raises
    ValueError."""

    def __init__(self, folder, meta, owned, threads=None, verbose=None):
        self._lock = threading.RLock()
        self._rt = None
        self._others = {}  # (mode, batch) -> Runtime sharing this step's parameters and state
        self._shared = []  # (module, attribute, kind) of the module tensors that view the step's memory
        self._module = None
        self._examples = None
        self.optimizer = None  # the torch.optim optimizer whose groups and state are the step's
        self._binding = None
        self._folder, self._owned, self._meta = folder, owned, meta
        self._threads, self._verbose = threads, verbose
        self._so_fd = _files.open_regular(os.path.join(folder, "step.so"))
        try:
            self._rt = Runtime(self._so_fd, os.path.join(folder, "step.so"), threads or 0)
            try:
                inputs = {t["name"]: t for t in self._rt.tensors if t["kind"] == "input"}
                self._inputs = [inputs[n] for n in meta["inputs"]]
            except KeyError as e:
                raise KilnError(f"{folder}: the library and kiln.json do not describe one step ({e!r})") from None
        except BaseException:
            self._release()
            raise
        self.descriptor = self._rt.descriptor
        self._by_name = self._rt.by_name
        self._tensors = self._rt.tensors
        # Tied tensors (one parameter under two module names, as a language model's head that is its
        # embedding): the export keeps one; every name of the group reads and writes it.
        prefix = meta.get("prefix", "")
        self._held = {}
        for name in meta["state_names"]:
            group = next((g for g in meta.get("tied", []) if name in g), [name])
            t = next((self._by_name[prefix + n] for n in group if prefix + n in self._by_name), None)
            if t is not None:
                self._held[name] = t

    # --- plumbing ---

    def _open(self):
        if self._rt is None or not self._rt.s:
            raise ValueError("the step is closed")

    def _check(self, rc):
        self._rt.check(rc)

    def _array(self, t):
        return self._rt.array(t)

    def _set(self, t, a):
        self._rt.set(t, a)

    @property
    def _lib(self):
        return self._rt.lib

    @property
    def _s(self):
        return self._rt.s if self._rt else None

    def _report(self, line):
        if self._verbose is not False:
            import sys
            print(line, file=sys.stderr, flush=True)

    # --- running ---

    def _arrays(self, inputs, expected, batched):
        """inputs as contiguous arrays of expected's dtypes, checked; and the batch they hold when it
        differs from the compiled one (else None): only the inputs batched says hold the batch may."""
        import numpy as np

        if len(inputs) != len(expected):
            raise TypeError(f"the step takes {len(expected)} inputs, not {len(inputs)}")
        out, batch, as_torch = [], None, False
        for t, x, b in zip(expected, inputs, batched):
            if hasattr(x, "detach"):  # a torch tensor: its memory, when it lies on the CPU
                as_torch = True
                x = x.detach().cpu().numpy()
            a = np.asarray(x)
            want = np.dtype(NP_DTYPES[t["dtype"]])
            shape = list(t["shape"])
            if list(a.shape) != shape:
                if not (b and a.ndim == len(shape) and a.ndim > 0 and list(a.shape[1:]) == shape[1:]):
                    raise ValueError(f"input {t['name']} has shape {list(a.shape)}, the step was compiled for {shape}")
                if batch is not None and a.shape[0] != batch:
                    raise ValueError(f"input {t['name']} holds a batch of {a.shape[0]}, another input one of {batch}")
                batch = a.shape[0]
            if want.kind in "iub" and a.dtype.kind not in "iub":
                raise TypeError(f"input {t['name']} holds {t['dtype']} values (labels or indices), not {a.dtype}: "
                                "convert it (y.long()) rather than let Kiln truncate it")
            if a.dtype != want or not a.flags.c_contiguous:
                a = np.ascontiguousarray(a, dtype=want)  # a copy only where the layout or type differs
            out.append(a)
        if batch is not None and any(b and list(a.shape) == list(t["shape"]) for a, t, b in zip(out, expected, batched)):
            raise ValueError("the inputs hold different batches")
        return out, batch, as_torch

    def _runtime_for(self, mode, batch):
        """The runtime that runs mode ("train": this step's, "eval": its eval step) on a batch (None: the
        compiled one), compiled the first time it is asked for and sharing this step's parameters and
        state."""
        if mode == "train" and batch is None:
            return self._rt
        key = (mode, batch)
        rt = self._others.get(key)
        if rt is None:
            rt = self._others[key] = self._compile_other(mode, batch)
        return rt

    def __call__(self, *inputs):
        with self._lock:
            self._open()
            arrays, batch, as_torch = self._arrays(inputs, self._inputs, self._meta.get("batched") or [False] * len(self._inputs))
            self._check_batch(batch)
            rt = self._runtime_for("train", batch)
            byname = {t["name"]: t for t in rt.tensors if t["kind"] == "input"}
            if self._binding is not None:
                self._binding.state_in()
                self._binding.hyper_in()
            rt.run([(byname[t["name"]], a) for t, a in zip(self._inputs, arrays)])
            results = self._results(rt)
            self._after_step()
            if self._binding is not None:
                self._binding.stepped()
        if as_torch:
            import torch
            results = {k: torch.from_numpy(v) for k, v in results.items()}
        return results

    def _check_batch(self, batch):
        if batch is not None and batch > self._meta.get("batch", 0):
            raise ValueError(f"a batch of {batch} is larger than the {self._meta.get('batch')} the step was "
                             f"compiled for: compile it with example inputs of batch {batch} (smaller batches run "
                             "as they are)")

    def _results(self, rt):
        """The results a caller sees: the loss, the module's outputs kept with it and, without an
        optimizer, the gradients, named by the module's parameter names."""
        if not self._meta.get("train", True):
            return {t["name"]: rt.array(t) for t in rt.results}  # a forward's outputs
        prefix = self._meta.get("prefix", "")
        outputs = set(self._meta.get("outputs") or [])
        results = {}
        for t in rt.results:
            name, role = t["name"], t["role"]
            if role == "loss" or name in outputs:
                results[name] = rt.array(t)
            elif role == "grad" and not self._meta.get("optimizer"):
                param = name[len("grad."):]
                results["grad." + (param[len(prefix):] if prefix and param.startswith(prefix) else param)] = rt.array(t)
        return results

    def eval(self):
        """The step's eval mode: a callable that runs the module's forward as module.eval() does (batch norm
        with its running statistics, dropout off) on this step's current weights, and returns the module's
        outputs. Compiled the first time it is called (for each batch), never again."""
        return EvalStep(self)

    def train(self):
        """This step (training mode), for symmetry with eval()."""
        return self

    # --- what changes from step to step ---

    def _steps(self):
        t = self._by_name.get("optimizer.step")
        return int(self._array(t)) if t else 0

    def _updates(self, tracked):
        """How many times a step updates the batch norm whose num_batches_tracked is named tracked (the
        descriptor's "updates" of its running mean: one per application, PyTorch's forward calls)."""
        t = self._held.get(tracked[: -len("num_batches_tracked")] + "running_mean")
        return int(t.get("updates") or 1) if t else 1

    def _tracked(self, name, steps):
        return self._meta["tracked"].get(name, 0) + steps * self._updates(name)

    def _after_step(self):
        """Brings the shared module's num_batches_tracked up to date (the step counts it by its steps)."""
        if not self._shared:
            return
        steps = None
        for mod, attr, kind in self._shared:
            if kind == "tracked":
                if steps is None:
                    steps = self._steps()
                getattr(mod, attr).fill_(self._tracked(self._tracked_name(mod, attr), steps))

    def _tracked_name(self, mod, attr):
        return self._module_names[(id(mod), attr)]

    def state_dict(self):
        """Copies of the step's tensors, {name: torch.Tensor}: first the module's, named as
        module.state_dict() names them (parameters and buffers, num_batches_tracked included: the module's
        count when compiled plus, per step, the number of times the step updates its statistics, as
        PyTorch counts forward calls; tied names share one tensor, as in the module's state_dict()); then,
        with an optimizer, its state as torch.optim keeps it, under keys that start "optimizer.":
        optimizer.state.NAME.KEY (KEY: momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq; NAME the
        parameter's module name: torch.optim's state_dict() numbers the same tensors by their order in
        param_groups), optimizer.step (the steps taken, torch's per-parameter "step"), and
        optimizer.param_groups.K.HYPER (HYPER: lr, momentum, beta1, beta2 of group K, what the next step
        uses); last, the step's own state under kiln.NAME (kiln.random.offset: the position of dropout's
        random stream). Loaded into a step compiled from the same module, it continues bit for bit."""
        import torch

        out, read = {}, {}
        with self._lock:
            self._open()
            if self._binding is not None:
                self._binding.state_in()
            steps = self._steps()
            for name in self._meta["state_names"]:
                t = self._held.get(name)
                if t is not None:
                    if t["name"] not in read:
                        read[t["name"]] = torch.from_numpy(self._array(t))
                    out[name] = read[t["name"]]
                elif name.endswith("num_batches_tracked"):
                    out[name] = torch.tensor(self._tracked(name, steps), dtype=torch.int64)
            if self._binding is not None:
                out.update(self._optimizer_entries())
            for t in self._own_state():
                out["kiln." + t["name"]] = torch.from_numpy(self._array(t))
        return out

    def _own_state(self):
        """The step's state that is neither the module's nor the optimizer's (state_dict()'s kiln.NAME
        entries): the random generator's position, a loss scale's."""
        held = {t["name"] for t in self._held.values()}
        covered = ("optimizer_state", "lr", "hyper", "step") if self._binding is not None else ()
        return [t for t in self._tensors if t["kind"] == "state" and t["name"] not in held
                and t.get("role") not in covered and t.get("role") != "running_stat"]

    def _optimizer_entries(self):
        """The optimizer's entries of state_dict()."""
        import torch

        b = self._binding
        views, step_view = b.state_views()
        out = {}
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                for key, v in views.get(id(p), {}).items():
                    out[f"optimizer.state.{b.names[id(p)]}.{key}"] = v.clone()
        t = self._by_name.get("optimizer.step")
        if t is not None:
            out["optimizer.step"] = torch.from_numpy(self._array(t))
        for k, g in enumerate(self.optimizer.param_groups):
            for key, value in _hyper_values(g).items():
                out[f"optimizer.param_groups.{k}.{key}"] = torch.tensor(value, dtype=torch.float64)
        return out

    def _stage_optimizer_entry(self, name, a, mismatched):
        """What loading state_dict entry name (an array a) does, as a function to call once every entry is
        checked; None (and a line in mismatched) when it does not fit."""
        import torch

        b = self._binding
        views, step_view = b.state_views()
        t = self._by_name.get("optimizer.step")
        if name == "optimizer.step" and t is not None:
            if a.size != 1:
                mismatched.append(f"size mismatch for {name}: a tensor of shape {list(a.shape)}, not a count")
                return None
            return lambda: self._set(t, a.reshape(()))
        if name.startswith("optimizer.state."):
            pname, _, key = name[len("optimizer.state."):].rpartition(".")
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    if b.names.get(id(p)) == pname and key in views.get(id(p), {}):
                        v = views[id(p)][key]
                        if list(a.shape) != list(v.shape):
                            mismatched.append(f"size mismatch for {name}: copying a tensor of shape {list(a.shape)}, "
                                              f"the shape in the step is {list(v.shape)}")
                            return None
                        return lambda: v.copy_(torch.from_numpy(a.astype(v.numpy().dtype, copy=False)))
        if name.startswith("optimizer.param_groups."):
            k, _, key = name[len("optimizer.param_groups."):].partition(".")
            if k.isdigit() and int(k) < len(self.optimizer.param_groups):
                g = self.optimizer.param_groups[int(k)]
                if key in _hyper_values(g):
                    if a.size != 1:
                        mismatched.append(f"size mismatch for {name}: a tensor of shape {list(a.shape)}, not a number")
                        return None
                    return lambda: _set_hyper(g, key, float(a.reshape(())))
        raise KeyError(f"the step holds no tensor {name!r}")

    def load_state_dict(self, state_dict):
        """Sets the tensors that state_dict holds, named as state_dict() names them: the module's, the
        optimizer's and the step's own (a module's state_dict alone leaves the others as they are). Each
        tensor must have the shape the step holds (its dtype is converted); every entry is checked before
        any is set, so a refused state_dict changes nothing. Unknown names raise KeyError, shapes
        RuntimeError (PyTorch's "size mismatch for NAME")."""
        import numpy as np

        staged, tracked, mismatched, later = [], {}, [], []
        with self._lock:
            self._open()
            steps = None
            if self._binding is not None:
                self._binding.state_in()
            for name, value in state_dict.items():
                if name.startswith("kiln."):
                    t = next((t for t in self._own_state() if t["name"] == name[len("kiln."):]), None)
                    if t is None:
                        raise KeyError(f"the step holds no tensor {name!r}")
                    _stage(name, t, value, staged, mismatched)
                    continue
                if name.startswith("optimizer.") and self._binding is not None:
                    if hasattr(value, "detach"):
                        value = value.detach().cpu().numpy()
                    fn = self._stage_optimizer_entry(name, np.asarray(value), mismatched)
                    if fn is not None:
                        later.append(fn)
                    continue
                t = self._held.get(name)
                if t is not None:
                    _stage(name, t, value, staged, mismatched)
                elif name.endswith("num_batches_tracked") and name in self._meta["state_names"]:
                    if steps is None:
                        # The count after loading: the state_dict's, else the step's.
                        count = state_dict.get("optimizer.step", state_dict.get("kiln.optimizer.step"))
                        steps = int(float(count)) if count is not None else self._steps()
                    tracked[name] = int(value) - steps * self._updates(name)
                else:
                    raise KeyError(f"the step holds no tensor {name!r}")
            if mismatched:
                raise RuntimeError("Error(s) in loading state_dict:\n\t" + "\n\t".join(mismatched))
            for t, a in staged:
                self._set(t, a)
            for fn in later:
                fn()
            self._meta["tracked"].update(tracked)
            self._after_step()

    def set_lr(self, lr):
        """Sets the learning rate of every parameter group for the next steps (as a scheduler sets
        step.optimizer.param_groups[k]["lr"])."""
        with self._lock:
            self._open()
            if self._binding is None:
                raise KilnError("the step has no optimizer (compile it with optimizer=...)")
            for g in self.optimizer.param_groups:
                g["lr"] = float(lr)
            self._binding.hyper_in()

    def _bind_optimizer(self, opt, params):
        """Makes opt (a torch.optim optimizer over params, {module name: parameter}) the step's optimizer;
        None: one rebuilt from kiln.json's groups over the step's own parameters (a reopened checkpoint),
        its hyper-parameters the checkpoint's."""
        import torch

        if opt is None:
            params = {}
            prefix = self._meta.get("prefix", "")
            for g in self._meta["param_groups"]:
                for n in g["params"]:
                    t = self._by_name.get(prefix + n)
                    if t is not None and t["kind"] == "param":
                        params[n] = torch.nn.Parameter(torch.from_numpy(self._rt.view(t)))
            opt = _optim.rebuild(self._meta["optimizer"], self._meta["param_groups"], params)
        names = {}
        for n, p in params.items():
            names.setdefault(id(p), n)
        self._binding = _optim.Binding(opt, self._meta["optimizer"], self._rt, names, self._meta.get("prefix", ""))
        self.optimizer = opt

    # --- the module trained in place ---

    def _share_with(self, module, examples):
        """Makes module's parameters and buffers views of the step's memory (each one the step holds with
        its dtype and shape), so that training updates them in place, and keeps num_batches_tracked
        current. examples are the example inputs of the module's own forward (for its eval step)."""
        import torch

        self._module, self._examples = module, examples
        self._module_names = {}
        self._views = set()
        seen = set()
        for name, tensor in module.state_dict(keep_vars=True).items():
            owner_path, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            if name.endswith("num_batches_tracked") and name in self._meta["tracked"]:
                self._module_names[(id(owner), attr)] = name
                self._shared.append((owner, attr, "tracked"))
                continue
            t = self._held.get(name)
            if t is None or id(tensor) in seen or tensor.dtype != getattr(torch, NP_DTYPES[t["dtype"]]) or list(tensor.shape) != list(t["shape"]):
                continue
            seen.add(id(tensor))
            view = torch.from_numpy(self._rt.view(t))
            if isinstance(tensor, torch.nn.Parameter):
                tensor.data = view
                self._shared.append((owner, attr, "param"))
            else:
                setattr(owner, attr, view)
                self._shared.append((owner, attr, "buffer"))
            self._views.add(view.data_ptr())

    def _unshare(self):
        """Gives the module (and the optimizer) copies of the tensors that still view the step's memory (it
        is about to go; a later compile of the same module may have taken them over)."""
        if self._binding is not None:
            self._binding.unshare()
        for mod, attr, kind in self._shared:
            t = getattr(mod, attr, None)
            if t is None or kind == "tracked" or t.data_ptr() not in self._views:
                continue
            if kind == "param":
                t.data = t.data.clone()
            else:
                setattr(mod, attr, t.clone())
        self._shared = []

    # --- other batches and the eval step ---

    def _compile_other(self, mode, batch):
        """Compiles this step's model for mode and batch from the ONNX it kept, and makes its parameters
        and state this step's."""
        meta = self._meta
        if not meta.get("recompile"):
            raise KilnError("this step was loaded from a checkpoint, which keeps no model to compile again: "
                            f"{'its eval mode' if mode == 'eval' else f'a batch of {batch}'} needs the step compiled "
                            "from the module (kiln.compile)")
        rc = meta["recompile"]
        phases = _binary.Phases(f"the {'eval step' if mode == 'eval' else 'step'}" + (f" for a batch of {batch}" if batch else ""),
                                quiet=self._verbose is False)
        if mode == "eval":
            onnx_path = os.path.join(self._folder, "eval.onnx")
            if not os.path.exists(onnx_path):
                if self._module is None:
                    raise KilnError("the eval step needs the module the step was compiled from")
                tmp = tempfile.mkdtemp(prefix="kiln-eval-", dir=self._folder)
                try:
                    n = len(self._meta.get("outputs") or []) or 1
                    path = phases.time("export", _export.export, self._module, self._examples, tmp, rc["eval_inputs"], True,
                                       self._verbose, _export.forward_output_names(n))
                    os.replace(path, onnx_path)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            data, trainable, prefix = rc["eval_inputs"], rc["eval_trainable"], meta.get("prefix", "")
            compile_args = ["-O2"]
        else:
            onnx_path = os.path.join(self._folder, "model.onnx")
            data, trainable, prefix = meta["inputs"], rc["trainable"], ""
            compile_args = rc["compile"]
        groups = rc.get("groups") if mode == "train" else None
        kir = phases.time("import", _export.import_onnx, onnx_path, self._folder, data, trainable, batch, mode == "eval",
                          groups=groups)
        lib = os.path.join(self._folder, f"{mode}.b{batch or 0}.so")
        phases.time("compile", _binary.run, ["compile", kir, "--target", "llvm", "--emit", "lib", *compile_args, "-o", lib],
                    phases.report, "compile")
        os.remove(kir)
        fd = _files.open_regular(lib)
        try:
            rt = Runtime(fd, lib, self._threads or 0)
        finally:
            os.close(fd)
        try:
            for t in rt.tensors:
                if t["kind"] not in ("param", "state"):
                    continue
                u = self._by_name.get(prefix + t["name"]) or self._by_name.get(t["name"])
                if u is None:
                    if t["kind"] == "param" or mode == "train":
                        raise KilnError(f"the {mode} step's {t['name']} is not this step's")
                    continue  # eval-only state (none PyTorch makes)
                rt.share(t, self._rt, u)
        except BaseException:
            rt.close()
            raise
        return rt

    # --- profile, checkpoints, the end ---

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
            if replacing and (os.path.islink(target) or not os.path.isdir(target) or not _files.is_checkpoint(target)):
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
                saved = {k: v for k, v in self._meta.items() if k != "recompile"}
                if self.optimizer is not None:  # the groups' hyper-parameters as the next step reads them
                    saved["param_groups"] = [dict(g, **{k: _optim.plain(v) for k, v in tg.items() if k != "params"})
                                             for g, tg in zip(self._meta["param_groups"], self.optimizer.param_groups)]
                with open(os.path.join(tmp, "kiln.json"), "x") as f:
                    json.dump(saved, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o777 & ~_files.umask())
                if not replacing:
                    # Never over anything that appeared there meanwhile (a plain rename would replace an
                    # empty folder).
                    if not _files.renameat2(tmp, target, _files.RENAME_NOREPLACE):
                        os.rename(tmp, target)
                    tmp = None
                elif not _files.renameat2(tmp, target, _files.RENAME_EXCHANGE):
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
                _files.fsync_dir(parent)
            finally:
                if tmp is not None:
                    _files.remove_checkpoint_dir(tmp)

    def _release(self):
        for rt in getattr(self, "_others", {}).values():
            rt.close()
        self._others = {}
        if getattr(self, "_rt", None) is not None:
            self._rt.close()
        if getattr(self, "_so_fd", None) is not None:
            os.close(self._so_fd)
            self._so_fd = None
        if getattr(self, "_owned", False):
            shutil.rmtree(self._folder, ignore_errors=True)
            self._owned = False

    def close(self):
        """Frees the step (the module keeps copies of its tensors); any use after this raises ValueError.
        Closing twice does nothing."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if self._rt is not None and self._rt.s:
                self._unshare()
            self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter shutdown the modules it uses may be gone already
            pass


def _hyper_values(g):
    """The hyper-parameters of param group g that the step reads each call, flat: lr, momentum, beta1,
    beta2 (those g has)."""
    out = {"lr": float(g["lr"])}
    if "momentum" in g:
        out["momentum"] = float(g["momentum"])
    if "betas" in g:
        out["beta1"], out["beta2"] = (float(b) for b in g["betas"])
    return out


def _set_hyper(g, key, value):
    if key in ("beta1", "beta2"):
        b = list(g["betas"])
        b[0 if key == "beta1" else 1] = value
        g["betas"] = tuple(b)
    else:
        g[key] = value


class EvalStep:
    """A training step's eval mode (Step.eval()): the module's forward as module.eval() runs it (batch norm
    with its running statistics, dropout off), on the step's current weights; called with the module's own
    inputs (no targets), it returns the module's output (a tensor, or a tuple of them). Any batch runs, a
    larger one than the training step's too: each batch's forward is compiled the first time it comes."""

    def __init__(self, step):
        self._step = step

    def __call__(self, *inputs):
        step = self._step
        with step._lock:
            step._open()
            if not step._meta.get("recompile"):
                step._runtime_for("eval", None)  # raises what a loaded step lacks
            names = step._meta["recompile"]["eval_inputs"]
            batched = step._meta.get("batched") or []
            rt = step._runtime_for("eval", None)
            byname = {t["name"]: t for t in rt.tensors if t["kind"] == "input"}
            arrays, batch, as_torch = step._arrays(inputs, [byname[n] for n in names], batched[:len(names)])
            # Any batch: a forward holds no gradients, and each batch's is compiled for it.
            if batch is not None:
                rt = step._runtime_for("eval", batch)
                byname = {t["name"]: t for t in rt.tensors if t["kind"] == "input"}
            rt.run([(byname[n], a) for n, a in zip(names, arrays)])
            outs = [rt.array(t) for t in rt.results]
        import torch
        outs = [torch.from_numpy(o) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)


def _stage(name, t, value, staged, mismatched):
    """Stages value (a tensor or array) for the step's tensor t of that name, or records PyTorch's size
    mismatch message when its shape differs."""
    import numpy as np

    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    if list(a.shape) != list(t["shape"]):
        mismatched.append(f"size mismatch for {name}: copying a tensor of shape {list(a.shape)}, "
                          f"the shape in the step is {list(t['shape'])}")
    else:
        staged.append((t, a))
