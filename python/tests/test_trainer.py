"""Training the way PyTorch users train: losses as PyTorch writes them, the module trained in place, an eval
step over the same weights, any batch up to the compiled one, extra outputs; each against PyTorch.
Run: KILN=path/to/kiln PYTHONPATH=python /usr/bin/python3 python/tests/test_trainer.py

Error model: Kiln and PyTorch compute in f32 and sum in other orders; one step's loss and gradients differ
by about 1e-6 relative for these sizes, and parameters fed from step to step drift slowly. Losses are held
to 1e-5 relative over a few steps and parameters to 1e-4; an eval forward on the same weights to 1e-5
(relative to the whole output), which is what the trainer issue asks (1e-5 relative)."""
import io
import contextlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


class CNN(nn.Module):
    """A small CNN with batch norm and dropout that returns its logits (no bias before the batch norm,
    which cancels it and leaves its gradient rounding noise that no tolerance could bound)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, images):
        h = F.max_pool2d(F.relu(self.bn(self.conv(images))), 2)
        return self.fc(self.drop(h).flatten(1))


def data(n, seed, batch=8):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 5, (batch,), generator=g)) for _ in range(n)]


def check_losses_as_pytorch_writes_them():
    """loss_fn takes F.cross_entropy, nn.CrossEntropyLoss(), a user function and nn.MSELoss; label smoothing
    (which PyTorch 1.13 cannot export) is Kiln's own lowering. One step each, without dropout (eval-free
    comparisons need the same masks): the loss and the updated weights equal PyTorch's."""
    torch.manual_seed(1)
    for name, loss_fn, target in [
        ("F.cross_entropy", F.cross_entropy, "class"),
        ("nn.CrossEntropyLoss()", nn.CrossEntropyLoss(), "class"),
        ("label smoothing 0.1", nn.CrossEntropyLoss(label_smoothing=0.1), "class"),
        ("label smoothing, ignore_index", nn.CrossEntropyLoss(label_smoothing=0.2, ignore_index=2), "class"),
        ("a user's function", lambda out, y: (out - y).abs().mean() + out.pow(2).sum() * 1e-3, "dense"),
        ("nn.MSELoss()", nn.MSELoss(), "dense"),
        ("F.mse_loss, sum", lambda out, y: F.mse_loss(out, y, reduction="sum"), "dense"),
        ("nn.L1Loss()", nn.L1Loss(), "dense"),
        ("nn.SmoothL1Loss(beta=0.5)", nn.SmoothL1Loss(beta=0.5), "dense"),
        ("nn.HuberLoss(delta=0.7)", nn.HuberLoss(delta=0.7), "dense"),
        ("cross-entropy of class probabilities", lambda out, y: F.cross_entropy(out, y.softmax(1), label_smoothing=0.1), "dense"),
    ]:
        net = CNN()
        net.drop.p = 0.0
        ref = CNN()
        ref.load_state_dict(net.state_dict())
        ref.drop.p = 0.0
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        x, y = data(1, 2)[0]
        if target == "dense":
            y = torch.randn(8, 5)
        with kiln.compile(net, (x, y), loss_fn=loss_fn, optimizer="sgd", lr=0.1, verbose=False) as step:
            for i in range(3):
                got = float(step(x, y)["loss"])
                opt.zero_grad()
                want = loss_fn(ref(x), y)
                want.backward()
                opt.step()
                assert abs(got - float(want)) <= 1e-5 * abs(float(want)), (name, i, got, float(want))
            for k, v in ref.state_dict().items():
                assert rel_err(net.state_dict()[k], v) < 1e-4, (name, k)
    # A module that returns a tensor, trained without saying what its loss is: refused, saying what to pass.
    try:
        kiln.compile(CNN(), data(1, 3)[0][0], optimizer="adam", verbose=False)
    except ValueError as e:
        assert "loss_fn=" in str(e) and "loss='sum'" in str(e), e
    else:
        raise AssertionError("a module returning logits trained with no loss must be refused")
    print("losses: F.cross_entropy, nn.CrossEntropyLoss (label smoothing, ignore_index), a function, MSE, L1, "
          "smooth L1, Huber and cross-entropy of probabilities match torch")


def check_module_trained_in_place():
    """After training, the module's own tensors hold the trained values under its own names; PyTorch's
    module.eval()(x) equals step.eval()(x); close() leaves the module with copies that keep working."""
    torch.manual_seed(4)
    net = CNN()
    batches = data(6, 5)
    with kiln.compile(net, batches[0], loss_fn=F.cross_entropy, optimizer="adam", lr=0.01, verbose=False) as step:
        w0 = net.fc.weight.detach().clone()
        for x, y in batches:
            step(x, y)
        assert not torch.equal(net.fc.weight.detach(), w0), "the module was not trained"
        sd = step.state_dict()
        assert list(sd) == list(net.state_dict()), (list(sd), list(net.state_dict()))
        for k, v in net.state_dict().items():
            assert torch.equal(sd[k], v), k
        assert int(net.bn.num_batches_tracked) == 6
        x = batches[0][0]
        net.eval()
        with torch.no_grad():
            want = net(x)
        got = step.eval()(x)
        assert rel_err(got, want) <= 1e-5, rel_err(got, want)
        # The eval step reads the current weights: one more step, and it follows.
        net.train()
        step(*batches[1])
        net.eval()
        with torch.no_grad():
            want2 = net(x)
        got2 = step.eval()(x)
        assert rel_err(got2, want2) <= 1e-5 and rel_err(got2, got) > 1e-4, (rel_err(got2, want2), rel_err(got2, got))
        net.train()
        # module.load_state_dict writes into the step.
        fresh = CNN().state_dict()
        net.load_state_dict(fresh)
        assert torch.equal(step.state_dict()["fc.weight"], fresh["fc.weight"])
    # Closed: the module holds copies of its own.
    before = {k: v.clone() for k, v in net.state_dict().items()}
    net.fc.weight.data.mul_(2)
    assert torch.equal(net.fc.weight.data, before["fc.weight"] * 2)
    net.train()
    assert net(batches[0][0]).shape == (8, 5)
    print("the module is trained in place: its state_dict is the step's; eval() equals module.eval() within 1e-5")


def check_any_batch():
    """A smaller batch (an epoch's last) runs as that batch, its loss and update equal PyTorch's on it,
    batch norm and the mean loss counting its rows; a larger one is refused, saying how to compile for it."""
    torch.manual_seed(6)
    net = CNN()
    net.drop.p = 0.0
    ref = CNN()
    ref.load_state_dict(net.state_dict())
    ref.drop.p = 0.0
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    batches = data(3, 7) + data(1, 8, batch=3) + data(1, 9)
    with kiln.compile(net, batches[0], loss_fn=F.cross_entropy, optimizer="sgd", lr=0.05, momentum=0.9, verbose=False) as step:
        for i, (x, y) in enumerate(batches):
            got = float(step(x, y)["loss"])
            opt.zero_grad()
            want = F.cross_entropy(ref(x), y)
            want.backward()
            opt.step()
            assert abs(got - float(want)) <= 1e-5 * abs(float(want)), (i, len(x), got, float(want))
        for k, v in ref.state_dict().items():
            if not k.endswith("tracked"):
                assert rel_err(net.state_dict()[k], v) < 1e-4, k
        assert int(net.bn.num_batches_tracked) == len(batches)
        net.eval()
        ref.eval()
        with torch.no_grad():
            assert rel_err(step.eval()(batches[3][0]), ref(batches[3][0])) < 1e-5
        try:
            step(*data(1, 10, batch=12)[0])
        except ValueError as e:
            assert "compile it with example inputs of batch 12" in str(e), e
        else:
            raise AssertionError("a larger batch must be refused")
    print("any batch: a batch of 3 after batches of 8 equals torch on it; a larger batch is refused")


def check_outputs_and_names():
    """outputs=True returns the module's outputs beside the loss; inputs are named by the forward's
    arguments; verbose=False prints nothing; threads= is the step's threads; device='cuda' is refused at
    once where the step cannot run on a GPU."""
    torch.manual_seed(11)
    net = CNN()
    net.drop.p = 0.0
    x, y = data(1, 12)[0]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        step = kiln.compile(net, (x, y), loss_fn=F.cross_entropy, optimizer="adamw", outputs=True, threads=1, verbose=False)
    assert err.getvalue() == "", err.getvalue()
    with step:
        net.eval()  # no dropout, and batch norm's statistics are the batch's in training: compare logits in training mode
        net.train()
        with torch.no_grad():
            want = net(x)
        r = step(x, y)
        assert sorted(r) == ["loss", "output"], sorted(r)
        assert rel_err(r["output"], want) < 1e-5, rel_err(r["output"], want)
        names = [t["name"] for t in step.descriptor["tensors"] if t["kind"] == "input"]
        assert names == ["images", "target"], names
    try:
        kiln.compile(net, (x, y), loss_fn=F.cross_entropy, device="cuda", verbose=False)
    except kiln.KilnError as e:
        assert "cuda" in str(e), e
    else:
        raise AssertionError("device='cuda' must be refused here")
    print("outputs=True returns the logits; inputs named by forward's arguments; verbose=False is silent")


def main():
    check_losses_as_pytorch_writes_them()
    check_module_trained_in_place()
    check_any_batch()
    check_outputs_and_names()
    print("ok")


if __name__ == "__main__":
    main()
