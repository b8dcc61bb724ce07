"""Single operators (or short chains) in the forms their converters decompose, with weights, PyTorch's
outputs and the gradients of sum(output) with respect to the input and every parameter: the references of
onnx.TestOperatorsMatchPyTorch. Modules PyTorch exports; operators it cannot export (torchvision's
roi_align) are built with onnx.helper, their reference computed by the PyTorch function they match. Writes OUT/NAME/{model.onnx,input.npy,output.npy,grad.input.npy,
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


class FakeQuant(torch.nn.Module):
    """Quantisation-aware training's fake quantisers (exported as QuantizeLinear then DequantizeLinear):
    per tensor on an activation (int8, zero point 3) and per output channel on a weight (uint8), with a
    range narrow enough that some values saturate. Its gradients are PyTorch's straight-through ones,
    which Kiln gives with --allow ste (the file allow lists the approximations the test allows)."""
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.fake_quantize_per_tensor_affine(self.a(x), 0.02, 3, -128, 127)
        scale = torch.linspace(0.004, 0.01, 4)
        w = torch.fake_quantize_per_channel_affine(self.b.weight, scale, torch.full((4,), 100, dtype=torch.int32), 0, 0, 255)
        return torch.nn.functional.linear(h, w, self.b.bias)


OPS = {
    "fake_quant": (FakeQuant, lambda: torch.randn(5, 6) * 2, 13),

    "conv_transpose3d": (Deconv3d, lambda: torch.randn(2, 4, 3, 4, 3), 17),
}

# Fixed rois of two images, some reaching past the border (torchvision's layout: batch index first).
ROIS = [[0, 0.5, 1.0, 6.0, 5.5], [1, 2.0, 0.0, 9.5, 3.0], [1, -1.0, 4.0, 3.0, 10.5], [0, 3.3, 3.3, 3.9, 4.1]]


def roi_align(ratio):
    """An ONNX RoiAlign node (opset 16, half-pixel) built with onnx.helper, as PyTorch 1.13 cannot export
    torchvision's op; its reference is torchvision.ops.roi_align(aligned=True). sampling_ratio 0 (-1 in
    torchvision) sizes each roi's sample grid by the roi."""
    from onnx import TensorProto, helper, numpy_helper
    import torchvision
    rois = np.array([r[1:] for r in ROIS], dtype=np.float32)
    idx = np.array([r[0] for r in ROIS], dtype=np.int64)
    # The rois are Constant nodes, not initializers (which would be trainable parameters).
    consts = [helper.make_node("Constant", [], [name], name="/" + name, value=numpy_helper.from_array(v, name))
              for name, v in (("rois", rois), ("idx", idx))]
    node = helper.make_node("RoiAlign", ["input", "rois", "idx"], ["output"], name="/roi", output_height=3,
                            output_width=2, sampling_ratio=ratio, spatial_scale=0.9,
                            coordinate_transformation_mode="half_pixel")
    g = helper.make_graph(consts + [node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 3, 8, 9])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [4, 3, 3, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    m.ir_version = 8

    def forward(x):
        return torchvision.ops.roi_align(x, torch.tensor(ROIS), (3, 2), spatial_scale=0.9,
                                         sampling_ratio=ratio if ratio > 0 else -1, aligned=True)
    return m.SerializeToString(), forward


def grid_sample(mode, padding, align):
    """An ONNX GridSample node (opset 16) with a fixed grid whose coordinates cover the border region
    (within half a pixel of the edges, where bicubic taps must not be clipped before they are taken)
    and beyond it; its reference is torch's F.grid_sample."""
    from onnx import TensorProto, helper, numpy_helper
    g = torch.Generator().manual_seed(3)
    ramp = torch.linspace(-1.25, 1.25, 11)
    grid = torch.stack([torch.stack(torch.meshgrid(ramp, ramp, indexing="xy"), -1),
                        torch.rand(11, 11, 2, generator=g) * 2.6 - 1.3])  # [2, 11, 11, 2]
    node = helper.make_node("Constant", [], ["grid"], name="/grid", value=numpy_helper.from_array(grid.numpy(), "grid"))
    gs = helper.make_node("GridSample", ["input", "grid"], ["output"], name="/gs", mode=mode, padding_mode=padding,
                          align_corners=align)
    gr = helper.make_graph([node, gs], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 3, 5, 6])],
                           [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 3, 11, 11])])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 16)])
    m.ir_version = 8

    def forward(x):
        return torch.nn.functional.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=bool(align))
    return m.SerializeToString(), forward


# name: (ONNX model bytes and the PyTorch function it computes, input)
BUILT = {
    "grid_sample_bicubic_border": (lambda: grid_sample("bicubic", "border", 0), lambda: torch.randn(2, 3, 5, 6)),
    "grid_sample_bicubic_reflection": (lambda: grid_sample("bicubic", "reflection", 0), lambda: torch.randn(2, 3, 5, 6)),
    "grid_sample_bicubic_border_corners": (lambda: grid_sample("bicubic", "border", 1), lambda: torch.randn(2, 3, 5, 6)),
    "grid_sample_bilinear_border": (lambda: grid_sample("bilinear", "border", 0), lambda: torch.randn(2, 3, 5, 6)),
    "roi_align": (lambda: roi_align(2), lambda: torch.randn(2, 3, 8, 9)),
    "roi_align_adaptive": (lambda: roi_align(0), lambda: torch.randn(2, 3, 8, 9)),
}


def save(d, x, y, params=()):
    y.sum().backward()
    np.save(os.path.join(d, "input.npy"), x.detach().numpy())
    np.save(os.path.join(d, "output.npy"), y.detach().numpy())
    np.save(os.path.join(d, "grad.input.npy"), x.grad.numpy())
    for pname, p in params:
        np.save(os.path.join(d, f"grad.{pname}.npy"), p.grad.numpy())


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
        save(d, x, model(x), model.named_parameters())
        if name == "fake_quant":
            with open(os.path.join(d, "allow"), "w") as fh:
                fh.write("ste\n")
        print(name, "exported")
    for name, (build, make_input) in BUILT.items():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        data, forward = build()
        x = make_input().requires_grad_(True)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as fh:
            fh.write(data)
        save(d, x, forward(x))
        print(name, "built")
