"""Building ONNX models in tests: a graph of `nodes` wrapped in a model with its opsets."""

from __future__ import annotations

import onnx
from onnx import helper


def model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    *,
    opset: int = 17,
    value_info: list[onnx.ValueInfoProto] = (),  # type: ignore[assignment]
    domains: tuple[str, ...] = (),
) -> onnx.ModelProto:
    """A model of one graph, named "m", importing the default domain at `opset` and each of
    `domains` at version 1."""
    graph = helper.make_graph(
        nodes, "m", inputs, outputs, list(initializers), value_info=list(value_info)
    )
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)
