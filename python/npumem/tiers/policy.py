"""Promotion policies: which blocks deserve the fast tier.

A policy is a small replaceable object with four members (`Policy`):

* `admit(nbytes, hot)`: whether a new block asks for the fast tier when the caller named no
  tier;
* `touch(heat, now)`: update a block's `Heat` when it is accessed at tick `now`;
* `touch_n(heat, now, count)` (optional): `count` accesses at ticks `now` to
  `now + count - 1` at once, as `count` calls of `touch` would record them; the tiered pool
  makes those calls itself for a policy without it;
* `score(heat, now)`: how hot the block is at tick `now`; `rebalance()` promotes the
  highest scores and demotes the lowest;
* `moves`: whether `rebalance()` moves anything at all under this policy;
* `per_byte`: whether `rebalance()` ranks blocks by score per byte (the most accesses per
  byte of SRAM) rather than by score alone.

Time is the tiered pool's access clock: one tick per `touch`.
Three policies ship:

* `FrequencyPolicy`: access counts with exponential decay (a count halves every
  `half_life` ticks), so a block that was hot and went cold loses its place to hotter ones;
* `LRUPolicy`: the most recently touched blocks are the hottest;
* `SizeOnlyPolicy`: placement by size alone, decided once at allocation (small blocks in
  the fast tier while it has room), never moved: the baseline the others are measured against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from npumem._shown import shown
from npumem.errors import InvalidArgumentError

__all__ = ["FrequencyPolicy", "Heat", "LRUPolicy", "Policy", "SizeOnlyPolicy"]


@dataclass(slots=True)
class Heat:
    """What a policy remembers of one block's accesses."""

    value: float = 0.0
    """The policy's running figure (a decayed count, or nothing)."""
    last: int = -1
    """The tick of the last access (-1: never touched)."""
    count: int = 0
    """Accesses so far, without decay."""


@runtime_checkable
class Policy(Protocol):
    """What `TieredPool` needs of a promotion policy."""

    name: str
    moves: bool
    per_byte: bool

    def admit(self, nbytes: int, hot: bool) -> bool:
        """Whether a new block of `nbytes` asks for the fast tier (no tier named)."""

    def touch(self, heat: Heat, now: int) -> None:
        """Record one access at tick `now`."""

    def score(self, heat: Heat, now: int) -> float:
        """How hot the block is at tick `now` (higher is hotter)."""


class FrequencyPolicy:
    """Access counts with exponential decay: each access adds 1, and the count halves every
    `half_life` ticks. Blocks are ranked by count per byte, so that the fast tier serves as
    many accesses as its bytes allow. `hot` blocks are admitted to the fast tier at
    allocation.

    `admit_cold`: cold blocks (not `hot`) of at most this many bytes are admitted too, while
    the fast tier has room (default 0: none). They cost little SRAM, one that turns hot is
    served from the start, and one that stays cold scores 0 and is the first to make room
    at a rebalance."""

    name = "frequency"
    moves = True
    per_byte = True

    def __init__(self, half_life: float = 4096.0, *, admit_cold: int = 0) -> None:
        if isinstance(half_life, bool) or not isinstance(half_life, int | float):
            raise InvalidArgumentError(f"half_life must be a number, got {shown(half_life)}")
        if not half_life > 0 or half_life == float("inf"):
            raise InvalidArgumentError(f"half_life must be finite and > 0, got {shown(half_life)}")
        if isinstance(admit_cold, bool) or not isinstance(admit_cold, int) or admit_cold < 0:
            raise InvalidArgumentError(f"admit_cold must be an int >= 0, got {shown(admit_cold)}")
        self.half_life = float(half_life)
        self.admit_cold = admit_cold
        self._rate = math.log(2.0) / self.half_life  # the decay of one tick is exp(-rate)
        self._sums: dict[int, float] = {}  # count -> 1 + r + ... + r^(count - 1)

    def admit(self, nbytes: int, hot: bool) -> bool:
        return hot or nbytes <= self.admit_cold

    def _decayed(self, heat: Heat, now: int) -> float:
        if heat.last < 0:
            return 0.0
        return float(heat.value * 0.5 ** ((now - heat.last) / self.half_life))

    def touch(self, heat: Heat, now: int) -> None:
        last = heat.last
        if last < 0:
            heat.value = 1.0
        else:
            heat.value = float(heat.value * 0.5 ** ((now - last) / self.half_life)) + 1.0
        heat.last = now
        heat.count += 1

    def touch_n(self, heat: Heat, now: int, count: int) -> None:
        # count touches one tick apart: v * r^(end - last) + (1 + r + ... + r^(count - 1))
        if count <= 0:
            return
        added = self._sums.get(count)
        if added is None:
            # (1 - r^count) / (1 - r) with r = exp(-rate), through expm1: exact however long
            # the half-life (1 - r rounds to 0 from a half-life of about 1e16 ticks on).
            rate = self._rate
            added = math.expm1(-count * rate) / math.expm1(-rate) if rate > 0 else float(count)
            if len(self._sums) < 4096:
                self._sums[count] = added
        last = heat.last
        end = now + count - 1
        if last < 0:
            heat.value = added
        else:
            heat.value = float(heat.value * 0.5 ** ((end - last) / self.half_life)) + added
        heat.last = end
        heat.count += count

    def score(self, heat: Heat, now: int) -> float:
        return self._decayed(heat, now)

    def __repr__(self) -> str:
        cold = f", admit_cold={self.admit_cold}" if self.admit_cold else ""
        return f"FrequencyPolicy(half_life={self.half_life:g}{cold})"


class LRUPolicy:
    """Least recently used: the later the last access, the hotter the block. `hot` blocks
    are admitted to the fast tier at allocation."""

    name = "lru"
    moves = True
    per_byte = False

    def admit(self, nbytes: int, hot: bool) -> bool:
        return hot

    def touch(self, heat: Heat, now: int) -> None:
        heat.last = now
        heat.count += 1

    def touch_n(self, heat: Heat, now: int, count: int) -> None:
        if count > 0:
            heat.last = now + count - 1
            heat.count += count

    def score(self, heat: Heat, now: int) -> float:
        return float(heat.last + 1)  # 0 for a block never touched

    def __repr__(self) -> str:
        return "LRUPolicy()"


class SizeOnlyPolicy:
    """Placement by size alone: a block of at most `max_block` bytes goes to the fast tier at
    allocation while it has room (`hot` is ignored), and nothing ever moves."""

    name = "size-only"
    moves = False
    per_byte = False

    def __init__(self, max_block: int) -> None:
        if isinstance(max_block, bool) or not isinstance(max_block, int) or max_block < 1:
            raise InvalidArgumentError(f"max_block must be an int >= 1, got {shown(max_block)}")
        self.max_block = max_block

    def admit(self, nbytes: int, hot: bool) -> bool:
        return nbytes <= self.max_block

    def touch(self, heat: Heat, now: int) -> None:
        heat.last = now
        heat.count += 1

    def touch_n(self, heat: Heat, now: int, count: int) -> None:
        if count > 0:
            heat.last = now + count - 1
            heat.count += count

    def score(self, heat: Heat, now: int) -> float:
        return 0.0

    def __repr__(self) -> str:
        return f"SizeOnlyPolicy(max_block={self.max_block})"
