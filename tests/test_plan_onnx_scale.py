"""ONNX import of large models: values are looked up through indexes built once per graph,
never by walking a graph's lists (which made import time grow with nodes x initializers)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npumem.plan import onnx_import, onnx_shapes
from npumem.plan.onnx_import import graph_from_onnx

V = helper.make_tensor_value_info
F = TensorProto.FLOAT


class _Guarded:
    """A graph whose initializers and outputs may not be read (a lookup must use an index)."""

    def __init__(self, graph: Any) -> None:
        self._graph = graph

    def __getattr__(self, name: str) -> Any:
        if name in ("initializer", "output"):
            raise AssertionError(f"a lookup walks graph.{name}")
        return getattr(self._graph, name)


@contextmanager
def _graphs_guarded(scopes: list[Any]) -> Iterator[None]:
    saved = [s.graph for s in scopes]
    for s in scopes:
        s.graph = _Guarded(s.graph)
    try:
        yield
    finally:
        for s, g in zip(scopes, saved, strict=True):
            s.graph = g


def _chain(scope: Any) -> list[Any]:
    found = []
    while scope is not None:
        found.append(scope)
        scope = scope.parent
    return found


@pytest.fixture
def lookups_use_indexes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make `Inferred.value_of` and `_Scope.declare_in` fail when they read a graph's
    initializers or outputs; count their calls."""
    calls = {"value_of": 0, "declare_in": 0}
    value_of = onnx_shapes.Inferred.value_of
    declare_in = onnx_import._Scope.declare_in

    def guarded_value_of(self: Any, onnx_module: Any, name: str) -> Any:
        calls["value_of"] += 1
        with _graphs_guarded(_chain(self)):
            return value_of(self, onnx_module, name)

    def guarded_declare_in(self: Any, name: str) -> str:
        calls["declare_in"] += 1
        with _graphs_guarded([self]):
            return declare_in(self, name)

    monkeypatch.setattr(onnx_shapes.Inferred, "value_of", guarded_value_of)
    monkeypatch.setattr(onnx_import._Scope, "declare_in", guarded_declare_in)
    return calls


def _shape(name: str, *dims: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(dims, np.int64), name)


def layered_model(layers: int) -> onnx.ModelProto:
    """`layers` Reshapes, each by a shape initializer of its own, then an If whose
    then-branch reshapes by an initializer of its own named like one of the model's (which
    shadows it) and whose else-branch reshapes by one of the model's."""
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        inits.append(_shape(f"s{i}", *((2, 8) if i % 2 else (4, 4))))
        nodes.append(helper.make_node("Reshape", [x, f"s{i}"], [f"r{i}"], name=f"reshape{i}"))
        x = f"r{i}"
    then = helper.make_graph(
        [helper.make_node("Reshape", [x, "s0"], ["t"], name="inner")],
        "then",
        [],
        [V("t", F, None)],
        [_shape("s0", 16)],  # shadows the model's s0 (4 x 4)
    )
    other = helper.make_graph(
        [helper.make_node("Reshape", [x, "flat"], ["e"], name="outer")],
        "else",
        [],
        [V("e", F, None)],
    )
    inits.append(_shape("flat", 16))
    nodes.append(
        helper.make_node("If", ["c"], ["y"], name="sel", then_branch=then, else_branch=other)
    )
    nodes.append(helper.make_node("Relu", ["y"], ["z"], name="relu"))
    graph = helper.make_graph(
        nodes, "layers", [V("x", F, [4, 4]), V("c", TensorProto.BOOL, [])], [V("z", F, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_lookups_use_indexes_and_shadowed_names_resolve(
    lookups_use_indexes: dict[str, int],
) -> None:
    layers = 200
    graph = graph_from_onnx(layered_model(layers))
    # Every lookup ran without walking a graph's initializers or outputs.
    assert lookups_use_indexes["value_of"] >= layers
    assert lookups_use_indexes["declare_in"] >= layers
    # The then-branch reshapes by its own s0 (16, not the model's 4 x 4), the else-branch by
    # the model's flat (16): the If's output has one shape whichever branch runs.
    assert graph.tensors["z"].size == 16 * 4
