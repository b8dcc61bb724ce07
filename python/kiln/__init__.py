"""Kiln from Python: train a PyTorch module with a step Kiln compiles, run in this process, and plan the
memory of its training step.

    import kiln, torch.nn.functional as F
    step = kiln.compile(net, (x, y), loss_fn=F.cross_entropy, optimizer="adamw", lr=1e-3)
    for x, y in loader:                 # any batch up to the example's: the last one too
        step(x, y)                      # forward, backward and update; net's tensors are trained in place
    logits = step.eval()(x)             # net.eval()'s forward on the same weights
    step.save("ckpt"); step = kiln.load("ckpt")

    report = kiln.memory(net, (x, y), loss_fn=F.cross_entropy, budget=0.5, optimizer="adam")

The module (with its loss) is exported with torch.onnx.export (training mode, opset 17, constants not
folded), imported, and planned by the Kiln binary as `kiln mem --train -O2` plans it from the same
arguments: differentiated, given its optimizer step and memory budget, fused, reordered and assigned into
one arena. kiln.compile builds it into a shared library (clang) and runs it through its C ABI with ctypes.
The binary is $KILN, else kiln on PATH, else one built with go build from the source tree this package
came from. Only torch (and onnx, which torch.onnx uses) and numpy are needed.
"""
import dataclasses
import json
import os
import shutil
import tempfile

from . import _binary, _export, _files, _optim
from ._errors import KilnError
from ._step import EvalStep, Step

__all__ = ["MemoryReport", "KilnError", "memory", "compile", "load", "Step", "EvalStep"]


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


def _plan_args(budget, optimizer, allow, microbatches, device, precision=None, loss="sum"):
    """The flags of a training-step request, as `kiln mem` and `kiln compile` take them: the same
    request gives the same plan from Python and from the command line."""
    args = [f"--train={loss}", "-O2"]
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


class _Model:
    """What a compile exports: the module, or the module with its loss (loss_fn), its inputs' names and
    which hold the batch, and the names that tie the step's tensors to the module's."""

    def __init__(self, module, example_inputs, loss_fn, targets, outputs):
        self.module = module
        self.inputs = _export.as_tuple(example_inputs)
        if loss_fn is None:
            targets = 0
        elif targets is None:
            targets = 1
        if loss_fn is not None and not (isinstance(targets, int) and 1 <= targets < len(self.inputs)):
            raise ValueError(f"targets={targets}: the example inputs hold the module's inputs, then the loss's targets "
                             f"(at least one of each; {len(self.inputs)} inputs given)")
        self.targets = targets
        self.names = _export.input_names(module, len(self.inputs), targets)
        self.outputs = outputs
        self.prefix = _export.WithLoss.PREFIX if loss_fn is not None else ""
        self.exported = _export.WithLoss.build(module, loss_fn, targets, outputs) if loss_fn is not None else module
        lead = [x.shape[0] if getattr(x, "ndim", 0) > 0 else None for x in self.inputs]
        self.batch = lead[0] if lead and lead[0] is not None else 0
        self.batched = [b is not None and b == self.batch for b in lead]

    def output_names(self, n_outputs):
        """The graph's outputs: the loss (or the module's output), then with outputs the module's
        n_outputs ones (after its loss, for a module that returns its loss first)."""
        if not self.outputs:
            return ["loss"] if self.prefix else ["output"]
        if not self.prefix:
            n_outputs -= 1  # the module returns its loss, then the others
        if n_outputs == 1:
            return ["loss.value", "output"]
        return ["loss.value"] + [f"output{i}" for i in range(n_outputs)]


def _count_outputs(module, inputs):
    """How many tensors module(*inputs) returns (one forward without gradients, the module's state
    kept)."""
    import torch

    saved = {k: v.clone() for k, v in module.state_dict().items()}
    try:
        with torch.no_grad():
            out = module(*inputs)
    finally:
        module.load_state_dict(saved)
    return len(out) if isinstance(out, (tuple, list)) else 1


def _loss_shape(onnx_path):
    import onnx

    out = onnx.load(onnx_path, load_external_data=False).graph.output[0]
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in out.type.tensor_type.shape.dim]


def _export_train(model, folder, phases, verbose, plan=None):
    """Exports and imports the training graph; returns the kir and ONNX paths, the trainable names, the
    graph's output names and the trainable names' parameter groups (plan: what _optim.plan returned;
    without one every parameter requiring a gradient is trained)."""
    own = model.inputs[:len(model.inputs) - model.targets]
    names = model.output_names(_count_outputs(model.module, own) if model.outputs else 1)
    onnx_path = phases.time("export", _export.export, model.exported, model.inputs, folder, model.names, True, verbose, names)
    trainable = _export.trainable_names(model.exported, onnx_path)
    groups = None
    if plan is not None:
        group_of = {model.prefix + n: k for n, k in plan[2].items()}
        every = [n for n, p in model.exported.named_parameters() if p.requires_grad]
        if trainable is None and (set(group_of) != set(every) or any(group_of.values())):
            raise KilnError("the ONNX export renamed the module's parameters, so Kiln cannot tell them apart: the "
                            "optimizer must then train every parameter in one group")
        if trainable is not None:
            trainable = [n for n in trainable if n in group_of]
            groups = {n: group_of[n] for n in trainable if group_of[n]}
    kir = phases.time("import", _export.import_onnx, onnx_path, folder, model.names, trainable, groups=groups)
    return kir, onnx_path, trainable, names, groups


def memory(model, example_inputs, budget=None, optimizer=None, allow=(), microbatches=None, device=None,
           precision=None, loss_fn=None, targets=None, loss="sum", verbose=None):
    """Plan the memory of one training step of model on example_inputs (a tensor or a tuple of them)
    and return a MemoryReport: the plan `kiln mem --train -O2` makes with the same arguments.
    loss_fn and targets: as kiln.compile's (else the loss is loss, "sum" or "mean", of the first output);
    budget: bound the peak (a fraction of the step's peak after autodiff alone, such as 0.5, or bytes
    such as "2GiB"), by recomputation, microbatches, swapping and offloading in turn; optimizer: add its
    update step ("sgd", "momentum", "adam" or "adamw"); microbatches: split the step into that many
    slices of the batch; device: the device the plan models ("h100", or rates); allow: the names of the
    approximations the plan may make ("per-slice-bn", "per-rank-dropout", "ste", "bf16-saved", "fp8-saved"; none
    unless named); precision: "bf16" or "f16" mixed precision (f32 master weights), optionally with the
    precision pass's options ("bf16,saved=fp8", which needs allow=("fp8-saved",))."""
    m = _Model(model, example_inputs, loss_fn, targets, False)
    args = _plan_args(budget, optimizer, allow, microbatches, device, precision, loss)
    phases = _binary.Phases("kiln.memory", quiet=verbose is False)
    with tempfile.TemporaryDirectory(prefix="kiln-") as tmp:
        kir = _export_train(m, tmp, phases, verbose)[0]
        out, err = phases.time("plan", _binary.run, ["mem", kir, *args, "--json", "--print-pipeline"], phases.report, "plan")
    raw = json.loads(out)
    pipes = [line[len("pipeline: "):] for line in err.splitlines() if line.startswith("pipeline: ")]
    return MemoryReport(
        planned_bytes=raw["planned_bytes"], peak_bytes=raw["peak_bytes"], arena_bytes=raw["arena_bytes"],
        params_bytes=raw["params_bytes"], state_bytes=raw["state_bytes"], inputs_bytes=raw["inputs_bytes"],
        flops=raw["flops"], recompute_flops=raw["recompute_flops"], pipeline=pipes[-1] if pipes else "",
        raw=raw)


def _check_device(device):
    """device as a plan models it; "cuda" is refused here, where Python runs the CPU step."""
    if device in (None, "cpu"):
        return None
    if device == "cuda":
        nvcc, gpu = shutil.which("nvcc"), os.path.exists("/dev/nvidia0")
        raise KilnError("device='cuda': kiln.compile runs the step on the CPU in this process; "
                        + ("this machine has no GPU" if not gpu else "no nvcc is installed" if not nvcc else
                           "the CUDA program is built with `kiln compile IN --target cuda --emit exe` (docs/cuda.md)"))
    return device


def _optimizer(module, optimizer, param_groups, lr, momentum, betas, eps, weight_decay, nesterov, amsgrad):
    """The torch.optim optimizer a compile trains with: optimizer itself, or one made from its name over
    param_groups (else the module's parameters)."""
    import torch

    given = {"lr": lr, "momentum": momentum, "betas": betas, "eps": eps, "weight_decay": weight_decay,
             "nesterov": nesterov or None, "amsgrad": amsgrad or None, "param_groups": param_groups}
    if isinstance(optimizer, torch.optim.Optimizer):
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise ValueError(f"{', '.join(extra)}: the optimizer given holds its hyper-parameters and groups; "
                             "pass them to it, not to kiln.compile")
        return optimizer
    if not isinstance(optimizer, str):
        raise ValueError(f"optimizer must be None, 'sgd', 'momentum', 'adam', 'adamw' or a torch.optim.SGD, Adam "
                         f"or AdamW, not {optimizer!r}")
    params = param_groups if param_groups is not None else list(module.parameters())
    return _optim.make(optimizer, params, lr, momentum, betas, eps, weight_decay, nesterov, amsgrad)


def compile(module, example_inputs, train=True, loss=None, loss_fn=None, targets=None, outputs=False,
            optimizer=None, lr=None, momentum=None, betas=None, eps=None, weight_decay=None, nesterov=False,
            amsgrad=False, param_groups=None, max_grad_norm=None,
            budget=None, microbatches=None, allow=(), device=None, precision=None, threads=None, verbose=None):
    """Compile module for example_inputs (a tensor or a tuple; their dtypes and shapes fixed, their first
    dimension the largest batch) into a Step run in this process.

    The loss: with loss_fn (any callable: F.cross_entropy, nn.CrossEntropyLoss(), nn.MSELoss(), one of
    the user's), the step computes loss_fn(module(*inputs), *targets), the targets the last `targets`
    example inputs (1 unless given); nn.CrossEntropyLoss(label_smoothing=s), which PyTorch 1.13 cannot
    export, Kiln lowers itself. Without it, module(*inputs) returns the loss: a scalar as it is, a tensor
    reduced by loss ("sum" or "mean"); with an optimizer, a tensor and no loss is refused. outputs=True
    returns the module's outputs beside the loss.

    train=True: with optimizer None the step returns {"loss", "grad.NAME"...} and updates no parameter
    (each call is still a forward and backward in training mode: new dropout masks, batch-norm
    statistics updated, as in PyTorch). With an optimizer it runs forward, backward and the update in
    place and returns {"loss"}: optimizer is a torch.optim.SGD, Adam or AdamW over the module's parameters
    (its groups, hyper-parameters, nesterov and amsgrad are compiled; a parameter in no group is not
    trained), or a name, "sgd", "momentum" (SGD with momentum 0.9 unless given), "adam" or "adamw", with
    torch.optim's keywords (lr, momentum, betas, eps, weight_decay, nesterov, amsgrad; None: PyTorch's
    defaults, lr 1e-3) and param_groups (torch.optim's list of {"params": [...], "lr": ...} dicts).
    max_grad_norm clips the gradients' global norm first, as torch.nn.utils.clip_grad_norm_. The step's
    optimizer (Step.optimizer) is that torch.optim object: schedulers drive it (Step)
    train=False compiles the module's eval-mode forward and returns its outputs.

    The module's parameters and buffers become views of the step's memory: training updates them in
    place (Step). budget, microbatches and allow are the planner's request, as --budget, --microbatches
    and --allow; device is the device the plan models ("cuda" is refused: the step runs on the CPU);
    precision: "bf16" trains in bf16 with f32 master weights, as --precision. threads: the step's
    threads (None: every core). verbose: None shows the phases of a compile longer than two seconds on
    stderr, True also torch's export warnings, False nothing."""
    device = _check_device(device)
    if not train and (optimizer is not None or microbatches is not None or precision is not None or loss_fn is not None):
        raise ValueError("an optimizer, microbatches, precision or a loss_fn need train=True")
    opt = plan = None
    if optimizer is not None:
        opt = _optimizer(module, optimizer, param_groups, lr, momentum, betas, eps, weight_decay, nesterov, amsgrad)
        plan = _optim.plan(opt, module.named_parameters(), max_grad_norm)
    elif any(v is not None for v in (lr, momentum, betas, eps, weight_decay, param_groups, max_grad_norm)) or nesterov or amsgrad:
        raise ValueError("optimizer keywords without an optimizer: pass optimizer= ('sgd', 'adam', 'adamw' or a torch.optim one)")
    if loss not in (None, "sum", "mean"):
        raise ValueError(f"loss must be None, 'sum' or 'mean', not {loss!r}")
    if loss is not None and loss_fn is not None:
        raise ValueError("give loss_fn (the module returns its outputs) or loss (the module returns its loss), not both")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None (every core) or a positive count, not {threads!r}")
    model = _Model(module, example_inputs, loss_fn if train else None, targets, outputs and train)
    phases = _binary.Phases("kiln.compile", quiet=verbose is False)
    tmp = tempfile.mkdtemp(prefix="kiln-compile-")
    try:
        if train:
            kir, onnx_path, trainable, out_names, groups = _export_train(model, tmp, phases, verbose, plan)
            shape = _loss_shape(onnx_path)
            if loss is None:
                if shape and optimizer is not None:
                    raise ValueError(f"the module returns a tensor of shape {shape}, not a loss: pass loss_fn= (F.cross_entropy, "
                                     "with the targets last in example_inputs), or loss='sum' or 'mean' to train on its "
                                     "sum or mean")
                loss = "sum"
            args = _plan_args(budget, None, allow, microbatches, device, precision, loss)
            if outputs:
                args.append("--keep-outputs")
            if plan is not None:
                args += ["--optimizer", plan[0], "--optimizer-options", plan[1]]
            else:
                # Gradients only: no update, but each call is a new forward and backward in training mode
                # (new dropout masks, running statistics updated, as PyTorch's).
                args += ["--optimizer", "none"]
        else:
            own = model.inputs
            out_names = _export.forward_output_names(_count_outputs(module, own))
            onnx_path = phases.time("export", _export.export, module, own, tmp, model.names, True, verbose, out_names)
            out_names, groups = [], None
            trainable = _export.trainable_names(module, onnx_path)
            kir = phases.time("import", _export.import_onnx, onnx_path, tmp, model.names, trainable, None, True)
            args = ["-O2"]
            if budget is not None:
                args += ["--budget", str(budget)]
            if device is not None:
                args += ["--device", device]
        if threads == 1:
            args += ["--threads", "1"]
        phases.time("compile", _binary.run, ["compile", kir, "--target", "llvm", "--emit", "lib", "-o",
                                             os.path.join(tmp, "step.so"), *args], phases.report, "compile")
        for f in os.listdir(tmp):
            if f not in ("step.so", "model.onnx"):
                os.remove(os.path.join(tmp, f))
        if not train:
            os.replace(os.path.join(tmp, "model.onnx"), os.path.join(tmp, "eval.onnx"))
        own_names = model.names[:len(model.names) - model.targets]
        meta = {"inputs": model.names, "optimizer": plan[0] if plan else None, "train": bool(train),
                "param_groups": plan[3] if plan else [],
                "state_names": list(module.state_dict().keys()),
                "tracked": {k: int(v) for k, v in module.state_dict().items() if k.endswith("num_batches_tracked")},
                "tied": _export.tied(module), "prefix": model.prefix if train else "",
                "outputs": out_names[1:] if outputs and train else [],
                "batch": model.batch, "batched": model.batched,
                "recompile": {"trainable": trainable, "groups": groups, "compile": args if train else ["-O2"],
                              "eval_inputs": own_names,
                              "eval_trainable": [n for n, p in module.named_parameters() if p.requires_grad]}}
        step = Step(tmp, meta, owned=True, threads=threads, verbose=verbose)
        try:
            step.load_state_dict({k: v for k, v in module.state_dict().items() if k in step._held})
            step._share_with(module, model.inputs[:len(own_names)])
            if opt is not None:
                step._bind_optimizer(opt, dict(module.named_parameters()))
        except BaseException:
            step.close()
            raise
        return step
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_meta(meta, path):
    """meta is what Step.save writes to kiln.json, or a KilnError naming path."""
    def strings(v):
        return isinstance(v, list) and all(isinstance(n, str) for n in v)

    ok = (isinstance(meta, dict) and strings(meta.get("inputs")) and strings(meta.get("state_names"))
          and isinstance(meta.get("tracked"), dict) and all(isinstance(k, str) and isinstance(v, int) for k, v in meta["tracked"].items())
          and meta.get("optimizer") in (None, "sgd", "momentum", "adam", "adamw")
          and isinstance(meta.get("param_groups", []), list)
          and all(isinstance(g, dict) and strings(g.get("params")) for g in meta.get("param_groups", []))
          and (meta.get("optimizer") is None or meta.get("param_groups"))
          and isinstance(meta.get("tied", []), list) and all(strings(g) for g in meta.get("tied", []))
          and isinstance(meta.get("prefix", ""), str) and strings(meta.get("outputs", []))
          and isinstance(meta.get("batch", 0), int) and isinstance(meta.get("batched", []), list)
          and all(isinstance(b, bool) for b in meta.get("batched", [])) and "recompile" not in meta)
    if not ok:
        raise KilnError(f"{path} is not the kiln.json of a saved step")
    return meta


def load(path, threads=None):
    """Reopens a step that Step.save wrote: the same library, its state from the checkpoint; training
    continues bit for bit, with no module and no recompilation (so at the batch it was compiled for, and
    without an eval step). Only regular files are read."""
    path = os.fspath(path)
    meta_path = os.path.join(path, "kiln.json")
    try:
        meta = json.loads(_files.read_regular(meta_path))
    except ValueError as e:
        raise KilnError(f"{meta_path} is not the kiln.json of a saved step: {e}") from None
    step = Step(path, _check_meta(meta, meta_path), owned=False, threads=threads)
    try:
        step._check(step._lib.kiln_load(step._s, os.fsencode(os.path.join(path, "checkpoint.npz"))))
        if meta.get("optimizer"):
            step._bind_optimizer(None, None)
    except BaseException:
        step.close()
        raise
    return step
