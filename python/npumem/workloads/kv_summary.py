"""What the demo reports of its paged KV cache: the highest pages in use, the bytes sharing saved,
the waste, the copies on write."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npumem.kv.cache import KVCache
    from npumem.kv.stats import KVStats

__all__ = ["KVSummary"]


@dataclass
class KVSummary:
    """The text model's paged KV cache over a demo run, sampled by the monitor and the workers."""

    page_bytes: int
    peak_pages: int = 0
    peak_shared_saved_bytes: int = 0
    waste_samples: list[float] = field(default_factory=list)
    copies: int = 0
    bytes_copied: int = 0
    beam_forks: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def peak_bytes(self) -> int:
        """Bytes of the pages in use at the highest sample."""
        return self.peak_pages * self.page_bytes

    @property
    def mean_waste_share(self) -> float:
        """KV waste (unused tails of partly filled pages) over the bytes of the pages in use,
        averaged over the samples that had pages in use."""
        return sum(self.waste_samples) / len(self.waste_samples) if self.waste_samples else 0.0

    def sample(self, cache: KVCache) -> None:
        """Add one sample of `cache` (from any thread)."""
        s = cache.stats()
        with self._lock:
            self._add(s)

    def _add(self, s: KVStats) -> None:
        self.peak_pages = max(self.peak_pages, s.pages_in_use)
        self.peak_shared_saved_bytes = max(self.peak_shared_saved_bytes, s.shared_saved_bytes)
        if s.pages_in_use:
            self.waste_samples.append(s.waste_share)
        self.copies = max(self.copies, s.copies)
        self.bytes_copied = max(self.bytes_copied, s.bytes_copied)
