"""Tests of kiln.memory on real torch models: a torchvision ResNet-18 and a small GPT.
Run: KILN=path/to/kiln PYTHONPATH=python /usr/bin/python3 python/tests/test_memory.py"""
import math
import sys

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
    # A fraction is of the peak when remat starts (after the saved-set selection), so the budget's plan
    # is below the default one, and recomputes more.
    part = kiln.memory(model, x, budget=budget)
    assert part.peak_bytes < base.peak_bytes, (name, part.peak_bytes, base.peak_bytes)
    assert part.recompute_flops > base.recompute_flops, (name, part.recompute_flops, base.recompute_flops)
    print(f"{name}: budget {budget}: peak {part.peak_bytes} B (+{part.recompute_flops} FLOPs)")


def main():
    torch.manual_seed(0)
    resnet, x = torchvision.models.resnet18(num_classes=10), torch.randn(8, 3, 128, 128)
    check("resnet18", resnet, x, None)
    # Half of this step's peak is less than its parameters and their gradients (45 MB each), which
    # neither recomputation nor microbatching can move: the budget is refused with the lowest peak
    # reached.
    try:
        kiln.memory(resnet, x, budget=0.5)
    except kiln.KilnError as e:
        assert "can't reduce memory below" in str(e), e
    else:
        raise AssertionError("an unreachable budget must raise KilnError")
    check("tiny_gpt", TinyGPT(), torch.randint(0, 64, (2, 16)), 0.95)
    try:
        kiln.memory(nn.Linear(4, 4), torch.randn(2, 4), optimizer="bogus")
    except kiln.KilnError as e:
        assert "bogus" in str(e), e
    else:
        raise AssertionError("a bad optimizer name must raise KilnError")
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
