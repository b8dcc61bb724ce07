"""Export torchvision's ResNet-50 with its (randomly initialised) weights, training mode, opset 17, batch 8
at 224x224: about 100 MB, for the pass-speed benchmark (driver BenchmarkPassesOnResNet50WithWeights), which
reads the path from $KILN_RESNET50_WEIGHTS. Not committed: run it where the benchmark runs.
Usage: /usr/bin/python3 export_resnet50_weights.py OUT.onnx"""
import sys

import torch
import torchvision


def main(out):
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    model.train()
    x = torch.randn(8, 3, 224, 224)
    torch.onnx.export(model, (x,), out, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, export_params=True)


if __name__ == "__main__":
    main(sys.argv[1])
