"""Anytime search for small arenas: branch and bound over canonical bottom-up packings.

The search works on one *component* at a time: the problem splits at every time point that no
buffer's live range crosses, and the parts can be packed independently (the arena is the largest
part's). Inside a component, time is cut into *sections* between consecutive range ends.

Canonical packings
    Take any packing and push buffers down in the order of their offsets: each goes to the lowest
    aligned offset that is free of the buffers placed before it (and of pinned buffers). Nothing
    gets higher, so some optimal packing is a fixed point of this, and in it every buffer sits at
    `raw(b)`: the lowest aligned offset at or above the *floor* of its sections (the highest end
    of a buffer placed earlier in any section it is live in), skipping pinned buffers. The search
    therefore builds packings bottom-up: it only chooses *which* buffer comes next; the offset
    follows, and offsets never decrease along a branch.

Pruning (each rule keeps at least one optimal packing reachable)
    * capacity: a buffer whose lowest possible offset plus its size exceeds the capacity.
    * cross sections: in every section, the buffers still to place must fit between
      `max(floor, last offset)` and the capacity, as their sum.
    * dead buffers: a buffer whose floor is below the last offset can only be placed once some
      other buffer live with it is placed above the last offset; if none is left, prune.
    * symmetry: buffers placed one after the other at the same offset do not overlap in time, so
      their order does not matter; only the order of the branching preference is explored.
    * dominance: a child whose offset reaches another buffer's `raw + size` is skipped (that
      buffer would fit entirely below it); a child nothing is live with that fails ends the
      node (placing it first is never worse).

Decision runs (`PackingInstance.decide`, after MiniMalloc's dynamic decomposition)
    Once no buffer still to place is live on both sides of a time point, the two sides are
    independent: the run splits there and packs each part on its own, failing as soon as one
    part fails, instead of backtracking through the other part's choices. Each part orders its
    children afresh (`HEURISTICS`: lifetime, area, and the most bytes still to place in the
    buffer's sections, counted when the part starts; led by the alignment where the part
    mixes alignments). Parts already decided are remembered by their buffers, their floors and
    the last offset, so a part met again is not searched again.
    Forced sections: at the lowest level a buffer can still start at, a section whose buffers
    could not all fit if none of them started there (the next start is at least a raw offset
    above the level, or the level plus the smallest buffer still to place that one would rest
    on) must be covered at that level; the node branches only on the buffers that cover the
    forced section with the fewest of them, and fails when there are none.
    Room cutoff (both kinds of run): every placement after a child at offset `r` starts at `r`
    or above, so each section whose floor is not above `r` must hold its buffers still to place
    between `r` and the capacity; children come by offset, so the first child that leaves a
    section too little room ends the node (every later child would fail its first check).

Anytime
    The search starts from the best greedy packing, the smallest of the greedy rules that
    finished and `linear_scan` (`npumem.plan.greedy.best_greedy` with the deadline and the
    lower bound, or with a capacity the larger of the bound and the capacity, as its goal:
    the first of them at the goal ends the greedy phase), and ends
    there when it meets the bound (or fits the capacity), when the deadline has passed
    already, or when more pairs of buffers are live together than the time allows to list
    (`npumem.plan.greedy.pairs_listable`: the search lists them all). The set-up (listing
    the pairs, building the parts and the core's instances) and every run keep to the deadline
    too: when it comes during the set-up, the greedy start is the answer. The part that
    holds the arena up gets, in passes with doubling node budgets, decision runs an eighth of
    the way down and halfway from the best packing to the bound (without a capacity) and at
    the goal (the capacity, or the proven lower bound), each order in turn, then one descent
    run (`PackingInstance.search`: every packing found tightens its capacity to
    one byte below it). A decision run that exhausts its tree proves the capacity it probed
    infeasible, which raises the lower bound; `progress` reports the arena and the bound at
    every improvement.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import add, attrgetter

from npumem._core import PackingInstance
from npumem._shown import shown
from npumem.plan.bounds import lower_bound
from npumem.plan.errors import PlanArgumentError, PlanArgumentTypeError, PlanTooLargeError
from npumem.plan.greedy import best_greedy, pairs_listable
from npumem.plan.problem import MAX_PLAN_BYTES, Problem, check_problem, overlap_lists
from npumem.plan.solution import (
    FEASIBLE,
    INFEASIBLE,
    OPTIMAL,
    SearchStats,
    Solution,
    check_count,
    check_offsets,
)

__all__ = [
    "MAX_SEED",
    "Component",
    "Progress",
    "check_progress",
    "check_seed",
    "components",
    "solve",
]


@dataclass(slots=True)
class Component:
    """A part of a problem that no buffer connects to the rest in time, in the search's terms:
    local indices `0..n-1` for the movable buffers, sections for time."""

    indices: list[int]
    """Problem indices of the movable buffers."""
    sizes: list[int]
    alignments: list[int]
    section_lo: list[int]
    section_hi: list[int]
    """Each buffer is live in sections `section_lo[i] <= s < section_hi[i]`."""
    n_sections: int
    neighbors: list[list[int]]
    """Local indices of the movable buffers live at the same time as each one."""
    obstacles: list[list[tuple[int, int]]]
    """Byte ranges of pinned buffers live at the same time as each one, sorted and merged."""
    lifetimes: list[int]
    lower_bound: int
    """Largest of the static bounds of this part (pinned buffers included)."""

    def packing_instance(self) -> PackingInstance:
        """The part as the core's search takes it."""
        return PackingInstance(
            self.sizes,
            self.alignments,
            self.section_lo,
            self.section_hi,
            self.n_sections,
            self.neighbors,
            self.obstacles,
        )


_SIZE = attrgetter("size")
_ID = attrgetter("id")

FINISH_SAMPLE = 1 << 13
"""Buffers of the sample that `_finish_seconds` times."""


def _finish_seconds(problem: Problem) -> float:
    """About how long `solve` takes to turn offsets into its `Solution` (the checks of the
    offsets, the arena, the offsets by id): three times the time that work takes on the first
    `FINISH_SAMPLE` buffers, scaled to all of them (a large table misses the caches more
    than the sample does); 0 for a problem not much larger than the sample."""
    n = len(problem.buffers)
    if n <= 4 * FINISH_SAMPLE:
        return 0.0
    sample = problem.buffers[:FINISH_SAMPLE]
    zeros = [0] * FINISH_SAMPLE
    began = time.perf_counter()
    check_offsets(sample, zeros)
    max(map(add, zeros, map(_SIZE, sample)))
    max(map(add, zeros, map(_SIZE, sample)))
    dict(zip(map(_ID, sample), zeros, strict=True))
    return 3 * (time.perf_counter() - began) * n / FINISH_SAMPLE


class _DeadlinePassed(Exception):
    """The set-up of the search (`_components`, the core's instances) reached the deadline."""


CHECK_WORK = 1 << 12
"""Work (a pair live together, or a quarter of a buffer) the set-up does between two looks at
the clock: about a millisecond of Python, and a clock read per thousands of pairs costs nothing
measurable."""


class _Clock:
    """Counts work done and raises `_DeadlinePassed` once `deadline` (a `time.perf_counter()`
    instant; `None`: none) has passed, reading the clock every `CHECK_WORK` units of work."""

    __slots__ = ("deadline", "work")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.work = 0

    def tick(self, work: int) -> None:
        if self.deadline is None:
            return
        self.work += work
        if self.work >= CHECK_WORK:
            self.check()

    def check(self) -> None:
        """Read the clock now (between steps that each take a while)."""
        self.work = 0
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            raise _DeadlinePassed


def components(problem: Problem) -> list[Component]:
    """Split `problem` at every time point no live range crosses (see the module docstring)."""
    return _components(problem, None)


def _pinned_obstacles(part: Problem, pinned: list[int]) -> list[tuple[int, int]]:
    """The byte ranges of `part`'s pinned buffers `pinned`, merged where they touch or overlap
    (pinned buffers not live together may overlap), in ascending order."""
    merged: list[tuple[int, int]] = []
    for j in sorted(pinned, key=lambda j: part.buffers[j].offset or 0):
        offset = part.buffers[j].offset
        assert offset is not None
        lo, hi = offset, offset + part.buffers[j].size
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _components(problem: Problem, deadline: float | None) -> list[Component]:
    """`components(problem)`, raising `_DeadlinePassed` once `deadline` (a
    `time.perf_counter()` instant, `None`: none) has passed: listing the pairs live together
    takes a good part of a second at a million pairs, so it looks at the clock as it goes."""
    clock = _Clock(deadline)
    buffers = problem.buffers
    # By (lower, upper, index): two stable sorts by a list lookup, no tuple per buffer.
    order = list(range(len(buffers)))
    order.sort(key=[b.upper for b in buffers].__getitem__)
    order.sort(key=[b.lower for b in buffers].__getitem__)
    clock.check()
    groups: list[list[int]] = []
    reach = None
    for i in order:
        if reach is None or buffers[i].lower >= reach:
            groups.append([])
            reach = buffers[i].upper
        groups[-1].append(i)
        reach = max(reach, buffers[i].upper)
    clock.check()
    result = []
    for group in groups:
        # The buffers of a checked problem: only the rules over all of them are checked again.
        part = Problem([buffers[i] for i in group], _checked=True)
        movable = [k for k, i in enumerate(group) if buffers[i].offset is None]
        local = {k: m for m, k in enumerate(movable)}
        times = sorted({t for i in group for t in (buffers[i].lower, buffers[i].upper)})
        section = {t: s for s, t in enumerate(times)}
        clock.tick(4 * len(group))
        adjacency = overlap_lists(part.buffers, clock.tick)
        neighbors: list[list[int]] = []
        obstacles: list[list[tuple[int, int]]] = []
        if len(movable) == len(group):  # nothing pinned: local indices are the part's
            neighbors = adjacency
            obstacles = [[] for _ in movable]
        else:
            for k in movable:
                nbrs = adjacency[k]
                neighbors.append([local[j] for j in nbrs if j in local])
                clock.tick(len(nbrs) + 1)
                obstacles.append(_pinned_obstacles(part, [j for j in nbrs if j not in local]))
        result.append(
            Component(
                indices=[group[k] for k in movable],
                sizes=[part.buffers[k].size for k in movable],
                alignments=[part.buffers[k].alignment for k in movable],
                section_lo=[section[part.buffers[k].lower] for k in movable],
                section_hi=[section[part.buffers[k].upper] for k in movable],
                n_sections=max(len(times) - 1, 0),
                neighbors=neighbors,
                obstacles=obstacles,
                lifetimes=[part.buffers[k].lifetime for k in movable],
                lower_bound=lower_bound(part),
            )
        )
        clock.tick(4 * len(group))
    return result


INSTANCE_SHARE = 0.5
"""The time the core takes to build a `PackingInstance` from a component's lists, as a share of
the time `_components` took to make them (about a quarter to a third, measured): what must be
left of the time limit to start building it."""


HEURISTICS = (
    ("WAT", False),
    ("TAW", False),
    ("TWA", False),
    ("ZWT", False),
    ("WAT", True),
    ("TWA", True),
    ("TAW", True),
)
"""Orders of the decision runs, in MiniMalloc's letters (compared in turn, largest first): `W`
the lifetime, `A` lifetime times size, `Z` the size, `T` the most bytes still to place in
one of the buffer's sections, counted afresh in every part the search splits off. The flag:
whether a forced section is the one the order's first child covers (else the one with the
fewest children); the two choices fail on different instances, so each of MiniMalloc's three
orders (`WAT`, `TAW`, `TWA`) runs with both. In a part whose buffers do not all share one
alignment, every order leads with `G`, the alignment: at one offset the most aligned buffer comes
first. It has the fewest offsets it can take (a multiple of its alignment whose sections are all
filled to it), and any other buffer placed there first and live with it pushes it up by a whole
alignment; in a part of one alignment the key changes nothing, so those runs stay as they are."""

BASE_NODES = 20_000
"""Nodes of the shortest descent run; run `k` gets `BASE_NODES` times the k-th Luby term."""


def _luby(i: int) -> int:
    """The i-th term (from 0) of the Luby sequence 1, 1, 2, 1, 1, 2, 4, 1, ..."""
    k = 1
    while (1 << k) - 1 < i + 1:
        k += 1
    while True:
        if i + 1 == (1 << k) - 1:
            return 1 << (k - 1)
        i -= (1 << (k - 1)) - 1
        k = 1
        while (1 << k) - 1 < i + 1:
            k += 1


def _ranks(comp: Component, run: int, rng: random.Random) -> list[int]:
    """Order among children at the same offset for descent run `run`: five fixed rules first
    (area, lifetime, size, start, conflicts; largest first), then seeded perturbations."""
    n = len(comp.sizes)
    life, size, start = comp.lifetimes, comp.sizes, comp.section_lo
    degree = [len(nb) for nb in comp.neighbors]
    keys: list[Callable[[int], tuple[int, ...]]] = [
        lambda q: (-size[q] * life[q], q),
        lambda q: (-life[q], -size[q], q),
        lambda q: (-size[q], -life[q], q),
        lambda q: (start[q], -life[q], q),
        lambda q: (-degree[q], -size[q], q),
    ]
    if run < len(keys):
        order = sorted(range(n), key=keys[run])
    else:
        base = keys[rng.randrange(len(keys))]
        spread = rng.choice((0.1, 0.3, 1.0))
        noisy = {q: base(q)[0] * (1.0 + spread * rng.random()) for q in range(n)}
        order = sorted(range(n), key=lambda q: (noisy[q], q))
    rank = [0] * n
    for position, q in enumerate(order):
        rank[q] = position
    return rank


@dataclass(slots=True)
class Progress:
    """Passed to a `progress` callback of `solve()` each time the best arena improves."""

    seconds: float
    arena_size: int
    lower_bound: int
    nodes: int

    @property
    def gap(self) -> float:
        """How far the arena is above the lower bound, as a fraction of the bound."""
        return self.arena_size / self.lower_bound - 1 if self.lower_bound else 0.0


@dataclass(slots=True)
class _PartState:
    """What the schedule knows about one component."""

    comp: Component
    instance: PackingInstance
    arena: int
    bound: int
    base_rank: list[int]
    level: int = 0
    """Pass number: decision runs of this pass get `2 * n * 2**level` nodes each."""
    descents: int = 0
    probes: list[int] | None = None
    """Capacities still to probe in this pass."""
    mixed: bool = False
    """Whether the part's buffers have more than one alignment: its orders lead with `G`."""


def check_time_limit(time_limit: object) -> None:
    """Refuse a time limit that is not a finite number of seconds >= 0
    (`PlanArgumentTypeError` for a value that is no number, bools included;
    `PlanArgumentError` for one out of range, NaN too)."""
    if isinstance(time_limit, bool) or not isinstance(time_limit, int | float):
        raise PlanArgumentTypeError(
            f"time_limit must be a number of seconds, got {shown(time_limit)}"
        )
    if not 0 <= time_limit < math.inf:  # NaN too
        raise PlanArgumentError(
            f"time_limit must be a finite number of seconds >= 0, got {time_limit}"
        )


MAX_SEED = (1 << 64) - 1
"""The largest seed `solve()` takes (64 bits, as `npumem plan --seed` takes)."""


def check_seed(seed: object) -> None:
    """Refuse a seed that is not an integer from 0 to `MAX_SEED` (`PlanArgumentTypeError`
    for a value that is no integer, bools included; `PlanArgumentError` for one out of
    range)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PlanArgumentTypeError(
            f"seed must be an integer from 0 to {MAX_SEED}, got {shown(seed)}"
        )
    if not 0 <= seed <= MAX_SEED:
        raise PlanArgumentError(f"seed must be an integer from 0 to {MAX_SEED}, got {shown(seed)}")


def check_progress(progress: object) -> None:
    """Refuse a `progress` callback that is neither `None` nor callable
    (`PlanArgumentTypeError`)."""
    if progress is not None and not callable(progress):
        raise PlanArgumentTypeError(
            f"progress must be None or a callable taking a Progress, got {shown(progress)}"
        )


def solve(
    problem: Problem,
    *,
    capacity: int | None = None,
    time_limit: float = 10.0,
    seed: int = 0,
    node_limit: int | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> Solution:
    """Pack `problem` into as small an arena as can be found within `time_limit` seconds.

    Starts from the best greedy packing: the smallest of the greedy rules that finish before
    the deadline and of `linear_scan`, never worse than the scan (`best_greedy` with the
    deadline; see `npumem.plan.greedy`). Then searches (see this module's docstring), keeps
    the best packing and stops early once it meets a lower bound: the first greedy candidate
    at `lower_bound(problem)` (the scan, or a rule) ends the greedy phase, the rules after it
    unrun, and the search is not started (`stats.runs == 0`).

    With `capacity`, stops as soon as a packing fits; when none is found in time the solution
    keeps the best packing and has `status == "capacity-not-met"` (`"infeasible"` when the
    capacity is proven too small) and `fits == False`.

    The search is deterministic for a given `seed` (an integer from 0 to `MAX_SEED`): with
    `node_limit` (total search nodes) the result is the same on any machine; with only a time
    limit a faster machine may get further. `progress`, when given, is called with a
    `Progress` at every improvement.

    Arguments are checked before any work: a `problem` that is not a `Problem`, or a
    `time_limit`, `capacity`, `node_limit`, `seed` or `progress` of the wrong type, raises
    `PlanArgumentTypeError`; one out of range `PlanArgumentError`.
    """
    check_problem(problem, "solve()")
    check_time_limit(time_limit)
    check_count("capacity", capacity, "bytes")
    check_count("node_limit", node_limit, "search nodes")
    check_seed(seed)
    check_progress(progress)
    start = time.perf_counter()
    # The work after the search (the checks and the offsets by id of the `Solution`) cannot
    # stop at a clock; at hundreds of thousands of buffers it takes a good part of a second,
    # so the search ends that much before the limit.
    deadline = start + max(time_limit - _finish_seconds(problem), 0.0)
    stats = SearchStats()
    bound = lower_bound(problem)
    # A candidate at the bound cannot be beaten, and with a capacity one that fits is the
    # answer: the greedy phase ends at the first one.
    greedy = best_greedy(problem, deadline=deadline, goal=max(bound, capacity or 0))
    stats.greedy_rule, stats.greedy_arena, stats.greedy_seconds = (
        greedy.rule,
        greedy.arena_size,
        greedy.seconds,
    )
    offsets = list(greedy.offsets)
    arena = greedy.arena_size
    stats.improvements.append((time.perf_counter() - start, arena))
    if capacity is not None and arena <= capacity:
        stats.time_to_fit = time.perf_counter() - start

    def finish(status: str | None = None) -> Solution:
        stats.seconds = time.perf_counter() - start
        top = max(map(add, offsets, map(_SIZE, problem.buffers)), default=0)
        if top > MAX_PLAN_BYTES:
            # Each buffer fits on its own (`Problem` checks that), but the best packing found
            # does not: no plan can hold it.
            proven = bound > MAX_PLAN_BYTES
            why = (
                f"the buffers need at least {bound} bytes"
                if proven
                else f"the best packing found in {time_limit:g} s needs {top} bytes"
            )
            raise PlanTooLargeError(
                f"no plan within the {MAX_PLAN_BYTES} bytes (2^63 - 1) a plan can address: {why}",
                proven=proven,
            )
        return Solution(
            problem,
            offsets,
            lower_bound=bound,
            capacity=capacity,
            status=status,
            stats=stats,
        )

    if capacity is not None and bound > capacity:
        return finish(INFEASIBLE)
    goal = bound if capacity is None else capacity
    if arena <= goal:
        return finish()
    left = deadline - time.perf_counter()
    if left <= 0 or not pairs_listable(problem, left):
        # No time left (as when no greedy rule finished: the rules stop only at the deadline),
        # or more pairs live together than there is time to list for the search: the greedy
        # start is the answer.
        return finish()

    pinned_top = _pinned_top(problem)
    rng = random.Random(seed)
    parts: list[_PartState] = []
    try:
        listing = time.perf_counter()
        comps = _components(problem, deadline)
        listing = time.perf_counter() - listing
        for comp in comps:
            # The core takes the lists in one call that cannot stop at the deadline: a fraction
            # of the time it took to make them (`INSTANCE_SHARE`), so start it only with that
            # much time left.
            share = sum(map(len, comp.neighbors)) / max(2 * problem.overlap_pairs, 1)
            if time.perf_counter() + INSTANCE_SHARE * share * listing >= deadline:
                raise _DeadlinePassed
            rank = list(range(len(comp.sizes)))
            rng.shuffle(rank)
            parts.append(
                _PartState(
                    comp=comp,
                    instance=comp.packing_instance(),
                    arena=max(
                        (offsets[i] + problem.buffers[i].size for i in comp.indices), default=0
                    ),
                    bound=comp.lower_bound,
                    base_rank=rank,
                    mixed=len(set(comp.alignments)) > 1,
                )
            )
    except _DeadlinePassed:
        # The deadline came during the set-up: the greedy start is the answer.
        return finish()
    nodes_left = node_limit

    def current() -> int:
        return max(max((p.arena for p in parts), default=0), pinned_top)

    def proven() -> int:
        return max(bound, *(p.bound for p in parts))

    def adopt(part: _PartState, found: list[int]) -> None:
        for local, i in enumerate(part.comp.indices):
            offsets[i] = found[local]
        part.arena = max((o + s for o, s in zip(found, part.comp.sizes, strict=True)), default=0)
        elapsed = time.perf_counter() - start
        stats.improvements.append((elapsed, current()))
        if capacity is not None and current() <= capacity and stats.time_to_fit is None:
            stats.time_to_fit = elapsed
        if progress is not None:
            progress(Progress(elapsed, current(), proven(), stats.nodes))

    while True:
        bound = proven()
        arena = current()
        if arena <= goal or arena <= bound or bound > MAX_PLAN_BYTES:
            break
        # Work on the part that holds the arena up; if it is proven optimal, so is the arena.
        part = max(parts, key=lambda p: p.arena)
        if part.arena <= part.bound:
            bound = max(bound, part.arena)
            break
        remaining = deadline - time.perf_counter()
        if remaining <= 0 or (nodes_left is not None and nodes_left <= 0):
            break
        n = len(part.comp.sizes)
        floor = max(bound, part.bound)
        if not part.probes:
            # A new pass: decision probes halfway up to the best packing and at the goal (or the
            # proven bound), then one descent run from the best packing.
            part.level += 1 if part.probes is not None else 0
            # A packing beyond what a plan addresses is no plan: none is looked for.
            top = min(part.arena - 1, MAX_PLAN_BYTES)
            target = min(top, capacity if capacity is not None else floor)
            probes = [target]
            if capacity is None and top - floor > 1:
                probes.insert(0, (floor + top) // 2)  # halfway: it improves soonest
                step = (top - floor) // 8
                if step > 0:
                    probes.insert(0, top - step)  # a short step down: the likeliest to fit
            probes.append(-1)  # the descent run
            part.probes = probes
        probe = part.probes.pop(0)
        budget = 2 * n << part.level
        if probe < 0:
            # Descent: one run that keeps tightening below each packing it finds.
            budget = min(budget, BASE_NODES * _luby(part.descents))
            if nodes_left is not None:
                budget = min(budget, nodes_left)
            below = min(part.arena - 1, MAX_PLAN_BYTES)
            exhausted, found, found_arena, nodes = part.instance.search(
                _ranks(part.comp, part.descents, rng),
                below,
                capacity if capacity is not None else floor,
                budget,
                max(remaining, 0.0),
            )
            part.descents += 1
            stats.nodes += nodes
            stats.runs += 1
            if nodes_left is not None:
                nodes_left -= nodes
            if found is not None and found_arena < part.arena:
                adopt(part, found)
            if exhausted:
                # No packing below the last one found, or below `below` when none was.
                part.bound = max(part.bound, below + 1 if found is None else found_arena)
            continue
        if probe < part.bound or probe >= part.arena:
            continue
        for keys, follow_order in HEURISTICS:
            if part.mixed:
                keys = "G" + keys
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or (nodes_left is not None and nodes_left <= 0):
                break
            run_budget = budget if nodes_left is None else min(budget, nodes_left)
            verdict, found, nodes = part.instance.decide(
                keys,
                part.comp.lifetimes,
                part.base_rank,
                probe,
                run_budget,
                remaining,
                follow_order,
            )
            stats.nodes += nodes
            stats.runs += 1
            if nodes_left is not None:
                nodes_left -= nodes
            if verdict == "found":
                assert found is not None
                adopt(part, found)
                break
            if verdict == "exhausted":
                part.bound = max(part.bound, probe + 1)
                part.probes = [p for p in part.probes if p < 0 or p > probe]
                if capacity is not None and part.bound > capacity:
                    bound = proven()
                    return finish(INFEASIBLE)
                break

    bound = proven()
    if capacity is not None:
        return finish()
    return finish(OPTIMAL if current() <= bound else FEASIBLE)


def _pinned_top(problem: Problem) -> int:
    return max((b.offset + b.size for b in problem.buffers if b.offset is not None), default=0)
