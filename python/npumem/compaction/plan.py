"""What a compaction would do, moving nothing (:meth:`Compactor.plan`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from npumem.sizes import format_bytes as human_bytes

__all__ = ["CompactionPlan", "PlannedMove"]


@dataclass(frozen=True, slots=True)
class PlannedMove:
    """One move a compaction would make: a ``"block"``, ``"slab object"``, ``"run"`` (of
    whole chunks) or ``"slab"`` (a slab with all its objects) from ``src`` to ``dst``."""

    kind: str
    src: int
    dst: int
    nbytes: int
    blocks: int


def _fragmentation(largest: int, free: int) -> float:
    return 0.0 if free <= 0 else max(0.0, 1.0 - largest / free)


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """The answer to "what if we compacted now?": the moves, the bytes, and the largest free
    block expected afterwards (an estimate: the pool keeps changing)."""

    mode: str
    moves: tuple[PlannedMove, ...]
    blocks: int
    bytes: int
    chunks_emptied: int
    bytes_free: int
    largest_free_before: int
    largest_free_after: int

    @classmethod
    def from_core(cls, mode: str, raw: dict[str, Any]) -> CompactionPlan:
        """Build from ``Pool.plan_compaction``'s dict."""
        return cls(
            mode=mode,
            moves=tuple(PlannedMove(*m) for m in raw["moves"]),
            blocks=raw["blocks"],
            bytes=raw["bytes"],
            chunks_emptied=raw["chunks_emptied"],
            bytes_free=raw["bytes_free"],
            largest_free_before=raw["largest_free_before"],
            largest_free_after=raw["largest_free_after"],
        )

    @property
    def expected_gain(self) -> int:
        """How much the largest free block would grow (bytes)."""
        return self.largest_free_after - self.largest_free_before

    @property
    def fragmentation_before(self) -> float:
        """``external_fragmentation`` now."""
        return _fragmentation(self.largest_free_before, self.bytes_free)

    @property
    def fragmentation_after(self) -> float:
        """``external_fragmentation`` expected afterwards."""
        return _fragmentation(self.largest_free_after, self.bytes_free)

    def as_dict(self) -> dict[str, Any]:
        """Every field, the moves as dicts, plus the derived figures."""
        d = asdict(self)
        d["moves"] = [asdict(m) for m in self.moves]
        d.update(
            expected_gain=self.expected_gain,
            fragmentation_before=self.fragmentation_before,
            fragmentation_after=self.fragmentation_after,
        )
        return d

    def __str__(self) -> str:
        return (
            f"compaction plan ({self.mode}): {self.blocks:,} blocks, "
            f"{human_bytes(self.bytes)} to move, {self.chunks_emptied} chunk(s) emptied; "
            f"largest free block {human_bytes(self.largest_free_before)} -> "
            f"{human_bytes(self.largest_free_after)} (fragmentation "
            f"{self.fragmentation_before:.1%} -> {self.fragmentation_after:.1%})"
        )
