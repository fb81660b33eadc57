"""`solve` stops as soon as a candidate meets the lower bound: the greedy phase ends at the first
candidate at the bound (the linear scan, a rule, or the first pass of a rule of two), the rules
after it are not run and the search does not start."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from npumem import plan
from npumem.plan import Buffer, Problem, best_greedy, lower_bound, run_rule, solve
from npumem.plan import greedy as greedy_module
from npumem.plan.bounds import live_bytes
from npumem.plan.greedy import linear_scan


def scan_arena(problem: Problem) -> int:
    return max(o + b.size for o, b in zip(linear_scan(problem), problem.buffers, strict=True))


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Counts the greedy rules' placement passes (one entry per pass, its `best_fit`)."""
    seen: list[bool] = []
    original = greedy_module.place_in_order

    def counting(
        problem: Problem, order: Sequence[int], *, best_fit: bool, deadline: float | None = None
    ) -> list[int]:
        seen.append(best_fit)
        return original(problem, order, best_fit=best_fit, deadline=deadline)

    monkeypatch.setattr(greedy_module, "place_in_order", counting)
    return seen


def identical(n: int, seed: int, alignment: int = 1) -> Problem:
    """Buffers of one size with random live ranges: the linear scan packs them at the bound."""
    rng = random.Random(seed)
    buffers = []
    for i in range(n):
        lower = rng.randrange(n // 4)
        size = 1000 if alignment > 1 else 4096
        buffers.append(Buffer(f"i{i}", lower, lower + 1 + rng.randrange(30), size, alignment))
    return Problem(buffers)


@pytest.mark.parametrize("alignment", [1, 1024])
def test_a_scan_at_the_bound_ends_solve_before_any_rule(passes: list[bool], alignment: int) -> None:
    problem = identical(2000, seed=1, alignment=alignment)
    bound = lower_bound(problem)
    if alignment > 1:
        # The alignment-aware bound, above the live bytes, is the one met.
        assert bound > live_bytes(problem)
    assert scan_arena(problem) == bound
    solution = solve(problem, time_limit=20.0)
    solution.validate()
    assert solution.status == plan.OPTIMAL
    assert solution.arena_size == solution.lower_bound == bound
    assert solution.stats.greedy_rule == "linear-scan"
    assert solution.stats.runs == 0 and solution.stats.nodes == 0
    assert passes == []  # no greedy rule ran


# The linear scan packs these in 16 bytes, TFLite's rule (the first) at the bound, 11.
TFLITE_AT_THE_BOUND = [("b0", 4, 7, 9), ("b1", 1, 3, 5), ("b2", 2, 5, 2)]


def test_the_first_rule_at_the_bound_ends_the_greedy_phase(passes: list[bool]) -> None:
    problem = Problem([Buffer(*row) for row in TFLITE_AT_THE_BOUND])
    assert lower_bound(problem) == 11 < scan_arena(problem) == 16
    solution = solve(problem, time_limit=20.0)
    assert (solution.stats.greedy_rule, solution.arena_size) == ("tflite", 11)
    assert solution.status == plan.OPTIMAL and solution.stats.runs == 0
    assert passes == [True]  # TFLite's one pass; the other rules' passes were not run


def test_a_rule_of_two_passes_stops_after_a_first_pass_at_the_goal(passes: list[bool]) -> None:
    problem = Problem([Buffer(*row) for row in TFLITE_AT_THE_BOUND])
    greedy = best_greedy(problem, ["xla"], goal=lower_bound(problem))
    assert (greedy.rule, greedy.arena_size) == ("xla", 11)
    assert passes == [True]  # size-ordered best fit only, not the duration-ordered pass
    # Without a goal both passes run, as before.
    passes.clear()
    assert best_greedy(problem, ["xla"]).arena_size == 11
    assert len(passes) == 2


def test_a_goal_the_scan_meets_returns_the_scan_without_rules(passes: list[bool]) -> None:
    problem = Problem([Buffer(*row) for row in TFLITE_AT_THE_BOUND])
    greedy = best_greedy(problem, deadline=1e300, goal=16)
    assert (greedy.rule, greedy.arena_size) == ("linear-scan", 16)
    assert passes == []
    # A goal nothing meets runs every rule, and the best candidate is the result.
    greedy = best_greedy(problem, deadline=1e300, goal=10)
    assert greedy.arena_size == min(run_rule(problem, r).arena_size for r in plan.GREEDY_RULES)


@pytest.mark.parametrize(
    ("goal", "error"),
    [
        (-1, plan.PlanArgumentError),
        (1.5, plan.PlanArgumentTypeError),
        (True, plan.PlanArgumentTypeError),
        ("8", plan.PlanArgumentTypeError),
    ],
)
def test_a_bad_goal_is_refused(goal: object, error: type[Exception]) -> None:
    problem = Problem([Buffer(*row) for row in TFLITE_AT_THE_BOUND])
    with pytest.raises(error, match="goal"):
        best_greedy(problem, goal=goal)  # type: ignore[arg-type]


def test_with_a_capacity_the_first_candidate_that_fits_ends_solve(passes: list[bool]) -> None:
    """The scan fits a generous capacity: no rule runs and the search does not start."""
    problem = Problem([Buffer(*row) for row in TFLITE_AT_THE_BOUND])
    assert lower_bound(problem) == 11 < scan_arena(problem) == 16
    solution = solve(problem, time_limit=20.0, capacity=16)
    assert solution.fits and solution.arena_size == 16
    assert solution.stats.greedy_rule == "linear-scan" and solution.stats.runs == 0
    assert passes == []
    # Below the scan's arena, the rules run as before and TFLite's packing fits.
    solution = solve(problem, time_limit=20.0, capacity=15)
    assert solution.fits and solution.arena_size == 11 and passes == [True]
