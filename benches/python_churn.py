"""A churn of random sizes from Python at a high occupancy: failed allocations and the time per
step, through the binding as a runtime allocates (``pool.alloc``: the quick part with the GIL
held, then the full path without it).

A 1 GiB pool with ``backing="none"`` and two core pools is filled with sizes log-uniform from
256 B to 1 MiB until the requested bytes reach the occupancy; then each step frees a random
live block and allocates a new random size in its place. When that allocation fails, the step
counts a failure and the slot takes a block of its old size again if that fits (else it is
dropped), so the occupancy stays. The same sizes as the Rust harness's churn table
(``benches/examples/mixed_sizes.rs``), drawn by Python's generator from ``--seed``.

    .venv/bin/python benches/python_churn.py [--occupancy 85] [--steps 200000] [--seed 1]

Pin it to one CPU (``taskset -c 1``) for a sequence that does not depend on the scheduler: the
core pool an allocation uses follows the CPU the thread runs on.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

import npumem
from bench_args import positive_int, positive_int_at_most

LO, HI = 256, 1 << 20
CAPACITY = 1 << 30


def churn(occupancy: int, steps: int, seed: int) -> tuple[int, float]:
    """Failed allocations and CPU ns per step of the churn (see above)."""
    rng = random.Random(seed)
    lo, hi = math.log(LO), math.log(HI)

    def size() -> int:
        return int(math.exp(rng.uniform(lo, hi)))

    pool = npumem.Pool(CAPACITY, cores=2, backing="none")
    held: list[tuple[npumem.Block, int]] = []
    requested = 0
    while requested * 100 < occupancy * CAPACITY:
        n = size()
        held.append((pool.alloc(n), n))
        requested += n
    failed = 0
    start = time.thread_time()
    for _ in range(steps):
        i = rng.randrange(len(held))
        blk, old = held[i]
        blk.free()
        n = size()
        try:
            held[i] = (pool.alloc(n), n)
        except npumem.OutOfMemoryError:
            failed += 1
            try:
                held[i] = (pool.alloc(old), old)
            except npumem.OutOfMemoryError:
                held.pop(i)
    ns = (time.thread_time() - start) / steps * 1e9
    for blk, _ in held:
        blk.free()
    pool.check()
    return failed, ns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A churn of random sizes from Python")
    parser.add_argument("--occupancy", type=positive_int_at_most(95), default=85, help="percent")
    parser.add_argument("--steps", type=positive_int, default=200_000)
    parser.add_argument("--seed", type=positive_int, default=1)
    args = parser.parse_args(argv)
    failed, ns = churn(args.occupancy, args.steps, args.seed)
    print(
        f"Churn from Python at {args.occupancy}% (1 GiB, {LO} B-{HI >> 20} MiB, seed {args.seed}): "
        f"{failed} of {args.steps} allocations failed, {ns:,.0f} ns per step (CPU time)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
