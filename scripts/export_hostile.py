"""Writes the tiny ONNX models of testdata/hostile: graphs whose tensors are
far larger than any machine's memory, which Kiln must refuse or handle
without materialising them (driver/hostmem_test.go).

    /usr/bin/python3 scripts/export_hostile.py
"""
import os

import onnx
from onnx import TensorProto, helper

OUT = os.path.join(os.path.dirname(__file__), "..", "testdata", "hostile")


def main():
    os.makedirs(OUT, exist_ok=True)
    # An inference Dropout on 2^40 elements: the mask it could return is
    # all ones, never to be built at full size.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 40])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 40])
    g = helper.make_graph([helper.make_node("Dropout", ["x"], ["y"], ratio=0.5)], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]), os.path.join(OUT, "dropout_2e40.onnx"))
    # An Expand to 2^41 x 6 that a ReduceSum takes back to 6: fused at -O2,
    # the large value lives inside one kernel.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [1 << 41, 6])
    axes = helper.make_tensor("a", TensorProto.INT64, [1], [0])
    g = helper.make_graph(
        [helper.make_node("Expand", ["x", "s"], ["e"]), helper.make_node("ReduceSum", ["e", "a"], ["y"], keepdims=0)],
        "g", [x], [y], initializer=[shape, axes])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), os.path.join(OUT, "expand_2e41.onnx"))


if __name__ == "__main__":
    main()
