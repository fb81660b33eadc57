"""A paged KV cache's pages at the moment of a snapshot, by state: `free` (a page of the
cache's reservation that no sequence holds), `exclusive` (held by one sequence) and `shared`
(held by several, through `fork`). Snapshots carry them (`Snapshot.with_kv`), the report
prints them, the address map colours the pages by state.

A cache's pages and its stats are one picture: `KVPages.contradiction` names what the stats
say that the pages do not, `layout_contradiction` a page that overlaps another or lies in no
block of the snapshot. The snapshot reader refuses a file with either; `KVPages.of` and
`Snapshot.with_kv` never make one."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npumem._shown import shown
from npumem.errors import PoolBusyError
from npumem.monitor._files import Reader

if TYPE_CHECKING:
    from npumem.kv.cache import KVCache

__all__ = ["PAGE_STATES", "KVPages", "layout_contradiction", "page_state"]

PAGE_STATES = ("free", "exclusive", "shared")

READ_TRIES = 100
"""How many times `KVPages.of` reads a cache that changes under it before it gives up."""


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
        """The pages of `cache` now, with the stats of the same moment: the pages and the
        stats are two reads, taken again while another thread changes the cache between them
        (`PoolBusyError` if they never agree in `READ_TRIES` tries)."""
        for _ in range(READ_TRIES):
            kv = cls(
                str(cache.tag),
                int(cache.page_bytes),
                tuple((int(o), int(r)) for o, r in cache.pages()),
                cache.stats().as_dict(),
            )
            if kv.contradiction(0) is None:
                return kv
        raise PoolBusyError(
            f"the pages of KV cache {shown(str(cache.tag))} changed at each of {READ_TRIES} "
            "reads: its pages and its stats never showed the same moment"
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

    def contradiction(self, index: int) -> str | None:
        """What the stats say that the pages do not (this is cache `index` of a snapshot, for
        the message), or None. Only the figures the stats have are compared: a field missing
        from an older file is not."""
        in_use = sum(1 for _, r in self.pages if r > 0)
        shared = sum(1 for _, r in self.pages if r > 1)
        logical = sum(r for _, r in self.pages)
        free = len(self.pages) - in_use
        s = self.stats
        what = f"kv {index}"
        if "page_bytes" in s and s["page_bytes"] != self.page_bytes:
            return (
                f"{what} stats.page_bytes is {s['page_bytes']}, but page_bytes is {self.page_bytes}"
            )
        preallocated = s.get("preallocated")
        if preallocated is False and free:
            i = next(i for i, (_, r) in enumerate(self.pages) if r == 0)
            return (
                f"{what} page {i} has 0 references, but the cache is not preallocated (only a "
                "reservation has free pages)"
            )
        page_bytes = self.page_bytes
        expected: list[tuple[str, int, str]] = [
            ("pages_in_use", in_use, f"{in_use} of its pages are in use"),
            ("pages_shared", shared, f"{shared} of its pages are shared"),
            ("pages_logical", logical, f"the references of its pages add up to {logical}"),
            ("pages_exclusive", in_use - shared, f"{in_use - shared} of its pages are exclusive"),
            (
                "bytes_in_use",
                in_use * page_bytes,
                f"its {in_use} pages in use hold {in_use * page_bytes}",
            ),
            (
                "shared_saved_bytes",
                (logical - in_use) * page_bytes,
                f"its pages give {(logical - in_use) * page_bytes}",
            ),
        ]
        if preallocated:
            expected += [
                ("pages_total", len(self.pages), f"it lists {len(self.pages)} pages"),
                ("pages_free", free, f"{free} of its pages are free"),
            ]
        for key, value, why in expected:
            if key in s and s[key] != value:
                return f"{what} stats.{key} is {s[key]}, but {why}"
        given = all(k in s for k in ("pages_total", "pages_in_use", "pages_free"))
        if given and s["pages_total"] != s["pages_in_use"] + s["pages_free"]:
            return (
                f"{what} stats.pages_total is {s['pages_total']}, but pages_in_use and "
                f"pages_free add up to {s['pages_in_use'] + s['pages_free']}"
            )
        if "copies" in s and "bytes_copied" in s and s["bytes_copied"] != s["copies"] * page_bytes:
            return (
                f"{what} stats.bytes_copied is {s['bytes_copied']}, but its copies "
                f"({s['copies']} pages) make {s['copies'] * page_bytes}"
            )
        if "waste_bytes" in s:
            held = in_use * page_bytes
            if s["waste_bytes"] > held:
                return (
                    f"{what} stats.waste_bytes is {s['waste_bytes']}, more than the {held} bytes "
                    "of its pages in use"
                )
            share = s["waste_bytes"] / held if held else 0.0
            if "waste_share" in s and not math.isclose(s["waste_share"], share, abs_tol=1e-12):
                return f"{what} stats.waste_share is {s['waste_share']}, but its pages give {share}"
        return None

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
            pages.append(
                (
                    r.non_negative(row[0], f"kv {index} page {i}: offset"),
                    r.non_negative(row[1], f"kv {index} page {i}: references"),
                )
            )
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


def layout_contradiction(
    caches: Sequence[KVPages], blocks: Iterable[tuple[int, int]]
) -> str | None:
    """A page of `caches` (cache `i` named `kv i`) that overlaps another page, of its cache or
    of another, or that does not lie inside one of `blocks` (`(offset, end)` of the live blocks
    of the snapshot, which do not overlap): every page is a block of its own or part of its
    cache's reservation. None when there is none."""
    spans = sorted(
        (offset, offset + k.page_bytes, index, i)
        for index, k in enumerate(caches)
        for i, (offset, _) in enumerate(k.pages)
    )
    for (a_start, a_end, a_kv, a_page), (b_start, _, b_kv, b_page) in itertools.pairwise(spans):
        if b_start < a_end:
            return (
                f"kv {a_kv} page {a_page} [{a_start}, {a_end}) overlaps kv {b_kv} page {b_page} "
                f"starting at {b_start}"
            )
    ordered = sorted(blocks)
    starts = [start for start, _ in ordered]
    for start, end, index, i in spans:
        at = bisect.bisect_right(starts, start) - 1
        if at < 0 or end > ordered[at][1]:
            return (
                f"kv {index} page {i} [{start}, {end}) lies in no block of the snapshot (a page "
                "is a block of its own or part of its cache's reservation)"
            )
    return None
