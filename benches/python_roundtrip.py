"""Python-side costs of npumem, medians of repeated timings in one run, with peers measured the
same way in the same process:

- ``pool.alloc(n).free()`` round trip (target: at most 500 ns);
- ``pool.alloc_many(sizes)`` then ``pool.free_many(blocks)`` for 1000 blocks, per block
  (target: alloc_many at most 100 ns per block);
- peers: ``bytearray(n)`` creation and release (CPython's own allocator), and the cost of an
  empty method call on a Rust object (``pool.capacity``), the floor of any binding call;
- random sizes: with 2000 blocks live (sizes log-uniform from 64 B to 1 MiB, on a 1 GiB pool
  with ``backing="none"``), each step frees a random live block and allocates a new size in its
  place; beside it, the same loop over a dict (delete a random key, insert a new one) with the
  same indices, in the same run, alternating (target: the pool at most 3x the dict); and the
  pool's loop with every size 256 B, which only the slab path serves: what the step costs
  without the buddy placement and release (the binding, the handles and the interpreter).

    .venv/bin/python benches/python_roundtrip.py [--repeat 15] [--cpu-time] [--only random]
        [--loop pool|dict|small]

``--cpu-time`` times every loop by the thread's CPU time instead of wall time: on a shared
machine, time given to other processes then does not count. ``--only random`` measures the
random sizes only; ``--loop`` runs only one of their three loops (and prints its figure), for a
profiler: under callgrind, ``--only random --loop pool --repeat 2`` less the same with
``--repeat 1`` is one run of 20,000 steps of that loop, everything else being the same.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
import timeit

import npumem
from bench_args import positive_int

#: The clock of every timing: wall time, or the thread's CPU time with ``--cpu-time``.
clock = time.perf_counter


def median_ns(stmt: str, setup_globals: dict[str, object], number: int, repeat: int) -> float:
    timer = timeit.Timer(stmt, timer=clock, globals=setup_globals)
    runs = timer.repeat(repeat=repeat, number=number)
    return statistics.median(runs) / number * 1e9


LIVE = 2000


LOOPS = ("pool", "dict", "small")


def random_sizes(
    repeat: int, steps: int = 20_000, loops: tuple[str, ...] = LOOPS
) -> dict[str, float]:
    """Median ns per step of the random-size pool loop (``pool``), of the dict loop (``dict``)
    and of the pool loop with every size 256 B (``small``), of those named in ``loops`` (see
    above)."""
    rng = random.Random(5)
    lo, hi = math.log(64), math.log(1 << 20)

    def size() -> int:
        return int(math.exp(rng.uniform(lo, hi)))

    sizes = [size() for _ in range(steps)]
    slots = [rng.randrange(LIVE) for _ in range(steps)]
    pool = npumem.Pool(1 << 30, cores=2, backing="none")
    live = [pool.alloc(size()) for _ in range(LIVE)]
    small_pool = npumem.Pool(1 << 30, cores=2, backing="none")
    small = [small_pool.alloc(256) for _ in range(LIVE)]
    table = {k: k for k in range(LIVE)}
    keys = list(range(LIVE))

    def pool_loop() -> None:
        for i, n in zip(slots, sizes, strict=True):
            live[i].free()
            live[i] = pool.alloc(n)

    def small_loop() -> None:
        for i, _n in zip(slots, sizes, strict=True):
            small[i].free()
            small[i] = small_pool.alloc(256)

    def dict_loop() -> None:
        key = keys[-1] + LIVE
        for i, n in zip(slots, sizes, strict=True):
            del table[keys[i]]
            key += 1
            keys[i] = key
            table[key] = n

    runs = {"pool": pool_loop, "dict": dict_loop, "small": small_loop}
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeat):
        for name in loops:
            start = clock()
            runs[name]()
            times[name].append((clock() - start) / steps * 1e9)
    for b in live:
        b.free()
    for b in small:
        b.free()
    pool.check()
    small_pool.check()
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Python-side costs of npumem")
    parser.add_argument("--repeat", type=positive_int, default=15)
    parser.add_argument("--cpu-time", action="store_true", help="time by the thread's CPU time")
    parser.add_argument(
        "--only", choices=("all", "random"), default="all", help="measure the random sizes only"
    )
    parser.add_argument("--loop", choices=LOOPS, help="run only this loop of the random sizes")
    args = parser.parse_args(argv)
    global clock
    if args.cpu_time:
        clock = time.thread_time
    what = "CPU time" if args.cpu_time else "wall time"
    if args.loop is not None:
        ns = random_sizes(args.repeat, loops=(args.loop,))[args.loop]
        print(f"Random sizes, {args.loop} loop only: {ns:,.0f} ns per step ({what})")
        return 0
    if args.only == "random":
        print_random_sizes(args.repeat)
        return 0
    pool = npumem.Pool(256 << 20, cores=2)
    env: dict[str, object] = {"pool": pool, "sizes": [256] * 1000}
    rows: list[tuple[str, float, str]] = []
    for size in (64, 256, 4096, 65536, 1 << 20):
        env["n"] = size
        rows.append(
            (
                f"pool.alloc({size}).free()",
                median_ns("pool.alloc(n).free()", env, 20_000, args.repeat),
                "round trip",
            )
        )
        rows.append(
            (
                f"bytearray({size}) (peer)",
                median_ns("bytearray(n)", env, 20_000, args.repeat),
                "create + release",
            )
        )
    rows.append(
        (
            "pool.capacity (floor)",
            median_ns("pool.capacity", env, 200_000, args.repeat),
            "getter call",
        )
    )
    per_block = median_ns("pool.alloc_many(sizes)", {**env, "pool": pool}, 1, 1)  # warm up
    allocs = []

    def alloc_many_once() -> None:
        allocs.append(pool.alloc_many(env["sizes"]))  # type: ignore[arg-type]

    def free_many_once() -> None:
        pool.free_many(allocs.pop())

    a_times, f_times = [], []
    for _ in range(args.repeat * 4):
        a_times.append(timeit.timeit(alloc_many_once, timer=clock, number=1))
        f_times.append(timeit.timeit(free_many_once, timer=clock, number=1))
    per_block = statistics.median(a_times) / 1000 * 1e9
    per_free = statistics.median(f_times) / 1000 * 1e9
    rows.append(("pool.alloc_many(1000 x 256 B)", per_block, "per block"))
    rows.append(("pool.free_many(1000 blocks)", per_free, "per block"))
    python_version = sys.version.split()[0]
    print(f"npumem {npumem.__version__}, Python {python_version}, ", end="")
    print(f"medians of {args.repeat} runs, {what}\n")
    print("| operation | median ns | unit |")
    print("|---|---:|---|")
    for name, ns, unit in rows:
        print(f"| `{name}` | {ns:,.0f} | {unit} |")
    pool.check()
    print()
    print_random_sizes(args.repeat)
    return 0


def print_random_sizes(repeat: int) -> None:
    found = random_sizes(repeat)
    pool_ns, dict_ns, small_ns = found["pool"], found["dict"], found["small"]
    print(f"Random sizes 64 B-1 MiB, {LIVE} live, medians of {repeat} runs (alternating):\n")
    print("| loop step | median ns |")
    print("|---|---:|")
    print(f"| pool: free a random block, allocate a random size | {pool_ns:,.0f} |")
    print(f"| dict: delete a random key, insert a new one | {dict_ns:,.0f} |")
    print(f"| pool / dict (target: at most 3x) | {pool_ns / dict_ns:.2f}x |")
    print(f"| pool, every size 256 B (slab path only) | {small_ns:,.0f} |")
    print(f"| pool, every size 256 B / dict | {small_ns / dict_ns:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
