"""Exports testdata/parallel/mlp_blocks.onnx: two transformer MLP blocks
(LayerNorm, Linear, GELU, Linear, residual) as PyTorch exports them, for the
tensor-parallel tests. Run with Debian's /usr/bin/python3 (PyTorch 1.13)."""
import torch

torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


model = torch.nn.Sequential(Block(), Block())
torch.onnx.export(model, torch.randn(2, 8, 16), "testdata/parallel/mlp_blocks.onnx", opset_version=14,
                  input_names=["x"], output_names=["y"], training=torch.onnx.TrainingMode.TRAINING,
                  do_constant_folding=False)
