"""Lower bounds on the arena size of a problem.

Every packing needs at least:

* `live_bytes`: the most bytes live at one time. The live ranges form an interval graph, whose
  maximum-weight clique is exactly the set of buffers live at one instant, so this is also the
  clique bound. MiniMalloc's suite calls it LB.
* `alignment_bound`: the buffers live at one instant that are aligned to at least `g` bytes
  all start at multiples of `g`, so each of them but the topmost takes its size rounded up to
  `g` (the next one starts at a multiple of `g` after its end). The topmost needs only its size:
  so, for every alignment `g` of the problem, their rounded sizes less the largest padding of
  one of them. With `g` the smallest alignment live at that instant, this counts every buffer
  live there.
* `fixed_bound`: the highest end of a pinned (fixed-offset) buffer.

`lower_bound()` is the largest of these. The search in `npumem.plan.search` may prove a
stronger one (an exhausted search at capacity `c` proves `c + 1`); `npumem.plan.solve()`
reports whichever is larger.
"""

from __future__ import annotations

from collections import Counter

from npumem.plan.problem import Problem, check_problem

__all__ = ["alignment_bound", "fixed_bound", "live_bytes", "live_profile", "lower_bound"]


def _events(problem: Problem) -> list[tuple[int, int, int]]:
    """(time, +1 start / -1 end, buffer index), ends before starts at the same time."""
    events: list[tuple[int, int, int]] = []
    for i, b in enumerate(problem.buffers):
        events.append((b.lower, 1, i))
        events.append((b.upper, -1, i))
    events.sort(key=lambda e: (e[0], e[1]))
    return events


def live_profile(problem: Problem) -> list[tuple[int, int]]:
    """The bytes live over time, as `(time, bytes live from this time on)` steps."""
    profile: list[tuple[int, int]] = []
    live = 0
    for time, kind, i in _events(problem):
        live += kind * problem.buffers[i].size
        if profile and profile[-1][0] == time:
            profile[-1] = (time, live)
        else:
            profile.append((time, live))
    return profile


def live_bytes(problem: Problem) -> int:
    """The most bytes live at any one time (LB): max over t of the sizes of buffers live at t."""
    return max((live for _, live in live_profile(problem)), default=0)


def alignment_bound(problem: Problem) -> int:
    """The largest, over each instant and each alignment `g` of the problem, of the sizes of the
    buffers live there that are aligned to at least `g`, each rounded up to `g`, less the largest
    padding of one of them (see the module docstring); and never below `live_bytes`."""
    alignments = sorted({b.alignment for b in problem.buffers})
    if alignments in ([], [1]):
        return live_bytes(problem)
    # Per alignment g: the live buffers aligned to at least g, as (rounded size, padding).
    live: dict[int, Counter[tuple[int, int]]] = {g: Counter() for g in alignments}
    best = 0
    events = _events(problem)
    for k, (time, kind, i) in enumerate(events):
        b = problem.buffers[i]
        for g in alignments:
            if b.alignment < g:
                break
            rounded = -(-b.size // g) * g
            live[g][rounded, rounded - b.size] += kind
            live[g] = +live[g]  # drop what ended
        if k + 1 < len(events) and events[k + 1][0] == time:
            continue  # evaluate once all events at this time are applied
        for held in live.values():
            if held:
                total = sum(rounded * n for (rounded, _), n in held.items())
                best = max(best, total - max(padding for _, padding in held))
    return max(best, live_bytes(problem))


def fixed_bound(problem: Problem) -> int:
    """The highest byte used by a buffer with a fixed offset (0 when none is fixed)."""
    return max((b.offset + b.size for b in problem.buffers if b.offset is not None), default=0)


def lower_bound(problem: Problem) -> int:
    """The strongest of the bounds above: no packing of `problem` can be smaller. The live
    bytes and alignment bounds come from one sweep in the core (`PlanTimeline.live_bound`),
    the same sums as `alignment_bound`, in O(n log n) for each alignment of the problem.
    A `problem` that is not a `Problem` raises `PlanArgumentTypeError`."""
    check_problem(problem, "lower_bound()")
    return max(problem.timeline.live_bound(), fixed_bound(problem))
