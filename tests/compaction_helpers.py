"""Helpers shared by the compaction tests: fragmented pools with a distinct byte pattern in
every block, and checks that every byte is still where its handle says."""

from __future__ import annotations

import numpy as np

import npumem
from npumem.compaction import HostMirror

MIB = 1 << 20
SIZES = (64, 200, 900, 3000, 5000, 20_000, 70_000, 300_000, 900_000, 3 * MIB)


def pattern(ident: int, n: int) -> bytes:
    """Bytes unique to block ``ident``."""
    i = np.arange(n, dtype=np.uint64)
    return ((i * 7 + ident * 131 + (i >> 8)) & 0xFF).astype(np.uint8).tobytes()


def fill(blk: npumem.Block, ident: int, mirror: HostMirror | None = None) -> None:
    data = pattern(ident, blk.nbytes)
    if mirror is None:
        view = memoryview(blk)
        view[:] = data
        view.release()
    else:
        mirror.write(blk.offset, data)


def intact(blk: npumem.Block, ident: int, mirror: HostMirror | None = None) -> bool:
    want = pattern(ident, blk.nbytes)
    if mirror is None:
        view = memoryview(blk)
        same = view.tobytes() == want
        view.release()
        return same
    return mirror.read(blk.offset, blk.nbytes) == want


def fragmented(
    pool: npumem.Pool,
    rounds: int,
    sizes: tuple[int, ...] = SIZES,
    mirror: HostMirror | None = None,
) -> list[tuple[npumem.Block, int]]:
    """Interleave blocks of ``sizes``, ``rounds`` times, fill them, free every other one;
    returns the survivors with their pattern ids."""
    made: list[npumem.Block] = []
    for _ in range(rounds):
        for size in sizes:
            made.append(pool.alloc(size))
    kept = []
    for i, blk in enumerate(made):
        if i % 2 == 0:
            blk.free()
        else:
            fill(blk, i, mirror)
            kept.append((blk, i))
    return kept
