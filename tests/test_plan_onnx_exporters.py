"""ONNX import on models shaped like real exporters' output (PyTorch, graph-surgery tools,
custom runtimes), built with onnx.helper."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_contract import run_cli
from npumem.plan import GraphError, Problem, solve
from npumem.plan.onnx_import import graph_from_onnx
from onnx_builders import model

V = helper.make_tensor_value_info


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


def custom_output(output: onnx.ValueInfoProto, value_info: list[onnx.ValueInfoProto]) -> Any:
    """A custom op (no shape inference) whose output `t` is a graph output."""
    x = V("x", TensorProto.FLOAT, [2, 4])
    nodes = [helper.make_node("MyOp", ["x"], ["t"], name="custom", domain="my.domain")]
    return model(nodes, [x], [output], value_info=value_info, domains=("my.domain",))


@pytest.mark.parametrize(
    ("output", "value_info"),
    [
        pytest.param([None, None], [2, 6], id="output unknown, value_info known"),
        pytest.param([2, 6], [None, None], id="output known, value_info unknown"),
        pytest.param([2, None], [None, 6], id="one known dimension each"),
        pytest.param(None, [2, 6], id="output of unknown rank"),
        pytest.param([2, 6], [2, 6], id="both known and equal"),
        pytest.param(["n", 6], [2, None], id="a known dimension beats a named one"),
    ],
)
def test_the_more_specific_of_two_declarations_sizes_a_custom_output(
    output: list[int | str | None] | None, value_info: list[int | str | None]
) -> None:
    m = custom_output(V("t", TensorProto.FLOAT, output), [V("t", TensorProto.FLOAT, value_info)])
    assert sizes(m)["t"] == 2 * 6 * 4
    assert {b.id: b.size for b in Problem.from_onnx(m, alignment=1).buffers}["t"] == 48


def test_two_declarations_that_disagree_are_refused_naming_both() -> None:
    m = custom_output(V("t", TensorProto.FLOAT, [2, 7]), [V("t", TensorProto.FLOAT, [2, 6])])
    with pytest.raises(GraphError) as info:
        graph_from_onnx(m)
    assert str(info.value) == (
        "m: tensor 't' has no known shape: node 'custom' (my.domain::MyOp) has no ONNX shape "
        "inference, and the model declares two shapes for it that disagree (the value_info "
        "declares float 2 x 6, the outputs float 2 x 7); make the two agree"
    )
    other_type = custom_output(
        V("t", TensorProto.FLOAT16, [2, 6]), [V("t", TensorProto.FLOAT, [2, 6])]
    )
    with pytest.raises(GraphError, match=r"float 2 x 6, the outputs float16 2 x 6\)"):
        graph_from_onnx(other_type)
    other_rank = custom_output(V("t", TensorProto.FLOAT, [12]), [V("t", TensorProto.FLOAT, [2, 6])])
    with pytest.raises(GraphError, match=r"float 2 x 6, the outputs float 12\)"):
        graph_from_onnx(other_rank)


def test_declarations_that_disagree_are_not_needed_where_inference_sizes_the_value() -> None:
    x = V("x", TensorProto.FLOAT, [4, 4])
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = model(
        nodes,
        [x],
        [V("y", TensorProto.FLOAT, [1, 1])],
        value_info=[V("y", TensorProto.FLOAT, [2, 2])],
    )
    assert sizes(m)["y"] == 64  # what the op writes, as for a single stale declaration


def test_an_unsized_graph_output_is_told_where_its_shape_may_be_declared() -> None:
    m = custom_output(V("t", TensorProto.FLOAT, [None, None]), [])
    with pytest.raises(
        GraphError,
        match=r"declare the shape of 't' in the model's value_info or its graph outputs$",
    ):
        graph_from_onnx(m)


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
    assert f"{src}: tensor 'y' is written by node #0 (Relu) and by node #1 (Neg)" in err
    with pytest.raises(GraphError, match=r"twice\.onnx: tensor 'y' is written by node #0"):
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


def test_a_tensor_without_producer_and_a_cycle_are_named_as_such() -> None:
    x = V("x", TensorProto.FLOAT, ["batch", 4])
    y = V("y", TensorProto.FLOAT, None)
    ghost = model([helper.make_node("Add", ["x", "ghost"], ["y"])], [x], [y])
    with pytest.raises(
        GraphError,
        match=r"node #0 \(Add\) reads tensor 'ghost', which has no producer: no node writes "
        r"it, and it is neither a graph input nor an initializer",
    ):
        graph_from_onnx(ghost, dims={"batch": 2})
    cycle = model(
        [
            helper.make_node("Relu", ["x"], ["start"], name="start"),
            helper.make_node("Add", ["start", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["b"], name="loop"),
            helper.make_node("Relu", ["b"], ["y"]),
        ],
        [x],
        [y],
    )
    with pytest.raises(
        GraphError, match=r"the graph has a cycle: node '(add|loop)' \((Add|Relu)\)"
    ):
        graph_from_onnx(cycle, dims={"batch": 2})
    returned = model([helper.make_node("Relu", ["x"], ["a"])], [x], [y])
    with pytest.raises(GraphError, match=r"graph output 'y' has no producer"):
        graph_from_onnx(returned, dims={"batch": 2})


def test_a_tensor_written_twice_is_refused() -> None:
    x = V("x", TensorProto.FLOAT, [4])
    y = V("y", TensorProto.FLOAT, [4])
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    over_weight = model(
        [helper.make_node("Relu", ["x"], ["w"]), helper.make_node("Add", ["w", "x"], ["y"])],
        [x],
        [y],
        [w],
    )
    with pytest.raises(
        GraphError, match=r"node #0 \(Relu\) writes tensor 'w', which is an initializer"
    ):
        graph_from_onnx(over_weight)
    over_input = model(
        [
            helper.make_node("Relu", ["y"], ["x"], name="back"),
            helper.make_node("Relu", ["x"], ["y"]),
        ],
        [x],
        [y],
    )
    with pytest.raises(
        GraphError, match=r"node 'back' \(Relu\) writes tensor 'x', which is a graph"
    ):
        graph_from_onnx(over_input)
    twice = numpy_helper.from_array(np.ones((9, 4), np.float32), "w")
    two_weights = model([helper.make_node("Add", ["x", "w"], ["y"])], [x], [y], [w, twice])
    with pytest.raises(GraphError, match=r"two initializers are named 'w'"):
        graph_from_onnx(two_weights)
    typeless = model([helper.make_node("Relu", ["x"], ["y"])], [onnx.ValueInfoProto(name="x")], [y])
    with pytest.raises(GraphError, match=r"graph input 'x' has no type; declare its element type"):
        graph_from_onnx(typeless)


def test_an_unsized_graph_output_is_blamed_on_its_node() -> None:
    """A graph output whose op has no shape inference in the model's opsets, or whose inference
    fails, gets the message of any other tensor (not "a unknown, not a tensor"), and an
    unnamed node is named by its position and op type."""
    x = V("x", TensorProto.FLOAT, ["batch", 64])
    y = V("y", TensorProto.FLOAT, None)
    fused = model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("FusedMatMul", ["r", "r"], ["y"], domain="com.microsoft", transB=1),
        ],
        [x],
        [y],
        domains=("com.microsoft",),
    )
    with pytest.raises(
        GraphError,
        match=r"tensor 'y' has no known shape: node #1 \(com\.microsoft::FusedMatMul\) has no "
        r"ONNX shape inference; declare the shape of 'y'",
    ):
        graph_from_onnx(fused, dims={"batch": 2})
    scale = numpy_helper.from_array(np.ones(64, np.float32), "scale")
    bias = numpy_helper.from_array(np.zeros(64, np.float32), "bias")
    layer_norm = model(
        [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-12)],
        [x],
        [y],
        [scale, bias],
        opset=14,
    )
    with pytest.raises(
        GraphError,
        match=r"tensor 'y' has no known shape: node #0 \(LayerNormalization\) has no ONNX shape "
        r"inference \(ONNX defines LayerNormalization from opset 17 on, and the model imports "
        r"opset 14 of the default domain\)",
    ):
        graph_from_onnx(layer_norm, dims={"batch": 2})
    a = V("a", TensorProto.FLOAT, ["batch", "n"])
    add = model([helper.make_node("Add", ["x", "a"], ["y"])], [x, a], [y])
    assert sizes(add, batch=2, n=64)["y"] == 2 * 64 * 4
    with pytest.raises(
        GraphError,
        match=r"tensor 'y' has no shape: the dimensions of the inputs of node #0 \(Add\) do not "
        r"broadcast together \('x' 2 x 64, 'a' 2 x 30\)",
    ):
        graph_from_onnx(add, dims={"batch": 2, "n": 30})


def kv_attention() -> onnx.ModelProto:
    """Attention over a KV cache as optimum exports it: the mask's length is a dimension of
    its own, named after the sum it stands for."""
    total = "past_sequence_length + sequence_length"
    inputs = [
        V("q", TensorProto.FLOAT, ["batch_size", 4, "sequence_length", 16]),
        V("k", TensorProto.FLOAT, ["batch_size", 4, "sequence_length", 16]),
        V("past_key", TensorProto.FLOAT, ["batch_size", 4, "past_sequence_length", 16]),
        V("mask", TensorProto.FLOAT, ["batch_size", 1, 1, total]),
    ]
    nodes = [
        helper.make_node("Concat", ["past_key", "k"], ["present"], axis=2),
        helper.make_node("Transpose", ["present"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Add", ["scores", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
    ]
    outputs = [
        V("probs", TensorProto.FLOAT, ["batch_size", 4, "sequence_length", total]),
        V("present", TensorProto.FLOAT, ["batch_size", 4, total, 16]),
    ]
    return model(nodes, inputs, outputs)


def test_inconsistent_dims_of_a_kv_cache_model_are_a_broadcast_mismatch() -> None:
    dims = {"batch_size": 2, "sequence_length": 8, "past_sequence_length": 16}
    good = sizes(kv_attention(), **dims, **{"past_sequence_length + sequence_length": 24})
    assert good["masked"] == 2 * 4 * 8 * 24 * 4
    with pytest.raises(GraphError) as e:
        graph_from_onnx(kv_attention(), dims=dims | {"past_sequence_length + sequence_length": 30})
    message = str(e.value)
    assert (
        "node #3 (Add) do not broadcast together ('scores' 2 x 4 x 8 x 24, 'mask' 2 x 1 x 1 x 30)"
        in message
    )
    assert "depend on the data" not in message


def test_the_suggested_dim_is_quoted_for_the_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "mask.onnx"
    mask = V("mask", TensorProto.INT64, ["batch", "past_sequence_length + 1"])
    cast = helper.make_node("Cast", ["mask"], ["y"], to=TensorProto.FLOAT)
    onnx.save(model([cast], [mask], [V("y", TensorProto.FLOAT, None)]), src)
    out = tmp_path / "plan.json"
    status, _, err = run_cli(
        ["plan", str(src), "--dim", "batch=2", "-o", str(out)], capsys, output=out
    )
    assert status == 2
    hint = err.split("(command line: ", 1)[1].split(";", 1)[0]
    assert hint == "--dim 'past_sequence_length + 1=1'"
    # The hint, as a shell splits it, is an argument the command takes.
    status, _, err = run_cli(
        ["plan", str(src), "--dim", "batch=2", *shlex.split(hint), "-o", str(out)],
        capsys,
        output=out,
    )
    assert status == 0, err
