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
number of such pairs. Above what the time left allows to list (`pairs_listable`: a million
pairs always, up to `MAX_LISTED_PAIRS` with time), or when a deadline passes before the first
rule is done, the start is `linear_scan`: buffers placed as a runtime allocator would, in order
of their start, each at the lowest free range at that moment (on top of everything once the
deadline has passed), in O(n log n) plus the free list.
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from npumem.plan.problem import Problem

__all__ = [
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
"""Pairs of buffers live at the same time that the greedy rules (and the search, which needs
the pairs too) always list, whatever the time left (about 0.3 s)."""

MAX_LISTED_PAIRS = 8_000_000
"""The most pairs they list, given time (about 2.5 s and a few hundred megabytes); above it,
or above what the time left allows (`LISTED_PAIRS_PER_SECOND`), `linear_scan` places the
buffers instead."""

LISTED_PAIRS_PER_SECOND = 1_000_000
"""Pairs listed per second of the time left: listing takes about 0.3 us a pair, so a third of
the time at most, and the rules and the search have the rest."""

LINEAR_SCAN = "linear-scan"
"""The rule name of a start that `linear_scan` made."""

_CHECK_EVERY = 64
"""Placements between two looks at the clock when a deadline is given."""

_LATE_WALK = 64
"""The free ranges `linear_scan` looks at for one buffer once its deadline has passed."""


class _DeadlinePassed(Exception):
    """A placement pass stopped at its deadline."""


@dataclass(frozen=True, slots=True)
class GreedyResult:
    """Offsets (in problem order) found by one rule, the arena they need and the time taken."""

    rule: str
    offsets: tuple[int, ...]
    arena_size: int
    seconds: float


def place_in_order(
    problem: Problem, order: Sequence[int], *, best_fit: bool, deadline: float | None = None
) -> list[int]:
    """Place the buffers in `order` (indices; pinned buffers may be left out), each in the best
    (`best_fit`) or the lowest gap among the already placed buffers live at the same time.
    With `deadline` (a `time.perf_counter()` value), raises `_DeadlinePassed` once it has
    passed."""
    buffers = problem.buffers
    neighbors = problem.neighbors
    offsets: list[int] = [-1] * len(buffers)
    pinned = [i for i, b in enumerate(buffers) if b.offset is not None]
    for i in pinned:
        offset = buffers[i].offset
        assert offset is not None
        offsets[i] = offset
    for count, i in enumerate(order):
        if deadline is not None and count % _CHECK_EVERY == 0 and time.perf_counter() >= deadline:
            raise _DeadlinePassed
        b = buffers[i]
        if b.offset is not None:
            continue
        size = b.size
        mask = b.alignment - 1
        occupied = sorted(
            (offsets[j], offsets[j] + buffers[j].size) for j in neighbors[i] if offsets[j] >= 0
        )
        cursor = 0
        chosen = -1
        chosen_gap = -1
        for start, end in occupied:
            if start > cursor:
                aligned = (cursor + mask) & ~mask
                if aligned + size <= start:
                    if not best_fit:
                        chosen = aligned
                        break
                    gap = start - cursor
                    if chosen < 0 or gap < chosen_gap:
                        chosen, chosen_gap = aligned, gap
            cursor = max(cursor, end)
        if chosen < 0:
            chosen = (cursor + mask) & ~mask
        offsets[i] = chosen
    return offsets


def linear_scan(problem: Problem, *, deadline: float | None = None) -> list[int]:
    """Offsets as a runtime allocator would give them: buffers in order of their start (then
    problem order), each at the lowest aligned free range at that moment, above every pinned
    buffer; a buffer's range is free again once it ends. Always valid (of two buffers live at
    the same time, the later one is placed while the earlier one is live), in O(n log n) plus
    the walks of the free list. A walk is skipped when no free range is long enough (the
    longest is kept in a heap), and, once `deadline` (a `time.perf_counter()` value) has
    passed, looks at the lowest `_LATE_WALK` ranges only (a buffer that fits none of them
    goes on top of what is live): the time then stays O(n log n) plus the list's updates,
    whatever the fragments."""
    buffers = problem.buffers
    base = max((b.offset + b.size for b in buffers if b.offset is not None), default=0)
    offsets = [b.offset if b.offset is not None else -1 for b in buffers]
    events = sorted(
        [(b.upper, 0, i) for i, b in enumerate(buffers) if b.offset is None]
        + [(b.lower, 1, i) for i, b in enumerate(buffers) if b.offset is None]
    )
    free: list[tuple[int, int]] = []  # sorted, disjoint, not touching: (start, end) below top
    # (-length, start, end) of every range in `free`, and of some gone since (checked on pop).
    longest: list[tuple[int, int, int]] = []
    ranges: set[tuple[int, int]] = set()

    def add(at: int, lo: int, hi: int) -> None:
        free.insert(at, (lo, hi))
        ranges.add((lo, hi))
        heapq.heappush(longest, (lo - hi, lo, hi))

    def longest_now() -> int:
        while longest and (longest[0][1], longest[0][2]) not in ranges:
            heapq.heappop(longest)
        return -longest[0][0] if longest else 0

    top = base
    walking = True
    for count, (_, starts, i) in enumerate(events):
        if walking and deadline is not None and count % _CHECK_EVERY == 0:
            walking = time.perf_counter() < deadline
        b = buffers[i]
        if not starts:  # the range [offset, offset + size) is free again
            lo, hi = offsets[i], offsets[i] + b.size
            at = bisect.bisect_left(free, (lo, hi))
            if at > 0 and free[at - 1][1] == lo:
                at -= 1
                ranges.discard(free[at])
                lo = free.pop(at)[0]
            if at < len(free) and free[at][0] == hi:
                ranges.discard(free[at])
                hi = free.pop(at)[1]
            if hi == top:
                top = lo
            else:
                add(at, lo, hi)
            continue
        mask = b.alignment - 1
        if longest_now() >= b.size:
            for k, (lo, hi) in enumerate(free if walking else free[:_LATE_WALK]):
                start = (lo + mask) & ~mask
                if start + b.size <= hi:
                    del free[k]
                    ranges.discard((lo, hi))
                    for piece in ((start + b.size, hi), (lo, start)):
                        if piece[0] < piece[1]:
                            add(k, *piece)
                    offsets[i] = start
                    break
        if offsets[i] < 0:
            start = (top + mask) & ~mask
            if start > top:
                add(len(free), top, start)
            offsets[i] = start
            top = start + b.size
    return offsets


def pairs_listable(problem: Problem, seconds_left: float | None) -> bool:
    """Whether the rules and the search may list the pairs of buffers of `problem` live at the
    same time, with `seconds_left` of the time limit (`None`: no limit): `MAX_RULE_PAIRS`
    always, more with the time to list them, never above `MAX_LISTED_PAIRS`."""
    if seconds_left is None:
        return problem.overlap_pairs <= MAX_LISTED_PAIRS
    # In floats: a limit of 1e303 s is a number of pairs no int conversion takes.
    allowed = max(MAX_RULE_PAIRS, seconds_left * LISTED_PAIRS_PER_SECOND)
    return problem.overlap_pairs <= min(MAX_LISTED_PAIRS, allowed)


def _arena(problem: Problem, offsets: Sequence[int]) -> int:
    return max((o + b.size for o, b in zip(offsets, problem.buffers, strict=True)), default=0)


def _by(problem: Problem, key: Callable[[int], tuple[int, ...]]) -> list[int]:
    return sorted(range(len(problem.buffers)), key=key)


def _size_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    return _by(problem, lambda i: (-bs[i].size, bs[i].lower, i))


def _duration_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    return _by(problem, lambda i: (-bs[i].lifetime, -bs[i].size, bs[i].lower, i))


def _conflict_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    nb = problem.neighbors
    return _by(problem, lambda i: (-len(nb[i]), -bs[i].size, bs[i].lower, i))


def _execution_order(problem: Problem) -> list[int]:
    bs = problem.buffers
    return _by(problem, lambda i: (bs[i].lower, -bs[i].size, i))


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


class _Passes:
    """Placement passes computed once and shared by the rules that use them."""

    def __init__(self, problem: Problem, deadline: float | None = None) -> None:
        self.problem = problem
        self.deadline = deadline
        self.cache: dict[tuple[str, bool], list[int]] = {}

    def get(self, order: str, best_fit: bool) -> list[int]:
        key = (order, best_fit)
        if key not in self.cache:
            self.cache[key] = place_in_order(
                self.problem,
                _ORDERS[order](self.problem),
                best_fit=best_fit,
                deadline=self.deadline,
            )
        return self.cache[key]

    def rule(self, name: str) -> list[int]:
        """The rule's offsets; raises `_DeadlinePassed` when the deadline passes first."""
        candidates = []
        for order, fit in _RULE_PASSES[name]:
            try:
                candidates.append(self.get(order, fit))
            except _DeadlinePassed:
                if not candidates:
                    raise
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
    """Run one rule of `GREEDY_RULES` and time it."""
    try:
        fn = GREEDY_RULES[rule]
    except KeyError:
        raise ValueError(
            f"unknown greedy rule {rule!r}; known: {', '.join(GREEDY_RULES)}"
        ) from None
    start = time.perf_counter()
    offsets = fn(problem)
    seconds = time.perf_counter() - start
    return GreedyResult(rule, tuple(offsets), _arena(problem, offsets), seconds)


def best_greedy(
    problem: Problem, rules: Sequence[str] | None = None, *, deadline: float | None = None
) -> GreedyResult:
    """Run every rule (or those named) and return the one with the smallest arena (the first
    such rule on a tie); its `seconds` is the time all the rules took together. Passes two
    rules share are computed once. With `deadline` (a `time.perf_counter()` value) the
    rules stop once it has passed, the first one too; when no rule finished in time, or the
    problem has more pairs of buffers live together than the time left allows to list
    (`pairs_listable`), the result is `linear_scan`'s (rule `"linear-scan"`)."""
    start = time.perf_counter()
    names = list(rules or GREEDY_RULES)
    unknown = [r for r in names if r not in _RULE_PASSES]
    if unknown:
        raise ValueError(f"unknown greedy rule(s) {unknown}; known: {', '.join(GREEDY_RULES)}")
    best: tuple[str, list[int], int] | None = None
    left = None if deadline is None else deadline - time.perf_counter()
    if pairs_listable(problem, left):
        passes = _Passes(problem, deadline)
        for name in names:
            try:
                offsets = passes.rule(name)
            except _DeadlinePassed:
                break
            arena = _arena(problem, offsets)
            if best is None or arena < best[2]:
                best = (name, offsets, arena)
    if best is None:
        offsets = linear_scan(problem, deadline=deadline)
        best = (LINEAR_SCAN, offsets, _arena(problem, offsets))
    return GreedyResult(best[0], tuple(best[1]), best[2], time.perf_counter() - start)
