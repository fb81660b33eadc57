"""What `KVCache.stats()` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["KVStats"]


@dataclass(frozen=True)
class KVStats:
    """A KV cache at one moment.

    Pages are counted once however many sequences share them; `pages_logical` is what the
    sequences would hold without sharing, so `shared_saved_bytes` is the memory that sharing
    saves. `waste_bytes` is the unused tail of each partly filled page (a shared one counted
    once): at most one page per sequence.
    """

    sequences: int
    pages_total: int
    """Pages of the reservation; on demand, pages in use plus those the pool could still give."""
    pages_free: int
    pages_in_use: int
    pages_shared: int
    """Pages referenced by more than one sequence."""
    pages_logical: int
    tokens: int
    """Tokens of all sequences (a shared prompt counts once per sequence)."""
    waste_bytes: int
    shared_saved_bytes: int
    copies: int
    """Pages copied on write: a sequence appended to a shared, partly filled last page."""
    bytes_copied: int
    evictions: int
    """Times `on_evict` was called and asked for a retry."""
    page_bytes: int
    preallocated: bool

    @property
    def bytes_in_use(self) -> int:
        """Bytes of the pages in use."""
        return self.pages_in_use * self.page_bytes

    @property
    def waste_share(self) -> float:
        """`waste_bytes` as a share of the bytes in use (0.0 when nothing is in use)."""
        return self.waste_bytes / self.bytes_in_use if self.pages_in_use else 0.0

    @property
    def pages_exclusive(self) -> int:
        """Pages in use by exactly one sequence."""
        return self.pages_in_use - self.pages_shared

    def as_dict(self) -> dict[str, Any]:
        """The fields, and the derived numbers, as a dict."""
        d = asdict(self)
        d.update(
            bytes_in_use=self.bytes_in_use,
            waste_share=self.waste_share,
            pages_exclusive=self.pages_exclusive,
        )
        return d
