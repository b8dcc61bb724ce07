"""Writes the ONNX error golden cases (testdata/cases/import/*.txtar): small models built with onnx.helper,
kept in the cases as base64 (the golden harness writes NAME.b64 as the binary NAME). The expected outputs
are filled in by KILN_UPDATE=1 go test ./driver -run TestGolden. Usage: golden_onnx.py CASES_DIR"""
import base64, os, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, opset=17, inits=(), domains=(), value_info=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits), value_info=list(value_info))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains]
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    return m.SerializeToString()


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def case(out, name, doc, cmds, files):
    parts = [doc.strip() + "\n", "-- cmd --\n" + "\n".join(cmds) + "\n"]
    for fname, data in files.items():
        b64 = base64.b64encode(data).decode()
        lines = "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))
        parts.append(f"-- {fname}.b64 --\n{lines}\n")
    parts.append("-- stdout --\n-- stderr --\n")
    with open(os.path.join(out, name + ".txtar"), "w") as fh:
        fh.write("".join(parts))


out = sys.argv[1]
relu = [helper.make_node("Relu", ["x"], ["y"], name="/relu")]
case(out, "old-opset", "A model below opset 6, or above 21, is an error naming the opset.",
     ["kiln import old.onnx", "kiln import new.onnx"],
     {"old.onnx": model(relu, [vi("x", [2])], [vi("y", [2])], opset=5),
      "new.onnx": model(relu, [vi("x", [2])], [vi("y", [2])], opset=22)})
case(out, "unknown-domain", "An operator domain other than the default one is an error naming it.",
     ["kiln import custom.onnx"],
     {"custom.onnx": model(relu, [vi("x", [2])], [vi("y", [2])], domains=[("com.example", 1)])})
case(out, "data-dependent", "An operator whose result shape depends on the data is an error naming the node.",
     ["kiln import nonzero.onnx", "kiln mem loop-free-if.onnx"],
     {"nonzero.onnx": model([helper.make_node("NonZero", ["x"], ["y"], name="/nz")], [vi("x", [3])], [vi("y", [1, None], TensorProto.INT64)]),
      "loop-free-if.onnx": model([helper.make_node("If", ["c"], ["y"], name="/if",
                                                   then_branch=helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "t", [], [vi("t", [2])]),
                                                   else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "e", [], [vi("e", [2])]))],
                                 [vi("x", [2]), vi("c", [], TensorProto.BOOL)], [vi("y", [2])])})
case(out, "declared-shape", "A shape the model declares that differs from the one Kiln computes is an error naming the node.",
     ["kiln import wrong.onnx"],
     {"wrong.onnx": model(relu + [helper.make_node("Neg", ["y"], ["z"], name="/neg")], [vi("x", [2, 3])], [vi("z", [2, 3])],
                          value_info=[vi("y", [3, 2])])})
case(out, "names", "Any ONNX name round-trips: names the bare-name grammar cannot read are quoted.",
     ["kiln import names.onnx -o names.kir", "kiln opt names.kir"],
     {"names.onnx": model([helper.make_node("Relu", ["in-put"], ["3"], name="a$b"), helper.make_node("Neg", ["3"], ["978"], name="n")],
                          [vi("in-put", [2])], [vi("978", [2])])})
ends = numpy_helper.from_array(np.array([np.iinfo(np.int64).max], dtype=np.int64), "ends")
starts = numpy_helper.from_array(np.array([1], dtype=np.int64), "starts")
axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
case(out, "int64-slice", "PyTorch writes x[:, 1:] as ends = INT64_MAX; it stays INT64_MAX (the result is [2,5], as declared).",
     ["kiln import slice.onnx"],
     {"slice.onnx": model([helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"], name="/slice")],
                          [vi("x", [2, 6])], [vi("y", [2, 5])], inits=[starts, ends, axes])})
case(out, "uint64", "UINT64 is u64: BitShift and Div compute on its 64 bits, read unsigned; ReduceMin reduces in u64.",
     ["kiln import u64.onnx"],
     {"u64.onnx": model([helper.make_node("BitShift", ["x", "s"], ["a"], name="/shift", direction="RIGHT"),
                         helper.make_node("Div", ["a", "x"], ["b"], name="/div"),
                         helper.make_node("ReduceMin", ["b"], ["y"], name="/min", keepdims=0)],
                        [vi("x", [3], TensorProto.UINT64), vi("s", [3], TensorProto.UINT64)], [vi("y", [], TensorProto.UINT64)])})
zp = numpy_helper.from_array(np.array(3, dtype=np.int8), "zp")
sc = numpy_helper.from_array(np.array(0.02, dtype=np.float32), "sc")
case(out, "fake-quant", "A DequantizeLinear of a QuantizeLinear (a fake quantiser) stays a float chain: its round is straight_through (autodiff's ste approximation passes the gradient through it) and its saturation keeps the bounds' gradient.",
     ["kiln import fq.onnx"],
     {"fq.onnx": model([helper.make_node("QuantizeLinear", ["x", "sc", "zp"], ["q"], name="/q"),
                        helper.make_node("DequantizeLinear", ["q", "sc", "zp"], ["y"], name="/dq")],
                       [vi("x", [4])], [vi("y", [4])], opset=13, inits=[zp, sc])})
case(out, "preview-training", "The optimizer operators of ai.onnx.preview.training: Adam of two tensors, with the learning rate and the step count read at run time; no default-domain opset is needed.",
     ["kiln import adam.onnx"],
     {"adam.onnx": model([helper.make_node("Adam", ["R", "T", "X1", "X2", "G1", "G2", "V1", "V2", "H1", "H2"],
                                           ["X1n", "X2n", "V1n", "V2n", "H1n", "H2n"], name="/adam", domain="ai.onnx.preview.training",
                                           alpha=0.9, beta=0.999, epsilon=1e-8, norm_coefficient=0.01)],
                         [vi("R", []), vi("T", [], TensorProto.INT64)] + [vi(n, [2 if n.endswith("2") else 1]) for n in ["X1", "X2", "G1", "G2", "V1", "V2", "H1", "H2"]],
                         [vi(n, [2 if "2" in n else 1]) for n in ["X1n", "X2n", "V1n", "V2n", "H1n", "H2n"]],
                         domains=[("ai.onnx.preview.training", 1)])})
cond = np.array([True, False, True])
case(out, "compress", "Compress's result shape depends on its condition: given with --input, it is a gather of the kept positions; otherwise an error naming the input.",
     ["kiln import compress.onnx", "kiln import compress.onnx --input c=c.npy"],
     {"compress.onnx": model([helper.make_node("Compress", ["x", "c"], ["y"], name="/compress", axis=1)],
                             [vi("x", [2, 3]), vi("c", [3], TensorProto.BOOL)], [vi("y", [2, 2])]),
      "c.npy": (lambda b: (np.save(b, cond), b.getvalue())[1])(__import__("io").BytesIO())})
print("written")
