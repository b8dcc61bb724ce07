"""Tests of kiln.compile on real torch models: a small GPT's training step (loss and every gradient) and
a torchvision ResNet-18's forward pass, compiled by Kiln's LLVM backend, against torch.
Run: KILN=path/to/kiln PYTHONPATH=python /usr/bin/python3 python/tests/test_compile.py

Error model: both sides compute in f32 and differ in the order of their sums; relative to the whole
tensor, the difference stays under 1e-4 for sums of a few thousand terms (unit roundoff 6e-8, errors of
random sign), far below what a wrong gradient gives (order 1)."""
import numpy as np
import torch
import torchvision

import kiln
from test_memory import TinyGPT
from compare import rel_err

TOL = 1e-4


def check_training_step():
    torch.manual_seed(0)
    model = TinyGPT()
    ids = torch.randint(0, 64, (2, 16))
    with kiln.compile(model, ids, train=True) as step:
        got = step(ids)
    model.train()
    model.zero_grad()
    out = model(ids)
    loss = out.sum()
    loss.backward()
    assert rel_err(got["loss"].numpy(), loss.detach().numpy()) < TOL, (got["loss"], loss)
    compared = 0
    params = dict(model.named_parameters())
    for name, p in params.items():
        g = got.get("grad." + name)
        if g is None:
            continue  # the exporter renamed this weight
        e = rel_err(g.numpy(), p.grad.numpy())
        assert e < TOL, (name, e)
        assert np.abs(p.grad.numpy()).max() > 0, name  # a zero reference would prove nothing
        compared += 1
    assert compared >= 0.8 * len(params), (compared, len(params), sorted(got))
    print(f"tiny_gpt training step: loss and {compared} of {len(params)} gradients match torch")


def check_forward():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    with kiln.compile(model, x, train=False) as fwd:
        got = fwd(x)
    want = model(x).detach().numpy()
    assert list(got) == ["output"], list(got)
    e = rel_err(got["output"].numpy(), want)
    assert e < TOL, e
    print(f"resnet18 forward: the output matches torch (relative error {e:.1e})")


def main():
    check_training_step()
    check_forward()
    try:
        kiln.compile(torch.nn.Linear(4, 4), torch.randn(2, 4), train=False, optimizer="adam")
    except ValueError as e:
        assert "train=True" in str(e), e
    else:
        raise AssertionError("an optimizer without train=True must be refused")
    print("ok")


if __name__ == "__main__":
    main()
