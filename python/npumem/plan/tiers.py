"""Static plans over several memory pools: which buffers live in SRAM, and where in each pool.

`solve(problem, pools=[("sram", 2 << 20), ("hbm", None)])` plans the buffers of `problem`
into pools given fastest first, each with a capacity (`None`: as large as needed, only for the
last pool). Each buffer has a weight, what it is worth to have it in a fast pool: its
`weight` (an access count, or bytes x accesses) or, when it
has none, its size in bytes.

The choice
    Pool by pool, fastest first, the planner picks among the buffers not placed yet a set that
    fits in the pool's capacity with the most weight. Whether a set fits is decided by an actual
    packing (buffers live at the same time never share bytes), so the choice is always
    feasible. When at most the capacity's bytes of them are live at once, the planner's search
    first tries to pack them all within it, and takes that when it fits. Otherwise the set is
    built greedily, each buffer placed at the lowest free offset that holds it: first in the
    order of weight per byte (the least the pool gets: nothing weighing less replaces it), then
    in other orders (weight, size, and the order of the reduced costs of the bound below, then
    randomly perturbed ones); the best set is then repacked with the
    planner's search (`npumem.plan.search.solve`) and the buffers left out are offered
    again in the space this frees, then once more each with a short search over the whole set;
    with the time left, parts of the set live at a random time are taken out and the space
    refilled. The choice stops early when it meets the bound. The last pool gets every buffer
    left and is packed by the search. Buffers with a fixed offset stay in the last pool.

The bound
    No choice can place more weight in the first pool than the linear relaxation of

        maximize  sum w_i x_i
        subject to  sum of s_i x_i over the buffers live at t  <=  C   for every time t,
                    x_i in {0, 1},  x_i = 0 when s_i > C

    (a packing within `C` bytes never has more than `C` bytes live at once). Its Lagrangian
    dual, `C sum_t l_t + sum_i max(0, w_i - s_i sum_{t in life(i)} l_t)`, is an upper bound
    for every `l >= 0`; subgradient steps drive it down towards the relaxation's optimum.
    `TieredSolution.weight_bound` is the smallest value seen, and
    `TieredSolution.weight_gap` how far the placed weight is below it.
"""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, overload

from npumem._shown import shown
from npumem.fileio import json_text, read_json_object, write_text
from npumem.plan.buffers import Buffer
from npumem.plan.c_header import c_comment, c_identifier, c_string
from npumem.plan.errors import (
    PlanArgumentError,
    PlanArgumentTypeError,
    PlanError,
    PlanValidationError,
    ProblemFormatError,
)
from npumem.plan.inputs import TIER_PLAN_FORMAT, TIER_PLAN_VERSION, check_header, path_argument
from npumem.plan.problem import PLAN_FORMAT, Problem, check_problem, csv_id
from npumem.plan.search import check_seed, check_time_limit
from npumem.plan.search import solve as solve_one
from npumem.plan.solution import FEASIBLE, NOT_MET, OPTIMAL, Solution
from npumem.sizes import MAX_BYTES

__all__ = [
    "PoolSpec",
    "TieredSolution",
    "buffer_weight",
    "parse_pools",
    "solve",
    "solve_tiers",
    "weight_bound",
]

PoolSpec = tuple[str, int | None]
"""A pool of a tiered plan: `(name, capacity in bytes)`; `None`: as large as needed."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def buffer_weight(buf: Buffer) -> float:
    """What having `buf` in a fast pool is worth: its weight, or its size when it has none."""
    return float(buf.size if buf.weight is None else buf.weight)


def parse_pools(pools: Sequence[PoolSpec] | Sequence[str]) -> list[PoolSpec]:
    """Check `pools` and return them as `(name, capacity)` pairs. Items may also be text
    as on the command line: `"sram=2MiB"`, `"hbm"`. Pools of the wrong type raise
    `PlanArgumentTypeError`, other bad pools `PlanArgumentError`."""
    from npumem.errors import InvalidArgumentError
    from npumem.sizes import parse_bytes

    out: list[PoolSpec] = []
    if isinstance(pools, str | bytes) or not isinstance(pools, Sequence):
        raise PlanArgumentTypeError(
            f"pools must be a list of (name, capacity) pairs, got {type(pools).__name__}"
        )
    if not pools:
        raise PlanArgumentError("pools must be a non-empty list of (name, capacity) pairs")
    for item in pools:
        if isinstance(item, str):
            name, sep, cap_text = item.partition("=")
            try:
                capacity: int | None = parse_bytes(cap_text) if sep else None
            except InvalidArgumentError as exc:
                raise PlanArgumentError(f"pool {shown(name)}: {exc}") from None
        elif isinstance(item, tuple) and len(item) == 2:
            name, capacity = item
        else:
            raise PlanArgumentTypeError(
                f"a pool is (name, capacity) or 'NAME[=BYTES]', got {shown(item)}"
            )
        if not isinstance(name, str):
            raise PlanArgumentTypeError(f"pool name {shown(name)} must be a str")
        if not _NAME.match(name):
            raise PlanArgumentError(
                f"pool name {shown(name)} must be an identifier (letters, digits, _)"
            )
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)):
            raise PlanArgumentTypeError(
                f"pool {shown(name)}: capacity must be an int >= 1 or None, got {shown(capacity)}"
            )
        if capacity is not None and capacity < 1:
            raise PlanArgumentError(
                f"pool {shown(name)}: capacity must be an int >= 1 or None, got {shown(capacity)}"
            )
        out.append((name, capacity))
    names = [n for n, _ in out]
    if len({n.upper() for n in names}) != len(names):
        # Upper-cased, a name is part of the C header's macros: they must not clash.
        raise PlanArgumentError(f"pool names must differ (ignoring case), got {names}")
    if any(cap is None for _, cap in out[:-1]):
        raise PlanArgumentError("only the last pool may have no capacity")
    return out


# ----- the bound -------------------------------------------------------------------------------


def weight_bound(
    problem: Problem,
    capacity: int,
    *,
    candidates: Sequence[int] | None = None,
    iterations: int = 300,
    target: float = 0.0,
    deadline: float | None = None,
) -> tuple[float, list[float]]:
    """An upper bound on the weight of buffers that fit in `capacity` bytes (see the module
    docstring), and the reduced cost of each candidate at the best multipliers (higher: more
    worth placing). `candidates` are problem indices (default: all without a fixed offset);
    `target` is a weight known to be reachable, which sizes the subgradient steps. The steps
    stop after `iterations` or once `deadline` (a `time.perf_counter()` value) has passed;
    every value seen is a bound, so a bound cut short is valid, only less tight."""
    buffers = problem.buffers
    if candidates is None:
        candidates = [i for i, b in enumerate(buffers) if b.offset is None]
    items = [i for i in candidates if buffers[i].size <= capacity]
    weights = [buffer_weight(buffers[i]) for i in items]
    total = sum(weights, 0.0)
    if not items or (deadline is not None and time.perf_counter() >= deadline):
        return total, weights  # the dual at zero multipliers
    # Maximal sets of buffers live together start where some buffer starts.
    timeline = _Timeline(buffers, items)
    span = [timeline.span[i] for i in items]
    sizes = [buffers[i].size for i in items]
    lam = [0.0] * timeline.count
    best = total
    best_reduced = list(weights)
    theta = 1.0
    stall = 0
    for _ in range(iterations):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        prefix = [0.0]
        for v in lam:
            prefix.append(prefix[-1] + v)
        value = capacity * prefix[-1]
        load = [0.0] * (timeline.count + 1)
        red: list[float] = []
        for (lo, hi), s, w in zip(span, sizes, weights, strict=True):
            r = w - s * (prefix[hi] - prefix[lo])
            red.append(r)
            if r > 0:
                value += r
                load[lo] += s
                load[hi] -= s
        if value < best - 1e-9:
            best, best_reduced, stall = value, red, 0
        else:
            stall += 1
            if stall >= 10:
                theta, stall = theta / 2, 0
        grad: list[float] = []
        running = 0.0
        for k in range(timeline.count):
            running += load[k]
            grad.append(capacity - running)  # the dual's subgradient
        norm = sum(g * g for v, g in zip(lam, grad, strict=True) if v > 0 or g < 0)
        if norm == 0 or theta < 1e-6:
            break
        step = theta * max(value - target, 1e-9 * max(value, 1.0)) / norm
        lam = [max(0.0, v - step * g) for v, g in zip(lam, grad, strict=True)]
    return min(best, total), best_reduced


# ----- the choice ------------------------------------------------------------------------------


class _Timeline:
    """The live ranges of some buffers on a reduced time axis: its `count` points are the
    buffers' distinct starts in increasing order, and `span[i]` (by problem index) is the range
    `[lo, hi)` of the points within buffer `i`'s live range (never empty: its own start is
    one). Two of the buffers are live at the same time exactly when their spans share a point
    (the later start lies in both)."""

    def __init__(self, buffers: Sequence[Buffer], indices: Sequence[int]) -> None:
        points = sorted({buffers[i].lower for i in indices})
        self.count = len(points)
        where = {t: k for k, t in enumerate(points)}
        self.span: dict[int, tuple[int, int]] = {
            i: (where[buffers[i].lower], bisect.bisect_left(points, buffers[i].upper))
            for i in indices
        }

    def most_live(self, buffers: Sequence[Buffer]) -> int:
        """The most bytes of the buffers live at one time (no packing of them all is smaller)."""
        load = [0] * (self.count + 1)
        for i, (lo, hi) in self.span.items():
            load[lo] += buffers[i].size
            load[hi] -= buffers[i].size
        return max(itertools.accumulate(load))


_LATE_MEETS = 64
"""Once its time is up, a first fit that must finish leaves out a buffer live with more than
this many placed buffers instead of looking for room among them."""


def _first_fit(
    buffers: Sequence[Buffer],
    timeline: _Timeline,
    order: Sequence[int],
    capacity: int,
    placed: dict[int, int],
    until: float,
    *,
    finish: bool = False,
) -> dict[int, int]:
    """Offer the buffers of `order` in turn to a pool of `capacity` bytes that already holds
    `placed` (index -> offset); each goes to the lowest aligned offset free of the buffers
    placed and live with it, if it fits. Returns the new placement (`placed` plus those).
    Every buffer is in `timeline`. Once `until` (a `time.perf_counter()` value) has passed,
    the buffers not offered yet are left out; with `finish` they are still offered, but one
    that meets more than `_LATE_MEETS` placed buffers is left out, so that the rest of the
    pass costs O(log n) a buffer. What is placed stays valid either way.

    The placed buffers live with a new one are those live at its start and those that start
    later within its span. Two segment trees over the points find them: in `covering` a placed
    buffer is listed at the O(log n) nodes that tile its span, and the new buffer's start
    meets each of those once on its leaf-to-root path; in `starting` it is listed on the path
    above its start's leaf, and the nodes that tile the rest of the new buffer's span meet
    it once when it starts there. A buffer costs O(log n) plus the buffers it meets, however
    many buffers are placed."""
    span = timeline.span
    n = timeline.count
    # Node k (1 <= k < 2n; the leaves, n + point, from n) lists the (offset, end) of placed
    # buffers: in `covering` of those whose span covers its points (and not its parent's), in
    # `starting` of those that start at one of its points.
    covering: list[list[tuple[int, int]] | None] = [None] * (2 * n)
    starting: list[list[tuple[int, int]] | None] = [None] * (2 * n)

    def add(tree: list[list[tuple[int, int]] | None], k: int, taken: tuple[int, int]) -> None:
        node = tree[k]
        if node is None:
            tree[k] = [taken]
        else:
            node.append(taken)

    def place(i: int, offset: int) -> None:
        taken = (offset, offset + buffers[i].size)
        lo, hi = span[i]
        k = lo + n
        while k:
            add(starting, k, taken)
            k >>= 1
        lo += n
        hi += n
        while lo < hi:
            if lo & 1:
                add(covering, lo, taken)
                lo += 1
            if hi & 1:
                hi -= 1
                add(covering, hi, taken)
            lo >>= 1
            hi >>= 1

    out = dict(placed)
    for i, offset in placed.items():
        place(i, offset)
    late = False
    for count, i in enumerate(order):
        if not late and count % 64 == 63 and time.perf_counter() >= until:
            if not finish:
                break
            late = True
        if i in out:
            continue
        b = buffers[i]
        size = b.size
        if size > capacity:
            continue
        lo, hi = span[i]
        nodes: list[list[tuple[int, int]]] = []
        k = lo + n
        while k:
            node = covering[k]
            if node is not None:
                nodes.append(node)
            k >>= 1
        lo += n + 1
        hi += n
        while lo < hi:
            if lo & 1:
                node = starting[lo]
                if node is not None:
                    nodes.append(node)
                lo += 1
            if hi & 1:
                hi -= 1
                node = starting[hi]
                if node is not None:
                    nodes.append(node)
            lo >>= 1
            hi >>= 1
        if late and sum(map(len, nodes)) > _LATE_MEETS:
            continue
        taken = sorted(itertools.chain.from_iterable(nodes))
        pos = 0
        for start, end in taken:
            if pos + size <= start:
                break
            if end > pos:
                pos = -(-end // b.alignment) * b.alignment
        if pos + size <= capacity:
            out[i] = pos
            place(i, pos)
    return out


def _weight_of(buffers: Sequence[Buffer], chosen: Iterable[int]) -> float:
    return sum(buffer_weight(buffers[i]) for i in chosen)


def _density_key(buffers: Sequence[Buffer]) -> Callable[[int], tuple[float, ...]]:
    """The order of weight per byte, heaviest first (ties: larger, then problem order)."""
    return lambda i: (-buffer_weight(buffers[i]) / buffers[i].size, -buffers[i].size, i)


def _repack_and_grow(
    buffers: Sequence[Buffer],
    timeline: _Timeline,
    chosen: dict[int, int],
    order: Sequence[int],
    capacity: int,
    until: float,
    seed: int,
) -> dict[int, int]:
    """Repack `chosen` as tightly as the search can before `until`, offer the buffers of
    `order` again in the space that frees, and repeat while that places more."""
    while time.perf_counter() < until:
        indices = sorted(chosen)
        sub = Problem([buffers[i] for i in indices])
        remaining = max(0.0, until - time.perf_counter())
        tight = solve_one(sub, capacity=None, time_limit=remaining / 2, seed=seed)
        if tight.arena_size > capacity:
            break
        repacked = {i: tight.offsets[buffers[i].id] for i in indices}
        grown = _first_fit(buffers, timeline, order, capacity, repacked, until)
        if len(grown) == len(chosen):
            return repacked
        chosen = grown
    return chosen


def _choose(
    problem: Problem,
    timeline: _Timeline,
    candidates: list[int],
    capacity: int,
    reduced: dict[int, float],
    deadline: float,
    seed: int,
    first: tuple[list[int], dict[int, int]],
    enough: float = math.inf,
) -> dict[int, int]:
    """A set of `candidates` (all in `timeline`) that fits in `capacity` bytes with much
    weight, packed: index -> offset. `first` is a first fit found already and its order
    (weight per byte); the result never weighs less. First fits in other greedy orders and
    in perturbed ones; the best set is then repacked and grown, the rest offered once more by
    search, and parts taken out and refilled, until `deadline` or until the set weighs
    `enough` (the bound: nothing weighs more)."""
    buffers = problem.buffers
    w = {i: buffer_weight(buffers[i]) for i in candidates}
    s = {i: buffers[i].size for i in candidates}
    life = {i: buffers[i].lifetime for i in candidates}
    density = _density_key(buffers)
    orders: list[Callable[[int], tuple[float, ...]]] = [
        lambda i: (-w[i] / (s[i] * life[i]), -s[i], i),
        lambda i: (-w[i], i),
        lambda i: (-s[i], -w[i], i),
        lambda i: (-reduced.get(i, 0.0) / s[i], -w[i] / s[i], i),
        lambda i: (-reduced.get(i, 0.0), -w[i], i),
    ]
    # Two fifths of the time for first fits in many orders, the rest to repack the best.
    search_until = time.perf_counter() + 0.4 * max(deadline - time.perf_counter(), 0.0)
    best_order, best = first
    best_weight = _weight_of(buffers, best)

    def consider(order: list[int]) -> None:
        nonlocal best, best_order, best_weight
        chosen = _first_fit(buffers, timeline, order, capacity, {}, search_until)
        weight = _weight_of(buffers, chosen)
        if weight > best_weight:
            best, best_order, best_weight = chosen, order, weight

    for key in orders:
        if time.perf_counter() >= search_until or best_weight >= enough:
            break
        consider(sorted(candidates, key=key))
    rng = random.Random(seed)
    base_keys = [density, orders[0], orders[3]]
    while time.perf_counter() < search_until and best_weight < enough:
        key = base_keys[rng.randrange(len(base_keys))]
        spread = rng.choice((0.05, 0.2, 0.5))
        noisy = {i: key(i)[0] * (1.0 + spread * rng.random()) for i in candidates}
        consider(sorted(candidates, key=lambda i: (noisy[i], i)))
    if best_weight >= enough:
        return best
    left = max(deadline - time.perf_counter(), 0.0)
    grow_until = time.perf_counter() + 0.75 * left
    best = _repack_and_grow(buffers, timeline, best, best_order, capacity, grow_until, seed)
    best = _insert_by_search(buffers, best, best_order, capacity, deadline, seed)
    if _weight_of(buffers, best) >= enough:
        return best
    return _ruin_and_recreate(buffers, timeline, best, candidates, capacity, deadline, rng, enough)


def _ruin_and_recreate(
    buffers: Sequence[Buffer],
    timeline: _Timeline,
    chosen: dict[int, int],
    candidates: Sequence[int],
    capacity: int,
    until: float,
    rng: random.Random,
    enough: float = math.inf,
) -> dict[int, int]:
    """Until `until`: take out some of the chosen buffers live at a random time, offer every
    buffer left out in a perturbed order of weight per byte (the others stay where they are),
    and keep the result when it weighs at least as much."""
    if not chosen:
        return chosen
    density = {i: buffer_weight(buffers[i]) / buffers[i].size for i in candidates}
    best, best_weight = chosen, _weight_of(buffers, chosen)
    while time.perf_counter() < until and best_weight < enough:
        pivot = buffers[rng.choice(list(best))]
        t = rng.randrange(pivot.lower, pivot.upper)
        share = rng.choice((0.3, 0.6, 1.0))
        kept = {
            i: o
            for i, o in best.items()
            if not (buffers[i].lower <= t < buffers[i].upper and rng.random() < share)
        }
        noise = rng.choice((0.05, 0.2, 0.5))
        order = sorted(
            (i for i in candidates if i not in kept),
            key=lambda i: (-density[i] * (1.0 + noise * rng.random()), i),
        )
        trial = _first_fit(buffers, timeline, order, capacity, kept, until)
        weight = _weight_of(buffers, trial)
        if weight >= best_weight:
            best, best_weight = trial, weight
    return best


def _insert_by_search(
    buffers: Sequence[Buffer],
    chosen: dict[int, int],
    order: Sequence[int],
    capacity: int,
    until: float,
    seed: int,
) -> dict[int, int]:
    """Offer each buffer of `order` left out of `chosen` once more, repacking the whole set
    with the search (a short run per buffer) instead of keeping the others in place."""
    for i in order:
        now = time.perf_counter()
        if now >= until:
            break
        if i in chosen or buffers[i].size > capacity:
            continue
        b = buffers[i]
        live = [j for j in chosen if buffers[j].lower < b.upper and b.lower < buffers[j].upper]
        # Cheap necessary test: at the start of each buffer live with it, the bytes live then.
        points = {b.lower} | {buffers[j].lower for j in live if buffers[j].lower > b.lower}
        if any(
            b.size + sum(buffers[j].size for j in live if buffers[j].lower <= t < buffers[j].upper)
            > capacity
            for t in points
        ):
            continue
        indices = [*sorted(chosen), i]
        sub = Problem([buffers[j] for j in indices])
        trial = solve_one(sub, capacity=capacity, time_limit=min(0.05, until - now), seed=seed)
        if trial.arena_size <= capacity:
            chosen = {j: trial.offsets[buffers[j].id] for j in indices}
    return chosen


# ----- the solution ----------------------------------------------------------------------------


class TieredSolution:
    """A plan over several pools: each buffer's pool and its offset there.

    `solutions[name]` is the plan of one pool (an ordinary `Solution`
    over the buffers of that pool); `pool_of[id]` names each buffer's pool. `to_json()` writes
    it as an `npumem-tier-plan` file, which `from_json()` reads back and `npumem plot` draws.
    """

    def __init__(
        self,
        problem: Problem,
        pools: Sequence[PoolSpec],
        solutions: dict[str, Solution],
        *,
        weight_bound: float,
        seconds: float = 0.0,
    ) -> None:
        self.problem = problem
        self.pools = list(pools)
        self.solutions = solutions
        self.pool_of: dict[str, str] = {
            buf_id: name for name, sol in solutions.items() for buf_id in sol.offsets
        }
        self.offsets: dict[str, int] = {
            buf_id: off for sol in solutions.values() for buf_id, off in sol.offsets.items()
        }
        self.weight_bound = weight_bound
        """No choice places more weight in the first pool (see the module docstring)."""
        self.seconds = seconds
        self.status = FEASIBLE if self.fits else NOT_MET
        """`feasible` when every pool is within its capacity, else `capacity-not-met`."""

    @property
    def fits(self) -> bool:
        """Whether every pool's arena is within its capacity."""
        return all(
            cap is None or self.solutions[name].arena_size <= cap for name, cap in self.pools
        )

    def weight_in(self, pool: str) -> float:
        """The weight of the buffers placed in `pool`."""
        return sum(buffer_weight(self.problem[i]) for i in self.solutions[pool].offsets)

    @property
    def weight_total(self) -> float:
        return sum(buffer_weight(b) for b in self.problem.buffers)

    @property
    def weight_placed(self) -> float:
        """The weight of the buffers in the first (fastest) pool."""
        return self.weight_in(self.pools[0][0])

    @property
    def weight_gap(self) -> float:
        """How far the placed weight is below the bound, as a fraction of the bound."""
        if self.weight_bound <= 0:
            return 0.0
        return max(0.0, (self.weight_bound - self.weight_placed) / self.weight_bound)

    @property
    def weight_status(self) -> str:
        """`optimal` when the placed weight meets the bound, else `feasible`."""
        return OPTIMAL if self.weight_placed >= self.weight_bound - 1e-6 else FEASIBLE

    def summary(self) -> str:
        first = self.pools[0][0]
        parts = [
            f"{name}: {len(self.solutions[name].offsets)} buffers, arena "
            f"{self.solutions[name].arena_size:,} bytes" + ("" if cap is None else f" of {cap:,}")
            for name, cap in self.pools
        ]
        return (
            "; ".join(parts) + f"; weight in {first} {self.weight_placed:,.0f} of at most "
            f"{self.weight_bound:,.0f} (gap {self.weight_gap:.2%}), {self.status}, "
            f"{self.seconds:.3f} s"
        )

    def __repr__(self) -> str:
        return f"<TieredSolution {self.summary()}>"

    def validate(self, *, capacities: bool = True) -> None:
        """Raise `PlanValidationError` unless every buffer is in
        exactly one pool, each pool's plan is valid (aligned, pinned buffers in place, no two
        buffers live at the same time share a byte of the pool) and, with `capacities`,
        within its capacity (`fits` tells whether they were met)."""
        seen: dict[str, str] = {}
        for name, cap in self.pools:
            sol = self.solutions.get(name)
            if sol is None:
                raise PlanValidationError(f"pool {shown(name)} has no plan")
            for buf_id in sol.offsets:
                if buf_id in seen:
                    raise PlanValidationError(
                        f"buffer {shown(buf_id)} is in pools {shown(seen[buf_id])} and "
                        f"{shown(name)}"
                    )
                seen[buf_id] = name
            try:
                sol.validate(capacity=cap if capacities else None)
            except PlanValidationError as exc:
                raise PlanValidationError(f"pool {shown(name)}: {exc}") from None
        missing = [b.id for b in self.problem.buffers if b.id not in seen]
        if missing:
            raise PlanValidationError(f"buffer(s) in no pool: {', '.join(missing[:5])}")

    # ----- exports ----------------------------------------------------------------------------

    def tensor_offsets(self) -> dict[str, tuple[str, int, int]]:
        """`name -> (pool, offset, size)` for every tensor, aliases included; a tensor of 0
        bytes that lies in no buffer (`Problem.empty`) is at offset 0 of the first pool, with
        size 0."""
        table: dict[str, tuple[str, int, int]] = {}
        for name, sol in self.solutions.items():
            for tensor, (off, size) in sol.tensor_offsets().items():
                table[tensor] = (name, off, size)
        first = next(iter(self.solutions), None)
        if first is not None:
            for tensor in self.problem.empty:
                table[tensor] = (first, 0, 0)
        return table

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """`id,lower,upper,size[,alignment][,weight],pool,offset`, in problem order. Raises
        `PlanError` for an id a CSV file cannot keep (`npumem.plan.problem.csv_id`)."""
        buffers = self.problem.buffers
        with_align = any(b.alignment != 1 for b in buffers)
        with_weight = any(b.weight is not None for b in buffers)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(
            ["id", "lower", "upper", "size"]
            + (["alignment"] if with_align else [])
            + (["weight"] if with_weight else [])
            + ["pool", "offset"]
        )
        for b in buffers:
            row: list[object] = [csv_id(b.id), b.lower, b.upper, b.size]
            if with_align:
                row.append(b.alignment)
            if with_weight:
                row.append("" if b.weight is None else b.weight)
            row += [self.pool_of[b.id], self.offsets[b.id]]
            writer.writerow(row)
        text = out.getvalue()
        if path is not None:
            write_text(path, text)
        return text

    def to_json_obj(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict (format `npumem-tier-plan`, version 1; the schema is
        `npumem/schemas/tier-plan.schema.json`): summary figures, one entry per pool, buffers
        with `pool` and `offset`, aliases, the pinned buffers (`pinned`: each one's `id`, the
        `pool` it is pinned to and its `offset` there), tensors with their pool."""
        obj = self.problem.to_json_obj()
        for entry in obj["buffers"]:
            entry["pool"] = self.pool_of[entry["id"]]
            entry["offset"] = self.offsets[entry["id"]]
        pools = []
        for name, cap in self.pools:
            sol = self.solutions[name]
            pools.append(
                {
                    "name": name,
                    "capacity": cap,
                    "arena_size": sol.arena_size,
                    "lower_bound": sol.lower_bound,
                    "buffers": len(sol.offsets),
                    "weight": self.weight_in(name),
                }
            )
        return {
            "format": TIER_PLAN_FORMAT,
            "version": TIER_PLAN_VERSION,
            "status": self.status,
            "weight_placed": self.weight_placed,
            "weight_bound": self.weight_bound,
            "weight_gap": self.weight_gap,
            "weight_total": self.weight_total,
            "seconds": self.seconds,
            "pools": pools,
            **obj,
            "pinned": [
                {"id": b.id, "pool": self.pool_of[b.id], "offset": b.offset}
                for b in self.problem.buffers
                if b.offset is not None
            ],
            "tensors": [
                {"name": t, "pool": p, "offset": o, "size": s}
                for t, (p, o, s) in self.tensor_offsets().items()
            ],
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The plan as JSON text (written to `path` when given); `from_json()` reads it
        back."""
        text = json_text(self.to_json_obj(), indent=1)
        if path is not None:
            write_text(path, text)
        return text

    @classmethod
    def from_json(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        label: str = "<json>",
    ) -> TieredSolution:
        """Read back a plan over several pools (`to_json()`; format `npumem-tier-plan`).
        `source` is a path or the already-decoded object (errors then start with `label`).

        Every field is checked as `tier-plan.schema.json` describes it, the buffers and
        aliases as a problem's, and each pool's plan as `validate(capacities=False)` checks
        it; anything else raises `ProblemFormatError` naming the file and the field. A file of
        another format is refused in the same way. The buffers listed in `pinned` are pinned
        again in the problem read back (each must be one of the plan's buffers, once, pinned
        to one of its pools, and placed in that pool at the offset it is pinned at); a file
        without `pinned` reads with no pinned buffer."""
        if isinstance(source, Mapping):
            return _tier_plan_from_obj(source, label)
        path = path_argument(
            source,
            error=ProblemFormatError,
            what="a JSON file path (str or os.PathLike) or a decoded JSON object",
        )
        obj = read_json_object(
            path, error=ProblemFormatError, expected="a JSON object (a plan over several pools)"
        )
        return _tier_plan_from_obj(obj, str(path))

    def to_c_header(
        self, path: str | os.PathLike[str] | None = None, *, prefix: str = "npumem_plan"
    ) -> str:
        """A C header with one static offset table per pool (`<prefix>_<pool>_table`) and each
        pool's arena size and entry count. A `prefix` that is not a str raises
        `PlanArgumentTypeError`."""
        if not isinstance(prefix, str):
            raise PlanArgumentTypeError(f"prefix must be a str, got {shown(prefix)}")
        ident = c_identifier(prefix)
        macro = ident.upper()
        lines = [
            "/* Generated by npumem.plan: static offsets of a plan over several pools.",
            f" * problem: {c_comment(self.problem.name) or '(unnamed)'}; weight in "
            f"{c_comment(self.pools[0][0])} {self.weight_placed:.0f} of at most "
            f"{self.weight_bound:.0f}. */",
            f"#ifndef {macro}_H",
            f"#define {macro}_H",
            "",
            "#include <stddef.h>",
            "",
            f"typedef struct {ident}_entry {{",
            "    const char *name;",
            "    size_t offset;",
            "    size_t size;",
            f"}} {ident}_entry;",
            "",
        ]
        tables: dict[str, dict[str, tuple[int, int]]] = {name: {} for name, _ in self.pools}
        for tensor, (pool, off, size) in self.tensor_offsets().items():
            tables[pool][tensor] = (off, size)
        for name, cap in self.pools:
            sol = self.solutions[name]
            table = tables[name]
            pool_ident = c_identifier(name)
            pm = f"{macro}_{pool_ident.upper()}"
            lines += [
                f"/* pool {c_comment(name)}: "
                + ("no capacity" if cap is None else f"capacity {cap} bytes")
                + " */",
                f"#define {pm}_ARENA_SIZE {sol.arena_size}u",
                f"#define {pm}_NUM_TENSORS {len(table)}u",
            ]
            if table:
                lines.append(
                    f"static const {ident}_entry {ident}_{pool_ident}_table[{pm}_NUM_TENSORS] = {{"
                )
                lines += [f"    {{{c_string(t)}, {o}u, {s}u}}," for t, (o, s) in table.items()]
                lines.append("};")
            lines.append("")
        lines += [f"#endif /* {macro}_H */", ""]
        text = "\n".join(lines)
        if path is not None:
            write_text(path, text)
        return text


def _tier_plan_from_obj(obj: Mapping[str, Any], label: str) -> TieredSolution:
    """`TieredSolution.from_json` of a decoded object."""
    fmt = obj.get("format")
    if fmt == PLAN_FORMAT:
        raise ProblemFormatError(
            f"{label} is a plan of one arena ({PLAN_FORMAT!r}), not a plan over several pools "
            "(Problem.from_json and npumem plan read it, npumem plot draws it)"
        )
    check_header(obj, label, TIER_PLAN_FORMAT, TIER_PLAN_VERSION, error=ProblemFormatError)
    _check_tier_figures(obj, label)
    try:
        pools = parse_pools([(entry["name"], entry["capacity"]) for entry in obj["pools"]])
    except PlanError as exc:
        raise ProblemFormatError(f"{label}: pools: {exc}") from None
    names = [name for name, _ in pools]
    entries = obj.get("buffers")
    if not isinstance(entries, list):
        raise ProblemFormatError(f"{label}: expected a 'buffers' list")
    placed: list[tuple[str, int]] = []
    stripped: list[Any] = []
    for i, entry in enumerate(entries):
        where = f"{label}: buffers[{i}]"
        if not isinstance(entry, Mapping):
            raise ProblemFormatError(f"{where}: expected an object, got {shown(entry)}")
        pool, offset = entry.get("pool"), entry.get("offset")
        if pool not in names:
            raise ProblemFormatError(
                f"{where}: pool must be one of {names}, got {shown(pool)}"
                if "pool" in entry
                else f"{where}: missing field 'pool' (a plan over several pools has it)"
            )
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_BYTES:
            raise ProblemFormatError(
                f"{where}: offset must be an integer between 0 and {MAX_BYTES}, got {shown(offset)}"
                if "offset" in entry
                else f"{where}: missing field 'offset' (a plan over several pools has it)"
            )
        placed.append((str(pool), offset))
        stripped.append({k: v for k, v in entry.items() if k not in ("pool", "offset")})
    for i, pin_offset in _read_pins(obj, label, entries, placed, names).items():
        # The offset field of a problem's buffer pins it there.
        stripped[i]["offset"] = pin_offset
    problem = Problem.from_json(
        {k: v for k, v in obj.items() if k in ("name", "aliases")} | {"buffers": stripped},
        label=label,
    )
    solutions: dict[str, Solution] = {}
    for k, ((name, cap), figures) in enumerate(zip(pools, obj["pools"], strict=True)):
        indices = [i for i, (pool, _) in enumerate(placed) if pool == name]
        if figures["buffers"] != len(indices):
            raise ProblemFormatError(
                f"{label}: pools[{k}]: buffers is {figures['buffers']}, but {len(indices)} "
                f"buffer(s) are in pool {shown(name)}"
            )
        sub = _part(problem, indices, name)
        offsets = {problem.buffers[i].id: placed[i][1] for i in indices}
        try:
            solutions[name] = Solution(
                sub, offsets, lower_bound=figures["lower_bound"], capacity=cap
            )
        except PlanError as exc:
            raise ProblemFormatError(f"{label}: pool {shown(name)}: {exc}") from None
    solution = TieredSolution(
        problem,
        pools,
        solutions,
        weight_bound=float(obj["weight_bound"]),
        seconds=float(obj["seconds"]),
    )
    try:
        solution.validate(capacities=False)
    except PlanValidationError as exc:
        raise ProblemFormatError(f"{label}: {exc}") from None
    return solution


def _read_pins(
    obj: Mapping[str, Any],
    label: str,
    entries: Sequence[Mapping[str, Any]],
    placed: Sequence[tuple[str, int]],
    names: Sequence[str],
) -> dict[int, int]:
    """The optional `pinned` list of a plan over several pools, checked against the buffers
    (`entries`, each placed at `placed[i]`: pool and offset) and the pools' `names`: each
    entry names one of the buffers, once, a pool of the plan, and the pool and offset where
    the buffer is placed. Returns the pinned offset by buffer index; anything else raises
    `ProblemFormatError` naming the entry."""
    if "pinned" not in obj:
        return {}
    pins = obj["pinned"]
    if not isinstance(pins, list) or not all(isinstance(pin, Mapping) for pin in pins):
        raise ProblemFormatError(f"{label}: pinned must be a list of objects, got {shown(pins)}")
    index: dict[Any, int] = {}
    for i, entry in enumerate(entries):
        index.setdefault(entry.get("id"), i)
    out: dict[int, int] = {}
    seen: dict[int, int] = {}
    for k, pin in enumerate(pins):
        where = f"{label}: pinned[{k}]"
        for key in ("id", "pool", "offset"):
            if key not in pin:
                raise ProblemFormatError(f"{where}: missing field {shown(key)}")
        buf_id, pool, offset = pin["id"], pin["pool"], pin["offset"]
        if not isinstance(buf_id, str) or not isinstance(pool, str):
            key, value = ("id", buf_id) if not isinstance(buf_id, str) else ("pool", pool)
            raise ProblemFormatError(f"{where}: {key} must be a string, got {shown(value)}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_BYTES:
            raise ProblemFormatError(
                f"{where}: offset must be an integer between 0 and {MAX_BYTES}, got {shown(offset)}"
            )
        at = index.get(buf_id)
        if at is None:
            raise ProblemFormatError(
                f"{where}: buffer {shown(buf_id)} is not one of the plan's buffers"
            )
        if at in seen:
            raise ProblemFormatError(
                f"{where}: buffer {shown(buf_id)} is pinned twice (also pinned[{seen[at]}])"
            )
        seen[at] = k
        if pool not in names:
            raise ProblemFormatError(
                f"{where}: buffer {shown(buf_id)} is pinned to pool {shown(pool)}, which the "
                f"plan does not have (its pools: {list(names)})"
            )
        placed_pool, placed_offset = placed[at]
        if pool != placed_pool:
            raise ProblemFormatError(
                f"{where}: buffer {shown(buf_id)} is pinned to pool {shown(pool)} but placed in "
                f"pool {shown(placed_pool)}"
            )
        if offset != placed_offset:
            raise ProblemFormatError(
                f"{where}: buffer {shown(buf_id)} is pinned at offset {offset} but placed at "
                f"{placed_offset}"
            )
        out[at] = offset
    return out


def _check_tier_figures(obj: Mapping[str, Any], label: str) -> None:
    """The fields a plan over several pools must have besides its buffers, as
    `tier-plan.schema.json` lists them: `status` `feasible` or `capacity-not-met`; the weights
    and `seconds` finite numbers >= 0; `pools` a non-empty list of objects with a `name`, a
    `capacity` (a byte count or null), an `arena_size`, a `lower_bound` and a count of
    `buffers`, and a `weight`; `tensors` a list. Anything else raises `ProblemFormatError`
    naming the field."""

    def fail(
        key: str, wanted: str, where: Mapping[str, Any] = obj, at: str = ""
    ) -> ProblemFormatError:
        if key not in where:
            return ProblemFormatError(
                f"{label}: {at}missing field {shown(key)} (a plan over several pools has it)"
            )
        return ProblemFormatError(f"{label}: {at}{key} must be {wanted}, got {shown(where[key])}")

    def number(value: Any) -> bool:
        return (
            not isinstance(value, bool)
            and isinstance(value, int | float)
            and math.isfinite(value)
            and value >= 0
        )

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES

    if obj.get("status") not in (FEASIBLE, NOT_MET):
        raise fail("status", f"{FEASIBLE!r} or {NOT_MET!r}")
    for key in ("weight_placed", "weight_bound", "weight_gap", "weight_total", "seconds"):
        if not number(obj.get(key)):
            raise fail(key, "a finite number >= 0")
    if not isinstance(obj.get("name", ""), str):
        raise fail("name", "a string")
    pools = obj.get("pools")
    if not isinstance(pools, list) or not pools:
        raise fail("pools", "a non-empty list of objects")
    counts = f"an integer between 0 and {MAX_BYTES}"
    for i, entry in enumerate(pools):
        at = f"pools[{i}]: "
        if not isinstance(entry, Mapping):
            raise ProblemFormatError(f"{label}: {at}expected an object, got {shown(entry)}")
        if not isinstance(entry.get("name"), str):
            raise fail("name", "a string", entry, at)
        if "capacity" not in entry or not (entry["capacity"] is None or count(entry["capacity"])):
            raise fail("capacity", f"null or {counts}", entry, at)
        for key in ("arena_size", "lower_bound", "buffers"):
            if not count(entry.get(key)):
                raise fail(key, counts, entry, at)
        if not number(entry.get("weight")):
            raise fail("weight", "a finite number >= 0", entry, at)
    if not isinstance(obj.get("tensors"), list):
        raise fail("tensors", "a list")


# ----- solve -----------------------------------------------------------------------------------


def _part(problem: Problem, indices: Sequence[int], pool: str) -> Problem:
    """The buffers `indices` of `problem` (in increasing order) and their aliases: the problem
    of one pool."""
    buffers = problem.buffers
    ids = {buffers[i].id for i in indices}
    return Problem(
        [buffers[i] for i in indices],
        aliases=[a for a in problem.aliases if a.base in ids],
        name=f"{problem.name}:{pool}" if problem.name else pool,
    )


#: Up to this many buffers that fit a pool, `_fill_pool` tries every order (5,040 first fits
#: at 7). The lowest first fit in the order of an optimal packing's offsets puts every buffer
#: at or below its offset there, so the best of all orders is an optimal choice.
_EXACT_ITEMS = 7


def _fill_pool(
    problem: Problem,
    pool: PoolSpec,
    candidates: list[int],
    deadline: float,
    seed: int,
    bound_iterations: int,
) -> tuple[Solution, float]:
    """The plan of a pool with a capacity: the buffers chosen among `candidates` (problem
    indices) and their offsets; and the bound on the weight any choice places there.

    When at most the capacity's bytes of them are live at once, all of them may fit: the
    planner's packing of the whole set is tried first with half of the time until `deadline`,
    and taken when it fits (nothing weighs more). Otherwise, or when it does not fit, a first
    fit in the order of weight per byte that finishes past the deadline (it is the least the
    pool gets), then the bound with a quarter of the time left and `_choose` with the rest."""
    name, capacity = pool
    assert capacity is not None
    buffers = problem.buffers
    items = [i for i in candidates if buffers[i].size <= capacity]
    timeline = _Timeline(buffers, items)
    if len(items) <= _EXACT_ITEMS:
        # Few enough to try every order: the best first fit over them is the best choice.
        chosen = max(
            (
                _first_fit(buffers, timeline, order, capacity, {}, math.inf)
                for order in itertools.permutations(items)
            ),
            key=lambda placed: _weight_of(buffers, placed),
            default={},
        )
        indices = sorted(chosen)
        sub = _part(problem, indices, name)
        placed = Solution(sub, {buffers[i].id: chosen[i] for i in indices}, capacity=capacity)
        return placed, _weight_of(buffers, chosen)
    if items and timeline.most_live(buffers) <= capacity:
        whole = solve_one(
            _part(problem, items, name),
            capacity=capacity,
            time_limit=max(deadline - time.perf_counter(), 0.0) / 2,
            seed=seed,
        )
        if whole.arena_size <= capacity:
            return whole, _weight_of(buffers, items)
    order = sorted(items, key=_density_key(buffers))
    chosen = _first_fit(buffers, timeline, order, capacity, {}, deadline, finish=True)
    now = time.perf_counter()
    value, red = weight_bound(
        problem,
        capacity,
        candidates=items,
        iterations=bound_iterations,
        target=_weight_of(buffers, chosen),
        deadline=now + max(deadline - now, 0.0) / 4,
    )
    enough = value - 1e-6  # the bound, less rounding: no choice weighs more
    if _weight_of(buffers, chosen) < enough and time.perf_counter() < deadline:
        reduced = dict(zip(items, red, strict=True))
        chosen = _choose(
            problem, timeline, items, capacity, reduced, deadline, seed, (order, chosen), enough
        )
    indices = sorted(chosen)
    sub = _part(problem, indices, name)
    return Solution(sub, {buffers[i].id: chosen[i] for i in indices}, capacity=capacity), value


def solve_tiers(
    problem: Problem,
    pools: Sequence[PoolSpec] | Sequence[str],
    *,
    time_limit: float = 10.0,
    seed: int = 0,
    bound_iterations: int = 300,
) -> TieredSolution:
    """Plan `problem` over `pools` (see the module docstring); stops within about
    `time_limit` seconds. Bad arguments raise what the single-pool `solve` raises for them
    (`PlanArgumentError`, or `PlanArgumentTypeError` for a wrong type)."""
    check_problem(problem, "solve()")
    check_time_limit(time_limit)
    check_seed(seed)
    if isinstance(bound_iterations, bool) or not isinstance(bound_iterations, int):
        raise PlanArgumentTypeError(
            f"bound_iterations must be an int >= 0, got {shown(bound_iterations)}"
        )
    if bound_iterations < 0:
        raise PlanArgumentError(f"bound_iterations must be >= 0, got {bound_iterations}")
    specs = parse_pools(pools)
    start = time.perf_counter()
    buffers = problem.buffers
    remaining = [i for i, b in enumerate(buffers) if b.offset is None]
    fixed = [i for i, b in enumerate(buffers) if b.offset is not None]
    solutions: dict[str, Solution] = {}
    bound = 0.0
    n_limited = len(specs) - 1
    for k, spec in enumerate(specs[:-1]):
        deadline = time.perf_counter() + time_limit * 0.6 / max(n_limited, 1)
        placed, value = _fill_pool(problem, spec, remaining, deadline, seed, bound_iterations)
        if k == 0:
            bound = value
        solutions[spec[0]] = placed
        remaining = [i for i in remaining if buffers[i].id not in placed.offsets]
    for name, cap in specs[:-1]:
        placed = solutions[name]
        # A short search may pack the chosen set into less of the pool (room left for others).
        spare = max(0.0, time_limit - (time.perf_counter() - start)) / (2 * len(specs))
        if spare > 0 and placed.arena_size > placed.lower_bound:
            tighter = solve_one(placed.problem, capacity=None, time_limit=spare, seed=seed)
            if tighter.arena_size < placed.arena_size:
                solutions[name] = Solution(placed.problem, tighter.offsets, capacity=cap)
    last_name, last_cap = specs[-1]
    sub = _part(problem, sorted(remaining + fixed), last_name)
    left = max(0.0, time_limit - (time.perf_counter() - start))
    solutions[last_name] = solve_one(sub, capacity=last_cap, time_limit=left, seed=seed)
    if len(specs) == 1:
        bound = sum(buffer_weight(b) for b in buffers)
    ordered = {name: solutions[name] for name, _ in specs}
    return TieredSolution(
        problem,
        specs,
        ordered,
        weight_bound=max(bound, 0.0),
        seconds=time.perf_counter() - start,
    )


@overload
def solve(problem: Problem, *, pools: None = None, **options: Any) -> Solution: ...


@overload
def solve(
    problem: Problem, *, pools: Sequence[PoolSpec] | Sequence[str], **options: Any
) -> TieredSolution: ...


def solve(
    problem: Problem,
    *,
    pools: Sequence[PoolSpec] | Sequence[str] | None = None,
    **options: Any,
) -> Solution | TieredSolution:
    """`npumem.plan.search.solve` (one arena) without `pools`; with `pools`,
    `solve_tiers`, which returns a `TieredSolution`."""
    if pools is None:
        return solve_one(problem, **options)
    unknown = sorted(set(options) - {"time_limit", "seed", "bound_iterations"})
    if unknown:
        raise PlanArgumentTypeError(
            f"with pools, solve() takes time_limit and seed, not {', '.join(unknown)}"
        )
    return solve_tiers(problem, pools, **options)
