"""Hard packing instances with a known optimum: perfect packings of a time x bytes square.

Every instance cuts the square `[0, horizon) x [0, capacity)` (time steps x bytes, in units of
`unit` bytes and steps) into rectangles, and each rectangle becomes a buffer: live over its
time range, as large as its byte range. Every instant is covered exactly, so the lower bound
(the most bytes live at once) equals the capacity, and the cut itself is a packing at that
capacity: the instance is feasible at its bound, and a planner has to find a perfect packing.

Three kinds of cuts, after the MiniMalloc challenging instances (1 MiB x 1 MiB in units of 1 KiB;
150-450 buffers; most of them mix buffers of 1 KiB to most of the capacity living from one step
to the whole run, some have buffers of 30-120 KiB living 2-5% of the run):

* `guillotine`: rectangles cut in two, again and again, straight across (time or bytes, the
  largest rectangles most often), so sizes and lifetimes spread over three orders of magnitude;
* `skyline`: rectangles laid bottom-up on the lowest part of the filled profile, each as wide
  (in time) and tall (in bytes) as a random draw allows: a tiling that straight cuts cannot
  make, with sizes and lifetimes within a factor of about four;
* `skyline-mixed`: the same laying with sizes and lifetimes drawn on a log scale.

With `aligned=True`, each buffer also gets an alignment drawn from `ALIGNMENTS` (64 B, 4 KiB,
64 KiB, 1 MiB) among those that divide the byte start of its rectangle, so the cut is still a
packing at the bound with every offset aligned: instances with mixed large alignments whose
optimum is the capacity (the alignment bound is the capacity too).

`instance()` is deterministic: the same kind, seed and size give the same problem on every
machine (Python's `random.Random` with an integer seed).
"""

from __future__ import annotations

import math
import random

from npumem._shown import shown
from npumem.plan.bounds import lower_bound
from npumem.plan.buffers import Buffer
from npumem.plan.greedy import best_greedy
from npumem.plan.problem import Problem

__all__ = ["ALIGNMENTS", "KINDS", "instance", "instance_set", "is_hard", "spec"]

KINDS = ("guillotine", "skyline", "skyline-mixed")

GRID = 1024
"""Steps of time and units of bytes along each side of the square."""
UNIT = 1024
"""Bytes per unit: the capacity is `GRID * UNIT` = 1 MiB."""
MIN_BUFFERS, MAX_BUFFERS = 150, 450
ALIGNMENTS = (64, 4 << 10, 64 << 10, 1 << 20)
"""The alignments of `instance(..., aligned=True)`, in bytes."""


def _guillotine(rng: random.Random, count: int) -> list[tuple[int, int, int, int]]:
    rects = [(0, GRID, 0, GRID)]
    while len(rects) < count:
        weights = [((t1 - t0) * (a1 - a0)) ** 0.7 for t0, t1, a0, a1 in rects]
        k = rng.choices(range(len(rects)), weights=weights)[0]
        t0, t1, a0, a1 = rects[k]
        along_time = rng.random() < 0.5
        if (t1 - t0 if along_time else a1 - a0) < 2:
            along_time = not along_time
        lo, hi = (t0, t1) if along_time else (a0, a1)
        if hi - lo < 2:
            continue
        # Thin slices now and then: long-lived small buffers and short-lived large ones.
        draw = rng.random()
        if draw < 0.2:
            fraction = rng.uniform(0.01, 0.15)
        elif draw < 0.4:
            fraction = rng.uniform(0.85, 0.99)
        else:
            fraction = rng.uniform(0.15, 0.85)
        cut = lo + max(1, min(hi - lo - 1, round((hi - lo) * fraction)))
        if along_time:
            rects[k : k + 1] = [(t0, cut, a0, a1), (cut, t1, a0, a1)]
        else:
            rects[k : k + 1] = [(t0, t1, a0, cut), (t0, t1, cut, a1)]
    return rects


def _skyline(
    rng: random.Random, count: int, mixed: bool, scale: float
) -> list[tuple[int, int, int, int]]:
    side = scale * math.sqrt(GRID * GRID / count)

    def draw() -> int:
        if mixed:
            return max(1, round(side * math.exp(rng.uniform(-1.6, 1.2))))
        return max(1, round(side * rng.uniform(0.45, 1.55)))

    height = [0] * GRID  # bytes filled at each time step
    rects: list[tuple[int, int, int, int]] = []
    while True:
        # Valleys: runs of equal height with higher ground (or the ends) on both sides. A
        # rectangle laid on the floor of a valley leaves no hole under it.
        valleys = []
        t = 0
        while t < GRID:
            end = t
            while end < GRID and height[end] == height[t]:
                end += 1
            left = height[t - 1] if t > 0 else GRID + 1
            right = height[end] if end < GRID else GRID + 1
            if height[t] < GRID and left > height[t] < right:
                valleys.append((t, end))
            t = end
        if not valleys:
            return rects
        start, end = rng.choice(valleys)
        low = height[start]
        span = end - start
        width = min(draw(), span)
        if span - width < max(1, round(side * 0.3)):
            width = span  # a sliver would be left: take the whole valley
        t0 = start if rng.random() < 0.5 else end - width
        room = GRID - low
        size = min(draw(), room)
        if room - size < max(1, round(side * 0.3)):
            size = room
        rects.append((t0, t0 + width, low, low + size))
        for t in range(t0, t0 + width):
            height[t] = low + size


def spec(kind: str, seed: int) -> tuple[str, int]:
    """The kind and the number of rectangles aimed at for `seed` (the count of a skyline is
    near it, not exact)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {shown(kind)}; expected one of {', '.join(KINDS)}")
    rng = random.Random(f"{kind}/{seed}/count")
    return kind, rng.randrange(MIN_BUFFERS + 20, MAX_BUFFERS - 40)


def instance(kind: str, seed: int, *, aligned: bool = False) -> Problem:
    """One instance of `kind` (see `KINDS`): a perfect packing of 1 MiB x 1024 steps,
    150-450 buffers, shuffled, named `{kind}-{seed}`. With `aligned`, the same buffers each
    with an alignment of `ALIGNMENTS` that divides its byte start in the cut (drawn evenly
    among those), named `aligned-{kind}-{seed}`."""
    if not isinstance(aligned, bool):
        raise TypeError(f"aligned must be a bool, got {shown(aligned)}")
    _, count = spec(kind, seed)
    attempt = 0
    scale = 1.6 if kind == "skyline-mixed" else 1.3  # the lay leaves narrow pieces: more of them
    while True:
        rng = random.Random(f"{kind}/{seed}/{attempt}")
        if kind == "guillotine":
            rects = _guillotine(rng, count)
        else:
            rects = _skyline(rng, count, mixed=kind == "skyline-mixed", scale=scale)
        if MIN_BUFFERS <= len(rects) <= MAX_BUFFERS:
            break
        scale *= math.sqrt(len(rects) / count)
        attempt += 1
    rng.shuffle(rects)
    if not aligned:
        buffers = [
            Buffer(str(i), t0 * UNIT, t1 * UNIT, (a1 - a0) * UNIT)
            for i, (t0, t1, a0, a1) in enumerate(rects)
        ]
        return Problem(buffers, name=f"{kind}-{seed}")
    pick = random.Random(f"{kind}/{seed}/align")
    buffers = [
        Buffer(
            str(i),
            t0 * UNIT,
            t1 * UNIT,
            (a1 - a0) * UNIT,
            alignment=pick.choice([g for g in ALIGNMENTS if a0 * UNIT % g == 0]),
        )
        for i, (t0, t1, a0, a1) in enumerate(rects)
    ]
    return Problem(buffers, name=f"aligned-{kind}-{seed}")


def is_hard(problem: Problem) -> bool:
    """Whether no greedy rule of `npumem.plan.greedy` packs `problem` at its bound (the
    MiniMalloc challenging instances all leave the best rule 12-37% above it)."""
    return best_greedy(problem).arena_size > lower_bound(problem)


def instance_set(name: str, size: int) -> list[Problem]:
    """A named set of `size` hard instances (`is_hard()`), the kinds taken in turn:
    `"train"` draws seeds from 0, `"test"` from 1000000, so the two never share an instance.
    Instance `i` takes the first seed `first + i + 1000 * k` (k = 0, 1, ...) that is hard."""
    first = {"train": 0, "test": 1_000_000}.get(name)
    if first is None:
        raise ValueError(f"unknown set {shown(name)}; expected 'train' or 'test'")
    problems = []
    for i in range(size):
        kind = KINDS[i % len(KINDS)]
        seed = first + i
        while not is_hard(problem := instance(kind, seed)):
            seed += 1000
        problems.append(problem)
    return problems
