"""The events a recording of a tiered pool holds (`npumem.tiers.trace`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from npumem.tiers.block import TierKind

__all__ = ["EventKind", "TierEvent"]

EventKind = Literal["alloc", "touch", "touch_many", "free", "promote", "demote", "rebalance"]


@dataclass(frozen=True, slots=True)
class TierEvent:
    """One call on a tiered pool. `serial` names the block (its allocation's number)."""

    kind: EventKind
    serial: int = -1
    nbytes: int = 0
    core: int | None = None
    """`alloc`: the home core; `promote`: the target core."""
    tier: TierKind | None = None
    hot: bool = False
    tag: str | None = None
    count: int = 1
    """`touch`: accesses."""
    max_bytes: int | None = None
    """`rebalance`: the budget."""
    serials: tuple[int, ...] = ()
    """`touch_many` with counts: the blocks, in order."""
    counts: tuple[int, ...] = ()
    """`touch_many` with counts: the accesses of each block."""
