"""Checks of what a snapshot or trace file says, beyond its fields' types.

The readers (`Snapshot.from_json_obj`, `Trace.from_json_obj`) check each field on its own;
these functions check that the whole makes sense as the picture of one pool: byte counts and
offsets fit in 64 bits, the configuration is positive, every block and extent lies inside the
arena, live blocks do not overlap each other or a free run, the fragmentation is a fraction,
every traced allocation fits the recorded arena, and no handle is allocated again while its
block is live (handles carry a generation, so a pool never hands out the same one twice).
Each failure is a `npumem.monitor.errors.FileFormatError` of one line that names the file and
the entry.
`stats_from_dict` turns the stats a file keeps into a `PoolStats` after checking them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from npumem._core import NpumemError, PoolStats
from npumem.monitor.errors import FileFormatError
from npumem.sizes import MAX_BYTES

if TYPE_CHECKING:
    from npumem.monitor.snapshot import Snapshot
    from npumem.monitor.trace import Trace

__all__ = ["check_config", "check_snapshot", "check_trace", "stats_from_dict"]

POSITIVE_CONFIG = ("capacity", "cores", "chunk_size", "min_block", "bank_size", "alignment")
"""Configuration fields that must be > 0 in every file."""


def _fail(where: str, message: str) -> FileFormatError:
    return FileFormatError(f"{where}: {message}")


def _bytes(where: str, what: str, value: int) -> int:
    if value > MAX_BYTES:
        raise _fail(where, f"{what} = {value} does not fit in 64 bits (at most {MAX_BYTES})")
    return value


def check_config(config: Mapping[str, Any], where: str) -> int:
    """The positive configuration fields are ints in `1..MAX_BYTES`; returns the end of the
    offsets: the capacity, or for a pool that can grow (`max_capacity`), its offset space of
    twice `max_capacity` in whole chunks."""
    for key in (*POSITIVE_CONFIG, *(("max_capacity",) if "max_capacity" in config else ())):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _fail(where, f"config.{key} must be an integer > 0, got {value!r}")
        _bytes(where, f"config.{key}", value)
    capacity: int = config["capacity"]
    if "max_capacity" in config:
        chunk: int = config["chunk_size"]
        capacity = max(capacity, 2 * -(-config["max_capacity"] // chunk) * chunk)
    return capacity


def _disjoint(where: str, spans: Iterable[tuple[int, int, str]]) -> None:
    """Spans `(start, end, name)` do not overlap (empty spans never do)."""
    ordered = sorted(s for s in spans if s[1] > s[0])
    for (a_start, a_end, a), (b_start, _b_end, b) in itertools.pairwise(ordered):
        if b_start < a_end:
            raise _fail(where, f"{a} [{a_start}, {a_end}) overlaps {b} starting at {b_start}")


def check_snapshot(snapshot: Snapshot, where: str) -> None:
    """The snapshot describes one arena: see the module's docstring."""
    capacity = check_config(snapshot.config, where)
    spans: list[tuple[int, int, str]] = []
    for i, b in enumerate(snapshot.blocks):
        what = f"block {i}"
        for field in ("offset", "nbytes", "block_bytes", "align"):
            _bytes(where, f"{what}: {field}", getattr(b, field))
        if b.nbytes == 0 or b.block_bytes < b.nbytes:
            raise _fail(
                where,
                f"{what}: nbytes {b.nbytes} must be > 0 and at most block_bytes {b.block_bytes}",
            )
        if b.end > capacity:
            raise _fail(where, f"{what} [{b.offset}, {b.end}) ends beyond the capacity {capacity}")
        spans.append((b.offset, b.end, what))
    extents = {
        "free_runs": snapshot.free_runs,
        "slab_cached": snapshot.slab_cached,
        "untracked": snapshot.untracked,
    }
    for key, items in extents.items():
        for i, e in enumerate(items):
            _bytes(where, f"{key} {i}: offset", e.offset)
            _bytes(where, f"{key} {i}: length", e.length)
            if e.end > capacity:
                raise _fail(
                    where, f"{key} {i} [{e.offset}, {e.end}) ends beyond the capacity {capacity}"
                )
    _disjoint(
        where,
        spans + [(e.offset, e.end, f"free run {i}") for i, e in enumerate(snapshot.free_runs)],
    )
    _check_fragmentation(snapshot.stats.external_fragmentation, where)


def _check_fragmentation(frag: Any, where: str) -> None:
    if not isinstance(frag, int | float) or not (math.isfinite(frag) and 0 <= frag <= 1):
        raise _fail(where, f"stats.external_fragmentation must be between 0 and 1, got {frag!r}")


def stats_from_dict(
    stats: Mapping[str, Any], where: str, *, fragmentation: bool = True
) -> PoolStats:
    """The `PoolStats` of the stats a file keeps (`PoolStats.as_dict()`), after checking that
    every figure is a count (and, with `fragmentation`, that the fragmentation is a fraction)."""
    _check_stats(stats, where)
    if fragmentation:
        _check_fragmentation(stats.get("external_fragmentation"), where)
    try:
        return PoolStats.from_dict(dict(stats))
    except (NpumemError, TypeError, ValueError, OverflowError) as exc:
        raise _fail(where, f"stats: {exc}") from None


def _count(where: str, what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        raise _fail(where, f"{what} must be an integer between 0 and {MAX_BYTES}, got {value!r}")


def _check_stats(stats: Mapping[str, Any], where: str) -> None:
    """Every figure of the stats is a count, and so is every figure of the per-core and
    per-class rows; the fragmentation is checked on its own, other tables by their readers."""
    for key, value in stats.items():
        if key == "external_fragmentation":
            continue
        if key == "by_tag":
            continue  # a table of its own, checked by its reader
        if key in ("per_core", "size_classes"):
            if not isinstance(value, list):
                raise _fail(where, f"stats.{key} must be a list, got {type(value).__name__}")
            for i, row in enumerate(value):
                if not isinstance(row, dict):
                    raise _fail(where, f"stats.{key} {i} must be an object, got {row!r}")
                for k, v in row.items():
                    _count(where, f"stats.{key} {i}: {k!r}", v)
        else:
            _count(where, f"stats.{key!r}", value)


def check_trace(trace: Trace, where: str) -> None:
    """The trace's events fit its configuration: see the module's docstring."""
    capacity = check_config(trace.config, where)
    live: dict[int, int] = {}  # handle -> the event that allocated it
    for i, e in enumerate(trace.events):
        what = f"event {i}"
        if e.kind == "alloc":
            first = live.setdefault(e.handle, i)
            if first != i:
                raise _fail(
                    where,
                    f"{what}: handle {e.handle} is allocated again without a free since event "
                    f"{first}",
                )
        elif e.kind == "free":
            live.pop(e.handle, None)
        for field in ("offset", "size", "aux"):
            _bytes(where, f"{what}: {field}", getattr(e, field))
        if e.kind in ("alloc", "failed"):
            if e.size == 0:
                raise _fail(where, f"{what}: an {e.kind} event of 0 bytes")
            if e.aux and e.aux & (e.aux - 1):
                raise _fail(where, f"{what}: alignment {e.aux} is not a power of two")
        if e.kind == "alloc" and e.offset + e.size > capacity:
            raise _fail(
                where,
                f"{what}: block [{e.offset}, {e.offset + e.size}) ends beyond the capacity "
                f"{capacity}",
            )
