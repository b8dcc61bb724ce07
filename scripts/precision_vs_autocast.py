"""PyTorch autocast's gradient error, the yardstick of Kiln's bf16 training steps.

For every small model with weights (export_small.py's and the breadth zoo's), runs the training step of
the committed reference once more in PyTorch under torch.autocast("cpu", dtype=torch.bfloat16): the same
weights, input and loss (sum(output), or sum(output * weight) for the breadth zoo), f32 parameters.
PyTorch 1.13's CPU autocast leaves layer_norm and group_norm out of its f32 list and then fails on a bf16
input with f32 weights; they run here in f32, as CUDA autocast runs them. Mish, which 1.13 lacks in bf16 on
the CPU, runs in f32 too (CUDA autocast would run it in bf16: the yardstick is a little stricter there), and
so does hardtanh (ReLU6), whose backward 1.13 lacks in bf16 (exactly: a clamp of a bf16 value is one).

Each parameter's gradient is compared with the f32 gradient of the same step (the committed
grad.NAME.npy for the committed input, which the f32 step here must reproduce; PyTorch's f32 step for
the others). A gradient that f32 itself computes only to 2^-16 relative error of the same step in f64 is
so ill-conditioned that any bf16 step gets noise there (zero or nearly zero in exact arithmetic: a bias
or scale just before a normalisation); it is marked "noise" and no step can be judged on it. Writes
MODEL_DIR/autocast_input.K.npy (K = 1..15, drawn as the committed input was, with seeds 1001...) and
MODEL_DIR/autocast_bf16.json:

    {"torch": "1.13.1", "samples": [{"input": "input.npy" | "autocast_input.K.npy",
        "params": {"NAME": {"rel_err": ||g - g32|| / ||g32||, "cosine": cos(g, g32),
                            "noise": f32's own error is above 2^-16}}} or {"input": ..., "error": "..."}]}

or {"error": "..."} where the f32 step does not reproduce the reference. autocast_test.go's
TestBF16AgainstAutocast reads these files and holds Kiln's bf16 step to them. Usage (Debian's Python,
from scripts/):
    /usr/bin/python3 precision_vs_autocast.py ../testdata/models [NAME...]
"""
import copy
import json
import os
import sys

import numpy as np
import torch

import export_breadth
import export_small


# A gradient that f32 computes with a relative error above 2^-16 (against the same step in f64) has a
# condition number k with k * u_f32 > 2^-16, so k * u_bf16 > 1: any bf16 step gets noise there.
NOISE = 2.0 ** -16


def loss_of(y, w):
    y = y.float()
    return (y * w).sum() if w is not None else y.sum()


def in_f32(fn):
    """fn on f32 inputs with autocast off, as CUDA autocast runs the ops of its f32 list."""
    def wrapped(x, *args, **kwargs):
        if torch.is_autocast_cpu_enabled() and x.dtype == torch.bfloat16:
            with torch.autocast("cpu", enabled=False):
                return fn(x.float(), *args, **kwargs)
        return fn(x, *args, **kwargs)
    return wrapped


torch.nn.functional.layer_norm = in_f32(torch.nn.functional.layer_norm)
torch.nn.functional.group_norm = in_f32(torch.nn.functional.group_norm)
torch.nn.functional.mish = in_f32(torch.nn.functional.mish)  # 1.13 has no bf16 mish on the CPU
# 1.13's hardtanh (ReLU6) backward has no bf16 CPU kernel; clamping a bf16 value gives a bf16 value, so
# the f32 hardtanh computes exactly what a bf16 one would.
torch.nn.functional.hardtanh = in_f32(torch.nn.functional.hardtanh)


def grads(model, x, w, autocast):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = model(x)
    loss_of(y, w).backward()
    return {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def grads64(model, x, w):
    m = copy.deepcopy(model).double()
    x = x.double() if x.is_floating_point() else x
    return grads(m, x, None if w is None else w.double(), False)


def compare(g, ref):
    d = np.linalg.norm(g - ref)
    n = np.linalg.norm(ref)
    rel = float(d / n) if n > 0 else float(d)
    den = np.linalg.norm(g) * n
    cos = float(np.dot(g.ravel(), ref.ravel()) / den) if den > 0 else (1.0 if d == 0 else 0.0)
    return {"rel_err": float(f"{rel:.4g}"), "cosine": float(f"{cos:.6g}")}


SAMPLES = 15  # inputs besides the committed one


def sample(d, model, x, w, ref):
    """Autocast's error on input x against the f32 gradients ref (name -> array), with the noise flags."""
    state = copy.deepcopy(model.state_dict())
    g64 = grads64(model, x, w)
    model.load_state_dict(state)
    try:
        g = grads(model, x, w, True)
    except Exception as e:  # noqa: BLE001 - recorded for the test to report
        return {"error": "autocast failed: " + str(e).splitlines()[0]}
    model.load_state_dict(state)
    return {"params": {n: dict(compare(g[n], ref[n]), noise=compare(ref[n], g64[n])["rel_err"] > NOISE)
                       for n in sorted(ref)}}


def measure(d, model, x, w, make_input):
    """The committed input's sample, then SAMPLES more drawn as the reference's was (seeds 1001...), each
    saved as autocast_input.K.npy with its f32 gradients measured here (the test recomputes them with
    Kiln's f32 step)."""
    ref = {}
    for f in os.listdir(d):
        if f.startswith("grad.") and f.endswith(".npy"):
            ref[f[len("grad."):-len(".npy")]] = np.load(os.path.join(d, f)).astype(np.float64)
    # The f32 step must reproduce the committed gradients (batch-norm running statistics and other
    # buffers do not enter them), or the comparison would measure something else.
    state = copy.deepcopy(model.state_dict())
    g64 = grads64(model, x, w)
    g32 = grads(model, x, w, False)
    checked = 0
    for name, r in ref.items():
        if compare(r, g64[name])["rel_err"] <= 1e-4:
            checked += 1
            if compare(g32[name], r)["rel_err"] > 1e-3:
                return {"error": f"the f32 step does not reproduce grad.{name}.npy"}
    if checked == 0:
        return {"error": "no gradient that f32 computes to 1e-4, by which to check that the f32 step is the reference's"}
    model.load_state_dict(state)
    first = sample(d, model, x, w, ref)
    if "error" in first:
        return first
    samples = [dict(first, input="input.npy")]
    for k in range(1, SAMPLES + 1):
        torch.manual_seed(1000 + k)
        xk = make_input()
        if xk.shape != x.shape:  # a model exported at batch 2 and checked at batch 3, as its reference
            xk = torch.cat([xk, xk[:x.shape[0] - xk.shape[0]]], 0)
        name = f"autocast_input.{k}.npy"
        np.save(os.path.join(d, name), xk.numpy())
        model.load_state_dict(state)
        refk = grads(model, xk, w, False)
        model.load_state_dict(state)
        samples.append(dict(sample(d, model, xk, w, refk), input=name))
    return {"torch": torch.__version__, "samples": samples}


def main():
    root, only = sys.argv[1], set(sys.argv[2:])
    todo = []
    for name, model, _ in export_small.instances():
        if not only or name in only:
            todo.append((os.path.join(root, name), model, None, export_small.SMALL[name][1]))
    for name, model, _, _ in export_breadth.instances(only):
        table = export_breadth.BREADTH if name in export_breadth.BREADTH else export_breadth.DYNAMIC
        todo.append((os.path.join(root, "breadth", name), model,
                     torch.from_numpy(np.load(os.path.join(root, "breadth", name, "weight.npy"))), table[name][1]))
    for d, model, w, make_input in todo:
        x = torch.from_numpy(np.load(os.path.join(d, "input.npy")))
        res = measure(d, model, x, w, make_input)
        with open(os.path.join(d, "autocast_bf16.json.tmp"), "w") as fh:
            json.dump(res, fh, separators=(",", ":"), sort_keys=True)
            fh.write("\n")
        os.replace(os.path.join(d, "autocast_bf16.json.tmp"), os.path.join(d, "autocast_bf16.json"))
        if "error" in res:
            print(f"{d}: {res['error']}")
            continue
        worsts = [max([p["rel_err"] for p in smp["params"].values() if not p["noise"]], default=float("nan"))
                  for smp in res["samples"] if "params" in smp]
        failed = [smp["error"] for smp in res["samples"] if "error" in smp]
        print(f"{d}: worst gradient per sample " + " ".join(f"{e:.2e}" for e in worsts) + f", mean {np.mean(worsts):.3e}"
              + (f"; {len(failed)} samples failed: {failed[0]}" if failed else ""))


if __name__ == "__main__":
    main()
