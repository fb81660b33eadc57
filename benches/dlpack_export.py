"""The cost of handing a block to another library from Python, medians of repeated timings in
one run, with the peers measured the same way in the same process:

- ``blk.__dlpack__()`` and dropping the capsule unconsumed (pin, capsule, deleter, unpin);
- ``np.from_dlpack(blk)`` and dropping the array (the whole DLPack round trip through NumPy);
- ``blk.as_array(np.float32)`` (from_dlpack plus a typed view);
- peers: ``memoryview(blk)`` (the buffer protocol: pin, view, unpin) and
  ``np.frombuffer(blk, np.uint8)`` (NumPy over the buffer protocol).

    .venv/bin/python benches/dlpack_export.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np

import npumem
from bench_args import positive_int


def median_ns(stmt: str, env: dict[str, object], number: int, repeat: int) -> float:
    runs = timeit.Timer(stmt, globals=env).repeat(repeat=repeat, number=number)
    return statistics.median(runs) / number * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="DLPack export cost from Python")
    parser.add_argument("--repeat", type=positive_int, default=15)
    parser.add_argument("--number", type=positive_int, default=20000)
    args = parser.parse_args(argv)
    pool = npumem.Pool(64 << 20, cores=1)
    blk = pool.alloc(4096)
    env: dict[str, object] = {"blk": blk, "np": np}
    cases = [
        ("blk.__dlpack__() (capsule dropped)", "blk.__dlpack__()"),
        ("np.from_dlpack(blk)", "np.from_dlpack(blk)"),
        ("blk.as_array(np.float32)", "blk.as_array(np.float32)"),
        ("peer: memoryview(blk)", "memoryview(blk).release()"),
        ("peer: np.frombuffer(blk, np.uint8)", "np.frombuffer(blk, np.uint8)"),
    ]
    print(f"| operation (4 KiB host block) | ns, median of {args.repeat} |")
    print("|---|---:|")
    for label, stmt in cases:
        print(f"| {label} | {median_ns(stmt, env, args.number, args.repeat):.0f} |")
    assert blk.pins == 0
    blk.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
