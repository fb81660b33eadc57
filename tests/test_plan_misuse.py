"""Misuse of the planner's Python API raises typed npumem errors, and the fixes for tensors of
0 bytes, the greedy figure of shape buckets and the message for a tensor that cannot be
pipelined."""

from __future__ import annotations

import copy

import pytest

from npumem import plan
from npumem.plan import (
    Graph,
    Op,
    PlanArgumentError,
    PlanArgumentTypeError,
    Problem,
    ProblemFormatError,
    Tensor,
)


def _graph() -> Graph:
    return Graph.build(
        "g",
        [
            Tensor("x", 64),
            Tensor("w", 32, weight=True),
            Tensor("y", 64),
            Tensor("v", 32, view_of="y"),
            Tensor("z", 64),
        ],
        [Op("a", ["x", "w"], ["y"]), Op("b", ["y"], ["v"]), Op("c", ["v"], ["z"])],
        ["x"],
        ["z"],
    )


class _ModelProto:
    """Stands for an onnx.ModelProto (the check goes by the type's name)."""


_ModelProto.__name__ = "ModelProto"

_PROBLEM = Problem.from_graph(_graph())
_SOLUTION = plan.solve(_PROBLEM, time_limit=0.2)

MISUSES = {
    "solve None": (lambda: plan.solve(None), PlanArgumentTypeError),
    "solve object": (lambda: plan.solve(object()), PlanArgumentTypeError),
    "solve model": (lambda: plan.solve(_ModelProto()), PlanArgumentTypeError),
    "solve pools None problem": (
        lambda: plan.solve(None, pools=[("a", 64), ("b", None)]),
        PlanArgumentTypeError,
    ),
    "solve bound_iterations str": (
        lambda: plan.solve(_PROBLEM, pools=[("a", 64), ("b", None)], bound_iterations="3"),
        PlanArgumentTypeError,
    ),
    "lower_bound None": (lambda: plan.lower_bound(None), PlanArgumentTypeError),
    "best_greedy None": (lambda: plan.best_greedy(None), PlanArgumentTypeError),
    "best_greedy rules int": (lambda: plan.best_greedy(_PROBLEM, 5), PlanArgumentTypeError),
    "best_greedy deadline str": (
        lambda: plan.best_greedy(_PROBLEM, deadline="1"),
        PlanArgumentTypeError,
    ),
    "run_rule None": (lambda: plan.run_rule(None, "size"), PlanArgumentTypeError),
    "bind object": (lambda: _SOLUTION.bind(object()), PlanArgumentTypeError),
    "bind None": (lambda: _SOLUTION.bind(None), PlanArgumentTypeError),
    "validate str": (lambda: _SOLUTION.validate(capacity="x"), PlanArgumentTypeError),
    "validate float": (lambda: _SOLUTION.validate(capacity=1.5), PlanArgumentTypeError),
    "validate bool": (lambda: _SOLUTION.validate(capacity=True), PlanArgumentTypeError),
    "validate negative": (lambda: _SOLUTION.validate(capacity=-1), PlanArgumentError),
    "Solution None": (lambda: plan.Solution(None, {}), PlanArgumentTypeError),
    "Solution offsets int": (lambda: plan.Solution(_PROBLEM, 5), PlanArgumentTypeError),
    "Solution capacity str": (
        lambda: plan.Solution(_PROBLEM, _SOLUTION.offsets, capacity="1"),
        PlanArgumentTypeError,
    ),
    "iteration str": (lambda: _SOLUTION.iteration_offsets("1"), PlanArgumentTypeError),
    "iteration negative": (lambda: _SOLUTION.iteration_offsets(-1), PlanArgumentError),
    "header prefix None": (lambda: _SOLUTION.to_c_header(prefix=None), PlanArgumentTypeError),
    "from_graph dict": (lambda: Problem.from_graph({"tensors": []}), PlanArgumentTypeError),
    "from_graph None": (lambda: Problem.from_graph(None), PlanArgumentTypeError),
    "from_graph flag str": (
        lambda: Problem.from_graph(_graph(), include_weights="yes"),
        PlanArgumentTypeError,
    ),
    "from_onnx flag int": (
        lambda: Problem.from_onnx("no.onnx", include_outputs=1),
        PlanArgumentTypeError,
    ),
    "Problem buffers None": (lambda: Problem(None), PlanArgumentTypeError),
    "Problem aliases int": (lambda: Problem([], aliases=3), PlanArgumentTypeError),
    "Problem slots str": (lambda: Problem([], slots="a"), PlanArgumentTypeError),
    "pipelined None": (lambda: _PROBLEM.pipelined(None), PlanArgumentTypeError),
    "pipelined int name": (lambda: _PROBLEM.pipelined([1]), PlanArgumentTypeError),
    "Tensor.of_shape int shape": (lambda: plan.Tensor.of_shape("t", 4), PlanArgumentTypeError),
    "Graph.build tensors None": (lambda: plan.Graph.build("g", None, []), PlanArgumentTypeError),
    "Graph.build a str op": (lambda: plan.Graph.build("g", [], ["op"]), PlanArgumentTypeError),
    "Graph.build a dict tensor": (
        lambda: plan.Graph.build("g", [{"name": "t"}], []),
        PlanArgumentTypeError,
    ),
    "bucket_dims list": (lambda: plan.bucket_dims([("N", 1)]), PlanArgumentTypeError),
    "bucket_dims float": (lambda: plan.bucket_dims({"N": 1.5}), PlanArgumentTypeError),
    "bucket_dims str": (lambda: plan.bucket_dims({"N": "1,2"}), PlanArgumentTypeError),
    "bucket_dims str in a list": (lambda: plan.bucket_dims({"N": [1, "2"]}), PlanArgumentTypeError),
    "bucket_dims value twice": (lambda: plan.bucket_dims({"N": [1, 2, 1]}), PlanArgumentError),
    "plan_buckets pipelined int": (
        lambda: plan.plan_buckets(lambda N: _graph(), dims={"N": [1]}, pipelined=3),
        PlanArgumentTypeError,
    ),
}


@pytest.mark.parametrize("name", list(MISUSES))
def test_misuse_raises_typed_error_and_changes_nothing(name: str) -> None:
    call, error = MISUSES[name]
    problem_before = copy.deepcopy(_PROBLEM.to_json_obj())
    solution_before = _SOLUTION.to_json_obj()
    with pytest.raises(error) as info:
        call()
    assert len(str(info.value).splitlines()) == 1
    assert _PROBLEM.to_json_obj() == problem_before
    after = _SOLUTION.to_json_obj()
    assert {k: v for k, v in after.items() if k != "seconds"} == {
        k: v for k, v in solution_before.items() if k != "seconds"
    }


def test_solve_of_a_model_says_how_to_plan_one() -> None:
    with pytest.raises(PlanArgumentTypeError, match=r"Problem\.from_onnx"):
        plan.solve(_ModelProto())


def _zero_graph() -> Graph:
    return Graph.build(
        "zero",
        [
            Tensor("x", 0),
            Tensor("y", 0),
            Tensor("e", 0, view_of="big"),
            Tensor("big", 64),
            Tensor("z", 0),
            Tensor("out", 64),
        ],
        [
            Op("r", ["x"], ["y"]),
            Op("a", ["y"], ["z"]),
            Op("v", ["big"], ["e"]),
            Op("b", ["e"], ["out"]),
        ],
        ["x", "big"],
        ["z", "out"],
    )


def test_zero_byte_tensors_are_in_every_table(tmp_path) -> None:
    problem = Problem.from_graph(_zero_graph())
    solution = plan.solve(problem, time_limit=0.2)
    table = solution.tensor_offsets()
    for name in ("x", "y", "z"):
        assert table[name] == (0, 0)
    assert table["e"] == (solution.offsets["big"], 0)
    names = {t["name"] for t in solution.to_json_obj()["tensors"]}
    assert {"x", "y", "z", "e", "big", "out"} <= names
    header = solution.to_c_header()
    assert '{"x", 0u, 0u},' in header and '{"z", 0u, 0u},' in header
    assert "NUM_TENSORS 6u" in header
    # A plan file read back keeps them.
    path = tmp_path / "plan.json"
    solution.to_json(path)
    again = plan.solve(Problem.from_json(path), time_limit=0.2)
    assert again.tensor_offsets()["y"] == (0, 0)
    tiered = plan.solve(problem, pools=[("a", 64), ("b", None)], time_limit=0.2)
    assert tiered.tensor_offsets()["x"][1:] == (0, 0)
    assert '{"x", 0u, 0u},' in tiered.to_c_header()


def test_bucket_files_greedy_covers_the_weights() -> None:
    def build(N: int) -> Graph:
        return Graph.build(
            "m",
            [Tensor("x", 64 * N), Tensor("w", 4096, weight=True), Tensor("y", 64 * N)],
            [Op("a", ["x", "w"], ["y"])],
            ["x"],
            ["y"],
        )

    buckets = plan.plan_buckets(build, dims={"N": [1, 2]}, include_weights=True, time_limit=0.2)
    for bucket in buckets.buckets:
        whole = buckets.solution_of(bucket)
        greedy = whole.to_json_obj()["greedy"]["arena_size"]
        assert greedy >= whole.arena_size >= buckets.weights_size
        assert greedy == buckets.weights_size + bucket.solution.stats.greedy_arena


def test_pipelining_a_weight_or_a_view_says_what_it_is() -> None:
    problem = Problem.from_graph(_graph())
    with pytest.raises(ProblemFormatError, match=r"'w'.*a weight.*include_weights"):
        problem.pipelined(["w"])
    with pytest.raises(ProblemFormatError, match=r"'v'.*lies in buffer 'y'.*pipeline 'y'"):
        problem.pipelined(["v"])
    assert "w#slot1" in Problem.from_graph(_graph(), include_weights=True).pipelined(["w"]).ids
    with pytest.raises(ProblemFormatError, match=r"'w'.*shared by every shape bucket"):
        plan.plan_buckets(
            lambda N: _graph(), dims={"N": [1, 2]}, include_weights=True, pipelined=["w"]
        )
    with pytest.raises(ProblemFormatError, match=r"unknown buffer\(s\) 'nope'"):
        problem.pipelined(["nope"])
