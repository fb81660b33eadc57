"""Checks of what a snapshot or trace file says, beyond its fields' types.

The readers (`Snapshot.from_json_obj`, `Trace.from_json_obj`) check each field on its own;
these functions check that the whole makes sense as the picture of one pool: byte counts and
offsets fit in 64 bits, the configuration is positive, every block and extent lies inside the
arena, live blocks do not overlap each other or a free run, the fragmentation is a fraction,
KV pages lie inside live blocks, apart, and agree with their caches' stats,
every traced allocation and move fits the recorded arena, and no handle is allocated again while its
block is live (handles carry a generation, so a pool never hands out the same one twice).
The configuration must be one a pool can have (`check_config`), and every figure the formats
keep in 64 bits must fit in them. Each failure is a `npumem.monitor.errors.FileFormatError` of
one line that names the file and the entry.
`stats_from_dict` turns the stats a file keeps into a `PoolStats` after checking them.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from npumem._core import NpumemError, Pool, PoolStats
from npumem._shown import shown
from npumem.monitor.errors import FileFormatError
from npumem.monitor.kv_pages import layout_contradiction
from npumem.sizes import MAX_BYTES

if TYPE_CHECKING:
    from npumem.monitor.snapshot import Snapshot
    from npumem.monitor.trace import Trace

__all__ = ["check_config", "check_snapshot", "check_trace", "stats_from_dict"]

POSITIVE_CONFIG = ("capacity", "cores", "chunk_size", "min_block", "bank_size", "alignment")
"""Configuration fields that must be > 0 in every file."""

# The rules of the Rust core's `PoolConfig::validate`: a file's configuration must be one a
# pool can have, so that every command that reads it (and `replay`, which makes a pool of it)
# sees the same figures.
MAX_CAPACITY = 1 << 48
"""The largest arena a pool can have (`npumem_core::MAX_CAPACITY`)."""
MAX_CORES = 1024
"""The most core pools a pool can have (`npumem_core::MAX_CORES`)."""
MAX_CORE_RESERVE = 1024
MAX_TREE_DEPTH = 24
MAX_CHUNKS = 1 << 30
"""The most chunks an arena may span: `capacity`, or for a pool that can grow twice
`max_capacity`, over `chunk_size` (`npumem_core::MAX_CHUNKS`)."""
MAX_SLAB_CLASSES = 255
POWER_OF_TWO_CONFIG = ("chunk_size", "min_block", "bank_size", "alignment")
CONFIG_CHOICES = {"backing": ("host", "none"), "placement": ("best-fit", "first-fit")}


def _fail(where: str, message: str) -> FileFormatError:
    return FileFormatError(f"{where}: {message}")


def _bytes(where: str, what: str, value: int) -> int:
    if value > MAX_BYTES:
        raise _fail(where, f"{what} = {value} does not fit in 64 bits (at most {MAX_BYTES})")
    return value


def _config_int(config: Mapping[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(where, f"config.{key} must be an integer >= {low}, got {shown(value)}")
    if value > high:
        raise _fail(where, f"config.{key} must be at most {high}, got {value}")
    return int(value)


def check_config(config: Mapping[str, Any], where: str) -> int:
    """The configuration is one a pool can have (the rules of the Rust core's
    `PoolConfig::validate`: sizes are powers of two in range, the optional fields of the right
    type); returns the end of the offsets: the capacity, or for a pool that can grow
    (`max_capacity`), its offset space of twice `max_capacity` in whole chunks."""
    for key in POSITIVE_CONFIG:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _fail(where, f"config.{key} must be an integer > 0, got {shown(value)}")
    capacity = _config_int(config, "capacity", where, 1, MAX_CAPACITY)
    _config_int(config, "cores", where, 1, MAX_CORES)
    for key in POWER_OF_TWO_CONFIG:
        value = _config_int(config, key, where, 1, MAX_BYTES)
        if value & (value - 1):
            raise _fail(where, f"config.{key} must be a power of two, got {value}")
    chunk, min_block = int(config["chunk_size"]), int(config["min_block"])
    bank, alignment = int(config["bank_size"]), int(config["alignment"])
    if alignment > capacity:
        raise _fail(where, f"config.alignment {alignment} is more than the capacity {capacity}")
    if min_block < 64 or 2 * min_block > chunk:
        raise _fail(
            where,
            f"config.min_block must be at least 64 and at most half of chunk_size ({chunk}), "
            f"got {min_block}",
        )
    if chunk // min_block > 1 << MAX_TREE_DEPTH:
        raise _fail(
            where,
            f"config.chunk_size must be at most 2^{MAX_TREE_DEPTH} times min_block "
            f"({min_block}), got {chunk}",
        )
    if capacity < min_block:
        raise _fail(where, f"config.capacity {capacity} is less than min_block ({min_block})")
    if bank > chunk:
        raise _fail(where, f"config.bank_size must be at most chunk_size ({chunk}), got {bank}")
    _check_slab_sizes(config, where, chunk, bank)
    chunks = -(-capacity // chunk)
    if "core_reserve" in config:
        _config_int(config, "core_reserve", where, 0, max(chunks, MAX_CORE_RESERVE))
    for key, choices in CONFIG_CHOICES.items():
        if key in config and (not isinstance(config[key], str) or config[key] not in choices):
            raise _fail(where, f"config.{key} must be one of {choices}, got {shown(config[key])}")
    if "run_tails" in config and not isinstance(config["run_tails"], bool):
        raise _fail(
            where, f"config.run_tails must be true or false, got {shown(config['run_tails'])}"
        )
    if "max_capacity" not in config:
        _check_chunks(where, chunk, capacity, "capacity")
        return capacity
    most = _config_int(config, "max_capacity", where, capacity, MAX_CAPACITY // 2)
    _check_chunks(where, chunk, 2 * most, "twice max_capacity")
    if most > capacity and capacity % chunk:
        raise _fail(
            where,
            f"config.capacity must be a multiple of chunk_size ({chunk}) for a pool that can "
            f"grow, got {capacity}",
        )
    return max(capacity, 2 * -(-most // chunk) * chunk)


def _check_chunks(where: str, chunk: int, size: int, named: str) -> None:
    """`size` bytes (`named`: the capacity, or twice `max_capacity`) span at most `MAX_CHUNKS`
    chunks of `chunk` bytes; the message is the core's."""
    spanned = -(-size // chunk)
    if spanned > MAX_CHUNKS:
        least = 1 << (-(-size // MAX_CHUNKS) - 1).bit_length()
        raise _fail(
            where,
            f"config.chunk_size must be at least {least} here, got {chunk}: {size} bytes "
            f"({named}) make {spanned} chunks, and an arena has at most {MAX_CHUNKS}",
        )


@functools.cache
def _default_slab_sizes() -> tuple[int, ...]:
    """The slab sizes a pool has when its configuration names none (the core's default list,
    read from a small pool once)."""
    return tuple(Pool(1 << 20, cores=1, backing="none").slab_sizes)


def _check_slab_sizes(config: Mapping[str, Any], where: str, chunk: int, bank: int) -> None:
    """`slab_sizes` (the core's default list when the file names none): at most
    `MAX_SLAB_CLASSES` sizes, increasing, each in `1..bank_size`, the largest at most half of a
    chunk."""
    sizes = config["slab_sizes"] if "slab_sizes" in config else list(_default_slab_sizes())
    if not isinstance(sizes, list) or len(sizes) > MAX_SLAB_CLASSES:
        raise _fail(where, f"config.slab_sizes must be a list of at most {MAX_SLAB_CLASSES} sizes")
    previous = 0
    for i, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or not previous < size <= bank:
            raise _fail(
                where,
                f"config.slab_sizes {i} must be an integer above the one before it and at most "
                f"bank_size ({bank}), got {shown(size)}",
            )
        previous = size
    if sizes and chunk < 2 * previous:
        raise _fail(
            where,
            f"config.chunk_size must be at least twice the largest slab size ({previous}), "
            f"got {chunk}",
        )


def _disjoint(where: str, spans: Iterable[tuple[int, int, str]]) -> None:
    """Spans `(start, end, name)` do not overlap (empty spans never do)."""
    ordered = sorted(s for s in spans if s[1] > s[0])
    for (a_start, a_end, a), (b_start, _b_end, b) in itertools.pairwise(ordered):
        if b_start < a_end:
            raise _fail(where, f"{a} [{a_start}, {a_end}) overlaps {b} starting at {b_start}")


def check_snapshot(snapshot: Snapshot, where: str) -> None:
    """The snapshot describes one arena: see the module's docstring."""
    capacity = check_config(snapshot.config, where)
    cores = int(snapshot.config["cores"])
    _bytes(where, "time_ns", snapshot.time_ns)
    spans: list[tuple[int, int, str]] = []
    for i, b in enumerate(snapshot.blocks):
        what = f"block {i}"
        for field in ("offset", "nbytes", "block_bytes", "align", "pins"):
            _bytes(where, f"{what}: {field}", getattr(b, field))
        if b.core >= cores:
            raise _fail(where, f"{what}: core {b.core} is not one of the {cores} cores")
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
    _check_regions(snapshot, capacity, where)
    _check_kv(snapshot, capacity, where)
    _check_fragmentation(snapshot.stats.external_fragmentation, where)


def _check_regions(snapshot: Snapshot, capacity: int, where: str) -> None:
    """The regions (none listed: one region, the arena) are non-empty, in order, apart, and
    inside the offsets."""
    end = 0
    for i, r in enumerate(snapshot.regions):
        _bytes(where, f"region {i}: offset", r.offset)
        _bytes(where, f"region {i}: length", r.length)
        if r.length == 0 or r.offset < end or r.end > capacity:
            raise _fail(
                where,
                f"region {i} [{r.offset}, {r.end}) must be non-empty, after the region before "
                f"it and end within the offsets (at most {capacity})",
            )
        end = r.end


def _check_kv(snapshot: Snapshot, capacity: int, where: str) -> None:
    """Every KV page has a size in `1..capacity` and lies inside the offsets, and inside a
    live block; no two pages overlap; each cache's stats are those of its pages."""
    for index, k in enumerate(snapshot.kv):
        if not 0 < k.page_bytes <= capacity:
            raise _fail(
                where,
                f"kv {index} page_bytes must be between 1 and the capacity {capacity}, got "
                f"{k.page_bytes}",
            )
        for i, (offset, references) in enumerate(k.pages):
            _bytes(where, f"kv {index} page {i}: references", references)
            if offset + k.page_bytes > capacity:
                raise _fail(
                    where,
                    f"kv {index} page {i} [{offset}, {offset + k.page_bytes}) ends beyond the "
                    f"capacity {capacity}",
                )
        problem = k.contradiction(index)
        if problem is not None:
            raise _fail(where, problem)
    problem = layout_contradiction(snapshot.kv, ((b.offset, b.end) for b in snapshot.blocks))
    if problem is not None:
        raise _fail(where, problem)


def _check_fragmentation(frag: Any, where: str) -> None:
    number = isinstance(frag, int | float) and not isinstance(frag, bool)
    if not number or not (math.isfinite(frag) and 0 <= frag <= 1):
        raise _fail(
            where, f"stats.external_fragmentation must be between 0 and 1, got {shown(frag)}"
        )


STATS_COUNTS = (
    "capacity",
    "usable_capacity",
    "bytes_in_use",
    "bytes_free",
    "peak_bytes_in_use",
    "largest_free_block",
)
"""The counts every saved `PoolStats` has (with `external_fragmentation` and `per_core`)."""
CORE_COUNTS = (
    "core",
    "chunks",
    "bytes_in_use",
    "bytes_free",
    "alloc_count",
    "free_count",
    "overflow_allocs",
    "failed_allocs",
)
"""The counts every row of `per_core` has."""


def stats_from_dict(stats: Mapping[str, Any], where: str) -> PoolStats:
    """The `PoolStats` of the stats a file keeps (`PoolStats.as_dict()`), after checking that
    the required figures are there (`STATS_COUNTS`, `external_fragmentation`, `per_core` and
    its rows' `CORE_COUNTS`), that every figure is a count and that the fragmentation is a
    fraction."""
    missing = [k for k in (*STATS_COUNTS, "external_fragmentation", "per_core") if k not in stats]
    if missing:
        raise _fail(where, f"stats: missing field {shown(missing[0])}")
    _check_stats(stats, where)
    _check_fragmentation(stats.get("external_fragmentation"), where)
    for i, row in enumerate(stats["per_core"]):
        absent = [k for k in CORE_COUNTS if k not in row]
        if absent:
            raise _fail(where, f"stats.per_core {i}: missing field {shown(absent[0])}")
    try:
        return PoolStats.from_dict(dict(stats))
    except (NpumemError, TypeError, ValueError, OverflowError) as exc:
        raise _fail(where, f"stats: {exc}") from None


def _count(where: str, what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        raise _fail(
            where, f"{what} must be an integer between 0 and {MAX_BYTES}, got {shown(value)}"
        )


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
                    raise _fail(where, f"stats.{key} {i} must be an object, got {shown(row)}")
                for k, v in row.items():
                    _count(where, f"stats.{key} {i}: {shown(k)}", v)
        else:
            _count(where, f"stats.{shown(key)}", value)


def check_trace(trace: Trace, where: str) -> None:
    """The trace's events fit its configuration: see the module's docstring."""
    capacity = check_config(trace.config, where)
    cores = int(trace.config["cores"])
    _bytes(where, "dropped", trace.dropped)
    live: dict[int, int] = {}  # handle -> the event that allocated it
    # Messages are made only for an event that fails a check: a trace has millions of events.
    for i, e in enumerate(trace.events):
        if e.core >= cores:
            raise _fail(where, f"event {i}: core {e.core} is not one of the {cores} cores")
        if e.kind == "alloc":
            first = live.setdefault(e.handle, i)
            if first != i:
                raise _fail(
                    where,
                    f"event {i}: handle {e.handle} is allocated again without a free since "
                    f"event {first}",
                )
        elif e.kind == "free":
            live.pop(e.handle, None)
        if max(e.time_ns, e.offset, e.size, e.aux) > MAX_BYTES:
            for field in ("time_ns", "offset", "size", "aux"):
                _bytes(where, f"event {i}: {field}", getattr(e, field))
        if e.kind in ("alloc", "failed"):
            if e.size == 0:
                raise _fail(where, f"event {i}: an {e.kind} event of 0 bytes")
            if e.aux and e.aux & (e.aux - 1):
                raise _fail(where, f"event {i}: alignment {e.aux} is not a power of two")
        if (e.kind == "alloc" or e.kind == "move") and e.offset + e.size > capacity:
            raise _fail(
                where,
                f"event {i}: block [{e.offset}, {e.offset + e.size}) ends beyond the capacity "
                f"{capacity}",
            )
