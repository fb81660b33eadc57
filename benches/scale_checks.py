"""How the planner's scan, a grown pool's regions and compaction cost as they grow.

    .venv/bin/python benches/scale_checks.py [--only scan|regions|compaction] [--scale 1]

Each part runs at three sizes, each four times the one before (times `--scale`), so that a
cost that grows faster than its input shows as a ratio above 4 from one row to the next:

* `scan`: random buffers (seeded; lives of 1 to T/50 steps in T = n/10 steps, 1 to 4096
  bytes), `npumem.plan.greedy.linear_scan` without a deadline and with one already passed
  (the arena each gives), and `solve(time_limit=1)` (its arena and seconds);
* `regions`: a pool of 4 MiB that grew by a 2 MiB region for each block of 2 MiB kept, then
  `check()`, and `trim()` once every other block is freed;
* `compaction`: log-uniform blocks of 64 B to 32 KiB (seeded), half freed at random, then
  `plan_compaction("full")`, `plan_compaction("incremental")` with no byte limit, and
  `run_staged` of a staged full compaction with a mover that copies nothing: its pause, and
  the garbage collections that ran inside it.

Times are wall-clock seconds of one run each, on whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import npumem
from bench_args import positive_int_at_most
from npumem.plan import Buffer, Problem, solve
from npumem.plan.greedy import linear_scan

MIB = 1 << 20
PARTS = ("scan", "regions", "compaction")
BASE = {"scan": 50_000, "regions": 2_000, "compaction": 50_000}


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    out = work()
    return time.perf_counter() - began, out


def arena(problem: Problem, offsets: Sequence[int]) -> int:
    return max(o + b.size for o, b in zip(offsets, problem.buffers, strict=True))


def scan_row(n: int) -> str:
    rng = random.Random(0)
    steps = max(100, n // 10)
    buffers = []
    for i in range(n):
        lower = rng.randrange(steps)
        upper = lower + rng.randint(1, max(2, steps // 50))
        buffers.append(Buffer(f"b{i}", lower, upper, rng.randint(1, 4096)))
    problem = Problem(buffers)
    _ = problem.timeline
    whole_s, whole = timed(lambda: linear_scan(problem))
    late_s, late = timed(lambda: linear_scan(problem, deadline=time.perf_counter() - 1))
    solve_s, solution = timed(lambda: solve(problem, time_limit=1.0, seed=0))
    return (
        f"| {n:,} | {whole_s:.2f} | {arena(problem, whole):,} | {late_s:.2f} | "
        f"{arena(problem, late):,} | {solve_s:.2f} | {solution.arena_size:,} |"
    )


def regions_row(n: int) -> str:
    pool = npumem.Pool(4 * MIB, max_capacity=1 << 40, grow_by=2 * MIB, backing="none")
    kept = [pool.alloc(2 * MIB) for _ in range(n)]
    regions = len(pool.regions())
    check_s, _ = timed(pool.check)
    for blk in kept[::2]:
        blk.free()
    trim_s, _ = timed(pool.trim)
    return f"| {n:,} | {regions:,} | {check_s * 1e3:.1f} | {trim_s * 1e3:.1f} |"


def compaction_row(n: int) -> str:
    rng = random.Random(1)
    sizes = [int(2 ** rng.uniform(6, 15)) for _ in range(n)]
    capacity = -(-(2 * sum(sizes) + 64 * MIB) // (2 * MIB)) * 2 * MIB
    pool = npumem.Pool(capacity, cores=2, backing="none")
    blocks = pool.alloc_many(sizes)
    rng.shuffle(blocks)
    pool.free_many(blocks[: n // 2])
    full_s, _ = timed(lambda: pool.plan_compaction("full"))
    incremental_s, _ = timed(lambda: pool.plan_compaction("incremental", max_bytes=1 << 40))

    def mover(transfers: Sequence[Any]) -> None:
        pass

    staged = pool.stage_compaction("full", mover=mover)
    collections: list[str] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(str(info["generation"]))

    gc.callbacks.append(count)
    try:
        with pool.pause() as pause:
            report = pool.run_staged(pause, staged, mover=mover)
    finally:
        gc.callbacks.remove(count)
    by_generation = ", ".join(
        f"{collections.count(g)} of generation {g}" for g in sorted(set(collections))
    )
    return (
        f"| {n - n // 2:,} | {full_s * 1e3:.0f} | {incremental_s * 1e3:.0f} | "
        f"{report.pause_seconds * 1e3:.0f} | {by_generation or 'none'} |"
    )


HEADERS = {
    "scan": (
        "| buffers | scan s | arena | late scan s | late arena | solve(time_limit=1) s | "
        "solve arena |\n|---:|---:|---:|---:|---:|---:|---:|"
    ),
    "regions": "| regions grown | regions | check() ms | trim() ms |\n|---:|---:|---:|---:|",
    "compaction": (
        "| live blocks | plan full ms | plan incremental ms | run_staged pause ms | "
        "collections in the pause |\n|---:|---:|---:|---:|---|"
    ),
}
ROWS: dict[str, Callable[[int], str]] = {
    "scan": scan_row,
    "regions": regions_row,
    "compaction": compaction_row,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--only", choices=PARTS, help="one part (default: all)")
    parser.add_argument(
        "--scale",
        type=positive_int_at_most(16),
        default=1,
        help="multiply every size by this (1 to 16; default 1)",
    )
    args = parser.parse_args()
    for part in [args.only] if args.only else PARTS:
        print(f"\n### {part}\n\n{HEADERS[part]}", flush=True)
        for step in range(3):
            print(ROWS[part](BASE[part] * args.scale * 4**step), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
