"""Kiln from Python: plan a PyTorch model's training-step memory without leaving Python.

    import kiln
    report = kiln.memory(model, (x,), budget=0.5, optimizer="adam")
    print(report.planned_bytes, report.peak_bytes)

The model is exported with torch.onnx.export (training mode, opset 17, constants not folded), imported
with every example input as data, differentiated (loss = the sum of the first output), optionally given
an optimizer step and a recomputation budget, fused, reordered and assigned into one arena by the Kiln
binary: $KILN if set, else `kiln` on PATH. Only torch (and onnx, which torch.onnx uses) are needed.
"""
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile

__all__ = ["MemoryReport", "KilnError", "memory"]


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
    proc = subprocess.run([_binary()] + args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KilnError(proc.stderr.strip() or f"kiln exited with {proc.returncode}")
    return proc.stdout


def pipeline(budget=None, optimizer=None):
    """The pass pipeline memory() runs, as `kiln mem --train --optimizer KIND -O2 --budget B` expands it:
    autodiff, the optimizer step ("sgd", "momentum", "adam", "adamw"), clean-ups, the saved-set selection,
    remat under budget (a fraction of the peak it starts from, or bytes like "512MiB"), fuse, reorder and
    assign."""
    passes = ["autodiff{loss=sum}"]
    if optimizer is not None:
        passes.append(f"optimizer{{kind={optimizer}}}")
    passes += ["canonicalize", "dce", "cse", "saveset"]
    if budget is not None:
        passes.append(f"remat{{budget={budget}}}")
    passes += ["fuse", "reorder", "assign"]
    return ",".join(passes)


def memory(model, example_inputs, budget=None, optimizer=None):
    """Plan the memory of one training step of model on example_inputs (a tensor or a tuple of them)
    and return a MemoryReport. budget: recompute so that the peak fits it (a fraction such as 0.5, or
    bytes such as "2GiB"); optimizer: add its update step ("sgd", "momentum", "adam" or "adamw")."""
    import torch  # imported here so that `import kiln` works without torch

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    names = [f"input{i}" for i in range(len(example_inputs))]
    with tempfile.TemporaryDirectory(prefix="kiln-") as tmp:
        onnx_path = os.path.join(tmp, "model.onnx")
        was_training = model.training
        model.train()
        try:
            torch.onnx.export(model, example_inputs, onnx_path, export_params=True, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=names)
        finally:
            model.train(was_training)
        kir = os.path.join(tmp, "model.kir")
        _run(["import", onnx_path, "--data-inputs", ",".join(names), "-o", kir])
        pipe = pipeline(budget, optimizer)
        raw = json.loads(_run(["mem", kir, "--passes", pipe, "--json"]))
    return MemoryReport(
        planned_bytes=raw["planned_bytes"], peak_bytes=raw["peak_bytes"], arena_bytes=raw["arena_bytes"],
        params_bytes=raw["params_bytes"], state_bytes=raw["state_bytes"], inputs_bytes=raw["inputs_bytes"],
        flops=raw["flops"], recompute_flops=raw["recompute_flops"], pipeline=pipe, raw=raw)
