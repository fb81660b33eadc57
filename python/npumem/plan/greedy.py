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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from npumem.plan.problem import Problem

__all__ = ["GREEDY_RULES", "GreedyResult", "best_greedy", "place_in_order", "run_rule"]


@dataclass(frozen=True, slots=True)
class GreedyResult:
    """Offsets (in problem order) found by one rule, the arena they need and the time taken."""

    rule: str
    offsets: tuple[int, ...]
    arena_size: int
    seconds: float


def place_in_order(problem: Problem, order: Sequence[int], *, best_fit: bool) -> list[int]:
    """Place the buffers in `order` (indices; pinned buffers may be left out), each in the best
    (`best_fit`) or the lowest gap among the already placed buffers live at the same time."""
    buffers = problem.buffers
    neighbors = problem.neighbors
    offsets: list[int] = [-1] * len(buffers)
    pinned = [i for i, b in enumerate(buffers) if b.offset is not None]
    for i in pinned:
        offset = buffers[i].offset
        assert offset is not None
        offsets[i] = offset
    for i in order:
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

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.cache: dict[tuple[str, bool], list[int]] = {}

    def get(self, order: str, best_fit: bool) -> list[int]:
        key = (order, best_fit)
        if key not in self.cache:
            self.cache[key] = place_in_order(
                self.problem, _ORDERS[order](self.problem), best_fit=best_fit
            )
        return self.cache[key]

    def rule(self, name: str) -> list[int]:
        candidates = [self.get(order, fit) for order, fit in _RULE_PASSES[name]]
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
    rules after the first are skipped once it has passed."""
    start = time.perf_counter()
    names = list(rules or GREEDY_RULES)
    unknown = [r for r in names if r not in _RULE_PASSES]
    if unknown:
        raise ValueError(f"unknown greedy rule(s) {unknown}; known: {', '.join(GREEDY_RULES)}")
    passes = _Passes(problem)
    best: tuple[str, list[int], int] | None = None
    for name in names:
        if best is not None and deadline is not None and time.perf_counter() >= deadline:
            break
        offsets = passes.rule(name)
        arena = _arena(problem, offsets)
        if best is None or arena < best[2]:
            best = (name, offsets, arena)
    assert best is not None
    return GreedyResult(best[0], tuple(best[1]), best[2], time.perf_counter() - start)
