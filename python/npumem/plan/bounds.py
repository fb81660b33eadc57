"""Lower bounds on the arena size of a problem.

Every packing needs at least:

* `live_bytes`: the most bytes live at one time. The live ranges form an interval graph, whose
  maximum-weight clique is exactly the set of buffers live at one instant, so this is also the
  clique bound. MiniMalloc's suite calls it LB.
* `alignment_bound`: when every buffer live at one instant is aligned to at least `g` bytes,
  every offset there is a multiple of `g`, so each buffer but the topmost takes its size rounded
  up to `g`. The topmost one saves at most `g - 1` bytes of that padding.
* `fixed_bound`: the highest end of a pinned (fixed-offset) buffer.

`lower_bound()` is the largest of these. The search in `npumem.plan.search` may prove a
stronger one (an exhausted search at capacity `c` proves `c + 1`); `npumem.plan.solve()`
reports whichever is larger.
"""

from __future__ import annotations

from npumem.plan.problem import Problem

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
    """The live-bytes bound with each size rounded up to the smallest alignment live with it,
    less the padding the topmost buffer may save (see the module docstring)."""
    alignments = sorted({b.alignment for b in problem.buffers})
    if alignments in ([], [1]):
        return live_bytes(problem)
    count = dict.fromkeys(alignments, 0)
    rounded = dict.fromkeys(alignments, 0)  # sum over live buffers of size rounded up to a
    best = 0
    events = _events(problem)
    for k, (time, kind, i) in enumerate(events):
        b = problem.buffers[i]
        count[b.alignment] += kind
        for a in alignments:
            rounded[a] += kind * (-(-b.size // a) * a)
        if k + 1 < len(events) and events[k + 1][0] == time:
            continue  # evaluate once all events at this time are applied
        smallest = next((a for a in alignments if count[a]), None)
        if smallest is not None:
            best = max(best, rounded[smallest] - (smallest - 1))
    return max(best, live_bytes(problem))


def fixed_bound(problem: Problem) -> int:
    """The highest byte used by a buffer with a fixed offset (0 when none is fixed)."""
    return max((b.offset + b.size for b in problem.buffers if b.offset is not None), default=0)


def lower_bound(problem: Problem) -> int:
    """The strongest of the bounds above: no packing of `problem` can be smaller. The live
    bytes and alignment bounds come from one sweep in the core (`PlanTimeline.live_bound`),
    the same sums as `alignment_bound` in O(n log n) plus the alignments at each time."""
    return max(problem.timeline.live_bound(), fixed_bound(problem))
