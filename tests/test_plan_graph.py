"""Lifetimes from graphs: hand-built graphs with known answers, in-place ops, views, errors, and
the built-in networks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from npumem.plan import GraphError, Problem, solve
from npumem.plan.graph import Graph, Op, Tensor
from npumem.plan.networks import NETWORKS, bert_base, mobilenet_v2, resnet50


def chain(inplace: bool = False) -> dict[str, Any]:
    relu: dict[str, Any] = {"name": "relu", "inputs": ["a"], "outputs": ["b"]}
    if inplace:
        relu["inplace"] = {"b": "a"}
    return {
        "name": "chain",
        "tensors": [
            {"name": "x", "size": 10},
            {"name": "w", "size": 1000, "weight": True},
            {"name": "a", "size": 16},
            {"name": "b", "size": 16},
            {"name": "y", "size": 4},
        ],
        "inputs": ["x"],
        "outputs": ["y"],
        "ops": [
            {"name": "conv", "inputs": ["x", "w"], "outputs": ["a"]},
            relu,
            {"name": "head", "inputs": ["b"], "outputs": ["y"]},
        ],
    }


def spans(problem: Problem) -> dict[str, tuple[int, int, int]]:
    return {b.id: (b.lower, b.upper, b.size) for b in problem.buffers}


def test_chain_lifetimes_and_arena() -> None:
    problem = Problem.from_graph(Graph.from_json(chain()))
    assert spans(problem) == {
        "x": (0, 1, 10),
        "a": (0, 2, 16),
        "b": (1, 3, 16),
        "y": (2, 3, 4),
    }
    solution = solve(problem, time_limit=2.0)
    assert solution.arena_size == 32  # a and b live together at the relu
    solution.validate()


def test_inplace_op_reuses_its_input() -> None:
    problem = Problem.from_graph(Graph.from_json(chain(inplace=True)))
    assert spans(problem) == {"x": (0, 1, 10), "a": (0, 3, 16), "y": (2, 3, 4)}
    assert [(a.name, a.base, a.offset) for a in problem.aliases] == [("b", "a", 0)]
    solution = solve(problem, time_limit=2.0)
    assert solution.arena_size == 26  # x + a at the conv, a + y at the head
    assert solution.tensor_offsets()["b"] == solution.tensor_offsets()["a"]


def test_inplace_is_refused_when_the_input_is_read_later() -> None:
    graph = chain(inplace=True)
    graph["ops"][2]["inputs"] = ["b", "a"]  # the head reads a again: a residual
    problem = Problem.from_graph(Graph.from_json(graph))
    assert spans(problem) == {"x": (0, 1, 10), "a": (0, 3, 16), "b": (1, 3, 16), "y": (2, 3, 4)}
    assert problem.aliases == ()
    assert solve(problem, time_limit=2.0).arena_size == 36


def test_inplace_is_refused_on_graph_inputs() -> None:
    graph = chain()
    graph["ops"][0]["inplace"] = {"a": "x"}
    graph["tensors"][0]["size"] = 16
    problem = Problem.from_graph(Graph.from_json(graph))
    assert "a" in problem.ids and "x" in problem.ids


def test_a_view_extends_its_base() -> None:
    graph = chain()
    graph["tensors"].append({"name": "v", "size": 8, "view_of": "a", "view_offset": 8})
    graph["ops"].insert(1, {"name": "slice", "inputs": ["a"], "outputs": ["v"]})
    graph["ops"][3]["inputs"] = ["b", "v"]  # the head reads the view of a
    problem = Problem.from_graph(Graph.from_json(graph))
    assert spans(problem)["a"] == (0, 4, 16)  # alive until the head reads v at step 3
    assert [(a.name, a.base, a.offset, a.size) for a in problem.aliases] == [("v", "a", 8, 8)]
    solution = solve(problem, time_limit=2.0)
    offsets = solution.tensor_offsets()
    assert offsets["v"] == (offsets["a"][0] + 8, 8)


def test_weights_inputs_and_outputs_options() -> None:
    graph = Graph.from_json(chain())
    with_weights = Problem.from_graph(graph, include_weights=True)
    assert spans(with_weights)["w"] == (0, 3, 1000)
    no_inputs = Problem.from_graph(graph, include_inputs=False)
    assert "x" not in no_inputs.ids
    no_outputs = Problem.from_graph(graph, include_outputs=False)
    assert "y" not in no_outputs.ids
    aligned = Problem.from_graph(graph, alignment=64)
    assert {b.alignment for b in aligned.buffers} == {64}


def test_outputs_live_to_the_end() -> None:
    graph = chain()
    graph["outputs"] = ["y", "a"]
    problem = Problem.from_graph(Graph.from_json(graph))
    assert spans(problem)["a"] == (0, 3, 16)


def test_ops_out_of_order_are_sorted() -> None:
    graph = chain()
    graph["ops"].reverse()
    problem = Problem.from_graph(Graph.from_json(graph))
    assert spans(problem) == spans(Problem.from_graph(Graph.from_json(chain())))


def test_shapes_and_dtypes_size_tensors() -> None:
    graph = Graph.from_json(
        {
            "tensors": [
                {"name": "x", "shape": [1, 3, 4, 4], "dtype": "float16"},
                {"name": "y", "shape": [2, 5], "dtype": "int64"},
            ],
            "inputs": ["x"],
            "outputs": ["y"],
            "ops": [{"inputs": ["x"], "outputs": ["y"]}],
        }
    )
    assert graph.tensors["x"].size == 96
    assert graph.tensors["y"].size == 80
    assert graph.ops[0].name == "op0"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda g: g["ops"][1]["inputs"].append("ghost"), "unknown tensor 'ghost'"),
        (
            lambda g: g["ops"].append({"name": "loop", "inputs": ["y"], "outputs": ["a"]}),
            "written by op 'conv' and by op 'loop'",
        ),
        (lambda g: g["inputs"].clear(), "'x' is read by op 'conv' but is not a graph input"),
        (lambda g: g["ops"][0].update(name="relu"), "op name 'relu' is used twice"),
        (lambda g: g["tensors"][2].update(view_of="nothing"), "view of unknown tensor 'nothing'"),
        (lambda g: g["tensors"][2].pop("size"), "give 'size' (bytes) or 'shape'"),
        (lambda g: g["tensors"][2].update(size=-1), "'size' must be an integer >= 0"),
        (lambda g: g["ops"][1].update(inplace={"b": "zz"}), "in-place pair 'b' <- 'zz'"),
        (lambda g: g["ops"][0]["outputs"].append("w"), "writes weight 'w'"),
    ],
)
def test_bad_graphs_are_clear_errors(change: Any, words: str) -> None:
    graph = chain()
    change(graph)
    with pytest.raises(GraphError) as info:
        Problem.from_graph(Graph.from_json(graph))
    assert words in str(info.value)


def test_cycles_are_reported_with_their_ops() -> None:
    graph = Graph.build(
        "cyclic",
        [Tensor("x", 4), Tensor("p", 4), Tensor("q", 4)],
        [Op("first", ["x", "q"], ["p"]), Op("second", ["p"], ["q"])],
        inputs=["x"],
    )
    with pytest.raises(GraphError, match="cycle: 'first' -> 'second' -> 'first'"):
        Problem.from_graph(graph)
    selfish = Graph.build("self", [Tensor("p", 4)], [Op("loop", ["p"], ["p"])])
    with pytest.raises(GraphError, match="reads its own output"):
        Problem.from_graph(selfish)


def test_graph_json_files(tmp_path: Path) -> None:
    graph = Graph.from_json(chain(inplace=True))
    path = tmp_path / "g.json"
    graph.to_json(path)
    again = Graph.from_json(path)
    assert spans(Problem.from_graph(again)) == spans(Problem.from_graph(graph))
    bad = tmp_path / "bad.json"
    bad.write_text('{"tensors": [\n1,\n}')
    with pytest.raises(GraphError, match=r"bad.json, line 3"):
        Graph.from_json(bad)
    with pytest.raises(GraphError, match="expected a 'ops' list"):
        Graph.from_json({"tensors": []})


def test_resnet50_shapes() -> None:
    graph = resnet50()
    convs = [op for op in graph.ops if any(graph.tensors[t].weight for t in op.inputs)]
    convs = [op for op in convs if op.name != "fc"]
    assert len(convs) == 53
    assert graph.tensors["conv1.out"].size == 64 * 112 * 112 * 4
    assert graph.tensors["layer4.2.relu3.out"].size == 2048 * 7 * 7 * 4
    assert graph.tensors["fc.out"].size == 1000 * 4
    assert resnet50(dtype="float16").tensors["conv1.out"].size == 64 * 112 * 112 * 2


def test_mobilenet_v2_and_bert_shapes() -> None:
    mobile = mobilenet_v2()
    assert mobile.tensors["features.1.dw.out"].size == 32 * 112 * 112 * 4
    assert mobile.tensors["features.18.out"].size == 1280 * 7 * 7 * 4
    bert = bert_base(seq_len=64, layers=2)
    assert bert.tensors["layer1.scores.out"].size == 12 * 64 * 64 * 4
    assert bert.tensors["layer0.intermediate.out"].size == 64 * 3072 * 4
    assert len([op for op in bert.ops if op.name.endswith("output.norm")]) == 2


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_networks_plan_within_one_percent_of_the_bound(name: str) -> None:
    graph = NETWORKS[name]()
    problem = Problem.from_graph(graph, alignment=64)
    solution = solve(problem, time_limit=5.0)
    solution.validate()
    assert solution.arena_size <= 1.01 * solution.lower_bound
    assert solution.arena_size < problem.total_size < graph.activation_bytes


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ({"format": "npumem-graph", "version": 2}, "version 2 is not supported"),
        ({"format": "npumem-graph", "version": "1"}, "version '1' is not supported"),
        ({"format": "npumem-graph", "version": True}, "version True is not supported"),
        ({"format": "npumem-graph"}, "version None is not supported"),
        ({"version": 1}, "format is None, expected 'npumem-graph'"),
        ({"format": "npumem-plan", "version": 1}, "format is 'npumem-plan'"),
    ],
)
def test_graph_headers_are_checked(header: dict[str, Any], words: str) -> None:
    with pytest.raises(GraphError, match=words):
        Graph.from_json({**chain(), **header})
    assert Graph.from_json({**chain(), "format": "npumem-graph", "version": 1}).ops


def long_chain(n: int, link: str) -> Graph:
    """`n` tensors, op `o{i}` reading `t{i-1}` and writing `t{i}`, which is a view of `t{i-1}`
    (`link="view"`) or may be written in place into it (`link="inplace"`)."""
    tensors = [Tensor("x", 64)]
    ops = [Op("o0", ["x"], ["t0"])]
    for i in range(n):
        view = f"t{i - 1}" if link == "view" and i else None
        tensors.append(Tensor(f"t{i}", 1024, view_of=view))
        if i:
            inplace = {f"t{i}": f"t{i - 1}"} if link == "inplace" else {}
            ops.append(Op(f"o{i}", [f"t{i - 1}"], [f"t{i}"], inplace))
    return Graph.build(f"{link}-chain", tensors, ops, inputs=["x"], outputs=[f"t{n - 1}"])


@pytest.mark.parametrize("link", ["view", "inplace"])
def test_a_chain_of_20000_views_or_inplace_ops_is_linear(link: str) -> None:
    start = time.perf_counter()
    problem = Problem.from_graph(long_chain(20_000, link))
    assert time.perf_counter() - start < 10
    # Every tensor of the chain lives in t0's memory: one buffer, live from o0 to the end.
    assert spans(problem)["t0"] == (0, 20_000, 1024)
    assert len(problem.aliases) == 19_999


def test_cycles_through_long_view_chains_are_found_quickly() -> None:
    graph = long_chain(20_000, "view")
    graph.ops[0].inputs.append("t19999")  # o0 reads a view of its own output
    start = time.perf_counter()
    with pytest.raises(GraphError, match="'o0' reads its own output"):
        Problem.from_graph(graph)
    graph = long_chain(20_000, "view")
    graph.tensors["z"] = Tensor("z", 4)
    graph.ops[19_999].outputs.append("z")
    graph.ops[1].inputs.append("z")  # o1 reads z, which o19999 writes after reading o1's view
    with pytest.raises(GraphError, match="cycle: 'o1' -> 'o19999' -> 'o1'"):
        Problem.from_graph(graph)
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("alignment", [3, 0, -64, 2.0])
def test_a_tensor_alignment_that_is_not_a_power_of_two_is_refused(alignment: object) -> None:
    graph = chain()
    graph["tensors"][2]["alignment"] = alignment
    for a in (1, 64):  # the planner's own alignment must not hide it
        with pytest.raises(GraphError, match=r"tensors\[2\]|tensor 'a': alignment must be"):
            Problem.from_graph(Graph.from_json(graph), alignment=a)


def test_a_view_or_in_place_output_gets_the_alignment_it_asks_for() -> None:
    def graph(view_offset: int, inplace: bool) -> Graph:
        relu = Op("relu", ["v"], ["r"], {"r": "v"} if inplace else {})
        return Graph.build(
            "aligned",
            [
                Tensor("x", 100),
                Tensor("y", 512),
                Tensor("v", 128, view_of="y", view_offset=view_offset, alignment=256),
                Tensor("r", 128, alignment=512),
                Tensor("z", 8),
            ],
            [Op("a", ["x"], ["y"]), Op("flat", ["y"], ["v"]), relu, Op("b", ["r"], ["z"])],
            ["x"],
            ["z"],
        )

    problem = Problem.from_graph(graph(256, inplace=False), alignment=1)
    assert problem["y"].alignment == 256  # so that v, 256 bytes in, is aligned to 256
    solution = solve(problem, time_limit=1.0)
    offsets = {name: offset for name, (offset, _) in solution.tensor_offsets().items()}
    assert offsets["v"] % 256 == 0 and offsets["r"] % 512 == 0
    # In place, r would lie 256 bytes into y: not 512-aligned, so r keeps its own buffer.
    problem = Problem.from_graph(graph(256, inplace=True), alignment=1)
    assert problem["r"].alignment == 512
    with pytest.raises(GraphError, match="view 'v' asks for alignment 256 but lies 64 bytes"):
        Problem.from_graph(graph(64, inplace=False))


def test_an_empty_tensor_name_is_refused() -> None:
    graph = chain()
    graph["tensors"].append({"name": "", "size": 4})
    with pytest.raises(GraphError, match=r"tensors\[5\]: 'name' is empty"):
        Graph.from_json(graph)


def test_a_bad_graph_json_names_its_file_once(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    header = '"format": "npumem-graph", "version": 1'
    path.write_text("{" + header + ', "tensors": [], "ops": [], "inputs": 5}')
    with pytest.raises(GraphError) as info:
        Graph.from_json(path)
    assert str(info.value) == f"{path}: 'inputs' must be a list"
