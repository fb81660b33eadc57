"""ONNX import on models built with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npumem.plan import GraphError, Problem, solve
from npumem.plan.onnx_import import graph_from_onnx
from onnx_flow_helpers import check_plan


def small_model(batch: str | int = "batch") -> onnx.ModelProto:
    """x[batch,16] -> MatMul w1 -> Relu -> Reshape [batch,4,4] -> Reshape back -> MatMul w2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])
    w1 = numpy_helper.from_array(np.ones((16, 16), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((16, 8), np.float32), "w2")
    shape3 = numpy_helper.from_array(np.array([-1, 4, 4], np.int64), "shape3")
    shape2 = numpy_helper.from_array(np.array([-1, 16], np.int64), "shape2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape3"], ["r3"], name="to3d"),
        helper.make_node("Reshape", ["r3", "shape2"], ["r2"], name="to2d"),
        helper.make_node("MatMul", ["r2", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(nodes, "small", [x], [y], [w1, w2, shape3, shape2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shapes_views_inplace_and_weights() -> None:
    problem = Problem.from_onnx(small_model(), dims={"batch": 2}, alignment=1)
    spans = {b.id: (b.lower, b.upper, b.size) for b in problem.buffers}
    # h, r (in place), r3 and r2 (views) share one buffer, alive until mm2 (step 4).
    assert spans == {"x": (0, 1, 128), "h": (0, 5, 128), "y": (4, 5, 64)}
    assert sorted((a.name, a.base) for a in problem.aliases) == [
        ("r", "h"),
        ("r2", "h"),
        ("r3", "h"),
    ]
    solution = solve(problem, time_limit=2.0)
    solution.validate()
    assert solution.arena_size == 256  # x + h at mm1, h + y at mm2
    weights = Problem.from_onnx(small_model(), dims={"batch": 2}, include_weights=True)
    assert {"w1", "w2"} <= set(weights.ids)


def test_model_from_a_file_and_default_alignment(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(small_model(batch=1), path)
    problem = Problem.from_onnx(path)
    assert {b.alignment for b in problem.buffers} == {64}
    assert problem["x"].size == 64


def test_unbound_symbolic_dimension_is_a_clear_error() -> None:
    with pytest.raises(GraphError, match=r"tensor 'x' has an unknown shape.*bind 'batch'"):
        graph_from_onnx(small_model())


def test_unknown_shape_is_a_clear_error() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")
    model = helper.make_model(
        helper.make_graph([node], "dynamic", [x, shape], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(GraphError, match="'y'"):
        graph_from_onnx(model)


def test_an_if_that_returns_its_own_output_and_bad_files_are_refused(tmp_path: Path) -> None:
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, [1])
    branch = helper.make_graph([], "b", [], [out])
    node = helper.make_node("If", ["c"], ["o"], then_branch=branch, else_branch=branch)
    model = helper.make_model(helper.make_graph([node], "cf", [cond], [out]))
    # The branches return the If's own output: a cycle through the values they read.
    with pytest.raises(GraphError, match=r"the graph has a cycle: node #0 \(If\)"):
        graph_from_onnx(model)
    garbage = tmp_path / "bad.onnx"
    garbage.write_bytes(b"\xff\x00not a model")
    with pytest.raises(GraphError, match=r"bad\.onnx"):
        graph_from_onnx(garbage)
    with pytest.raises(GraphError, match="no such file"):
        graph_from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(GraphError, match=r"dims\['batch'\] must be an integer"):
        graph_from_onnx(small_model(), dims={"batch": -1})


@pytest.mark.parametrize(
    ("dims", "words"),
    [
        ({"batch": 10**23}, r"dims\['batch'\] must be an integer from 1 to 9223372036854775807"),
        ({"batch": 1 << 63}, r"dims\['batch'\] must be an integer from 1 to"),
        # A batch of 0 plans nothing: refused as `--dim batch=0` is.
        ({"batch": 0}, r"dims\['batch'\] must be an integer from 1 to .*, got 0"),
        ({"batch": 2.0}, r"dims\['batch'\] must be an integer"),
        ({"nosuch": 1}, r"no symbolic dimension 'nosuch'.*'batch'"),
        ({"batch": 1, "seq": 2}, r"no symbolic dimension 'seq'"),
        ([("batch", 1)], "dims must map dimension names to integers"),
        ({1: 1}, "a dimension name must be a string"),
    ],
)
def test_dims_that_cannot_be_bound_are_refused(dims: object, words: str, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(small_model(), path)
    for model in (small_model(), path):
        with pytest.raises(GraphError, match=words):
            Problem.from_onnx(model, dims=dims)  # type: ignore[arg-type]


def test_a_csv_or_json_file_is_not_read_as_onnx(tmp_path: Path) -> None:
    for name, text, kind in [("a.onnx", "id,lower,upper,size\n", "CSV"), ("b.onnx", "{}", "JSON")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(GraphError, match=f"{name}: not an ONNX model .*{kind}"):
            Problem.from_onnx(tmp_path / name)
    with pytest.raises(GraphError, match="got bytes"):
        Problem.from_onnx(b"m.onnx")


def dropout_model(mask_returned: bool) -> onnx.ModelProto:
    """x[2,8] -> Relu -> Dropout (opset 9: shape inference gives its mask no shape) -> Relu."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Dropout", ["r"], ["d", "mask"], name="drop", ratio=0.5),
        helper.make_node("Relu", ["d"], ["y"], name="relu2"),
    ]
    outputs = [y, mask] if mask_returned else [y]
    graph = helper.make_graph(nodes, "dropout", [x], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])


def test_an_unread_output_without_a_shape_is_left_out() -> None:
    graph = graph_from_onnx(dropout_model(mask_returned=False))
    assert "mask" not in graph.tensors
    assert {"x", "r", "d", "y"} <= set(graph.tensors)
    solution = solve(Problem.from_onnx(dropout_model(mask_returned=False)), time_limit=1.0)
    solution.validate()
    # A mask the graph returns must be sized: without a shape it is still an error.
    with pytest.raises(GraphError, match="'mask'"):
        graph_from_onnx(dropout_model(mask_returned=True))


def test_a_value_that_is_not_a_tensor_is_named() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [4])
    node = helper.make_node("SequenceConstruct", ["x"], ["s"], name="seq")
    model = helper.make_model(
        helper.make_graph([node], "sequence", [x], [seq]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(GraphError, match="value 's' is a sequence, not a tensor"):
        graph_from_onnx(model)


LIGHT_MODELS = sorted((Path(onnx.__file__).parent / "backend/test/data/light").glob("*.onnx"))


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_the_real_networks_shipped_with_onnx_plan(path: Path) -> None:
    """AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19 and
    ZFNet-512 as the onnx package ships them (opset 9, weights as graph inputs)."""
    problem = Problem.from_onnx(path)
    assert len(problem.buffers) >= 10
    solution = solve(problem, time_limit=0.5)
    solution.validate()
    biggest_step = max(
        sum(b.size for b in problem.buffers if b.lower <= t < b.upper)
        for t in range(max(b.upper for b in problem.buffers))
    )
    assert biggest_step <= solution.arena_size <= 2 * biggest_step


def test_the_real_networks_are_there() -> None:
    assert len(LIGHT_MODELS) >= 9, "the onnx package ships its light models in backend/test/data"


def linear_function_model(body_op: str = "Relu") -> onnx.ModelProto:
    """Two calls of a model-local function `Linear` (Transpose the weight, MatMul, then
    `body_op`), as torch.onnx's dynamo exporter writes a module."""
    domain = "pkg.torch.nn.modules.linear"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    body = [
        helper.make_node("Transpose", ["weight"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["inp", "wt"], ["mm"]),
        helper.make_node(body_op, ["mm"], ["out"]),
    ]
    function = helper.make_function(
        domain, "Linear", ["inp", "weight"], ["out"], body, [helper.make_opsetid("", 18)]
    )
    nodes = [
        helper.make_node("Linear", ["x", "w"], ["l1"], domain=domain, name="linear1"),
        helper.make_node("Linear", ["l1", "w"], ["y"], domain=domain, name="linear2"),
    ]
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    graph = helper.make_graph(nodes, "functions", [x], [y], [w])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets, functions=[function])


def test_the_tensors_inside_local_functions_are_planned_as_if_inlined() -> None:
    import onnx.inliner

    model = linear_function_model()
    inlined = onnx.inliner.inline_local_functions(model)
    plans = [
        solve(Problem.from_onnx(m, dims={"batch": 2}, alignment=1), time_limit=2.0)
        for m in (model, inlined)
    ]
    for plan in plans:
        plan.validate()
    # Each call's transposed weight (1,024 bytes) and product live inside the function.
    ids = set(plans[0].problem.ids)
    assert ids == set(plans[1].problem.ids)
    assert len(ids) > 3, ids
    assert plans[0].arena_size == plans[1].arena_size >= 1024 + 2 * 128


def test_control_flow_inside_a_local_function_is_planned() -> None:
    model = linear_function_model()
    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, None)
    branch = helper.make_graph(
        [helper.make_node("Identity", ["mm"], ["t"])], "branch", [], [then_out]
    )
    cond = helper.make_node("Constant", [], ["c"], value_int=1)
    call = helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=branch)
    function = model.functions[0]
    del function.node[2]
    function.node.extend([cond, call])
    # Inlined, each call has an If whose branches read the call's product.
    problem = Problem.from_onnx(model, dims={"batch": 2}, alignment=1)
    graph = graph_from_onnx(model, dims={"batch": 2})
    joins = [op for op in graph.ops if op.name.endswith("/join")]
    assert len(joins) == 2
    assert all(len(op.inputs) == 2 and op.inputs[0].startswith(op.name[: -len("join")] + "then/")
               for op in joins)  # fmt: skip
    solution = solve(problem, time_limit=1.0)
    solution.validate()
    check_plan(model, solution)


def test_a_graph_without_nodes_plans_its_inputs_passed_through(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    model = helper.make_model(
        helper.make_graph([], "empty", [x], [x]), opset_imports=[helper.make_opsetid("", 18)]
    )
    path = tmp_path / "empty.onnx"
    onnx.save(model, path)
    for source in (model, path):
        problem = Problem.from_onnx(source, alignment=1)
        assert [(b.id, b.size) for b in problem.buffers] == [("x", 16)]
