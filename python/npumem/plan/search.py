"""Anytime search for small arenas: branch and bound over canonical bottom-up packings.

The search works on one *component* at a time: the problem splits at every time point that no
buffer's live range crosses, and the parts can be packed independently (the arena is the largest
part's). Inside a component, time is cut into *sections* between consecutive range ends.

Canonical packings
    Take any packing and push buffers down in the order of their offsets: each goes to the lowest
    aligned offset that is free of the buffers placed before it (and of pinned buffers). Nothing
    gets higher, so some optimal packing is a fixed point of this, and in it every buffer sits at
    ``raw(b)``: the lowest aligned offset at or above the *floor* of its sections (the highest end
    of a buffer placed earlier in any section it is live in), skipping pinned buffers. The search
    therefore builds packings bottom-up: it only chooses *which* buffer comes next; the offset
    follows, and offsets never decrease along a branch.

Pruning (each rule keeps at least one optimal packing reachable)
    * capacity: a buffer whose lowest possible offset plus its size exceeds the capacity.
    * cross sections: in every section, the buffers still to place must fit between
      ``max(floor, last offset)`` and the capacity, as their sum.
    * dead buffers: a buffer whose floor is below the last offset can only be placed once some
      other buffer live with it is placed above the last offset; if none is left, prune.
    * symmetry: buffers placed one after the other at the same offset do not overlap in time, so
      their order does not matter; only the order of the branching preference is explored.

Anytime
    The search starts from the best greedy packing and runs depth-first with restarts (node
    budgets following the Luby sequence, branch order perturbed from the seed after the first
    runs). Each packing found tightens the capacity to one byte below it. A run that finishes
    within its budget has proven its last capacity infeasible, which is a lower bound.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from npumem.plan.bounds import lower_bound
from npumem.plan.greedy import best_greedy
from npumem.plan.problem import Problem
from npumem.plan.solution import FEASIBLE, INFEASIBLE, OPTIMAL, SearchStats, Solution

__all__ = ["Component", "Progress", "components", "solve"]


@dataclass(slots=True)
class Component:
    """A part of a problem that no buffer connects to the rest in time, in the search's terms:
    local indices ``0..n-1`` for the movable buffers, sections for time."""

    indices: list[int]
    """Problem indices of the movable buffers."""
    sizes: list[int]
    alignments: list[int]
    section_lo: list[int]
    section_hi: list[int]
    """Each buffer is live in sections ``section_lo[i] <= s < section_hi[i]``."""
    n_sections: int
    neighbors: list[list[int]]
    """Local indices of the movable buffers live at the same time as each one."""
    obstacles: list[list[tuple[int, int]]]
    """Byte ranges of pinned buffers live at the same time as each one, sorted."""
    lifetimes: list[int]
    lower_bound: int
    """Largest of the static bounds of this part (pinned buffers included)."""


def components(problem: Problem) -> list[Component]:
    """Split ``problem`` at every time point no live range crosses (see the module docstring)."""
    buffers = problem.buffers
    order = sorted(range(len(buffers)), key=lambda i: (buffers[i].lower, buffers[i].upper))
    groups: list[list[int]] = []
    reach = None
    for i in order:
        if reach is None or buffers[i].lower >= reach:
            groups.append([])
            reach = buffers[i].upper
        groups[-1].append(i)
        reach = max(reach, buffers[i].upper)
    result = []
    for group in groups:
        part = Problem([buffers[i] for i in group])
        movable = [k for k, i in enumerate(group) if buffers[i].offset is None]
        local = {k: m for m, k in enumerate(movable)}
        times = sorted({t for i in group for t in (buffers[i].lower, buffers[i].upper)})
        section = {t: s for s, t in enumerate(times)}
        neighbors: list[list[int]] = []
        obstacles: list[list[tuple[int, int]]] = []
        for k in movable:
            nbrs = part.neighbors[k]
            neighbors.append([local[j] for j in nbrs if j in local])
            pinned = []
            for j in nbrs:
                if j not in local:
                    offset = part.buffers[j].offset
                    assert offset is not None
                    pinned.append((offset, offset + part.buffers[j].size))
            obstacles.append(sorted(pinned))
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
    return result


@dataclass(slots=True)
class RunResult:
    """What one depth-first run returns."""

    exhausted: bool
    """The run explored its whole tree: no packing within its final capacity exists."""
    offsets: list[int] | None
    """The best packing found (local order), or ``None``."""
    arena: int
    nodes: int


def _raw(comp: Component, q: int, floor: int) -> int:
    """Lowest offset for buffer ``q`` at or above ``floor``: aligned, clear of pinned buffers."""
    mask = comp.alignments[q] - 1
    offset = (floor + mask) & ~mask
    size = comp.sizes[q]
    for start, end in comp.obstacles[q]:
        if offset + size <= start:
            break
        if end > offset:
            offset = (end + mask) & ~mask
    return offset


def depth_first(
    comp: Component,
    capacity: int,
    target: int,
    rank: Sequence[int],
    node_limit: int,
    deadline: float,
) -> RunResult:
    """One depth-first run over canonical packings of ``comp`` with an arena of at most
    ``capacity``; each packing found lowers the capacity below it, and the run stops at one of
    at most ``target`` bytes, after ``node_limit`` nodes, or at ``deadline`` (perf_counter).

    ``rank[q]`` orders candidates that share the lowest offset (smaller first).
    """
    n = len(comp.sizes)
    sizes, nbrs = comp.sizes, comp.neighbors
    lo, hi = comp.section_lo, comp.section_hi
    has_obstacles = any(comp.obstacles)
    floor_max = [0] * n
    placed = [False] * n
    offsets = [0] * n
    floor = [0] * comp.n_sections
    rem = [0] * comp.n_sections
    for q in range(n):
        for s in range(lo[q], hi[q]):
            rem[s] += sizes[q]
    best: list[int] | None = None
    best_arena = 0
    nodes = 0
    last = 0
    prev = -1
    top = 0

    big = 1 << 62
    n_sections = comp.n_sections

    def candidates() -> list[tuple[int, int, int]] | None:
        lowest = [big] * n_sections  # lowest possible offset of a buffer still to place
        found: list[tuple[int, int, int]] = []
        # The two smallest ends ``raw + size`` over the buffers still to place, for dominance.
        end1, end1_q, end2 = big, -1, big
        for q in range(n):
            if placed[q]:
                continue
            r = floor_max[q]
            if has_obstacles or comp.alignments[q] > 1:
                r = _raw(comp, q, r)
            end = r + sizes[q]
            if end <= last:
                return None  # it would fit below every later buffer: not a canonical packing
            if end < end1:
                end1, end1_q, end2 = end, q, end1
            elif end < end2:
                end2 = end
            if r < last:
                # Dead for now: it must rest on a buffer live with it placed at >= last.
                support = min((sizes[x] for x in nbrs[q] if not placed[x]), default=0)
                if not support:
                    return None
                e = last + support
            else:
                e = r
            if e + sizes[q] > capacity:
                return None
            for s in range(lo[q], hi[q]):
                if e < lowest[s]:
                    lowest[s] = e
            if r < last or (r == last and prev >= 0 and rank[q] < rank[prev]):
                continue
            found.append((r, rank[q], q))
        for s in range(n_sections):
            if lowest[s] + rem[s] > capacity:
                return None
        found.sort()
        # Placing q at r makes every other buffer c with raw(c) + size(c) <= r fit below all
        # later buffers (see above): only offsets below the smallest such end are children.
        kept = [c for c in found if c[0] < (end2 if c[2] == end1_q else end1)]
        if kept:
            q0 = kept[0][2]
            if not any(not placed[x] for x in nbrs[q0]):
                return kept[:1]  # nothing can go on top of it: placing it now is never worse
        return kept

    # Each frame: candidate list, next position, and the undo record of the placement made.
    stack: list[tuple[list[tuple[int, int, int]], int]] = []
    undo: list[tuple[int, int, int, int, list[tuple[int, int]], list[tuple[int, int]]]] = []
    first = candidates()
    if first is None:
        return RunResult(True, None, 0, 1)
    stack.append((first, 0))
    depth = 0
    while stack:
        cands, pos = stack[-1]
        # Undo the placement made from this frame's previous child, if any.
        if len(undo) > len(stack) - 1:
            q, old_last, old_prev, old_top, fl, fm = undo.pop()
            placed[q] = False
            for s, old in fl:
                floor[s] = old
            for s in range(lo[q], hi[q]):
                rem[s] += sizes[q]
            for x, old in fm:
                floor_max[x] = old
            last, prev, top = old_last, old_prev, old_top
            depth -= 1
        if pos < len(cands) and (
            nodes >= node_limit or (nodes & 63 == 0 and time.perf_counter() > deadline)
        ):
            return RunResult(False, best, best_arena, nodes)
        if pos >= len(cands):
            stack.pop()
            continue
        r, _, q = cands[pos]
        stack[-1] = (cands, pos + 1)
        if r + sizes[q] > capacity:
            continue  # the capacity dropped since this frame was built
        nodes += 1
        end = r + sizes[q]
        fl = [(s, floor[s]) for s in range(lo[q], hi[q])]
        for s in range(lo[q], hi[q]):
            floor[s] = end
            rem[s] -= sizes[q]
        fm = []
        for x in nbrs[q]:
            if not placed[x] and floor_max[x] < end:
                fm.append((x, floor_max[x]))
                floor_max[x] = end
        placed[q] = True
        offsets[q] = r
        undo.append((q, last, prev, top, fl, fm))
        last, prev, top = r, q, max(top, end)
        depth += 1
        if depth == n:
            best, best_arena = offsets.copy(), top
            if top <= target:
                return RunResult(False, best, best_arena, nodes)
            capacity = top - 1
            continue
        children = candidates()
        if children is None:
            continue
        stack.append((children, 0))
    return RunResult(True, best, best_arena, nodes)


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
    """Tie-break order for run ``run``: fixed rules first, then seeded perturbations."""
    n = len(comp.sizes)
    life, size = comp.lifetimes, comp.sizes
    keys: list[Callable[[int], tuple[float, ...]]] = [
        lambda q: (-life[q], -size[q], q),
        lambda q: (-size[q], -life[q], q),
        lambda q: (-size[q] * life[q], q),
    ]
    if run < len(keys):
        key = keys[run]
    else:
        base = keys[run % len(keys)]
        noise = [rng.random() for _ in range(n)]
        spread = 0.3

        def key(q: int) -> tuple[float, ...]:
            first = base(q)[0]
            return (first * (1.0 + spread * noise[q]), q)

    order = sorted(range(n), key=key)
    rank = [0] * n
    for position, q in enumerate(order):
        rank[q] = position
    return rank


@dataclass(slots=True)
class Progress:
    """Passed to a ``progress`` callback of :func:`solve` each time the best arena improves."""

    seconds: float
    arena_size: int
    lower_bound: int
    nodes: int


def solve(
    problem: Problem,
    *,
    capacity: int | None = None,
    time_limit: float = 10.0,
    seed: int = 0,
    node_limit: int | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> Solution:
    """Pack ``problem`` into as small an arena as can be found within ``time_limit`` seconds.

    Starts from the best greedy rule (see :mod:`npumem.plan.greedy`), then searches (see this
    module's docstring), keeps the best packing and stops early once it meets a lower bound.

    With ``capacity``, stops as soon as a packing fits; when none is found in time the solution
    keeps the best packing and has ``status == "capacity-not-met"`` (``"infeasible"`` when the
    capacity is proven too small) and ``fits == False``.

    The search is deterministic for a given ``seed``: with ``node_limit`` (total search nodes)
    the result is the same on any machine; with only a time limit a faster machine may get
    further.
    """
    if time_limit < 0:
        raise ValueError(f"time_limit must be >= 0, got {time_limit}")
    if capacity is not None and capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    start = time.perf_counter()
    deadline = start + time_limit
    stats = SearchStats()
    bound = lower_bound(problem)
    greedy = best_greedy(problem)
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

    parts = components(problem)
    # Arena of each part under the current packing, and what is proven about each part.
    part_arena = [
        max((offsets[i] + problem.buffers[i].size for i in c.indices), default=0) for c in parts
    ]
    part_bound = [c.lower_bound for c in parts]
    part_done = [False] * len(parts)  # exhausted: part_arena is optimal for that part
    part_runs = [0] * len(parts)
    rng = random.Random(seed)
    nodes_left = node_limit if node_limit is not None else None
    base_nodes = 200

    while True:
        arena = max(max(part_arena, default=0), _pinned_top(problem))
        bound = max(bound, max(part_bound, default=0))
        if arena <= goal or arena <= bound:
            break
        # Work on the part that holds the arena up, if it can still improve.
        k = max(range(len(parts)), key=lambda j: part_arena[j])
        if part_done[k] or part_arena[k] <= part_bound[k]:
            bound = max(bound, part_arena[k])
            break
        now = time.perf_counter()
        if now >= deadline or (nodes_left is not None and nodes_left <= 0):
            break
        comp = parts[k]
        run = part_runs[k]
        part_runs[k] += 1
        budget = base_nodes * _luby(run)
        if nodes_left is not None:
            budget = min(budget, nodes_left)
        result = depth_first(
            comp,
            capacity=part_arena[k] - 1 if capacity is None else capacity,
            target=goal,
            rank=_ranks(comp, run, rng),
            node_limit=budget,
            deadline=deadline,
        )
        stats.nodes += result.nodes
        stats.runs += 1
        if nodes_left is not None:
            nodes_left -= result.nodes
        if result.offsets is not None and result.arena < part_arena[k]:
            for local, i in enumerate(comp.indices):
                offsets[i] = result.offsets[local]
            part_arena[k] = result.arena
            elapsed = time.perf_counter() - start
            new_arena = max(max(part_arena), _pinned_top(problem))
            stats.improvements.append((elapsed, new_arena))
            if capacity is not None and new_arena <= capacity and stats.time_to_fit is None:
                stats.time_to_fit = elapsed
            if progress is not None:
                progress(Progress(elapsed, new_arena, max(bound, max(part_bound)), stats.nodes))
        if result.exhausted:
            part_done[k] = True
            if capacity is None:
                # Nothing below part_arena[k] exists for this part: it is optimal.
                part_bound[k] = max(part_bound[k], part_arena[k])
            elif result.offsets is None:
                part_bound[k] = max(part_bound[k], capacity + 1)
                bound = max(bound, capacity + 1)
                return finish(INFEASIBLE)

    arena = max(max(part_arena, default=0), _pinned_top(problem))
    bound = max(bound, max(part_bound, default=0))
    if capacity is not None:
        return finish()
    return finish(OPTIMAL if arena <= bound else FEASIBLE)


def _pinned_top(problem: Problem) -> int:
    return max((b.offset + b.size for b in problem.buffers if b.offset is not None), default=0)

