"""Times PyTorch eager on a zoo model's training-mode forward, as Kiln's
backend benchmark compares against (zoo/backends_test.go).
Usage: bench_torch.py NAME BATCH THREADS [RUNS]   prints the mean seconds of one run."""
import sys, time, torch
from models import ZOO

name, batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
torch.set_num_threads(threads)
torch.manual_seed(0)
ctor, make_input, _ = ZOO[name]
model = ctor()
model.train()
x = make_input(batch)
with torch.no_grad():
    for _ in range(2):
        model(x)
    start = time.perf_counter()
    for _ in range(runs):
        model(x)
print((time.perf_counter() - start) / runs)
