"""Training with kiln.compile in-process, against torch: optimizers step for step, state_dict round
trips, checkpoints that resume bit for bit, the learning rate as state, the kernel profile, a CNN with
batch norm trained on Fashion-MNIST (Debian's dataset-fashion-mnist), and a character-level transformer
trained on the Go distribution's source, both from the same weights on the same batches as torch.
Run: KILN=path/to/kiln PYTHONPATH=python /usr/bin/python3 python/tests/test_train.py
KILN_FULL_TRAINING=1 trains 300 steps per optimizer (the benchmark); the default is 60.

Error model: both sides compute in f32 and differ in the order of their sums (relative roundoff about
1e-6 per step for these sizes); training feeds each step's parameters to the next, so differences grow.
The MLPs stay within 1e-4 on the loss over 20 steps, their parameters within 1e-3 (Adam divides by the
root of the second moment, so a relative gradient error e moves an update by about e, each step adding
its share). The Fashion-MNIST CNN is chaotic at any useful learning rate: torch in f32 and torch in f64
from the same weights on the same batches differ by 0.27% at step 25 and 0.24% at step 40 (SGD, lr
0.01, momentum 0.9; measured 2026-12-06), so no f32 implementation can promise 1e-3 over 50 steps.
What is checked instead: the first 10 steps within 1e-4 (before the chaos amplifies roundoff; measured
3e-6), and test accuracy on 2000 images within 1 point (20 images) of torch's after the same steps. The
language model: the first 10 losses within 1e-4, the mean of the last 10 at least 1 nat below the first
10's and within 5% of torch's."""
import copy
import gzip
import os
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import kiln
from compare import module_part, rel_err


class MLP(torch.nn.Module):
    """A regression MLP with batch norm (no bias before it: batch norm cancels one, leaving its gradient
    rounding noise, which Adam's sign-like steps would amplify on both sides differently)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16, bias=False)
        self.bn = torch.nn.BatchNorm1d(16)
        self.l2 = torch.nn.Linear(16, 3)

    def forward(self, x, y):
        return ((self.l2(torch.relu(self.bn(self.l1(x)))) - y) ** 2).sum()


def batches(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 3, generator=g)) for _ in range(n)]


def check_optimizers_against_torch():
    for name, make in [("adam", lambda p: torch.optim.Adam(p, lr=0.01)),
                       ("adamw", lambda p: torch.optim.AdamW(p, lr=0.01)),
                       ("sgd", lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
                       ("sgd", lambda p: torch.optim.SGD(p, lr=0.01))]:
        torch.manual_seed(1)
        model = MLP()
        ref = copy.deepcopy(model)
        opt = make(ref.parameters())
        momentum = opt.defaults.get("momentum", 0.0)
        with kiln.compile(model, batches(1, 0)[0], optimizer=name, lr=0.01, momentum=momentum) as step:
            for i, (x, y) in enumerate(batches(20, 2)):
                got = float(step(x, y)["loss"])
                opt.zero_grad()
                want = ref(x, y)
                want.backward()
                opt.step()
                assert abs(got - float(want)) <= 1e-4 * abs(float(want)), (name, i, got, float(want))
            sd, want_sd = module_part(step.state_dict()), ref.state_dict()
            assert sorted(sd) == sorted(want_sd), (sorted(sd), sorted(want_sd))
            for k, v in want_sd.items():
                if k.endswith("num_batches_tracked"):
                    assert int(sd[k]) == int(v) == 20, (k, sd[k], v)
                    continue
                assert rel_err(sd[k].numpy(), v.numpy()) < 1e-3, (name, k, rel_err(sd[k].numpy(), v.numpy()))
        print(f"{name} (momentum {momentum}): 20 steps match torch.optim, running statistics and counts included")


def check_microbatch_accumulation():
    """microbatches=2 with per-slice statistics is PyTorch's gradient accumulation: each half's forward
    and backward (batch norm on the half, its running statistics updated once per half, in order), the
    gradients summed, one optimizer step.

    Error model: batch norm over halves of 2 samples amplifies f32 rounding, so two f32 evaluations of
    the same accumulation drift apart within a few steps (PyTorch's f32 and f64 runs: 6e-8 at step 0,
    4.1e-5 at step 8). Each loss is held against PyTorch's f64 run: Kiln's f32 step may be at most four
    times as far from it as PyTorch's f32 step is, plus 1e-5 (a handful of f32 roundings of the loss)."""
    torch.manual_seed(5)
    model = MLP()
    refs = []
    for dtype in (torch.float32, torch.float64):
        ref = copy.deepcopy(model).to(dtype)
        refs.append((ref, torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9), dtype))
    with kiln.compile(model, batches(1, 0)[0], optimizer="sgd", lr=0.01, momentum=0.9, microbatches=2,
                      allow=("per-slice-bn",)) as step:
        for i, (x, y) in enumerate(batches(10, 6)):
            got = float(step(x, y)["loss"])
            want = []
            for ref, opt, dtype in refs:
                opt.zero_grad()
                total = 0.0
                for half in (slice(0, 2), slice(2, 4)):
                    loss = ref(x[half].to(dtype), y[half].to(dtype))
                    loss.backward()
                    total += float(loss)
                opt.step()
                want.append(total)
            want32, want64 = want
            bound = 1e-5 * abs(want64) + 4 * abs(want32 - want64)
            assert abs(got - want64) <= bound, (i, got, want32, want64)
        # The state after 10 steps, by the same model: against the f64 run, at most four times PyTorch's
        # f32 distance from it, plus 1e-5.
        sd, sd32, sd64 = step.state_dict(), refs[0][0].state_dict(), refs[1][0].state_dict()
        for k, v in sd32.items():
            if k.endswith("num_batches_tracked"):
                assert int(sd[k]) == int(v) == int(sd64[k]) == 20, (k, sd[k], v)
                continue
            exact = sd64[k].numpy()
            e, e32 = rel_err(sd[k].numpy(), exact), rel_err(v.numpy(), exact)
            assert e <= 1e-5 + 4 * e32, (k, e, e32)
    print("microbatches=2, per-slice-bn: 10 steps match torch's gradient accumulation, running statistics and counts included")


def check_state_and_checkpoints():
    torch.manual_seed(3)
    model = MLP()
    data = batches(9, 4)
    step = kiln.compile(model, data[0], optimizer="adamw", lr=0.01)
    for x, y in data[:3]:
        step(x, y)
    # The module takes the step's state back (strict: every key, num_batches_tracked included).
    fresh = MLP()
    fresh.load_state_dict(module_part(step.state_dict()))
    assert int(fresh.bn.num_batches_tracked) == 3
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt")
        step.save(path)
        ckpt = np.load(os.path.join(path, "checkpoint.npz"))  # numpy opens the checkpoint
        assert float(ckpt["optimizer.step"]) == 3.0, ckpt["optimizer.step"]
        after = [float(step(x, y)["loss"]) for x, y in data[3:]]
        final = {k: v.clone() for k, v in step.state_dict().items()}
        step.close()
        resumed = kiln.load(path)
        again = [float(resumed(x, y)["loss"]) for x, y in data[3:]]
        assert after == again, (after, again)  # bit for bit
        for k, v in resumed.state_dict().items():
            assert torch.equal(v, final[k]), k
        # The learning rate is state: at 0 nothing moves.
        resumed.set_lr(0.0)
        before = resumed.state_dict()
        resumed(*data[0])
        for k, v in resumed.state_dict().items():
            if "running" not in k and "num_batches" not in k and not k.startswith(("optimizer.", "kiln.")):
                assert torch.equal(v, before[k]), k
        # The kernel profile times every kernel of the runs after profile().
        resumed.profile()
        resumed(*data[1])
        prof = resumed.kernel_profile()
        assert prof and all(r["calls"] == 1 for r in prof) and sum(r["seconds"] for r in prof) > 0, prof[:3]
        resumed.profile(False)
        # kiln_set on a bound input writes the step's own buffer, never the caller's memory.
        t = resumed._inputs[0]
        caller = np.ascontiguousarray(data[0][0].numpy())
        before_bytes = caller.copy()
        resumed._check(resumed._lib.kiln_bind(resumed._s, t["index"], caller.ctypes.data))
        zeros = np.zeros_like(caller)
        resumed._check(resumed._lib.kiln_set(resumed._s, t["index"], zeros.ctypes.data, zeros.nbytes))
        assert np.array_equal(caller, before_bytes), "kiln_set wrote through a binding"
        # load_state_dict sets the module's tensors.
        resumed.load_state_dict(fresh.state_dict())
        assert torch.equal(resumed.state_dict()["l1.weight"], fresh.l1.weight.detach())
        resumed.close()
    print("state_dict round trip, checkpoint resumes bit for bit, set_lr, load_state_dict")


def fashion_mnist(kind):
    root = "/usr/share/datasets/fashion-mnist"
    with gzip.open(os.path.join(root, f"{kind}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(root, f"{kind}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy((images.astype(np.float32) / 255 - 0.286) / 0.353), torch.from_numpy(labels.astype(np.int64))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16 * 7 * 7, 10)

    def logits(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))

    def forward(self, x, y):
        return F.cross_entropy(self.logits(x), y)


def accuracy(model, images, labels):
    model.eval()
    with torch.no_grad():
        right = (model.logits(images).argmax(1) == labels).sum().item()
    model.train()
    return 100.0 * right / len(labels)


def check_fashion_mnist():
    steps = 300 if os.environ.get("KILN_FULL_TRAINING") else 60
    images, labels = fashion_mnist("train")
    test_images, test_labels = fashion_mnist("t10k")
    test_images, test_labels = test_images[:2000], test_labels[:2000]
    batch = 32
    for name, make in [("sgd", lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
                       ("adamw", lambda p: torch.optim.AdamW(p, lr=0.002))]:
        torch.manual_seed(5)
        model = CNN()
        ref = copy.deepcopy(model)
        opt = make(ref.parameters())
        lr = opt.defaults["lr"]
        step = kiln.compile(model, (images[:batch], labels[:batch]), optimizer=name, lr=lr,
                            momentum=opt.defaults.get("momentum", 0.0))
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(7))
        worst, early = 0.0, 0.0
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            x, y = images[idx], labels[idx]
            got = float(step(x, y)["loss"])
            opt.zero_grad()
            want = ref(x, y)
            want.backward()
            opt.step()
            if i < 50:
                worst = max(worst, abs(got - float(want)) / abs(float(want)))
            if i < 10:
                early = worst
        assert early <= 1e-4, (name, early)
        trained = CNN()
        trained.load_state_dict(module_part(step.state_dict()))
        a, b = accuracy(trained, test_images, test_labels), accuracy(ref, test_images, test_labels)
        assert abs(a - b) <= 1.0, (name, a, b)
        assert a > 60, (name, a)  # it learned: chance is 10%
        step.close()
        print(f"fashion-mnist {name}: 10 losses within {early:.1e} of torch's, 50 within {worst:.1e}; test accuracy after {steps} steps "
              f"{a:.1f}% (torch {b:.1f}%)")


def check_fashion_mnist_precision():
    """The CNN trained by Kiln in f32, in bf16 (f32 master weights) and in bf16 with fp8 saved values, from
    the same weights on the same batches: each low-precision run's test accuracy is within 1 point of the
    f32 run's after the same steps (issue: mixed precision costs no accuracy here)."""
    steps = 300 if os.environ.get("KILN_FULL_TRAINING") else 60
    images, labels = fashion_mnist("train")
    test_images, test_labels = fashion_mnist("t10k")
    test_images, test_labels = test_images[:2000], test_labels[:2000]
    batch = 32
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(7))
    results = {}
    for name, precision, allow in [("f32", None, ()), ("bf16", "bf16", ()), ("bf16+fp8 saved", "bf16,saved=fp8", ("fp8-saved",))]:
        torch.manual_seed(5)
        model = CNN()
        step = kiln.compile(model, (images[:batch], labels[:batch]), optimizer="sgd", lr=0.01, momentum=0.9,
                            precision=precision, allow=allow)
        losses = []
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            losses.append(float(step(images[idx], labels[idx])["loss"]))
        trained = CNN()
        trained.load_state_dict(module_part(step.state_dict()))
        step.close()
        results[name] = (accuracy(trained, test_images, test_labels), np.mean(losses[:10]), np.mean(losses[-10:]))
    f32 = results["f32"][0]
    for name, (acc, first, last) in results.items():
        print(f"fashion-mnist {name}: test accuracy after {steps} steps {acc:.1f}% (f32 {f32:.1f}%), "
              f"mean loss of the first 10 steps {first:.4f}, of the last 10 {last:.4f}")
        assert abs(acc - f32) <= 1.0, (name, acc, f32)


def go_source_text(limit=400_000):
    """Bytes of the Go distribution's source, which every machine that builds Kiln has."""
    import subprocess
    root = subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()
    chunks, n = [], 0
    for dirpath, _, files in sorted(os.walk(os.path.join(root, "src", "strings"))) + sorted(os.walk(os.path.join(root, "src", "fmt"))):
        for f in sorted(files):
            if f.endswith(".go") and not f.endswith("_test.go"):
                with open(os.path.join(dirpath, f), "rb") as fh:
                    b = fh.read()
                chunks.append(b)
                n += len(b)
                if n >= limit:
                    return b"".join(chunks)
    return b"".join(chunks)


class CharLM(torch.nn.Module):
    """A one-block causal transformer over bytes (7-bit): embedding, learned positions, one attention head
    with a causal mask, an MLP, layer norms, and the next byte's cross-entropy."""

    def __init__(self, vocab=128, seq=32, dim=48):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.ln1, self.ln2, self.ln3 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e9), diagonal=1))
        self.dim = dim

    def forward(self, x, y):
        h = self.emb(x) + self.pos
        q, k, v = self.qkv(self.ln1(h)).split(self.dim, dim=-1)
        att = torch.softmax(q @ k.transpose(1, 2) / self.dim ** 0.5 + self.mask, dim=-1)
        h = h + self.proj(att @ v)
        h = h + self.mlp(self.ln2(h))
        logits = self.head(self.ln3(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def check_char_lm():
    steps = 300 if os.environ.get("KILN_FULL_TRAINING") else 60
    text = np.frombuffer(go_source_text(), np.uint8) & 127
    data = torch.from_numpy(text.astype(np.int64))
    batch, seq = 16, 32
    torch.manual_seed(11)
    model = CharLM(seq=seq)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(12)
    starts = torch.randint(0, len(data) - seq - 1, (steps, batch), generator=g)
    x0 = torch.stack([data[s:s + seq] for s in starts[0]])
    step = kiln.compile(model, (x0, x0), optimizer="adamw", lr=3e-3)
    got, want = [], []
    for i in range(steps):
        x = torch.stack([data[s:s + seq] for s in starts[i]])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts[i]])
        got.append(float(step(x, y)["loss"]))
        opt.zero_grad()
        l = ref(x, y)
        l.backward()
        opt.step()
        want.append(float(l))
    early = max(abs(a - b) / b for a, b in zip(got[:10], want[:10]))
    assert early <= 1e-4, early
    first, last = np.mean(got[:10]), np.mean(got[-10:])
    want_first, want_last = np.mean(want[:10]), np.mean(want[-10:])
    assert last < first - 1.0, (first, last)  # it learns: from ln(128) = 4.85 nats a byte
    assert abs(last - want_last) <= 0.05 * want_last, (last, want_last)
    step.close()
    print(f"char LM on Go's source: first 10 losses within {early:.1e} of torch's; mean loss {first:.3f} -> {last:.3f} "
          f"over {steps} steps (torch {want_first:.3f} -> {want_last:.3f})")


def main():
    check_optimizers_against_torch()
    check_microbatch_accumulation()
    check_state_and_checkpoints()
    check_fashion_mnist()
    check_fashion_mnist_precision()
    check_char_lm()
    print("ok")


if __name__ == "__main__":
    main()
