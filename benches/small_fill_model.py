"""How full an arena of 4 KiB banks can get with small blocks (64 B-4 KiB, log-uniform, no
frees), under the bank rule (no block straddles a bank boundary) and the default slab classes
(8 per doubling): a model, not a run of npumem. Three policies, filled until the first request
finds no room:

- *tiled*: each bank holds objects of one class only, as npumem's slabs do (a class opens a
  fresh bank when its last one is full); this is the bound `mixed_sizes --only fill` prints
  for the band.
- *mixed*: objects of any classes share a bank; each request takes the tightest bank tail
  (free bytes at a bank's end) that holds it, else a fresh bank (online best fit).
- *slab tails*: slabs as npumem carves them (`SlabClass::new`: up to 63 objects and 16 banks,
  objects never across a bank), and the rest of each bank of a slab, after its objects, offered
  to the next class that needs a new slab: the tightest rest that holds one of its objects
  takes as many as fit in it in each of that slab's banks (up to 63), before fresh banks. With
  one level a rest is carved once; with two, the rest of a rest once more. What slabs that share
  their banks between two classes could reach.
- *granule banks*: requests larger than a threshold are rounded up to granules (64 B: 64 per
  bank, one 64-bit word of free bits; 32 B: 128 per bank, two words) and take the tightest free
  end of the 8 banks open at a time (a fresh bank replaces the open one with the least room);
  smaller requests are tiled as above. The threshold is the least that keeps a request's
  granules within 9/8 of it (rounding to `g` bytes loses less than `g`, at most 1/8 of a request
  of `8 * (g - 1)` bytes or more). What a bank allocator of fixed granules could reach.

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
# npumem's defaults, for the slab geometry.
MIN_BLOCK = 256
CHUNK = 2 << 20
MAX_SLAB_BANKS = 16
MAX_OBJECTS = 63


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


def draw(rng: random.Random) -> int:
    """A request size, log-uniform over the band."""
    return int(math.exp(rng.uniform(math.log(LOW), math.log(HIGH))))


def tile(left: dict[int, int], c: int, used: int, banks: int) -> int | None:
    """Place an object of class `c` in its class's open bank (`left`: objects each class's
    open bank still holds), opening a fresh bank when that one is full; the banks used then,
    or None when none was left to open."""
    if left.get(c, 0) == 0:
        if used == banks:
            return None
        used += 1
        left[c] = BANK // c
    left[c] -= 1
    return used


def fill(policy: str, banks: int, seed: int, classes: list[int]) -> float:
    rng = random.Random(seed)
    requested = 0
    used = 0
    # tiled: objects left in each class's open bank; mixed: bank tails by length.
    left: dict[int, int] = {}
    tails: dict[int, int] = {}
    lengths: list[int] = []
    while True:
        n = draw(rng)
        c = classes[bisect.bisect_left(classes, n)]
        if policy == "tiled":
            placed = tile(left, c, used, banks)
            if placed is None:
                break
            used = placed
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


def fill_granule_banks(
    banks: int, seed: int, classes: list[int], granule: int, open_banks: int
) -> float:
    """Requested / capacity at the first failure with granule banks (see the module
    documentation) for requests of at least `8 * (granule - 1)` bytes."""
    rng = random.Random(seed)
    per_bank = BANK // granule
    threshold = 8 * (granule - 1)
    left: dict[int, int] = {}
    ends: list[int] = []  # free granules at the end of each open bank
    used = requested = 0
    while True:
        n = draw(rng)
        if n < threshold:
            placed = tile(left, classes[bisect.bisect_left(classes, n)], used, banks)
            if placed is None:
                break
            used = placed
        else:
            need = -(-n // granule)
            fits = [i for i, end in enumerate(ends) if end >= need]
            if fits:
                ends[min(fits, key=lambda i: ends[i])] -= need
            else:
                if used == banks:
                    break
                used += 1
                if len(ends) == open_banks:
                    ends.remove(min(ends))
                ends.append(per_bank - need)
        requested += n
    return requested / (banks * BANK)


def slab_geometry(size: int) -> tuple[int, int, int]:
    """npumem's slab for `size`-byte objects (`SlabClass::new`): its bytes, its objects and its
    objects per bank (the most objects with at most 1/8 lost, else the least loss)."""
    is_pow2 = size & (size - 1) == 0
    cap = CHUNK // 8 if is_pow2 else min(CHUNK // 8, BANK * MAX_SLAB_BANKS)
    floor = max(MIN_BLOCK, 1 << (size - 1).bit_length())
    candidates = []
    slab = floor
    while slab <= max(cap, floor):
        per_bank, slab_banks = (slab // size, 1) if slab <= BANK else (BANK // size, slab // BANK)
        objects = min(per_bank * slab_banks, MAX_OBJECTS)
        if objects > 0:
            candidates.append((slab, objects, per_bank))
        slab *= 2

    def rank(c: tuple[int, int, int]) -> tuple[bool, int, float]:
        loss = (c[0] - c[1] * size) / c[0]
        good = loss <= 0.125
        return (good, c[1] if good else 0, -loss)

    return max(candidates, key=rank)


def fill_slab_tails(banks: int, seed: int, classes: list[int], levels: int) -> float:
    """Requested / capacity at the first failure with slabs whose bank rests other classes
    carve (see the module documentation)."""
    rng = random.Random(seed)
    geometry = {c: slab_geometry(c) for c in classes}
    free: dict[int, int] = {}
    rests: list[tuple[int, int, int]] = []  # (bytes free at the end of each bank, banks, level)
    used = requested = 0
    while True:
        n = draw(rng)
        c = classes[bisect.bisect_left(classes, n)]
        if free.get(c, 0) == 0:
            fits = [i for i, (rest, _, _) in enumerate(rests) if rest >= c]
            if fits:
                rest, rest_banks, level = rests.pop(min(fits, key=lambda i: rests[i][0]))
                per_bank = rest // c
                free[c] = free.get(c, 0) + min(per_bank * rest_banks, MAX_OBJECTS)
                left = rest - per_bank * c
                if level < levels and left >= LOW:
                    rests.append((left, rest_banks, level + 1))
            else:
                slab, objects, per_bank = geometry[c]
                if used + slab > banks * BANK:
                    break
                used += slab
                free[c] = free.get(c, 0) + objects
                rest = BANK - per_bank * c
                if slab >= BANK and rest >= LOW:
                    rests.append((rest, slab // BANK, 1))
        free[c] -= 1
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
    for levels in (1, 2):
        figures = [fill_slab_tails(args.banks, seed, classes, levels) for seed in range(args.seeds)]
        name = f"slab tails, {levels} level{'s' if levels > 1 else ''}"
        print(f"| {name} | {statistics.median(figures):.3f} |")
    for granule in (64, 32):
        figures = [
            fill_granule_banks(args.banks, seed, classes, granule, 8) for seed in range(args.seeds)
        ]
        name = f"granule banks of {granule} B, from {8 * (granule - 1)} B, 8 open"
        print(f"| {name} | {statistics.median(figures):.3f} |")


if __name__ == "__main__":
    main()
