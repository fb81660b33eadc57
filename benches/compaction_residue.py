"""What a full compaction leaves outside the largest free block, on small pools of odd sizes:
a host pool is filled with blocks of uniform random sizes, every other one is freed, and
``Compactor(pool).compact("full")`` runs. Per seed it prints the fragmentation before and
after, the free bytes outside the largest free block, and the two parts of them no packing can
use: the bank rule's slack (the rest of the last bank of every block larger than a bank) and the
chunk granularity (the free part of the last, partly filled chunk: at most one chunk).

    .venv/bin/python benches/compaction_residue.py [--capacity-mib 64] [--min 1024]
        [--max 102400] [--seeds 8]
"""

from __future__ import annotations

import argparse
import random
import time

import npumem
from bench_args import positive_int
from npumem.compaction import Compactor

KIB, MIB = 1 << 10, 1 << 20


def run(capacity: int, low: int, high: int, seed: int) -> dict[str, float]:
    pool = npumem.Pool(capacity, cores=2)
    rng = random.Random(seed)
    made = []
    while True:
        try:
            made.append(pool.alloc(rng.randint(low, high)))
        except npumem.OutOfMemoryError:
            break
    for i, blk in enumerate(made):
        if i % 2 == 0:
            blk.free()
    before = pool.stats()
    started = time.perf_counter()
    report = Compactor(pool).compact("full")
    seconds = time.perf_counter() - started
    after = pool.stats()
    bank = pool.bank_size
    slack = sum(
        -b.block_bytes % bank for b in pool.blocks() if bank < b.block_bytes <= pool.chunk_size // 2
    )
    return {
        "before": before.external_fragmentation,
        "after": after.external_fragmentation,
        "outside": after.bytes_free - after.largest_free_block,
        "slack": slack,
        "chunk": pool.chunk_size,
        "moved": report.bytes_moved,
        "live": after.bytes_in_use,
        "ms": seconds * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity-mib", type=positive_int, default=64)
    parser.add_argument(
        "--min", type=positive_int, default=1024, help="smallest block size (bytes)"
    )
    parser.add_argument(
        "--max", type=positive_int, default=100 * KIB, help="largest block size (bytes)"
    )
    parser.add_argument("--seeds", type=positive_int, default=8)
    args = parser.parse_args(argv)
    if args.min > args.max:
        parser.error(f"--min ({args.min}) must not be above --max ({args.max})")
    if args.max * 4 > args.capacity_mib * MIB:
        parser.error(
            f"--max ({args.max}) must be at most a quarter of the pool ({args.capacity_mib} MiB)"
        )
    print(
        f"pool {args.capacity_mib} MiB, sizes {args.min}-{args.max} bytes, every other block freed"
    )
    print(
        "| seed | fragmentation before -> after | outside the largest free block | bank slack | "
        "moved / live | compact() |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for seed in range(args.seeds):
        r = run(args.capacity_mib * MIB, args.min, args.max, seed)
        within = "yes" if r["outside"] <= r["slack"] + r["chunk"] else "NO"
        print(
            f"| {seed} | {r['before']:.3f} -> {r['after']:.3f} | {r['outside'] / KIB:,.0f} KiB "
            f"(within slack + one chunk: {within}) | {r['slack'] / KIB:,.0f} KiB | "
            f"{r['moved'] / MIB:.1f} / {r['live'] / MIB:.1f} MiB | {r['ms']:.1f} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
