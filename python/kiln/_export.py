"""A PyTorch module (with its loss) as an ONNX graph and Kiln IR: what kiln.compile and kiln.memory
export, and the names that tie the compiled step's tensors to the module's."""
import contextlib
import inspect
import os
import warnings

from . import _binary
from ._errors import KilnError


def as_tuple(example_inputs):
    import torch

    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    return tuple(example_inputs)


def input_names(module, n, targets):
    """Names for n example inputs: the forward's argument names for the module's own, target (or target0,
    target1, ...) for the last targets ones; input0, input1, ... where the forward has no name for one."""
    own = n - targets
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [params[i].name if i < len(params) else f"input{i}" for i in range(own)]
    if targets == 1:
        names.append("target")
    else:
        names += [f"target{i}" for i in range(targets)]
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            names[i] = f"input{i}"
        seen.add(names[i])
    return names


def _reduce(x, reduction):
    if reduction == "none":
        return x
    return x.sum() if reduction == "sum" else x.mean()


def _legacy(size_average, reduce, reduction):
    """PyTorch's reduction from its deprecated size_average and reduce, as _Reduction.legacy_get_string."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


@contextlib.contextmanager
def exportable_losses():
    """Kiln's own lowering of the losses PyTorch 1.13 cannot export (aten::mse_loss, l1_loss,
    smooth_l1_loss, huber_loss, and cross_entropy with label_smoothing or class-probability targets):
    while it lasts, torch.nn.functional's (which nn.MSELoss and the others call) are their definitions in
    exportable ops, with PyTorch's semantics (reductions, ignore_index, label smoothing)."""
    import torch
    import torch.nn.functional as F

    saved = {n: getattr(F, n) for n in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "cross_entropy")}
    original_ce = saved["cross_entropy"]

    def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
        return _reduce((input - target) ** 2, _legacy(size_average, reduce, reduction))

    def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
        return _reduce((input - target).abs(), _legacy(size_average, reduce, reduction))

    def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
        d = (input - target).abs()
        per = d if beta == 0 else torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
        return _reduce(per, _legacy(size_average, reduce, reduction))

    def huber_loss(input, target, reduction="mean", delta=1.0):
        d = (input - target).abs()
        return _reduce(torch.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)

    def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                      reduction="mean", label_smoothing=0.0):
        reduction = _legacy(size_average, reduce, reduction)
        probabilities = target.is_floating_point()
        if not label_smoothing and not probabilities:
            return original_ce(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction)
        if weight is not None:
            raise ValueError("cross_entropy with class weights and label_smoothing (or class-probability targets): "
                             "Kiln lowers these itself (PyTorch 1.13 cannot export them) for unweighted losses only")
        logp = F.log_softmax(input, dim=1)
        classes = input.shape[1]
        if probabilities:
            q = target * (1 - label_smoothing) + label_smoothing / classes
            return _reduce(-(q * logp).sum(1), reduction)
        nll = F.nll_loss(logp, target, ignore_index=ignore_index, reduction="none")
        keep = (target != ignore_index).to(logp.dtype)
        per = (1 - label_smoothing) * nll - label_smoothing * logp.mean(dim=1) * keep
        if reduction == "mean":
            return per.sum() / keep.sum()
        return _reduce(per, reduction)

    F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.cross_entropy = mse_loss, l1_loss, smooth_l1_loss, huber_loss, cross_entropy
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(F, n, f)


class WithLoss:
    """module and its loss as one module for the export: forward(*inputs, *targets) is
    loss_fn(module(*inputs), *targets), and with keep the module's outputs after it. The module's tensors
    are named with the prefix "module."."""

    PREFIX = "module."

    @staticmethod
    def build(module, loss_fn, targets, keep):
        import torch

        class _WithLoss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.module = module
                if isinstance(loss_fn, torch.nn.Module):
                    self.loss_fn = loss_fn  # its buffers (class weights) are the step's state
                else:
                    self._fn = loss_fn

            def forward(self, *args):
                out = self.module(*args[:-targets])
                fn = self.loss_fn if isinstance(loss_fn, torch.nn.Module) else self._fn
                loss = fn(out, *args[-targets:])
                if not keep:
                    return loss
                return (loss,) + (tuple(out) if isinstance(out, (tuple, list)) else (out,))

        return _WithLoss()


def export(model, example_inputs, folder, names, training, verbose, output_names):
    """Exports model on example_inputs to folder/model.onnx (training mode, opset 17, constants not
    folded), the module keeping the state it had (tracing runs it once). torch's warnings are shown only
    when verbose is True. A loss PyTorch cannot export is named as such."""
    import torch

    path = os.path.join(folder, "model.onnx")
    was_training = model.training
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model.train(training)
    try:
        with warnings.catch_warnings(record=True) as caught, exportable_losses():
            warnings.simplefilter("always")
            torch.onnx.export(model, example_inputs, path, export_params=True, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=names, output_names=output_names)
    except torch.onnx.errors.UnsupportedOperatorError as e:
        raise KilnError(f"PyTorch cannot export the module or its loss to ONNX: {e}") from None
    finally:
        model.train(was_training)
        model.load_state_dict(saved)
    if verbose:
        for w in caught:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return path


def forward_output_names(n):
    """The names of a forward's n outputs: output, or output0, output1, ..."""
    return ["output"] if n == 1 else [f"output{i}" for i in range(n)]


def import_onnx(onnx_path, folder, data, trainable, batch=None, eval_mode=False, report=None, groups=None):
    """Imports onnx_path as folder/NAME.kir (kiln import), data naming the data inputs; trainable the
    parameters (the others state), groups their optimizer parameter groups where not 0. Returns the kir
    path."""
    args = ["--data-inputs", ",".join(data)]
    if trainable is not None:
        tfile = os.path.join(folder, "trainable.txt")
        groups = groups or {}
        with open(tfile, "w") as f:
            f.write("".join(n + (f"\t{groups[n]}" if groups.get(n) else "") + "\n" for n in trainable))
        args += ["--trainable-file", tfile]
    if batch is not None:
        args += ["--batch", str(int(batch))]
    if eval_mode:
        args.append("--eval")
    kir = os.path.join(folder, ("eval" if eval_mode else "model") + (f".b{batch}" if batch else "") + ".kir")
    _binary.run(["import", onnx_path, *args, "-o", kir], report, "import")
    return kir


def trainable_names(model, onnx_path):
    """The parameters torch trains, when the export kept each one's name (a renamed one would be frozen:
    then every float initializer is trainable, Kiln's default); None for the default."""
    import onnx

    initializers = {t.name for t in onnx.load(onnx_path, load_external_data=False).graph.initializer}
    params = [name for name, p in model.named_parameters() if p.requires_grad]
    if all(name in initializers for name in params):
        return params
    return None


def tied(module):
    """The groups of names under which module.state_dict() holds one tensor (a head tied to its
    embedding), each in the state_dict's order."""
    groups = {}
    for name, v in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(v), []).append(name)
    return [g for g in groups.values() if len(g) > 1]
