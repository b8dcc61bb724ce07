"""Single operators (or short chains) in the forms their converters decompose, with weights, PyTorch's
outputs and the gradients of sum(output) with respect to the input and every parameter: the references of
onnx.TestOperatorsMatchPyTorch. Writes OUT/NAME/{model.onnx,input.npy,output.npy,grad.input.npy,
grad.<param>.npy}. Usage: export_ops.py OUT_DIR [NAME...]"""
import os, sys, numpy as np, torch


class Deconv3d(torch.nn.Module):
    """A 3-D transposed convolution with every attribute away from its default: strides, pads,
    output padding, dilation and groups differ per axis."""
    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose3d(4, 6, (3, 2, 3), stride=(2, 1, 3), padding=(1, 0, 2),
                                           output_padding=(1, 0, 1), dilation=(1, 2, 1), groups=2)

    def forward(self, x):
        return self.up(x)


OPS = {
    "conv_transpose3d": (Deconv3d, lambda: torch.randn(2, 4, 3, 4, 3), 17),
}

if __name__ == "__main__":
    out = sys.argv[1]
    only = set(sys.argv[2:])
    for name, (ctor, make_input, opset) in OPS.items():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        model = ctor()
        x = make_input().requires_grad_(True)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        torch.onnx.export(model, x, os.path.join(d, "model.onnx"), export_params=True, opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=["input"], output_names=["output"])
        y = model(x)
        y.sum().backward()
        np.save(os.path.join(d, "input.npy"), x.detach().numpy())
        np.save(os.path.join(d, "output.npy"), y.detach().numpy())
        np.save(os.path.join(d, "grad.input.npy"), x.grad.numpy())
        for pname, p in model.named_parameters():
            np.save(os.path.join(d, f"grad.{pname}.npy"), p.grad.numpy())
        print(name, "exported")
