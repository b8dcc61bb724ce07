"""Times PyTorch eager's training step of a zoo model on the GPU, as the device check compares
Kiln's CUDA programs with it: loss = sum of the outputs, SGD, the same batch every step.
Precision f32 is strict (TF32 off for matmuls and cuDNN); bf16 runs the forward under autocast.
Usage: gpu_check_torch.py NAME BATCH f32|bf16   prints one JSON line: seconds per step (mean of
10 after 3 warm-up steps) and torch.cuda.max_memory_allocated()."""
import json, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch

name, batch, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    import torchvision  # noqa: F401 - models.py needs it
except ImportError:
    if name == "resnet50":
        print(json.dumps({"skipped": "torchvision is not installed: no PyTorch ResNet-50 to compare with"}))
        sys.exit(0)
    import types  # the transformers do not need it: models.py's import finds a stand-in
    sys.modules["torchvision"] = types.ModuleType("torchvision")
from models import ZOO

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
ctor, make_input, _ = ZOO[name]
model = ctor().cuda().train()
x = make_input(batch).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(x).float().sum()
    loss.backward()
    opt.step()


for _ in range(3):
    step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
for _ in range(10):
    step()
torch.cuda.synchronize()
print(json.dumps({"seconds": (time.perf_counter() - t0) / 10, "max_memory_allocated": torch.cuda.max_memory_allocated(),
                  "torch": torch.__version__, "device": torch.cuda.get_device_name()}))
