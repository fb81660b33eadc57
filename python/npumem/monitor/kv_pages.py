"""A paged KV cache's pages at the moment of a snapshot, by state: `free` (a page of the
cache's reservation that no sequence holds), `exclusive` (held by one sequence) and `shared`
(held by several, through `fork`). Snapshots carry them (`Snapshot.with_kv`), the report
prints them, the address map colours the pages by state."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npumem._shown import shown
from npumem.monitor._files import Reader

if TYPE_CHECKING:
    from npumem.kv.cache import KVCache

__all__ = ["PAGE_STATES", "KVPages", "page_state"]

PAGE_STATES = ("free", "exclusive", "shared")


def page_state(references: int) -> str:
    """The state of a page with `references` sequences holding it."""
    return PAGE_STATES[min(references, 2)]


@dataclass(frozen=True, slots=True)
class KVPages:
    """One KV cache: its tag, page size, every page as `(offset, references)` by offset, and
    its `KVStats.as_dict()`."""

    tag: str
    page_bytes: int
    pages: tuple[tuple[int, int], ...]
    stats: dict[str, Any]

    # Compared by value, but not hashable (`stats` is a dict): `hash()` names this class.
    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def of(cls, cache: KVCache) -> KVPages:
        """The pages of `cache` now."""
        return cls(
            str(cache.tag),
            int(cache.page_bytes),
            tuple((int(o), int(r)) for o, r in cache.pages()),
            cache.stats().as_dict(),
        )

    def count(self, state: str) -> int:
        """Pages in `state` (one of `PAGE_STATES`)."""
        return sum(1 for _, r in self.pages if page_state(r) == state)

    def counts(self) -> dict[str, int]:
        """Pages by state, every state present."""
        out = dict.fromkeys(PAGE_STATES, 0)
        for _, r in self.pages:
            out[page_state(r)] += 1
        return out

    def to_json_obj(self) -> dict[str, Any]:
        """The pages as a JSON-ready dict."""
        return {
            "tag": self.tag,
            "page_bytes": self.page_bytes,
            "pages": [[o, r] for o, r in self.pages],
            "stats": self.stats,
        }

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any], r: Reader, index: int) -> KVPages:
        """Read what `to_json_obj()` wrote (`r` names the file in errors)."""
        if not isinstance(obj, Mapping):
            raise r.fail(f"kv {index} must be an object, got {shown(obj)}")
        pages = []
        for i, row in enumerate(r.field(obj, "pages", list)):
            row = r.int_row(row, 2, f"kv {index} page", i)
            pages.append((r.non_negative(row[0], "kv page"), r.non_negative(row[1], "kv page")))
        return cls(
            tag=r.field(obj, "tag", str),
            page_bytes=r.non_negative(r.field(obj, "page_bytes", int), f"kv {index} page_bytes"),
            pages=tuple(pages),
            stats=_read_stats(r.field(obj, "stats", dict), r, index),
        )


def _read_stats(stats: dict[str, Any], r: Reader, index: int) -> dict[str, Any]:
    """`KVStats.as_dict()` as a file keeps it: `preallocated` is true or false, `waste_share`
    a finite fraction >= 0, every other figure a count (a field missing from an older file
    reads as 0 in the report)."""
    for key, value in stats.items():
        what = f"kv {index} stats.{key}"
        if key == "preallocated":
            if not isinstance(value, bool):
                raise r.fail(f"{what} must be true or false, got {shown(value)}")
        elif key == "waste_share":
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not (math.isfinite(value) and value >= 0):
                raise r.fail(f"{what} must be a finite number >= 0, got {shown(value)}")
        else:
            r.count(value, what)
    return stats
