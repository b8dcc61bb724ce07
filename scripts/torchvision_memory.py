"""Exports torchvision classifiers' training-mode forward graphs at batch 32 (224x224 images) to ONNX,
graph only, opset 17, and measures PyTorch's memory for their training step as torch_memory.py does
(AOTAutograd's default and min-cut partitions replayed with every tensor freed after its last use).
Stochastic depth is off (ONNX cannot export it in training mode). These stand in for the held-back torchvision steps that issue 24 measures. Writes OUT/NAME/model.onnx and
OUT/NAME/torch_memory.json. Usage: torchvision_memory.py OUT_DIR [NAME...]"""
import json, os, sys
import torch, torchvision
from functorch.compile import default_partition, min_cut_rematerialization_partition
from torch_memory import measure

MODELS = ["convnext_tiny", "vit_b_16", "efficientnet_b0", "mobilenet_v3_large", "squeezenet1_0",
          "densenet121", "regnet_y_400mf", "shufflenet_v2_x1_0", "resnext50_32x4d", "swin_t", "vgg16"]
BATCH = 32

if __name__ == "__main__":
    out = sys.argv[1]
    for name in sys.argv[2:] or MODELS:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)()
        for m in model.modules():
            if isinstance(m, torchvision.ops.StochasticDepth):
                m.p = 0.0  # bernoulli: ONNX cannot export it in training mode
        model.train()
        x = torch.randn(BATCH, 3, 224, 224)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        torch.onnx.export(model, x, os.path.join(out, name, "model.onnx"), export_params=False,
                          opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["input"], output_names=["output"])
        default = measure(model, x, default_partition)
        mincut = measure(model, x, min_cut_rematerialization_partition)
        res = {
            "params": sum(p.numel() * p.element_size() for p in model.parameters()),
            "input": x.numel() * x.element_size(),
            "default": default[0],
            "mincut": mincut[0],
            "default_512": default[1],
            "mincut_512": mincut[1],
        }
        with open(os.path.join(out, name, "torch_memory.json"), "w") as fh:
            json.dump(res, fh)
        print(name, res, flush=True)
