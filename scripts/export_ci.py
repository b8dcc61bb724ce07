"""CI-sized variants of the zoo: the same model definitions (scripts/models.py) at small sizes, graph
only, training mode, opset 17, so that tests can run whole training steps in the interpreter.
Writes OUT/{resnet50,bert_base,gpt2_small}_ci.onnx, and resnet50_ci_f64.onnx: ResNet-50 in f64 at batch 4
and 32x32, for the parallel numerics targets in f64. Usage: export_ci.py OUT_DIR [NAME...]"""
import os, sys, torch, torchvision
from models import Bert, GPT2

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
CI = {
    # torchvision's ResNet-50 at batch 2 and 64x64 images.
    "resnet50_ci": (torchvision.models.resnet50, lambda: torch.randn(2, 3, 64, 64)),
    # The same in f64, at batch 4 (four data-parallel ranks) and 32x32 images.
    "resnet50_ci_f64": (lambda: torchvision.models.resnet50().double(), lambda: torch.randn(4, 3, 32, 32, dtype=torch.float64)),
    # BERT and GPT-2 shapes with 2 layers, width 64, 4 heads, sequence 16, vocabulary 100, batch 2.
    "bert_base_ci": (lambda: Bert(vocab=100, d=64, heads=4, layers=2, ff=128, seq=16), lambda: torch.randint(0, 100, (2, 16))),
    "gpt2_small_ci": (lambda: GPT2(vocab=100, d=64, heads=4, layers=2, ff=128, seq=16), lambda: torch.randint(0, 100, (2, 16))),
}
for name, (ctor, make_input) in CI.items():
    if sys.argv[2:] and name not in sys.argv[2:]:
        continue
    torch.manual_seed(0)
    model = ctor()
    model.train()
    torch.onnx.export(model, make_input(), os.path.join(out, name + ".onnx"), export_params=False,
                      opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input"], output_names=["output"])
    print(name, "exported")
