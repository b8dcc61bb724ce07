"""Training-step speed of Kiln's compiled step (in-process, kiln.compile) against PyTorch 1.13 eager on
the same threads: medians of RUNS steps after two warm-up steps, SGD with momentum, the same batch.
Also the forward pass alone (train=False) and, with --profile, Kiln's slowest kernels.
Kiln's and PyTorch's steps take turns in blocks of ten, so that a shared machine's slow spells weigh on
both sides alike (not step by step: each side's thread pool spins for a while after its work, as
OpenMP's does, and would take the other's cores). PyTorch runs in a process of its own, which this
one drives through a pipe: in one process its OpenMP workers, spinning, slowed Kiln's ResNet-18 step
by a quarter (1.25x against 0.83x with OMP_WAIT_POLICY=PASSIVE).
Usage: KILN=path/to/kiln PYTHONPATH=python /usr/bin/python3 scripts/bench_train.py [MODEL...] [--runs N]
       [--threads T] [--profile]
Models: resnet18 (batch 16, 224x224), fmnist_cnn (batch 32, 28x28), gpt2_block (one GPT-2-small block,
batch 4, 128 tokens). Prints one line per model; docs/runtime.md keeps the figures.
PyTorch multiplies matrices through whichever libblas.so.3 Debian's alternatives select: the reference
BLAS (libblas3) makes its linear layers about 20x slower than OpenBLAS (libopenblas0-pthread), so the
script names the library it found and refuses the reference one unless --any-blas is given."""
import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/python/tests")
import kiln  # noqa: E402
from test_train import CNN  # noqa: E402


class Block(torch.nn.Module):
    """A GPT-2-small-shaped block (768 wide, 12 heads, causal) with a squared-output loss."""

    def __init__(self, dim=768, heads=12, seq=128):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc, self.out = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e9), diagonal=1))
        self.heads, self.dim = heads, dim

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + self.mask, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return (x * x).mean()


class Classify(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def models():
    torch.manual_seed(0)
    return {
        "resnet18": lambda: (Classify(torchvision.models.resnet18(num_classes=1000)),
                             (torch.randn(16, 3, 224, 224), torch.randint(0, 1000, (16,)))),
        "fmnist_cnn": lambda: (CNN(), (torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,)))),
        "gpt2_block": lambda: (Block(), (torch.randn(4, 128, 768),)),
    }


def blas_library():
    """The BLAS this process loaded for PyTorch (after one product), from /proc/self/maps."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    with open("/proc/self/maps") as maps:
        libs = {line.split()[-1] for line in maps if "blas" in line.rsplit("/", 1)[-1]}
    return sorted(libs)


def seconds(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def warm_up(fn, seconds_at_least=0.2):
    """Runs fn until seconds_at_least have passed (once at least): a block is timed in the steady state
    of a training loop, its threads and cores awake, not cold after the other side's turn (one warm-up
    call left the small CNN's 0.8 ms forward pass at 1.6 ms: waking an idle core of this virtual
    machine costs more than its kernels)."""
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < seconds_at_least:
        fn()


def torch_worker(name, threads):
    """The PyTorch side: builds model name and answers each line "step N" or "forward N" on stdin with
    the N step times (seconds) on stdout, one warm-up run before them."""
    torch.set_num_threads(threads)
    model, inputs = models()[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        model(*inputs).backward()
        opt.step()

    def forward():
        with torch.no_grad():
            model(*inputs)

    for line in sys.stdin:
        what, n = line.split()
        fn = step if what == "step" else forward
        model.train(what == "step")
        warm_up(fn)
        print(" ".join(repr(seconds(fn)) for _ in range(int(n))), flush=True)


class TorchSide:
    """A PyTorch worker process for one model; run(what, n) returns its n step times."""

    def __init__(self, name, threads):
        self.p = subprocess.Popen([sys.executable, __file__, "--torch-worker", name, "--threads", str(threads)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, what, n):
        self.p.stdin.write(f"{what} {n}\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            sys.exit("the PyTorch worker stopped")
        return [float(t) for t in line.split()]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def alternating_processes(kiln_fn, side, what, runs, block=10, settle=0.5):
    """Medians of each side's step times (Kiln's kiln_fn here, PyTorch's what in side's process) and
    their ratio, the sides taking turns in blocks of block steps, runs steps each in all. Each block
    follows settle seconds, in which the other side's spinning threads go to sleep (OpenBLAS's workers
    spin for tens of milliseconds after a product), and warm_up."""
    kiln_times, torch_times = [], []
    while len(kiln_times) < runs:
        warm_up(kiln_fn)
        kiln_times += [seconds(kiln_fn) for _ in range(min(block, runs - len(kiln_times)))]
        time.sleep(settle)
        torch_times += side.run(what, min(block, runs - len(torch_times)))
        time.sleep(settle)
    t_kiln, t_torch = statistics.median(kiln_times), statistics.median(torch_times)
    return t_kiln, t_torch, t_kiln / t_torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["fmnist_cnn", "gpt2_block", "resnet18"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--any-blas", action="store_true", help="time PyTorch on the reference BLAS too")
    ap.add_argument("--torch-worker", metavar="MODEL", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        torch_worker(a.torch_worker, a.threads)
        return
    torch.set_num_threads(a.threads)
    blas = blas_library()
    print("PyTorch's BLAS:", ", ".join(blas) or "none found", flush=True)
    if not a.any_blas and not any("openblas" in b or "mkl" in b for b in blas):
        sys.exit("PyTorch runs on the reference BLAS: install libopenblas0-pthread (or pass --any-blas)")
    table = models()
    for name in a.models:
        model, inputs = table[name]()
        side = TorchSide(name, a.threads)
        step = kiln.compile(model, inputs, optimizer="sgd", lr=0.01, momentum=0.9)
        t_kiln, t_torch, ratio = alternating_processes(lambda: step(*inputs), side, "step", a.runs)
        if a.profile:
            step.profile()
            step(*inputs)
            for r in step.kernel_profile()[:8]:
                print(f"  {r['kernel']:40s} {1e3 * r['seconds']:9.2f} ms  {r['bytes'] / 1e6:9.1f} MB  {r['flops'] / 1e9:7.2f} GFLOP")
            step.profile(False)
        step.close()
        model.eval()
        fwd = kiln.compile(model, inputs, train=False)
        t_kiln_fwd, t_torch_fwd, ratio_fwd = alternating_processes(lambda: fwd(*inputs), side, "forward", a.runs)
        fwd.close()
        side.close()
        print(f"{name}: step kiln {t_kiln * 1e3:.1f} ms, torch {t_torch * 1e3:.1f} ms ({ratio:.2f}x); "
              f"forward kiln {t_kiln_fwd * 1e3:.1f} ms, torch {t_torch_fwd * 1e3:.1f} ms ({ratio_fwd:.2f}x)",
              flush=True)


if __name__ == "__main__":
    main()
