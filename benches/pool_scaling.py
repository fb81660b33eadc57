"""What single calls cost on large pools and after large frees, by the calling thread's CPU
time (a shared machine's other processes do not count), each call timed alone:

- ``refill``: allocate N small blocks of one size, free them all in random order, then time the
  next 300 allocations of that size (the first refill of the class comes among them): the
  costliest and the median, per round;
- ``failing``: a pool of each capacity filled exactly with 1 MiB blocks, then 200 failing
  allocations of 64 B, of 1 MiB and of twice the capacity (refused as too large): median and
  costliest; and ``stats()`` on the full pool (median of 20);
- ``large``: allocations of whole chunks (2 MiB) filling an empty pool of each capacity
  (median), and a churn of 1-4 MiB blocks at 50% occupancy (median and p99), with
  ``run_tails`` on (the default) and off;
- ``stats``: ``stats()`` (median of 7) on a pool of each capacity filled to 90% with random
  sizes from 64 B to 8 MiB (log-uniform), after freeing a random half of the blocks, and after
  200 steps of a churn that frees one block and allocates another;
- ``huge``: ``stats()`` (median and range of 7) on offset-only pools of 1, 16 and 256 TiB that
  hold 100 blocks of 1 MiB: what a mostly empty arena of millions of chunks costs;
- ``growth``: a pool of one chunk that grows by one chunk at a time up to 1 TiB, allocating
  whole chunks: the CPU time per growth over each 1,000 growths, up to 3,000 regions.

    .venv/bin/python benches/pool_scaling.py [--parts refill,failing,large,stats,huge,growth]
        [--gib 1,16,64] [--blocks 1000000] [--steps 5000]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable

import npumem
from bench_args import positive_int, positive_int_at_most

PARTS = ("refill", "failing", "large", "stats", "huge", "growth")
clock = time.thread_time_ns


def timed(call: Callable[[], object]) -> float:
    """The thread CPU time of one call, microseconds."""
    start = clock()
    call()
    return (clock() - start) / 1e3


def refill(blocks: int, size: int, rounds: int = 3) -> None:
    print(f"\n### The allocations after freeing {blocks:,} blocks of {size} B (one core)\n")
    print("| round | costliest of the next 300, us | median, us |")
    print("|---|---:|---:|")
    pool = npumem.Pool(max(256 << 20, blocks * size * 2), cores=1, backing="none")
    rng = random.Random(1)
    for r in range(rounds):
        live = pool.alloc_many([size] * blocks)
        rng.shuffle(live)
        pool.free_many(live)
        del live
        kept: list[npumem.Block] = []

        def take(kept: list[npumem.Block] = kept) -> None:
            kept.append(pool.alloc(size))

        costs = [timed(take) for _ in range(300)]
        print(f"| {r + 1} | {max(costs):,.1f} | {statistics.median(costs):.2f} |")
        pool.free_many(kept)
    pool.check()


def failing(gibs: list[int]) -> None:
    print("\n### Failing allocations on a full pool (filled with 1 MiB blocks; two cores)\n")
    print(
        "| capacity | 64 B: median / max us | 1 MiB: median / max us | "
        "twice the capacity: median / max us | `stats()`: median us |"
    )
    print("|---|---:|---:|---:|---:|")
    for gib in gibs:
        capacity = gib << 30
        pool = npumem.Pool(capacity, cores=2, backing="none")
        live = pool.alloc_many([1 << 20] * (capacity >> 20))
        row = [f"{gib} GiB"]
        for size in (64, 1 << 20, 2 * capacity):

            def fail(pool: npumem.Pool = pool, size: int = size) -> None:
                try:
                    pool.alloc(size)
                except npumem.OutOfMemoryError:
                    return
                raise AssertionError("an allocation in a full pool succeeded")

            costs = [timed(fail) for _ in range(200)]
            row.append(f"{statistics.median(costs):,.1f} / {max(costs):,.0f}")
        row.append(f"{statistics.median(timed(pool.stats) for _ in range(20)):,.0f}")
        print("| " + " | ".join(row) + " |")
        pool.free_many(live)
        del live, pool


def large(gibs: list[int], steps: int) -> None:
    print("\n### Blocks of a chunk and more (two cores)\n")
    print(
        "| capacity | 2 MiB filling an empty pool: median us | 1-4 MiB churn at 50%: median / "
        "p99 us | the same, `run_tails=False` |"
    )
    print("|---|---:|---:|---:|")
    for gib in gibs:
        capacity = gib << 30
        pool = npumem.Pool(capacity, cores=2, backing="none")
        held: list[npumem.Block] = []

        def take(pool: npumem.Pool = pool, held: list[npumem.Block] = held) -> None:
            held.append(pool.alloc(2 << 20))

        fill = [timed(take) for _ in range(capacity >> 21)]
        pool.free_many(held)
        del held, pool
        churns = [churn(capacity, steps, tails) for tails in (True, False)]
        print(f"| {gib} GiB | {statistics.median(fill):,.1f} | {churns[0]} | {churns[1]} |")


def churn(capacity: int, steps: int, tails: bool) -> str:
    rng = random.Random(7)
    pool = npumem.Pool(capacity, cores=2, backing="none", run_tails=tails)

    def size() -> int:
        return int((1 << 20) * 2 ** (rng.random() * 2))

    live: list[npumem.Block] = []
    used = 0
    while used < capacity // 2:
        n = size()
        live.append(pool.alloc(n))
        used += n
    costs = []
    for _ in range(steps):
        j = rng.randrange(len(live))
        live[j].free()
        n = size()

        def replace(j: int = j, n: int = n) -> None:
            live[j] = pool.alloc(n)

        costs.append(timed(replace))
    costs.sort()
    pool.check()
    return f"{costs[len(costs) // 2]:,.1f} / {costs[int(len(costs) * 0.99)]:,.1f}"


def stats_cost(gibs: list[int]) -> None:
    print("\n### `stats()` on large pools of mixed sizes (two cores): median of 7, ms\n")
    print("| capacity | blocks | filled to 90% | a random half freed | after 200 more steps |")
    print("|---|---:|---:|---:|---:|")
    for gib in gibs:
        capacity = gib << 30
        pool = npumem.Pool(capacity, cores=2, backing="none")
        rng = random.Random(3)

        def size(rng: random.Random = rng) -> int:
            return int(64 * (2 ** (rng.random() * 17)))

        live: list[npumem.Block] = []
        used = 0
        while used < capacity * 9 // 10:
            n = size()
            try:
                live.append(pool.alloc(n))
            except npumem.OutOfMemoryError:
                break
            used += n
        blocks = len(live)
        figures = [statistics.median(timed(pool.stats) for _ in range(7)) / 1e3]
        rng.shuffle(live)
        pool.free_many(live[: len(live) // 2])
        live = live[len(live) // 2 :]
        figures.append(statistics.median(timed(pool.stats) for _ in range(7)) / 1e3)
        for _ in range(200):
            j = rng.randrange(len(live))
            live[j].free()
            live[j] = pool.alloc(size())
        figures.append(statistics.median(timed(pool.stats) for _ in range(7)) / 1e3)
        pool.free_many(live)
        pool.check()
        print(f"| {gib} GiB | {blocks:,} | " + " | ".join(f"{f:,.2f}" for f in figures) + " |")


def huge_stats() -> None:
    print("\n### `stats()` on mostly empty offset-only pools (100 blocks of 1 MiB)\n")
    print("| capacity | chunks | median, ms | range, ms |")
    print("|---|---:|---:|---|")
    for tib in (1, 16, 256):
        pool = npumem.Pool(tib << 40, cores=2, backing="none")
        held = [pool.alloc(1 << 20) for _ in range(100)]
        times = [timed(pool.stats) / 1e3 for _ in range(7)]
        print(
            f"| {tib} TiB | {(tib << 40) // pool.chunk_size:,} | {statistics.median(times):,.1f} | "
            f"{min(times):,.1f}-{max(times):,.1f} |"
        )
        pool.free_many(held)


def growth() -> None:
    print("\n### Growth by one chunk at a time (whole-chunk allocations, up to 1 TiB)\n")
    print("| regions | CPU per growth, us (the last 1,000) |")
    print("|---:|---:|")
    pool = npumem.Pool(2 << 20, cores=1, backing="none", max_capacity=1 << 40, grow_by=1)
    held = [pool.alloc(2 << 20)]
    for target in (1000, 2000, 3000):
        start = clock()
        while len(held) < target:
            held.append(pool.alloc(2 << 20))
        print(f"| {len(pool.regions()):,} | {(clock() - start) / 1e3 / 1000:,.1f} |")
    pool.free_many(held)
    pool.trim()


def parts(text: str) -> list[str]:
    named = [p.strip() for p in text.split(",")]
    unknown = [p for p in named if p not in PARTS]
    if unknown or not named:
        raise argparse.ArgumentTypeError(f"must name some of {', '.join(PARTS)}, got {text!r}")
    return named


def gib_list(text: str) -> list[int]:
    try:
        return [positive_int_at_most(1 << 14)(p) for p in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be capacities in GiB from 1 to 16384, separated by commas, got {text!r}"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="single calls on large pools and after large frees"
    )
    parser.add_argument("--parts", type=parts, default=list(PARTS))
    parser.add_argument("--gib", type=gib_list, default=[1, 16, 64])
    parser.add_argument("--blocks", type=positive_int_at_most(1 << 24), default=1_000_000)
    parser.add_argument("--steps", type=positive_int, default=5000)
    args = parser.parse_args(argv)
    gc.disable()
    print(f"npumem {npumem.__version__}, Python {sys.version.split()[0]}, thread CPU time")
    if "refill" in args.parts:
        refill(args.blocks, 64)
    if "failing" in args.parts:
        failing(args.gib)
    if "large" in args.parts:
        large(args.gib, args.steps)
    if "stats" in args.parts:
        stats_cost(args.gib)
    if "huge" in args.parts:
        huge_stats()
    if "growth" in args.parts:
        growth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
