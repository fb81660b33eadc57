"""What a compaction did: per step (`StepReport`, made by the Rust core) and in total
(`CompactionReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from npumem._core import StepReport
from npumem.compaction.policy import Mode
from npumem.sizes import format_bytes as human_bytes

__all__ = ["CompactionReport", "StepReport"]


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """A compaction: its mode, why it ran, its steps, and the pool before and after."""

    mode: Mode
    reason: str
    steps: tuple[StepReport, ...]
    fragmentation_before: float
    fragmentation_after: float
    largest_free_before: int
    largest_free_after: int
    bytes_free_before: int
    bytes_free_after: int
    seconds: float
    notes: tuple[str, ...] = field(default=())
    #: Blocks (and their bytes) that a full compaction would still move afterwards: what a
    #: compaction under a pause budget could not move (the notes say why).
    unmoved_blocks: int = 0
    unmoved_bytes: int = 0

    @property
    def blocks_moved(self) -> int:
        """Block moves, all steps together. A block moved twice counts twice, as its bytes
        do in `bytes_moved`: a slab object that a full compaction packs into another slab,
        which then moves whole."""
        return sum(s.blocks for s in self.steps)

    @property
    def bytes_moved(self) -> int:
        """Bytes copied, all steps together."""
        return sum(s.bytes for s in self.steps)

    @property
    def pause_times(self) -> tuple[float, ...]:
        """How long each step stopped the pool (seconds)."""
        return tuple(s.pause_seconds for s in self.steps)

    @property
    def longest_pause(self) -> float:
        """The longest single stop (seconds; 0.0 without steps)."""
        return max(self.pause_times, default=0.0)

    @property
    def gain(self) -> int:
        """How much the largest free block grew (bytes)."""
        return self.largest_free_after - self.largest_free_before

    def as_dict(self) -> dict[str, Any]:
        """Every field, the steps as dicts, plus the totals."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["steps"] = [s.as_dict() for s in self.steps]
        d["notes"] = list(self.notes)
        d.update(
            blocks_moved=self.blocks_moved,
            bytes_moved=self.bytes_moved,
            longest_pause=self.longest_pause,
            gain=self.gain,
        )
        return d

    def __str__(self) -> str:
        pauses = ", ".join(f"{p * 1e3:.2f} ms" for p in self.pause_times[:8])
        if len(self.steps) > 8:
            pauses += f", ... ({len(self.steps)} steps)"
        lines = [
            f"compaction ({self.mode}, {self.reason}): {self.blocks_moved:,} blocks, "
            f"{human_bytes(self.bytes_moved)} moved in {len(self.steps)} step(s)",
            f"  pauses: {pauses or 'none'}",
            f"  fragmentation {self.fragmentation_before:.1%} -> {self.fragmentation_after:.1%}, "
            f"largest free block {human_bytes(self.largest_free_before)} -> "
            f"{human_bytes(self.largest_free_after)}",
        ]
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)
