"""ONNX import on models shaped like real exporters' output (PyTorch, graph-surgery tools,
custom runtimes), built with onnx.helper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_contract import run_cli
from npumem.plan import GraphError, Problem, solve
from npumem.plan.onnx_import import graph_from_onnx

V = helper.make_tensor_value_info


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
    graph = helper.make_graph(
        nodes, "m", inputs, outputs, list(initializers), value_info=list(value_info)
    )
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)


def i64(name: str, values: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def sizes(m: onnx.ModelProto, **dims: int) -> dict[str, int]:
    return {t.name: t.size for t in graph_from_onnx(m, dims=dims).tensors.values()}


def attention_reshape(opset: int) -> onnx.ModelProto:
    """As PyTorch exports `x.view(b, s, heads, -1).transpose(1, 2)` with dynamic axes: the
    target shape is computed from the input's shape (Shape, Gather, Unsqueeze, Concat)."""
    unsqueeze = (
        [
            helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"]),
            helper.make_node("Unsqueeze", ["s", "axis0"], ["s1"]),
        ]
        if opset >= 13
        else [
            helper.make_node("Unsqueeze", ["b"], ["b1"], axes=[0]),
            helper.make_node("Unsqueeze", ["s"], ["s1"], axes=[0]),
        ]
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["q"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["zero"], value=i64("zero_value", 0)),
        helper.make_node("Constant", [], ["one"], value=i64("one_value", 1)),
        helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        *unsqueeze,
        helper.make_node("Concat", ["b1", "s1", "heads", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["q", "target"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Softmax", ["qt"], ["y"], axis=-1),
    ]
    weights = [
        numpy_helper.from_array(np.ones((16, 16), np.float32), "w"),
        i64("heads", [4]),
        i64("minus1", [-1]),
        i64("axis0", [0]),
    ]
    x = V("x", TensorProto.FLOAT, ["batch", "seq", 16])
    y = V("y", TensorProto.FLOAT, ["batch", 4, "seq", 4])
    return model(nodes, [x], [y], weights, opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 14, 17, 18, 21])
def test_a_reshape_to_a_shape_computed_from_the_input_is_sized(opset: int) -> None:
    m = attention_reshape(opset)
    found = sizes(m, batch=2, seq=8)
    assert found["q4"] == found["qt"] == found["y"] == 2 * 8 * 16 * 4
    solution = solve(Problem.from_onnx(m, dims={"batch": 2, "seq": 8}), time_limit=1.0)
    solution.validate()


def test_range_expand_slice_and_resize_shapes_are_computed() -> None:
    x = V("x", TensorProto.FLOAT, ["batch", "seq"])
    positions = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Range", ["zero", "s", "one"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "axis0"], ["pos2"]),
        helper.make_node("Expand", ["pos2", "shape"], ["posb"]),
        helper.make_node("Cast", ["posb"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "posf"], ["y"]),
    ]
    consts = [i64("zero", 0), i64("one", 1), i64("axis0", [0])]
    m = model(positions, [x], [V("y", TensorProto.FLOAT, None)], consts)
    assert sizes(m, batch=2, seq=7)["posb"] == 2 * 7 * 8

    halves = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "start", "end"], ["last"]),
        helper.make_node("Div", ["last", "two"], ["half"]),
        helper.make_node("Concat", ["minus1", "half", "two"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    consts = [i64("start", [1]), i64("end", [2]), i64("two", [2]), i64("minus1", [-1])]
    m = model(halves, [x], [V("y", TensorProto.FLOAT, None)], consts, opset=13)
    assert sizes(m, batch=2, seq=8)["y"] == 2 * 8 * 4

    image = V("image", TensorProto.FLOAT, [1, 3, 8, 8])
    upsample = [
        helper.make_node("Shape", ["image"], ["shape"]),
        helper.make_node("Mul", ["shape", "factor"], ["target"]),
        helper.make_node("Resize", ["image", "", "", "target"], ["y"], mode="nearest"),
    ]
    m = model(upsample, [image], [V("y", TensorProto.FLOAT, None)], [i64("factor", [1, 1, 2, 2])])
    assert sizes(m)["y"] == 3 * 16 * 16 * 4


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        pytest.param(V("y", TensorProto.FLOAT, [1, 1]), "a smaller shape", id="shape"),
        pytest.param(V("y", TensorProto.FLOAT16, [4, 4]), "a smaller type", id="type"),
        pytest.param(V("y", TensorProto.FLOAT, [2]), "another rank", id="rank"),
    ],
)
def test_a_stale_declared_shape_does_not_shrink_a_buffer(
    declared: onnx.ValueInfoProto, why: str
) -> None:
    """A declaration that contradicts what the op computes (left by graph surgery) must not
    make the plan give the op less memory than it writes."""
    x = V("x", TensorProto.FLOAT, [4, 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    stale_output = model(nodes, [x], [declared])
    r = onnx.ValueInfoProto()
    r.CopyFrom(declared)
    r.name = "r"
    stale_value_info = model(nodes, [x], [V("y", TensorProto.FLOAT, [4, 4])], value_info=[r])
    for m in (stale_output, stale_value_info):
        found = sizes(m)
        assert found["r"] == found["y"] == 64, why
        problem = Problem.from_onnx(m, alignment=1)
        assert {b.size for b in problem.buffers} == {64}


def test_a_custom_op_without_shape_inference() -> None:
    x = V("x", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Fused", ["r"], ["z"], name="fused", domain="com.acme"),
        helper.make_node("Tile", ["z", "reps"], ["y"]),
    ]
    reps = [i64("reps", [3])]
    unsized = model(nodes, [x], [V("y", TensorProto.FLOAT, None)], reps, domains=("com.acme",))
    with pytest.raises(
        GraphError,
        match=r"tensor 'z' has no known shape: node 'fused' \(com.acme::Fused\) has no ONNX "
        r"shape inference; declare the shape of 'z' in the model's value_info",
    ):
        graph_from_onnx(unsized)
    # Declared, its output is sized and the ops after it are inferred from it.
    declared = model(
        nodes,
        [x],
        [V("y", TensorProto.FLOAT, None)],
        reps,
        value_info=[V("z", TensorProto.FLOAT, [8])],
        domains=("com.acme",),
    )
    found = sizes(declared)
    assert (found["z"], found["y"]) == (32, 96)


def test_dimensions_named_by_shape_inference_are_not_offered_to_bind() -> None:
    x = V("x", TensorProto.FLOAT, [4, 4])
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["y"]),
    ]
    with pytest.raises(
        GraphError, match=r"tensor 'nz' has an unknown shape 2 x \? \(not infer"
    ) as e:
        graph_from_onnx(model(nodes, [x], [V("y", TensorProto.INT64, None)]))
    assert "unk__" not in str(e.value) and "--dim" not in str(e.value)
    unnamed = model(
        [helper.make_node("Relu", ["x"], ["y"])], [V("x", TensorProto.FLOAT, ["", 4])], []
    )
    with pytest.raises(GraphError, match=r"'x' has an unknown shape \? x 4 \(the model does not"):
        graph_from_onnx(unnamed)


def test_node_names_need_not_be_unique() -> None:
    x = V("x", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="act"),
        helper.make_node("Relu", ["a"], ["b"], name="act"),
        helper.make_node("Relu", ["b"], ["c"]),  # unnamed: Relu_2
        helper.make_node("Neg", ["c"], ["y"], name="Relu_2"),
    ]
    graph = graph_from_onnx(model(nodes, [x], [V("y", TensorProto.FLOAT, [4])]))
    assert [op.name for op in graph.ops] == ["act", "act#2", "Relu_2", "Relu_2#2"]


def test_element_types_without_a_fixed_size_and_packed_ones() -> None:
    strings = model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [V("x", TensorProto.STRING, [4])],
        [V("y", TensorProto.STRING, [4])],
    )
    with pytest.raises(GraphError, match=r"tensor 'x' has element type STRING \(8\), which has"):
        graph_from_onnx(strings)
    packed = model(
        [helper.make_node("Cast", ["x"], ["q"], to=TensorProto.INT4)],
        [V("x", TensorProto.FLOAT, [5])],
        [V("q", TensorProto.INT4, [5])],
        opset=21,
    )
    assert sizes(packed)["q"] == 3  # two 4-bit elements to a byte


def test_a_negative_dimension_is_refused() -> None:
    m = model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [V("x", TensorProto.FLOAT, [-1, 4])],
        [V("y", TensorProto.FLOAT, [-1, 4])],
    )
    with pytest.raises(GraphError, match=r"tensor 'x' has a negative dimension -1"):
        graph_from_onnx(m)


def test_graph_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = V("x", TensorProto.FLOAT, [4])
    twice = model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
        [x],
        [V("y", TensorProto.FLOAT, [4])],
    )
    src = tmp_path / "twice.onnx"
    onnx.save(twice, src)
    out = tmp_path / "plan.json"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert f"{src}: tensor 'y' is written by op" in err
    with pytest.raises(GraphError, match=r"twice\.onnx: tensor 'y' is written by op"):
        Problem.from_onnx(src)
    huge = model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [V("x", TensorProto.FLOAT, [1 << 40, 1 << 40])],
        [V("y", TensorProto.FLOAT, [1 << 40, 1 << 40])],
    )
    onnx.save(huge, src)
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2 and f"{src}: buffer 'x': size" in err and "64 bits" in err


def test_weights_stored_as_external_data_are_not_read(tmp_path: Path) -> None:
    """Planning needs the weights' shapes, not their bytes: a model plans without its data
    file, and a model of several gigabytes is never loaded whole."""
    m = attention_reshape(17)
    big = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    big.ClearField("raw_data")
    big.dims[:] = [1 << 28, 16]  # 16 GiB of weights that are nowhere
    big.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(1 << 34))):
        big.external_data.add(key=key, value=value)
    m.graph.initializer[0].CopyFrom(big)
    m.graph.node[0].op_type = "Gather"  # q = w[x]: sized from the indices, not w's data
    m.graph.node[0].input[:] = ["w", "x"]
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 1
    src = tmp_path / "model.onnx"
    onnx.save(m, src)
    problem = Problem.from_onnx(src, dims={"batch": 2, "seq": 8}, include_weights=True)
    assert problem["w"].size == 1 << 34
    assert Problem.from_onnx(src, dims={"batch": 2, "seq": 8})["q"].size == 2 * 8 * 16 * 4

    # Small external tensors (shape constants) are read: sizing may need their values.
    small = tmp_path / "small"
    small.mkdir()
    onnx.save_model(
        attention_reshape(13),
        small / "model.onnx",
        save_as_external_data=True,
        location="model.data",
        size_threshold=0,
    )
    found = {
        t.name: t.size
        for t in graph_from_onnx(small / "model.onnx", dims={"batch": 2, "seq": 8}).tensors.values()
    }
    assert found["q4"] == 2 * 8 * 16 * 4
    (small / "model.data").unlink()
    with pytest.raises(GraphError, match=r"model\.onnx: not a readable ONNX model .*model\.data"):
        graph_from_onnx(small / "model.onnx", dims={"batch": 2, "seq": 8})


def test_long_one_dimensional_tensors_are_sized_without_copying_them() -> None:
    """ONNX's data propagation holds a 1-D tensor's elements as dimensions: 8 million of them
    took over a gigabyte. Shapes are computed without it. (The child's peak is its own mm's
    high-water mark: `getrusage` would report the parent's peak too, inherited at fork.)"""
    script = """
import re
from onnx import TensorProto, helper
from npumem.plan import Problem
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8_000_000])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8_000_000])
graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "long", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
assert Problem.from_onnx(model)["y"].size == 32_000_000
with open("/proc/self/status") as status:
    print(int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1)) // 1024)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert int(done.stdout) < 400, f"peak memory {done.stdout.strip()} MiB"
