"""A plan addresses at most `MAX_PLAN_BYTES` (2^63 - 1) bytes: `Solution(...)`, `validate()` and
every writer refuse an offset at which a buffer would end beyond it with `PlanValidationError`,
and no file gets such an offset."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from npumem.plan import Buffer, PlanValidationError, Problem, Solution
from npumem.plan.problem import MAX_PLAN_BYTES

# Live at the same time: `a` (10 bytes) and `b` (20 bytes).
PROBLEM = Problem([Buffer("a", 0, 2, 10), Buffer("b", 1, 3, 20)])

TOO_FAR = [2**63, 2**64 - 1, 2**64, 2**70, MAX_PLAN_BYTES - 9, MAX_PLAN_BYTES]
"""Offsets of `a` at which it ends beyond MAX_PLAN_BYTES (the first at 2^63, one byte over)."""


@pytest.mark.parametrize("offset", TOO_FAR)
@pytest.mark.parametrize("as_list", [False, True])
def test_a_solution_refuses_an_offset_beyond_what_a_plan_addresses(
    offset: int, as_list: bool
) -> None:
    offsets = [offset, 0] if as_list else {"a": offset, "b": 0}
    with pytest.raises(PlanValidationError, match=r"'a': offset \d+ \+ size 10 ends at") as e:
        Solution(PROBLEM, offsets)
    assert f"{MAX_PLAN_BYTES} bytes (2^63 - 1) a plan can address" in str(e.value)


def test_the_last_addressable_byte_is_the_limit(tmp_path: Path) -> None:
    top = MAX_PLAN_BYTES - 10  # `a` ends at exactly 2^63 - 1
    solution = Solution(PROBLEM, {"a": top, "b": 0})
    solution.validate()
    assert solution.arena_size == MAX_PLAN_BYTES
    assert f"NPUMEM_PLAN_ARENA_SIZE {MAX_PLAN_BYTES}u" in solution.to_c_header()
    written = json.loads(solution.to_json(tmp_path / "plan.json"))
    assert written["arena_size"] == MAX_PLAN_BYTES
    assert written["buffers"][0]["offset"] == top
    assert solution.to_csv().splitlines()[1] == f"a,0,2,10,{top}"
    # One byte further is beyond it.
    with pytest.raises(PlanValidationError, match="a plan can address"):
        Solution(PROBLEM, {"a": top + 1, "b": 0})


WRITERS: dict[str, Callable[[Solution], object]] = {
    "validate": Solution.validate,
    "to_csv": Solution.to_csv,
    "to_json": Solution.to_json,
    "to_json_obj": Solution.to_json_obj,
    "to_c_header": Solution.to_c_header,
}


@pytest.mark.parametrize("offset", [2**63, 2**70])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_offset_changed_beyond_the_limit_is_refused_and_never_written(
    writer: str, offset: int
) -> None:
    solution = Solution(PROBLEM, {"a": 0, "b": 10})
    solution.offsets["a"] = offset  # `offsets` is a plain dict: it may change afterwards
    with pytest.raises(PlanValidationError, match="a plan can address"):
        WRITERS[writer](solution)


@pytest.mark.parametrize("writer", sorted(set(WRITERS) - {"validate"}))
def test_a_negative_or_missing_offset_is_refused_by_every_writer(writer: str) -> None:
    solution = Solution(PROBLEM, {"a": 0, "b": 10})
    solution.offsets["a"] = -1
    with pytest.raises(PlanValidationError, match="is not an integer >= 0"):
        WRITERS[writer](solution)
    del solution.offsets["a"]
    with pytest.raises(PlanValidationError, match="'a' has no offset"):
        WRITERS[writer](solution)


@pytest.mark.parametrize("value", [2**64, 2**70])
def test_a_capacity_or_bound_beyond_what_plan_files_hold_is_refused(value: int) -> None:
    """Plan files hold counts up to 2**64 - 1: a larger capacity would be written and then
    refused by every reader."""
    from npumem.plan import PlanArgumentError, solve

    with pytest.raises(PlanArgumentError, match="at most 2\\*\\*64 - 1"):
        Solution(PROBLEM, [0, 10], capacity=value)
    with pytest.raises(PlanArgumentError, match="at most 2\\*\\*64 - 1"):
        Solution(PROBLEM, [0, 10], lower_bound=value)
    with pytest.raises(PlanArgumentError, match="at most 2\\*\\*64 - 1"):
        Solution(PROBLEM, [0, 10]).validate(capacity=value)
    with pytest.raises(PlanArgumentError, match="at most 2\\*\\*64 - 1"):
        solve(PROBLEM, time_limit=1.0, capacity=value)
    kept = Solution(PROBLEM, [0, 10], capacity=2**64 - 1)
    obj = json.loads(kept.to_json())
    assert kept.fits and obj["capacity"] == 2**64 - 1
    assert len(Problem.from_json(obj).buffers) == 2  # a reader takes the plan back
