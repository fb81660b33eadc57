"""Movers between tiers: who copies the bytes when a block changes tier.

A tier mover is called as `mover(src_tier, src_offset, dst_tier, dst_offset, nbytes)` with
the `Tier` of each side (`tier.kind` is `"fast"` or `"slow"`,
`tier.core` the core of a fast pool) and offsets inside that tier's pool. A device runtime
implements it with its copy engine (SRAM to HBM DMA and back) and returns once the copy is
complete. If it raises, the move is undone: the destination block is given back and the source
is untouched, so the handle and its bytes are as before.

When every pool is host-backed the tiered pool copies itself (`host_copy`); a pool with
`backing="none"` needs a mover.
"""

from __future__ import annotations

from collections.abc import Callable

from npumem._core import Block
from npumem.tiers.block import Tier

__all__ = ["TierMover", "host_copy"]

#: `mover(src_tier, src_offset, dst_tier, dst_offset, nbytes)`; raising undoes the move.
TierMover = Callable[[Tier, int, Tier, int, int], object]


def host_copy(src: Block, dst: Block, nbytes: int) -> None:
    """Copy the first `nbytes` of host-backed `src` into host-backed `dst`."""
    with memoryview(src) as s, memoryview(dst) as d:
        d[:nbytes] = s[:nbytes]
