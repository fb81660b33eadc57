"""What a rebalance did (`RebalanceReport`) and what tiers hold (`TierStats`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from npumem.sizes import format_bytes
from npumem.tiers.block import Tier, TierKind

__all__ = ["RebalanceReport", "TierMove", "TierStats", "TierUsage"]


@dataclass(frozen=True, slots=True)
class TierMove:
    """One block moved by a rebalance."""

    tag: str | None
    nbytes: int
    src: Tier
    dst: Tier
    score: float
    """The policy's score of the block when it moved (per byte for a `per_byte` policy)."""

    @property
    def promotion(self) -> bool:
        """Whether the block moved to a fast tier."""
        return self.dst.kind == "fast"


@dataclass(slots=True)
class RebalanceReport:
    """What one `rebalance` did."""

    policy: str
    max_bytes: int | None
    """The byte budget (`None`: no limit)."""
    moves: list[TierMove] = field(default_factory=list)
    skipped_pinned: int = 0
    """Blocks that deserved a move but are pinned or have live views."""
    failed: int = 0
    """Moves that failed (no room at the destination, or the mover raised); nothing changed."""
    seconds: float = 0.0

    @property
    def promotions(self) -> int:
        return sum(1 for m in self.moves if m.promotion)

    @property
    def demotions(self) -> int:
        return sum(1 for m in self.moves if not m.promotion)

    @property
    def bytes_moved(self) -> int:
        return sum(m.nbytes for m in self.moves)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "max_bytes": self.max_bytes,
            "promotions": self.promotions,
            "demotions": self.demotions,
            "bytes_moved": self.bytes_moved,
            "skipped_pinned": self.skipped_pinned,
            "failed": self.failed,
            "seconds": self.seconds,
        }

    def __str__(self) -> str:
        budget = "no budget" if self.max_bytes is None else f"budget {format_bytes(self.max_bytes)}"
        return (
            f"rebalance ({self.policy}, {budget}): {self.promotions} promoted, "
            f"{self.demotions} demoted, {format_bytes(self.bytes_moved)} moved, "
            f"{self.skipped_pinned} pinned skipped, {self.failed} failed, "
            f"{self.seconds * 1e3:.2f} ms"
        )


@dataclass(frozen=True, slots=True)
class TierUsage:
    """One tier's figures: a core's fast pool, or the slow pool."""

    tier: TierKind
    core: int | None
    capacity: int
    bytes_in_use: int
    blocks: int
    """Tiered blocks held now."""
    hits: int
    """Accesses (`touch`) served by this tier."""
    hit_bytes: int
    """Bytes of those accesses (each access counts the whole block)."""
    allocs: int
    """Tiered blocks placed here at allocation."""
    promotions: int
    """Blocks promoted into this fast tier; for the slow tier, all promotions."""
    demotions: int
    """Blocks demoted out of this fast tier; for the slow tier, all demotions."""
    spills: int
    """Blocks that asked for this core's fast tier and went to the slow tier (fast only)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TierStats:
    """Every tier's figures (`stats`)."""

    policy: str
    fast: tuple[TierUsage, ...]
    """One per core."""
    slow: TierUsage
    accesses: int
    """Every `touch` so far."""
    bytes_accessed: int = 0
    """Their bytes (each access counts the whole block)."""

    @property
    def hit_rate(self) -> float:
        """The share of accesses served by a fast tier (0 when nothing was touched)."""
        if not self.accesses:
            return 0.0
        return sum(t.hits for t in self.fast) / self.accesses

    @property
    def byte_hit_rate(self) -> float:
        """The share of accessed bytes served by a fast tier."""
        if not self.bytes_accessed:
            return 0.0
        return sum(t.hit_bytes for t in self.fast) / self.bytes_accessed

    @property
    def promotions(self) -> int:
        return sum(t.promotions for t in self.fast)

    @property
    def demotions(self) -> int:
        return sum(t.demotions for t in self.fast)

    @property
    def spills(self) -> int:
        return sum(t.spills for t in self.fast)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "accesses": self.accesses,
            "hit_rate": self.hit_rate,
            "bytes_accessed": self.bytes_accessed,
            "byte_hit_rate": self.byte_hit_rate,
            "promotions": self.promotions,
            "demotions": self.demotions,
            "spills": self.spills,
            "fast": [t.as_dict() for t in self.fast],
            "slow": self.slow.as_dict(),
        }

    def __str__(self) -> str:
        lines = [
            f"tiers ({self.policy}): {self.accesses} accesses, fast-tier hit rate "
            f"{self.hit_rate:.1%} ({self.byte_hit_rate:.1%} of the bytes), "
            f"{self.promotions} promotions, {self.demotions} demotions, "
            f"{self.spills} spills"
        ]
        for t in (*self.fast, self.slow):
            name = str(Tier(t.tier, t.core))
            lines.append(
                f"  {name:<9} {format_bytes(t.bytes_in_use):>11} of {format_bytes(t.capacity):>11}"
                f"  {t.blocks:>6} blocks  {t.hits:>8} hits"
            )
        return "\n".join(lines)
