"""Problems near the 2^63 - 1 bytes a plan addresses (`MAX_PLAN_BYTES`): a problem is refused
only when no plan can fit within it; every plan that validates is read back as it was written;
and `solve` raises `PlanTooLargeError` when it finds no plan within the limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_contract import run_cli
from npumem.plan import (
    Buffer,
    PlanTooLargeError,
    Problem,
    ProblemFormatError,
    Solution,
    solve,
)
from npumem.plan.problem import MAX_PLAN_BYTES

# Live at the same time: `a` (10 bytes) and `b` (20 bytes).
PAIR = Problem([Buffer("a", 0, 2, 10), Buffer("b", 1, 3, 20)])


def _near_top_plan() -> Solution:
    """`a` pinned so that it ends at exactly the last addressable byte, `b` at 0."""
    solution = Solution(PAIR, {"a": MAX_PLAN_BYTES - 10, "b": 0})
    solution.validate()
    return solution


def test_a_plan_that_ends_at_the_limit_reads_back_from_csv_and_json(tmp_path: Path) -> None:
    solution = _near_top_plan()
    for name in ("plan.csv", "plan.json"):
        path = tmp_path / name
        (solution.to_csv if name.endswith(".csv") else solution.to_json)(path)
        read = Problem.from_csv(path) if name.endswith(".csv") else Problem.from_json(path)
        assert {b.id: b.offset for b in read.buffers} == solution.offsets
        again = solve(read, time_limit=1.0)
        assert again.offsets == solution.offsets
        assert again.arena_size == MAX_PLAN_BYTES


def test_a_plan_that_ends_at_the_limit_round_trips_through_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "plan.json"
    _near_top_plan().to_json(src)
    out = tmp_path / "again.json"
    status, _, err = run_cli(["plan", str(src), "-o", str(out), "-q"], capsys, output=out)
    assert (status, err) == (0, "")
    written = json.loads(out.read_text())
    assert written["arena_size"] == MAX_PLAN_BYTES
    assert {b["id"]: b["offset"] for b in written["buffers"]} == {"a": MAX_PLAN_BYTES - 10, "b": 0}


def test_a_free_buffer_beside_one_pinned_at_the_top_is_planned() -> None:
    # Sizes, padding and the pinned end add up beyond the limit; the plan is far below it.
    problem = Problem(
        [
            Buffer("top", 0, 2, 10, offset=MAX_PLAN_BYTES - 10),
            Buffer("x", 0, 2, 1 << 40, alignment=1 << 30),
            Buffer("y", 1, 3, 1 << 40, alignment=1 << 30),
        ]
    )
    solution = solve(problem, time_limit=1.0)
    solution.validate()
    assert solution.offsets["top"] == MAX_PLAN_BYTES - 10
    assert sorted([solution.offsets["x"], solution.offsets["y"]]) == [0, 1 << 40]


def test_two_bytes_aligned_to_2_62_live_together_are_planned(tmp_path: Path) -> None:
    problem = Problem(
        [Buffer("p", 0, 1, 1, alignment=1 << 62), Buffer("q", 0, 1, 1, alignment=1 << 62)]
    )
    solution = solve(problem, time_limit=1.0)
    solution.validate()
    assert sorted(solution.offsets.values()) == [0, 1 << 62]
    assert solution.arena_size == (1 << 62) + 1
    assert solution.status == "optimal"
    path = tmp_path / "plan.csv"
    solution.to_csv(path)
    assert {b.id: b.offset for b in Problem.from_csv(path).buffers} == solution.offsets


@pytest.mark.parametrize(
    ("buffers", "message"),
    [
        ([Buffer("big", 0, 1, 1 << 63)], "'big': size 9223372036854775808 is more than"),
        ([Buffer("hi", 0, 1, 2, offset=MAX_PLAN_BYTES - 1)], "'hi': pinned at"),
        ([Buffer(f"b{i}", 0, 1, 1 << 62) for i in range(2)], "need at least 9223372036854775808"),
        # Two aligned to 2^63: one at 0, the other only at 2^63 (the alignment bound says so).
        (
            [Buffer(f"b{i}", 0, 1, 8, alignment=1 << 63) for i in range(2)],
            "need at least 9223372036854775816",
        ),
    ],
)
def test_what_no_plan_can_address_is_refused(buffers: list[Buffer], message: str) -> None:
    with pytest.raises(ProblemFormatError, match="a plan can address") as e:
        Problem(buffers)
    assert message in str(e.value)


def test_a_problem_whose_optimum_passes_the_limit_raises_a_typed_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `x` does not fit below the pinned byte at 2^62 and ends beyond the limit above it; the
    # static bounds (the bytes live at once, the pinned end) are far below the limit.
    problem = Problem(
        [
            Buffer("pin", 0, 2, 1, offset=1 << 62),
            Buffer("x", 0, 2, (1 << 62) + (1 << 61)),
        ]
    )
    with pytest.raises(PlanTooLargeError, match="a plan can address") as e:
        solve(problem, time_limit=5.0)
    assert e.value.proven
    src = tmp_path / "past.csv"
    problem.to_csv(src)
    out = tmp_path / "out.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert err.startswith("npumem plan: error: no plan within the") and err.count("\n") == 1
