"""How full an arena of 4 KiB banks can get with small blocks (64 B-4 KiB, log-uniform, no
frees), under the bank rule (no block straddles a bank boundary) and the default slab classes
(8 per doubling): a model, not a run of npumem. Two policies, filled until the first request
finds no room:

- *tiled*: each bank holds objects of one class only, as npumem's slabs do (a class opens a
  fresh bank when its last one is full); this is the bound `mixed_sizes --only fill` prints
  for the band.
- *mixed*: objects of any classes share a bank; each request takes the tightest bank tail
  (free bytes at a bank's end) that holds it, else a fresh bank (online best fit).

It prints requested bytes / capacity at the first failure for each.

    .venv/bin/python benches/small_fill_model.py [--banks 16384] [--seeds 3]
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import statistics

from bench_args import positive_int_at_most

BANK = 4096
LOW, HIGH = 64, 4096


def default_classes() -> list[int]:
    """npumem's default slab classes: 1-16 B, then 8 per doubling up to 4096 B."""
    per = 8
    sizes = list(range(1, 2 * per + 1))
    low = 2 * per
    while low < BANK:
        step = low // per
        sizes += [low + i * step for i in range(1, per + 1)]
        low *= 2
    return sizes


def fill(policy: str, banks: int, seed: int, classes: list[int]) -> float:
    rng = random.Random(seed)
    requested = 0
    used = 0
    # tiled: objects left in each class's open bank; mixed: bank tails by length.
    left: dict[int, int] = {}
    tails: dict[int, int] = {}
    lengths: list[int] = []
    while True:
        n = int(math.exp(rng.uniform(math.log(LOW), math.log(HIGH))))
        c = classes[bisect.bisect_left(classes, n)]
        if policy == "tiled":
            if left.get(c, 0) == 0:
                if used == banks:
                    break
                used += 1
                left[c] = BANK // c
            left[c] -= 1
        else:
            i = bisect.bisect_left(lengths, c)
            if i < len(lengths):
                tail = lengths[i]
                tails[tail] -= 1
                if tails[tail] == 0:
                    del tails[tail]
                    lengths.pop(i)
            else:
                if used == banks:
                    break
                used += 1
                tail = BANK
            rest = tail - c
            if rest >= classes[0]:
                if rest not in tails:
                    bisect.insort(lengths, rest)
                    tails[rest] = 0
                tails[rest] += 1
        requested += n
    return requested / (banks * BANK)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--banks", type=positive_int_at_most(1 << 20), default=1 << 14, help="banks in the arena"
    )
    parser.add_argument(
        "--seeds", type=positive_int_at_most(100), default=3, help="sequences, medians printed"
    )
    args = parser.parse_args()
    classes = default_classes()
    print(f"Fill of 64 B-4 KiB, {args.banks} banks of 4 KiB, medians of {args.seeds} seeds\n")
    print("| policy | requested / capacity at the first failure |")
    print("|---|---:|")
    for policy in ("tiled", "mixed"):
        figures = [fill(policy, args.banks, seed, classes) for seed in range(args.seeds)]
        print(f"| {policy} | {statistics.median(figures):.3f} |")


if __name__ == "__main__":
    main()
