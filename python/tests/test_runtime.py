"""The Python runtime under misuse and concurrency: a step that fails changes nothing, a closed step raises,
threads take turns, checkpoints never destroy what Kiln did not write, loading reads regular files only and
never runs another model's code, state_dict round trips with PyTorch's rules (shapes, tied weights), and a
random sequence of all of these stays with a model trained in PyTorch.
Run: KILN=path/to/kiln PYTHONPATH=python /usr/bin/python3 python/tests/test_runtime.py

Error model: Kiln and PyTorch compute in f32 and differ in the order of their sums (relative roundoff about
1e-6 per step here); parameters fed from step to step drift apart slowly. Over the property test's few dozen
steps (Adam, lr 0.01) the losses stay within 1e-4 relative and the parameters within 1e-3, as in
test_train.py. What must not change at all is checked bit for bit: a failed step, a refused state_dict and
a checkpoint's save and load leave every tensor exactly as it was."""
import os
import random
import stat
import subprocess
import sys
import tempfile
import threading

import numpy as np
import torch
import torch.nn.functional as F

import kiln
from compare import module_part, rel_err


class Net(torch.nn.Module):
    """Batch norm (state written back in the forward, before the labels are read), an embedding (a gather
    whose indices come from the data) and a cross-entropy with PyTorch's ignore_index."""

    def __init__(self, classes=3):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 8, bias=False)
        self.bn = torch.nn.BatchNorm1d(8)
        self.emb = torch.nn.Embedding(5, 8)
        self.head = torch.nn.Linear(8, classes)

    def forward(self, x, ids, y):
        h = torch.relu(self.bn(self.l1(x))) + self.emb(ids).sum(1)
        return F.cross_entropy(self.head(h), y)


def batch(g, n=4, classes=3):
    return torch.randn(n, 6, generator=g), torch.randint(0, 5, (n, 2), generator=g), torch.randint(0, classes, (n,), generator=g)


def same_state(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def snapshot(step):
    return {k: v.clone() for k, v in step.state_dict().items()}


def every_tensor(step):
    """Copies of every parameter and state tensor of the step, the module's and the optimizer's (Adam's
    moments, the learning rate, the step count, the random position), by name."""
    return {t["name"]: step._array(t) for t in step._tensors if t["kind"] in ("param", "state")}


def same_tensors(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def expect(exc, fn, *args, contains=""):
    try:
        fn(*args)
    except exc as e:
        assert contains in str(e), (contains, str(e))
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def check_failed_steps_change_nothing():
    torch.manual_seed(0)
    net = Net()
    g = torch.Generator().manual_seed(1)
    x, ids, y = batch(g)
    for optimizer, microbatches in [("adam", None), ("sgd", None), ("adamw", 2)]:
        with kiln.compile(net, (x, ids, y), optimizer=optimizer, lr=0.01, momentum=0.9 if optimizer == "sgd" else 0.0,
                          microbatches=microbatches) as step:
            step(x, ids, y)
            for bad_ids, bad_y, what in [(ids, torch.tensor([0, 1, 3, 0]), "label 3 of 3 classes"),
                                         (ids, torch.tensor([0, -1, 2, 0]), "label -1 (ignore_index is -100)"),
                                         (torch.tensor([[0, 5], [1, 1], [2, 2], [3, 3]]), y, "embedding index 5 of 5"),
                                         (torch.tensor([[0, -6], [1, 1], [2, 2], [3, 3]]), y, "embedding index -6")]:
                before = every_tensor(step)
                expect(kiln.KilnError, step, x, bad_ids, bad_y, contains="index out of range")
                assert same_tensors(before, every_tensor(step)), (optimizer, microbatches, what)
            # The ignored label itself is fine, and a good step still runs after the failures.
            step(x, ids, torch.tensor([0, -100, 2, 0]))
            expect(TypeError, step, x, ids, y.float(), contains="not float32")
    print("failed steps (labels and indices out of range, -1 with ignore_index) change no tensor; float labels are refused")


def check_closed_steps_raise():
    net = Net()
    g = torch.Generator().manual_seed(2)
    data = batch(g)
    step = kiln.compile(net, data, optimizer="sgd", lr=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        step.close()
        step.close()  # twice is fine
        for fn, args in [(step, data), (step.state_dict, ()), (step.set_lr, (0.1,)), (step.load_state_dict, ({},)),
                         (step.save, (os.path.join(tmp, "c"),)), (step.profile, ()), (step.kernel_profile, ())]:
            expect(ValueError, fn, *args, contains="closed")
        assert not os.path.exists(os.path.join(tmp, "c"))
    print("a closed step raises ValueError from every call")


def check_threads_take_turns():
    """Two threads call one step with their own batches; each gets its own batch's loss. Without an
    optimizer the losses do not depend on the order, so each thread's results must equal the step's
    results for its batch alone, bit for bit."""
    torch.manual_seed(3)
    net = Net()
    g = torch.Generator().manual_seed(4)
    batches = [batch(g) for _ in range(2)]
    net.eval()  # no statistics: every call computes the same function
    with kiln.compile(net, batches[0], train=False) as step:
        want = [step(*b)["output"].clone() for b in batches]
        errors = []

        def worker(k):
            for _ in range(300):
                if not torch.equal(step(*batches[k])["output"], want[k]):
                    errors.append(k)

        threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, f"{len(errors)} calls returned another thread's result"
    print("two threads, 300 calls each: every call returns its own batch's result")


def check_load_state_dict_shapes():
    net = Net()
    g = torch.Generator().manual_seed(5)
    with kiln.compile(net, batch(g), optimizer="sgd", lr=0.1) as step:
        before = snapshot(step)
        w = before["l1.weight"]
        for bad in (w.t().contiguous(), w.flatten(), torch.zeros(9)):
            e = expect(RuntimeError, step.load_state_dict, {"head.bias": torch.ones(3), "l1.weight": bad}, contains="size mismatch for l1.weight")
            assert str(list(bad.shape)) in str(e), e
            assert same_state(before, step.state_dict()), "a refused state_dict changed the step"
        expect(KeyError, step.load_state_dict, {"nope": torch.zeros(1)})
        step.load_state_dict({"head.bias": torch.ones(3)})
        assert torch.equal(step.state_dict()["head.bias"], torch.ones(3))
    print("load_state_dict refuses another shape naming the tensor, and changes nothing when it refuses")


class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids, y):
        return F.cross_entropy(self.head(torch.tanh(self.emb(ids))).flatten(0, 1), y.flatten())


def check_tied_weights():
    torch.manual_seed(6)
    lm = TiedLM()
    ids = torch.randint(0, 11, (2, 5))
    with kiln.compile(lm, (ids, ids), optimizer="adam", lr=0.01) as step:
        step(ids, ids)
        sd = module_part(step.state_dict())
        assert sorted(sd) == sorted(lm.state_dict()), sorted(sd)
        assert sd["head.weight"] is sd["emb.weight"]
        fresh = TiedLM()
        fresh.load_state_dict(module_part(step.state_dict()))  # strict
        assert torch.equal(fresh.head.weight, sd["emb.weight"])
        step.load_state_dict({"head.weight": torch.zeros(11, 6)})
        assert torch.equal(step.state_dict()["emb.weight"], torch.zeros(11, 6))
    print("tied weights: state_dict holds both names, module.load_state_dict(step.state_dict()) works")


class DropoutBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.d = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.d(self.bn(self.l(x))).sum()


def check_gradient_steps_advance():
    """A step without an optimizer is PyTorch's forward and backward in training mode: each call draws a new
    dropout mask and updates the batch-norm statistics (the module is not updated)."""
    torch.manual_seed(7)
    m = DropoutBN()
    x = torch.randn(4, 8)
    start = {k: v.clone() for k, v in m.state_dict().items()}
    with kiln.compile(m, x) as step:
        a, b = step(x), step(x)
        assert not torch.equal(a["loss"], b["loss"]), "two calls drew the same dropout mask"
        assert not torch.equal(a["grad.l.weight"], b["grad.l.weight"])
        sd = step.state_dict()
        assert int(sd["bn.num_batches_tracked"]) == 2, sd["bn.num_batches_tracked"]
        ref = DropoutBN()
        ref.load_state_dict(start)
        ref.train()
        for _ in range(2):
            ref(x)
        assert rel_err(sd["bn.running_mean"], ref.bn.running_mean) < 1e-5
        assert torch.equal(sd["l.weight"], start["l.weight"]), "a gradient step changed a parameter"
        assert torch.equal(m.bn.running_mean, sd["bn.running_mean"]), "the module's buffers are the step's"
    print("gradient-only steps draw new masks and update running statistics, as PyTorch's forward does")


def check_exact_microbatches_update_statistics():
    """microbatches=2 with whole-batch statistics (exact-bn, the default) updates the running statistics once,
    as one whole-batch step does."""
    torch.manual_seed(8)
    net = Net()
    start = {k: v.clone() for k, v in net.state_dict().items()}
    g = torch.Generator().manual_seed(9)
    data = [batch(g) for _ in range(3)]
    steps = [kiln.compile(net, data[0], optimizer="sgd", lr=0.05, momentum=0.9, microbatches=mb) for mb in (None, 2)]
    for d in data:
        for s in steps:
            s(*d)
    whole, split = (s.state_dict() for s in steps)
    for k, v in whole.items():
        if k.startswith("bn."):
            assert not torch.equal(v, start[k]) or k.endswith("tracked"), k
            assert rel_err(split[k], v) < 1e-5, (k, split[k], v)
    assert int(split["bn.num_batches_tracked"]) == 3
    for s in steps:
        s.close()
    print("microbatches=2 (exact-bn) updates the running statistics as the whole batch does")


def check_per_slice_statistics_with_a_mean_loss():
    """allow=("per-slice-bn",) with F.cross_entropy's mean (its count of labels not ignored is a statistic of
    the whole batch, kept exact in phases) is PyTorch's gradient accumulation of loss/2 per half: each half's
    batch norm with its own statistics, running statistics updated per half. Error model: f32 against
    PyTorch's f64, three steps of a small MLP, within 1e-5 relative on the loss and 1e-5 on every tensor."""
    torch.manual_seed(13)
    net = Net()
    ref = Net().double()
    ref.load_state_dict(net.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(14)
    data = [batch(g, n=8) for _ in range(3)]
    with kiln.compile(net, data[0], optimizer="sgd", lr=0.1, microbatches=2, allow=("per-slice-bn",)) as step:
        for x, ids, y in data:
            got = float(step(x, ids, y)["loss"])
            opt.zero_grad()
            want = 0.0
            for h in (slice(0, 4), slice(4, 8)):
                loss = ref(x[h].double(), ids[h], y[h]) / 2
                loss.backward()
                want += float(loss)
            opt.step()
            assert abs(got - want) <= 1e-5 * abs(want), (got, want)
        sd = step.state_dict()
        for k, v in ref.state_dict().items():
            if k.endswith("num_batches_tracked"):
                assert int(sd[k]) == int(v) == 6, (k, sd[k], v)
            else:
                assert rel_err(sd[k], v) < 1e-5, (k, rel_err(sd[k], v))
    print("per-slice-bn with a mean cross-entropy: PyTorch's gradient accumulation, statistics and counts included")


def check_checkpoint_files():
    net = Net()
    g = torch.Generator().manual_seed(10)
    data = batch(g)
    with tempfile.TemporaryDirectory() as tmp, kiln.compile(net, data, optimizer="adam", lr=0.01) as step:
        step(*data)
        # A folder of the user's is never removed or written into.
        mine = os.path.join(tmp, "mine")
        os.makedirs(os.path.join(mine, "sub"))
        with open(os.path.join(mine, "notes.txt"), "w") as f:
            f.write("keep me")
        expect(FileExistsError, step.save, mine, contains="not a checkpoint")
        assert open(os.path.join(mine, "notes.txt")).read() == "keep me" and os.path.isdir(os.path.join(mine, "sub"))
        cwd = os.getcwd()
        os.chdir(mine)
        try:
            expect(FileExistsError, step.save, ".")
            expect(FileExistsError, step.save, "notes.txt")
        finally:
            os.chdir(cwd)
        assert sorted(os.listdir(mine)) == ["notes.txt", "sub"]
        # A checkpoint is replaced whole; nothing else is left beside it.
        ckpt = os.path.join(tmp, "ckpt")
        step.save(ckpt)
        first = snapshot(step)
        step(*data)
        step.save(ckpt + "/")
        assert sorted(os.listdir(tmp)) == ["ckpt", "mine"], os.listdir(tmp)
        with kiln.load(ckpt) as back:
            assert same_state(back.state_dict(), step.state_dict())
            assert not same_state(back.state_dict(), first)
        # A checkpoint with a file of the user's added is no longer Kiln's to replace.
        open(os.path.join(ckpt, "extra"), "w").close()
        expect(FileExistsError, step.save, ckpt)
        os.remove(os.path.join(ckpt, "extra"))

        # Loading reads regular files only: a FIFO is refused at once, never waited on.
        for name in ("checkpoint.npz", "kiln.json", "step.so"):
            bad = os.path.join(tmp, "fifo-" + name)
            os.makedirs(bad)
            for n in ("checkpoint.npz", "kiln.json", "step.so"):
                if n == name:
                    os.mkfifo(os.path.join(bad, n))
                else:
                    os.link(os.path.join(ckpt, n), os.path.join(bad, n))
            code = ("import kiln, sys\ntry:\n    kiln.load(sys.argv[1])\nexcept kiln.KilnError as e:\n"
                    "    assert 'not a regular file' in str(e), e\n    print('refused')\n")
            out = subprocess.run([sys.executable, "-c", code, bad], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0 and "refused" in out.stdout, (name, out.stdout, out.stderr)
        # A corrupt kiln.json is named, not a crash.
        broken = os.path.join(tmp, "broken")
        os.makedirs(broken)
        for n in ("checkpoint.npz", "step.so"):
            os.link(os.path.join(ckpt, n), os.path.join(broken, n))
        with open(os.path.join(broken, "kiln.json"), "w") as f:
            f.write('{"inputs": 5}')
        expect(kiln.KilnError, kiln.load, broken, contains="kiln.json")
    print("save never removes what it did not write and replaces a checkpoint whole; load reads regular files only")


class Other(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 3)

    def forward(self, x, ids, y):
        return F.cross_entropy(self.l1(x) * 3.0 + ids.float().mean(), y)


def check_load_after_replace():
    """A folder replaced by another model's save loads the other model's code, in the same process."""
    g = torch.Generator().manual_seed(11)
    data = batch(g)
    torch.manual_seed(12)
    a, b = Net(), Other()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt")
        with kiln.compile(a, data, optimizer="sgd", lr=0.1) as sa, kiln.compile(b, data, optimizer="sgd", lr=0.1) as sb:
            sa.set_lr(0.0)  # every call sees the same weights
            sb.set_lr(0.0)
            want_a, want_b = float(sa(*data)["loss"]), float(sb(*data)["loss"])
            sa.save(path)
            la = kiln.load(path)
            sb.save(path)  # replaces a's checkpoint
            lb = kiln.load(path)
            got_a, got_b = float(la(*data)["loss"]), float(lb(*data)["loss"])
            la.save(os.path.join(tmp, "again"))  # the library la runs, not the one now at path
            with kiln.load(os.path.join(tmp, "again")) as again:
                got_again = float(again(*data)["loss"])
            la.close()
            lb.close()
        assert want_a != want_b
        assert (got_a, got_b, got_again) == (want_a, want_b, want_a), (got_a, got_b, got_again, want_a, want_b)
        assert sorted(os.listdir(tmp)) == ["again", "ckpt"]
    print("a checkpoint folder replaced by another model's loads the other model; each step keeps its own library")


def check_property(seed, ops=40):
    """Random sequences of step, failing step, save and load, load_state_dict (good and refused), set_lr,
    close and reopen, and two threads stepping at once, against the same model and optimizer in PyTorch."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = Net()
    ref = Net()
    ref.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    data = [batch(g) for _ in range(6)]
    step = kiln.compile(net, data[0], optimizer="adam", lr=0.01)
    tmp = tempfile.mkdtemp(prefix="kiln-property-")
    path = os.path.join(tmp, "ckpt")
    saved = None
    log = []

    def torch_step(d):
        opt.zero_grad()
        loss = ref(*d)
        loss.backward()
        opt.step()
        return float(loss)

    def agree(what):
        sd, want = module_part(step.state_dict()), ref.state_dict()
        assert sorted(sd) == sorted(want), (what, sorted(sd))
        for k, v in want.items():
            if k.endswith("num_batches_tracked"):
                assert int(sd[k]) == int(v), (what, log, k, sd[k], v)
            else:
                assert rel_err(sd[k], v) < 1e-3, (what, log, k, rel_err(sd[k], v))

    try:
        for _ in range(ops):
            op = rng.choice(["step", "step", "step", "fail", "save", "load", "sync", "refuse", "lr", "close", "threads"])
            log.append(op)
            if op == "step":
                d = rng.choice(data)
                got, want = float(step(*d)["loss"]), torch_step(d)
                assert abs(got - want) <= 1e-4 * abs(want), (log, got, want)
            elif op == "fail":
                x, ids, y = rng.choice(data)
                y = y.clone()
                y[rng.randrange(len(y))] = rng.choice([-1, 3, 7])
                before = every_tensor(step)
                expect(kiln.KilnError, step, x, ids, y)
                assert same_tensors(before, every_tensor(step)), log
            elif op == "save":
                step.save(path)
                saved = (snapshot(step), {k: v.clone() for k, v in ref.state_dict().items()}, opt.state_dict())
                saved = (saved[0], saved[1], {"state": {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in s.items()}
                                                      for k, s in saved[2]["state"].items()}, "param_groups": saved[2]["param_groups"]})
            elif op == "load" and saved is not None:
                step.close()
                step = kiln.load(path)
                assert same_state(saved[0], step.state_dict()), log
                ref.load_state_dict(saved[1])
                opt.load_state_dict(saved[2])
            elif op == "sync":
                # The module's tensors from PyTorch into the step (optimizer state stays each side's).
                step.load_state_dict(ref.state_dict())
                assert same_state(module_part(step.state_dict()), {k: v.clone() for k, v in ref.state_dict().items()}), log
            elif op == "refuse":
                before = every_tensor(step)
                bad = {"head.bias": torch.zeros(3), "bn.running_var": torch.ones(9)}
                expect(RuntimeError, step.load_state_dict, bad, contains="bn.running_var")
                assert same_tensors(before, every_tensor(step)), log
            elif op == "lr":
                lr = rng.choice([0.0, 0.003, 0.01, 0.02])
                step.set_lr(lr)
                for group in opt.param_groups:
                    group["lr"] = lr
            elif op == "close":
                step.save(path)
                saved = None
                before = snapshot(step)
                step.close()
                expect(ValueError, step, *data[0])
                step = kiln.load(path)
                assert same_state(before, step.state_dict()), log
            elif op == "threads":
                # Two threads step the same batch at once: one call sees the state before both, the other the
                # state after the first, whichever thread comes first; PyTorch takes the two steps in turn.
                d = rng.choice(data)
                got = []
                threads = [threading.Thread(target=lambda: got.append(float(step(*d)["loss"]))) for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                want = [torch_step(d), torch_step(d)]
                assert len(got) == 2, log
                for a, b in zip(sorted(got), sorted(want)):
                    assert abs(a - b) <= 1e-4 * abs(b), (log, got, want)
            agree(op)
    finally:
        step.close()
        for root, dirs, files in os.walk(tmp, topdown=False):
            for n in files:
                os.remove(os.path.join(root, n))
            for n in dirs:
                os.rmdir(os.path.join(root, n))
        os.rmdir(tmp)
    return log


def main():
    check_failed_steps_change_nothing()
    check_closed_steps_raise()
    check_threads_take_turns()
    check_load_state_dict_shapes()
    check_tied_weights()
    check_gradient_steps_advance()
    check_exact_microbatches_update_statistics()
    check_per_slice_statistics_with_a_mean_loss()
    check_checkpoint_files()
    check_load_after_replace()
    for seed in range(3):
        log = check_property(seed)
        print(f"property test, seed {seed}: {len(log)} operations ({', '.join(sorted(set(log)))}) agree with PyTorch")
    print("ok")


if __name__ == "__main__":
    main()
