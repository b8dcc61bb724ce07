"""Kiln from Python: plan a PyTorch model's training-step memory, and run it compiled, without leaving
Python.

    import kiln
    report = kiln.memory(model, (x,), budget=0.5, optimizer="adam")
    print(report.planned_bytes, report.peak_bytes)

    step = kiln.compile(model, (x,), train=True)   # forward and backward, compiled by clang
    out = step(x)                                   # {"loss": ..., "grad.fc.weight": ..., ...}

The model is exported with torch.onnx.export (training mode, opset 17, constants not folded), imported
with every example input as data, and planned by the Kiln binary ($KILN if set, else `kiln` on PATH) as
`kiln mem --train -O2` plans it from the same arguments: differentiated (loss = the sum of the first
output), optionally given an optimizer step and a memory budget, fused, reordered and assigned into one
arena. Only torch (and onnx, which torch.onnx uses) are needed.
"""
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile

__all__ = ["MemoryReport", "KilnError", "memory", "compile", "Compiled"]


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
    model.train(training)
    try:
        mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(model, example_inputs, onnx_path, export_params=True, opset_version=17,
                          training=mode, do_constant_folding=False, input_names=names, output_names=["output"])
    finally:
        model.train(was_training)
    kir = os.path.join(tmp, "model.kir")
    _run(["import", onnx_path, "--data-inputs", ",".join(names), "-o", kir])
    return kir, names, example_inputs


def _plan_args(budget, optimizer, allow, microbatches, device):
    """The flags of a training-step request, as `kiln mem` and `kiln compile` take them: the same
    request gives the same plan from Python and from the command line."""
    args = ["--train", "-O2"]
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


def memory(model, example_inputs, budget=None, optimizer=None, allow=(), microbatches=None, device=None):
    """Plan the memory of one training step of model on example_inputs (a tensor or a tuple of them)
    and return a MemoryReport: the plan `kiln mem --train -O2` makes with the same arguments.
    budget: bound the peak (a fraction of the step's peak after autodiff alone, such as 0.5, or bytes
    such as "2GiB"), by recomputation, microbatches, swapping and offloading in turn; optimizer: add its
    update step ("sgd", "momentum", "adam" or "adamw"); microbatches: split the step into that many
    slices of the batch; device: the device the plan models ("h100", or rates); allow: the names of the
    approximations the plan may make ("per-slice-bn", "per-rank-dropout"; none unless named)."""
    args = _plan_args(budget, optimizer, allow, microbatches, device)
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


class Compiled:
    """A model compiled to a native program by Kiln's LLVM backend (clang -O2). Call it with tensors
    (numpy arrays or torch tensors, in the order of the example inputs); it returns a dict from result
    name to array: the model's outputs ("output" for the first), or for a training step "loss" and "grad.PARAM" for every
    parameter (and "updated.PARAM" after an optimizer step). Results are torch tensors when the inputs
    were. The weights are those the model had when it was compiled. close() (or the end of a with block)
    deletes the program."""

    def __init__(self, exe, names, tmp):
        self.exe, self.names, self._tmp = exe, names, tmp

    def __call__(self, *inputs):
        import numpy as np

        if len(inputs) != len(self.names):
            raise TypeError(f"the compiled model takes {len(self.names)} inputs, not {len(inputs)}")
        as_torch = False
        with tempfile.TemporaryDirectory(prefix="kiln-run-") as run:
            ins, outs = os.path.join(run, "in"), os.path.join(run, "out")
            os.makedirs(ins)
            for name, x in zip(self.names, inputs):
                if hasattr(x, "detach"):  # a torch tensor
                    as_torch = True
                    x = x.detach().cpu().numpy()
                np.save(os.path.join(ins, name + ".npy"), np.ascontiguousarray(x))
            proc = subprocess.run([self.exe, "--inputs", ins, "--output-dir", outs], capture_output=True, text=True)
            if proc.returncode != 0:
                raise KilnError(proc.stderr.strip() or f"the compiled program exited with {proc.returncode}")
            results = {}
            for f in sorted(os.listdir(outs)):
                if f.endswith(".npy"):
                    results[f[:-4]] = np.load(os.path.join(outs, f))
        if as_torch:
            import torch
            results = {k: torch.from_numpy(v) for k, v in results.items()}
        return results

    def close(self):
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter shutdown shutil may be gone already
            pass


def compile(model, example_inputs, train=False, loss="sum", optimizer=None, budget=None, allow=(),
            microbatches=None, device=None):
    """Compile model for example_inputs (their shapes and dtypes are fixed) into a native program and
    return it as a Compiled callable. train=False compiles the forward pass (eval mode); train=True the
    training step: forward, loss (the "sum" or "mean" of the first output) and backward, with an
    optimizer step when optimizer is "sgd", "momentum", "adam" or "adamw", and recomputation under
    budget (a fraction of the peak or bytes). Kiln plans it as memory() does (kiln compile --train -O2);
    allow, microbatches and device are memory()'s."""
    tmp = tempfile.mkdtemp(prefix="kiln-compile-")
    try:
        kir, names, _ = _export(model, example_inputs, tmp, training=train)
        exe = os.path.join(tmp, "step")
        args = ["compile", kir, "--target", "llvm", "--emit", "exe", "-o", exe]
        if train:
            args += _plan_args(budget, optimizer, allow, microbatches, device)
            args[args.index("--train")] = f"--train={loss}"
        elif optimizer is not None or microbatches is not None:
            raise ValueError("an optimizer or microbatches need train=True")
        else:
            args.append("-O2")
            if budget is not None:
                args += ["--budget", str(budget)]
            if device is not None:
                args += ["--device", device]
        _run(args)
        return Compiled(exe, names, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
