"""The planner's units of work: a `Buffer` to place and an `Alias` living in one."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Alias", "Buffer"]


@dataclass(frozen=True, slots=True)
class Buffer:
    """One buffer to place: live on `[lower, upper)`, `size` bytes, at an offset that is a
    multiple of `alignment`; `offset` pins it (`None`: the planner chooses). `weight` is
    what having it in a fast pool is worth in a plan over several pools (`None`: its size;
    see `npumem.plan.tiers`)."""

    id: str
    lower: int
    upper: int
    size: int
    alignment: int = 1
    offset: int | None = None
    weight: float | None = None

    @property
    def lifetime(self) -> int:
        """Number of time steps the buffer is live."""
        return self.upper - self.lower

    def overlaps(self, other: Buffer) -> bool:
        """Whether the two live ranges share a time step."""
        return self.lower < other.upper and other.lower < self.upper


@dataclass(frozen=True, slots=True)
class Alias:
    """A tensor that owns no memory: it lives inside buffer `base` at byte `offset` (a view,
    or the output of an in-place op that reuses its input's memory)."""

    name: str
    base: str
    offset: int
    size: int
