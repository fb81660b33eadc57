"""Pipelined plans (double buffering, k inferences in flight): every plan is checked against the
lifetimes of several unrolled iterations, not only against the problem it was solved as."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumem import plan
from npumem.cli import main
from npumem.plan import Buffer, Problem, ProblemFormatError, solve
from npumem.plan.networks import NETWORKS

DATA = Path(__file__).resolve().parent / "data" / "minimalloc"


def check_unrolled(original: Problem, solution: plan.Solution, in_flight: int) -> None:
    """Unroll ``2 * in_flight + 1`` iterations of period T: an ordinary buffer of iteration j is
    live on ``[jT + lower, jT + upper)`` at its offset; a pipelined buffer of iteration j is
    loaded from the start of iteration ``j - in_flight + 1`` and used until ``jT + upper``, in
    slot ``j % in_flight``. No two intervals live at once may share a byte."""
    start = min(b.lower for b in original.buffers)
    period = max(b.upper for b in original.buffers) - start
    slots = solution.problem.slots
    spans: list[tuple[int, int, int, int, str]] = []  # (t0, t1, byte0, byte1, label)
    for j in range(2 * in_flight + 1):
        base = j * period
        for b in original.buffers:
            if b.id in slots:
                offset = solution.iteration_offsets(j)[b.id]
                t0 = base - (in_flight - 1) * period + start
            else:
                offset = solution.offsets[b.id]
                t0 = base + b.lower
            spans.append((t0, base + b.upper, offset, offset + b.size, f"{b.id}@{j}"))
    for a, b in itertools.combinations(spans, 2):
        if a[0] < b[1] and b[0] < a[1]:
            assert a[3] <= b[2] or b[3] <= a[2], f"{a[4]} and {b[4]} overlap"


@st.composite
def pipelined_cases(draw: st.DrawFn) -> tuple[Problem, list[str], int]:
    n = draw(st.integers(2, 9))
    buffers = []
    for i in range(n):
        lower = draw(st.integers(0, 12))
        buffers.append(
            Buffer(
                f"b{i}",
                lower,
                lower + draw(st.integers(1, 6)),
                draw(st.integers(1, 40)),
                draw(st.sampled_from([1, 4, 16])),
            )
        )
    named = draw(st.lists(st.sampled_from([b.id for b in buffers]), min_size=1, unique=True))
    return Problem(buffers), named, draw(st.integers(1, 4))


@settings(max_examples=40, deadline=None)
@given(pipelined_cases())
def test_pipelined_plans_hold_over_unrolled_iterations(
    case: tuple[Problem, list[str], int],
) -> None:
    problem, named, in_flight = case
    pipelined = problem.pipelined(named, in_flight)
    solution = solve(pipelined, time_limit=0.5)
    solution.validate()
    if in_flight == 1:
        assert pipelined is problem
        return
    assert set(pipelined.slots) == set(named)
    assert all(len(ids) == in_flight for ids in pipelined.slots.values())
    check_unrolled(problem, solution, in_flight)
    for name in named:
        offsets = solution.slot_offsets(name)
        assert [solution.iteration_offsets(j)[name] for j in range(in_flight)] == offsets
        assert len(set(offsets)) == in_flight  # every slot is memory of its own


def test_double_buffered_network_and_bound() -> None:
    problem = Problem.from_graph(NETWORKS["mobilenet_v2"](), alignment=64)
    inputs = [b.id for b in problem.buffers if b.lower == 0]
    double = problem.double_buffered(inputs)
    solution = solve(double, time_limit=5.0)
    solution.validate()
    check_unrolled(problem, solution, 2)
    single = solve(problem, time_limit=5.0)
    assert solution.arena_size >= single.arena_size
    assert solution.lower_bound >= plan.lower_bound(double)
    obj = solution.to_json_obj()
    assert obj["slots"] == {name: [f"{name}#slot0", f"{name}#slot1"] for name in inputs}


def test_bad_pipelines_are_refused() -> None:
    problem = Problem([Buffer("a", 0, 2, 4), Buffer("p", 0, 1, 4, offset=8)])
    with pytest.raises(ProblemFormatError, match=r"unknown buffer\(s\) 'nope'$"):
        problem.double_buffered(["nope"])
    named = Problem([Buffer("gpu_0/data_0", 0, 2, 4), Buffer("gpu_0/conv1", 1, 2, 4)])
    with pytest.raises(ProblemFormatError, match=r"'data_0' \(did you mean 'gpu_0/data_0'\?\)"):
        named.double_buffered(["data_0"])
    with pytest.raises(ProblemFormatError, match="pinned"):
        problem.double_buffered(["p"])
    with pytest.raises(plan.PlanArgumentError, match="in_flight must be an integer from 1 to"):
        problem.pipelined(["a"], 0)
    with pytest.raises(KeyError):
        solve(problem).slot_offsets("a")


def test_double_buffer_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            str(DATA / "input.12.csv"),
            "-o",
            str(out),
            "--double-buffer",
            "b1,b4",
            "--in-flight",
            "3",
            "--time-limit",
            "2",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "slots        b1: iteration i uses slot i % 3" in text
    original = Problem.from_csv(DATA / "input.12.csv")
    solved = Problem.from_json(out)
    offsets = {b.id: b.offset for b in solved.buffers}
    assert {"b1#slot0", "b1#slot1", "b1#slot2", "b4#slot2"} <= set(offsets)
    pipelined = original.pipelined(["b1", "b4"], 3)
    check_unrolled(original, plan.Solution(pipelined, offsets), 3)  # type: ignore[arg-type]
    assert main(["plan", str(DATA / "input.12.csv"), "--double-buffer", "zz"]) == 2
    assert "unknown buffer" in capsys.readouterr().err
