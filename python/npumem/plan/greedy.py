"""The one-pass greedy rules production runtimes use, as a starting point and a yardstick.

Each rule visits the buffers in one order and puts each at a free address range among the buffers
already placed that are live at the same time (pinned buffers are placed first, where they are
pinned):

=============== ============================================ =====================================
rule            order                                        position
=============== ============================================ =====================================
`tflite`      size, largest first                          best fit: the smallest gap that fits
`tflm`        size, largest first                          first fit: the lowest gap that fits
`xla`         best of size-ordered and duration-ordered    best fit
`tvm`         best of size-ordered and conflict-ordered    first fit
`onnxruntime` execution order (start of the live range)    best fit
=============== ============================================ =====================================

A buffer that fits no gap goes on top of everything live with it. Ties in an order are broken by
the start, then the position in the problem, so every rule is deterministic.

The rules look at every pair of buffers live at the same time, so their cost grows with the
number of such pairs, but they never list them: the core (`PlanTimeline.place_in_order`) finds
the buffers live with each one as it places it, in O(n log n) memory. With a deadline (as
`npumem.plan.solve` always gives), `best_greedy` first runs `linear_scan`: buffers placed as a
runtime allocator would, in order of their start, each at the lowest free range at that moment
(past the deadline, a buffer looks at a bounded number of ranges), in O(n log n) plus the
ranges too short for a buffer in its own length class, a fraction of one rule's time. It is a
candidate beside the rules: the start is the smallest of the rules that finished before the
deadline and the scan (a rule on a tie), so it is never worse than the scan, and it is the
scan when no rule finished. Given a goal (`solve` gives the lower bound, or with a capacity
the larger of the bound and the capacity), the first candidate at or below it is the start
and nothing after it runs: no packing is smaller than the bound, and with a capacity one
that fits is the answer, even where a later rule would pack tighter. The search,
which does list the pairs, runs only below what the time left allows to list
(`pairs_listable`: a million pairs always, up to `MAX_LISTED_PAIRS` with time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from npumem._shown import shown
from npumem.plan.errors import PlanArgumentError, PlanArgumentTypeError
from npumem.plan.problem import MAX_PLAN_BYTES, Problem, check_problem

__all__ = [
    "BEYOND",
    "GREEDY_RULES",
    "LINEAR_SCAN",
    "LISTED_PAIRS_PER_SECOND",
    "MAX_LISTED_PAIRS",
    "MAX_RULE_PAIRS",
    "GreedyResult",
    "best_greedy",
    "linear_scan",
    "pairs_listable",
    "place_in_order",
    "run_rule",
]

MAX_RULE_PAIRS = 1_000_000
"""Pairs of buffers live at the same time that the search (which lists them) always allows,
whatever the time left (about 0.3 s to list). The greedy rules list no pairs."""

MAX_LISTED_PAIRS = 8_000_000
"""The most pairs the search lists, given time (about 2.5 s and a few hundred megabytes);
above it, or above what the time left allows (`LISTED_PAIRS_PER_SECOND`), the greedy start
is the answer."""

LISTED_PAIRS_PER_SECOND = 1_000_000
"""Pairs listed per second of the time left: listing takes about 0.3 us a pair, so a third of
the time at most, and the search has the rest."""

BEYOND = MAX_PLAN_BYTES + 1
"""The offset a placement reports for a buffer it put beyond what a plan addresses (buffers
that together need more than `MAX_PLAN_BYTES`): every arena with it is too large for a plan,
so the search looks for a better one, and `solve` raises `PlanTooLargeError` when none is
found."""

LINEAR_SCAN = "linear-scan"
"""The rule name of a start that `linear_scan` made."""


class _DeadlinePassed(Exception):
    """A placement pass stopped at its deadline."""


@dataclass(frozen=True, slots=True)
class GreedyResult:
    """Offsets (in problem order) found by one rule, the arena they need and the time taken."""

    rule: str
    offsets: tuple[int, ...]
    arena_size: int
    seconds: float


def _seconds_left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.perf_counter()


def place_in_order(
    problem: Problem, order: Sequence[int], *, best_fit: bool, deadline: float | None = None
) -> list[int]:
    """Place the buffers in `order` (indices; pinned buffers may be left out), each in the best
    (`best_fit`) or the lowest gap among the already placed buffers live at the same time, at
    the lowest aligned offset of that gap; a buffer that fits no gap goes on top of them.
    Buffers neither pinned nor in `order` get -1, those in `order` placed beyond what a plan
    addresses `BEYOND`. With `deadline` (a `time.perf_counter()`
    value), raises `_DeadlinePassed` once it has passed. Runs in the core
    (`PlanTimeline.place_in_order`), which finds the buffers live with each one without
    listing the pairs."""
    offsets = problem.timeline.place_in_order(list(order), best_fit, _seconds_left(deadline))
    if offsets is None:
        raise _DeadlinePassed
    if min(offsets, default=0) < 0:
        # The core gives -1 for a buffer it placed beyond 64-bit signed offsets too.
        for i in order:
            if offsets[i] < 0:
                offsets[i] = BEYOND
    return offsets


def linear_scan(problem: Problem, *, deadline: float | None = None) -> list[int]:
    """Offsets as a runtime allocator would give them: buffers in order of their start (then
    problem order), each at the lowest aligned free range at that moment, above every pinned
    buffer; a buffer's range is free again once it ends. Always valid (of two buffers live at
    the same time, the later one is placed while the earlier one is live). The free ranges are
    kept by address and by length class (the floor of the length's base-2 logarithm): a
    buffer's search skips the classes too short for it, takes the lowest range of the classes
    whose every range holds it (at least its size plus its alignment long), and below that
    walks the classes in between, so the time is O(n log n) plus the ranges there that it
    looks at and that are too short. Once `deadline` (a `time.perf_counter()` value) has
    passed, a search looks at 64 such ranges at most, then at the lowest range of each class
    in between only: a buffer may go higher than the lowest range that holds it, but not on
    top while a range surely holds it. Runs in the core (`PlanTimeline.linear_scan`). A
    buffer placed
    beyond what a plan addresses (the buffers need more than that together) gets `BEYOND`."""
    offsets = problem.timeline.linear_scan(_seconds_left(deadline))
    if min(offsets, default=0) < 0:  # the core's -1: beyond 64-bit signed offsets
        offsets = [BEYOND if o < 0 else o for o in offsets]
    return offsets


def pairs_listable(problem: Problem, seconds_left: float | None) -> bool:
    """Whether the search may list the pairs of buffers of `problem` live at the
    same time, with `seconds_left` of the time limit (`None`: no limit): `MAX_RULE_PAIRS`
    always, more with the time to list them, never above `MAX_LISTED_PAIRS`."""
    if seconds_left is None:
        return problem.overlap_pairs <= MAX_LISTED_PAIRS
    # In floats: a limit of 1e303 s is a number of pairs no int conversion takes.
    allowed = max(MAX_RULE_PAIRS, seconds_left * LISTED_PAIRS_PER_SECOND)
    return problem.overlap_pairs <= min(MAX_LISTED_PAIRS, allowed)


def _arena(problem: Problem, offsets: Sequence[int]) -> int:
    return max((o + b.size for o, b in zip(offsets, problem.buffers, strict=True)), default=0)


def _by(problem: Problem, *keys: list[int]) -> list[int]:
    """The buffer indices sorted by `keys` (a value per buffer each: the first key, then the
    next on a tie, then the index): one stable sort per key, the last key first, with a list
    lookup for a key (no tuple per buffer, which a million buffers make slow)."""
    order = list(range(len(problem.buffers)))
    for key in reversed(keys):
        order.sort(key=key.__getitem__)
    return order


def _size_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    return _by(problem, [-b.size for b in bs], [b.lower for b in bs])


def _duration_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    return _by(problem, [-b.lifetime for b in bs], [-b.size for b in bs], [b.lower for b in bs])


def _conflict_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    counts = [-c for c in problem.overlap_counts]
    return _by(problem, counts, [-b.size for b in bs], [b.lower for b in bs])


def _execution_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    return _by(problem, [b.lower for b in bs], [-b.size for b in bs])


_ORDERS: dict[str, Callable[[Problem], list[int]]] = {
    "size": _size_order,
    "duration": _duration_order,
    "conflicts": _conflict_order,
    "execution": _execution_order,
}

_RULE_PASSES: dict[str, tuple[tuple[str, bool], ...]] = {
    "tflite": (("size", True),),
    "tflm": (("size", False),),
    "xla": (("size", True), ("duration", True)),
    "tvm": (("size", False), ("conflicts", False)),
    "onnxruntime": (("execution", True),),
}
"""Each rule as its (order, best fit?) passes; a rule with several keeps the best."""


ORDER_SAMPLE = 4096
"""Buffers of the sample whose order `_order_seconds` times to tell how long the whole order
takes to sort."""


def _order_seconds(problem: Problem, order: str) -> float:
    """About how long `_ORDERS[order](problem)` takes: the time it takes on the first
    `ORDER_SAMPLE` buffers, scaled by n log n (0 for a problem not much larger than that)."""
    n = len(problem.buffers)
    if n <= 4 * ORDER_SAMPLE:
        return 0.0
    sample = Problem(problem.buffers[:ORDER_SAMPLE], _checked=True)
    start = time.perf_counter()
    _ORDERS[order](sample)
    seconds = time.perf_counter() - start
    return seconds * (n * math.log(n)) / (ORDER_SAMPLE * math.log(ORDER_SAMPLE))


class _Passes:
    """Placement passes computed once and shared by the rules that use them."""

    def __init__(self, problem: Problem, deadline: float | None = None) -> None:
        self.problem = problem
        self.deadline = deadline
        self.cache: dict[tuple[str, bool], list[int]] = {}

    def get(self, order: str, best_fit: bool) -> list[int]:
        key = (order, best_fit)
        if key not in self.cache:
            # Checked before the order is sorted too: that sort alone takes seconds on millions
            # of buffers and cannot stop at the deadline, so it starts only when the time
            # left is enough to finish it.
            if self.deadline is not None and (
                time.perf_counter() >= self.deadline
                or time.perf_counter() + _order_seconds(self.problem, order) >= self.deadline
            ):
                raise _DeadlinePassed
            self.cache[key] = place_in_order(
                self.problem,
                _ORDERS[order](self.problem),
                best_fit=best_fit,
                deadline=self.deadline,
            )
        return self.cache[key]

    def rule(self, name: str, goal: int | None = None) -> list[int]:
        """The rule's offsets; raises `_DeadlinePassed` when the deadline passes first. A pass
        whose arena is at most `goal` ends the rule: the rule's later passes are not run."""
        candidates = []
        for order, fit in _RULE_PASSES[name]:
            try:
                candidates.append(self.get(order, fit))
            except _DeadlinePassed:
                if not candidates:
                    raise
                break
            if goal is not None and _arena(self.problem, candidates[-1]) <= goal:
                break
        return min(candidates, key=lambda offsets: _arena(self.problem, offsets))


def _rule_fn(name: str) -> Callable[[Problem], list[int]]:
    def run(problem: Problem) -> list[int]:
        return _Passes(problem).rule(name)

    run.__name__ = f"_{name}"
    return run


GREEDY_RULES: dict[str, Callable[[Problem], list[int]]] = {
    name: _rule_fn(name) for name in _RULE_PASSES
}
"""The rules by name; each maps a problem to offsets in problem order."""


def run_rule(problem: Problem, rule: str) -> GreedyResult:
    """Run one rule of `GREEDY_RULES` and time it. A name that is not one of them raises
    `PlanArgumentError` (`PlanArgumentTypeError` for a value that is not a string, or a
    `problem` that is not a `Problem`)."""
    check_problem(problem, "run_rule()")
    if not isinstance(rule, str):
        raise PlanArgumentTypeError(
            f"rule must be the name of a greedy rule ({', '.join(GREEDY_RULES)}), got "
            f"{type(rule).__name__}"
        )
    try:
        fn = GREEDY_RULES[rule]
    except KeyError:
        raise PlanArgumentError(
            f"unknown greedy rule {shown(rule)}; the rules are {', '.join(GREEDY_RULES)}"
        ) from None
    start = time.perf_counter()
    offsets = fn(problem)
    seconds = time.perf_counter() - start
    return GreedyResult(rule, tuple(offsets), _arena(problem, offsets), seconds)


def best_greedy(
    problem: Problem,
    rules: Sequence[str] | None = None,
    *,
    deadline: float | None = None,
    goal: int | None = None,
) -> GreedyResult:
    """Run every rule (or those named) and return the one with the smallest arena (the first
    such rule on a tie); its `seconds` is the time all the rules took together. Passes two
    rules share are computed once. A name that is not one of `GREEDY_RULES` raises
    `PlanArgumentError`.

    With `deadline` (a `time.perf_counter()` value) `linear_scan` runs first (it costs a
    fraction of one rule) and is a candidate beside the rules, so the result is never worse
    than it: its packing (rule `"linear-scan"`) is the result when it is smaller than every
    rule that finished, or when no rule finished; on a tie the rules win, in their order. The
    rules stop once the deadline has passed, the first one too. Without a deadline only the
    rules run.

    With `goal` (bytes; `solve` gives the lower bound, or with a capacity the larger of the
    bound and the capacity), the first candidate whose arena is at
    most `goal` is the result and nothing after it runs: the scan when it meets the goal, else
    the first rule (in order) that does, a rule of two passes ending after the first when that
    one does. When `goal` is a lower bound, the candidates after that one could only tie.

    A `problem` that is not a `Problem`, `rules` that are not a list of names, a `deadline`
    that is not a number or a `goal` that is not a whole number raise
    `PlanArgumentTypeError`; a negative `goal` raises `PlanArgumentError`."""
    check_problem(problem, "best_greedy()")
    if rules is not None and (
        isinstance(rules, str)
        or not isinstance(rules, Sequence)
        or not all(isinstance(r, str) for r in rules)
    ):
        raise PlanArgumentTypeError(
            f"rules must be None or a list of greedy rule names, got {shown(rules)}"
        )
    if deadline is not None and (
        isinstance(deadline, bool) or not isinstance(deadline, int | float)
    ):
        raise PlanArgumentTypeError(
            f"deadline must be None or a time.perf_counter() value, got {shown(deadline)}"
        )
    if isinstance(goal, bool) or not (goal is None or isinstance(goal, int)):
        raise PlanArgumentTypeError(
            f"goal must be None or a whole number of bytes, got {shown(goal)}"
        )
    if goal is not None and goal < 0:
        raise PlanArgumentError(f"goal must be >= 0, got {goal}")
    start = time.perf_counter()
    names = list(rules or GREEDY_RULES)
    unknown = [r for r in names if r not in _RULE_PASSES]
    if unknown:
        raise PlanArgumentError(
            f"unknown greedy rule(s) {unknown}; the rules are {', '.join(GREEDY_RULES)}"
        )
    scan: tuple[str, list[int], int] | None = None
    if deadline is not None:
        # Before the rules, while the deadline has not passed: past it, the scan looks at the
        # lowest free ranges only.
        offsets = linear_scan(problem, deadline=deadline)
        scan = (LINEAR_SCAN, offsets, _arena(problem, offsets))
        if goal is not None and scan[2] <= goal:
            return GreedyResult(LINEAR_SCAN, tuple(offsets), scan[2], time.perf_counter() - start)
    best: tuple[str, list[int], int] | None = None
    passes = _Passes(problem, deadline)
    for name in names:
        try:
            offsets = passes.rule(name, goal)
        except _DeadlinePassed:
            break
        arena = _arena(problem, offsets)
        if best is None or arena < best[2]:
            best = (name, offsets, arena)
        if goal is not None and arena <= goal:
            break
    if scan is not None and (best is None or scan[2] < best[2]):
        best = scan
    assert best is not None  # some rule finished, or the scan ran (a deadline was given)
    return GreedyResult(best[0], tuple(best[1]), best[2], time.perf_counter() - start)
