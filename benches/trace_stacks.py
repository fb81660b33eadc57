"""The cost of recording Python call stacks in a trace (TraceRecorder(pool, stacks=True)):
alloc/free pairs of 256 bytes with the trace off, on, and on with stacks, at two call depths,
drain and conversion to TraceEvent included. Prints nanoseconds per pair (best of three).

    python benches/trace_stacks.py [PAIRS]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import npumem
from bench_args import positive_int
from npumem.monitor import TraceRecorder


def deep(n: int, f: Callable[[], None]) -> None:
    """Call ``f`` ``n`` frames deeper."""
    if n == 0:
        f()
    else:
        deep(n - 1, f)


def loop(pool: npumem.Pool, n: int) -> None:
    for _ in range(n):
        pool.alloc(256).free()


def main() -> None:
    parser = argparse.ArgumentParser(
        description="The cost of recording Python call stacks in a trace."
    )
    parser.add_argument(
        "pairs", nargs="?", type=positive_int, default=20_000, help="alloc/free pairs per run"
    )
    pairs = parser.parse_args().pairs
    for depth in (0, 20):
        best: dict[str, float] = {}
        for _ in range(3):
            for mode in ("off", "trace", "stacks"):
                pool = npumem.Pool(64 << 20, cores=1)
                start = time.perf_counter()
                if mode == "off":
                    deep(depth, lambda pool=pool: loop(pool, pairs))
                else:
                    rec = TraceRecorder(pool, capacity=1 << 17, stacks=mode == "stacks").start()
                    deep(depth, lambda pool=pool: loop(pool, pairs))
                    rec.stop()
                ns = (time.perf_counter() - start) / pairs * 1e9
                best[mode] = min(best.get(mode, ns), ns)
        cells = ", ".join(f"{mode} {ns:.0f} ns" for mode, ns in best.items())
        print(f"stack depth about {depth + 4}: {cells} per alloc/free pair")


if __name__ == "__main__":
    main()
