"""Tests of kiln.memory on real torch models: a torchvision ResNet-18 and a small GPT.
Run: KILN=path/to/kiln PYTHONPATH=python /usr/bin/python3 python/tests/test_memory.py"""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torchvision

import kiln


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        return self.head(self.blocks(x, mask=self.mask))


def param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def check(name, model, x, budget):
    base = kiln.memory(model, x)
    # The plan holds at least the parameters, the input and one gradient per parameter.
    assert base.params_bytes >= param_bytes(model), (name, base)
    assert base.planned_bytes >= base.peak_bytes > 0, (name, base)
    assert base.peak_bytes >= 2 * param_bytes(model), (name, base)
    adam = kiln.memory(model, x, optimizer="adam")
    # Adam keeps two state tensors per parameter.
    assert adam.state_bytes >= 2 * param_bytes(model), (name, adam)
    print(f"{name}: planned {base.planned_bytes} B, peak {base.peak_bytes} B (+{base.recompute_flops} FLOPs); "
          f"adam state {adam.state_bytes} B")
    if budget is None:
        return
    # A fraction is of the step's peak after autodiff alone; the plan under it is below the default
    # one, by recomputation, microbatches or offloading.
    part = kiln.memory(model, x, budget=budget)
    assert part.peak_bytes < base.peak_bytes, (name, part.peak_bytes, base.peak_bytes)
    assert part.recompute_flops > base.recompute_flops or "microbatch" in part.pipeline or "swap" in part.pipeline, (name, part)
    print(f"{name}: budget {budget}: peak {part.peak_bytes} B (+{part.recompute_flops} FLOPs)")


def same_as_cli(name, model, x, budget):
    """kiln.memory and `kiln mem --train -O2 --budget B` on the same export plan the same bytes: both
    ask the planner the same request."""
    py = kiln.memory(model, x, budget=budget)
    with tempfile.TemporaryDirectory(prefix="kiln-test-") as tmp:
        kir = kiln._export_train(kiln._Model(model, x, None, None, False), tmp, kiln._binary.Phases("test", quiet=True), None)[0]
        out = subprocess.run([os.environ["KILN"], "mem", kir, "--train", "-O2", "--budget", str(budget), "--json"],
                             capture_output=True, text=True, check=True).stdout
    cli = json.loads(out)
    assert py.planned_bytes == cli["planned_bytes"], (name, py.planned_bytes, cli["planned_bytes"])
    assert py.peak_bytes == cli["peak_bytes"], (name, py.peak_bytes, cli["peak_bytes"])
    assert py.peak_bytes < kiln.memory(model, x).peak_bytes, (name, "the budget lowers the peak")
    print(f"{name}: budget {budget}: kiln.memory and kiln mem both plan {py.planned_bytes} B ({py.pipeline})")


def main():
    torch.manual_seed(0)
    resnet, x = torchvision.models.resnet18(num_classes=10), torch.randn(8, 3, 128, 128)
    check("resnet18", resnet, x, None)
    same_as_cli("resnet18", resnet, x, 0.5)
    gpt, ids = TinyGPT(), torch.randint(0, 64, (2, 16))
    check("tiny_gpt", gpt, ids, 0.7)
    same_as_cli("tiny_gpt", gpt, ids, 0.5)
    # Names an approximation the planner does not know: refused, naming the ones it does.
    try:
        kiln.memory(nn.Linear(4, 4), torch.randn(2, 4), allow=["fast-math"])
    except kiln.KilnError as e:
        assert "per-slice-bn" in str(e), e
    else:
        raise AssertionError("an unknown approximation must raise KilnError")
    try:
        kiln.memory(nn.Linear(4, 4), torch.randn(2, 4), optimizer="bogus")
    except kiln.KilnError as e:
        assert "bogus" in str(e), e
    else:
        raise AssertionError("a bad optimizer name must raise KilnError")
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
