"""Snapshots: the whole arena at one moment (`pool.snapshot()`), saved and loaded as JSON.

A snapshot lists every live block, every maximal run of free bytes, and allocated bytes that
belong to no block (`untracked`: blocks of the Rust raw API), which together tile the usable
arena exactly; plus the pool's stats and configuration at that moment. It is what the address-map
pictures draw and what `npumem report` prints, and it can be looked at long after the pool is
gone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumem._gc import gc_paused
from npumem._shown import shown
from npumem.monitor._files import SNAPSHOT_FORMAT, Reader, read_json, write_json
from npumem.monitor.kv_pages import READ_TRIES, KVPages, layout_contradiction
from npumem.monitor.validate import (
    CORE_COUNTS,
    POSITIVE_CONFIG,
    STATS_COUNTS,
    check_config,
    check_snapshot,
    stats_from_dict,
)

if TYPE_CHECKING:
    from npumem import Pool
    from npumem._core import PoolStats, RawSnapshot
    from npumem.kv.cache import KVCache

__all__ = ["BlockRecord", "Extent", "Snapshot", "load_snapshot", "pool_config"]

SNAPSHOT_VERSION = 2
"""The version `Snapshot.save()` writes (handles as decimal text); version 1 (handles as
numbers) is read too."""
_READ_VERSIONS = (1, 2)
_BLOCK_FIELDS = ("offset", "nbytes", "block_bytes", "align", "core", "tag", "pins", "handle")


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """One live block: it covers `[offset, offset + block_bytes)` and asked for `nbytes`."""

    offset: int
    nbytes: int
    block_bytes: int
    align: int
    core: int
    tag: str | None
    pins: int
    handle: int

    @property
    def end(self) -> int:
        """One past the block's last byte."""
        return self.offset + self.block_bytes

    @property
    def pinned(self) -> bool:
        """Whether the block is pinned (it cannot move or be freed now)."""
        return self.pins > 0


@dataclass(frozen=True, slots=True)
class Extent:
    """A range of bytes `[offset, offset + length)`."""

    offset: int
    length: int

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.offset + self.length


def pool_config(pool: Pool) -> dict[str, Any]:
    """The configuration of `pool` as a JSON-ready dict (enough to make an equal pool; a pool
    that can grow, or grew, adds its `max_capacity`)."""
    growth = pool.max_capacity != pool.capacity or len(pool.regions()) > 1
    return {
        "capacity": pool.capacity,
        "cores": pool.cores,
        "chunk_size": pool.chunk_size,
        "min_block": pool.min_block,
        "bank_size": pool.bank_size,
        "alignment": pool.alignment,
        "slab_sizes": list(pool.slab_sizes),
        "backing": pool.backing,
        "placement": pool.placement,
        "run_tails": pool.run_tails,
        "core_reserve": pool.core_reserve,
        **({"max_capacity": pool.max_capacity} if growth else {}),
    }


@dataclass(frozen=True)
class Snapshot:
    """The arena at one moment: take one with `pool.snapshot()`, save it with `save()`,
    read it back with `load_snapshot()`.

    `stats` is the pool's `PoolStats` at the same moment; `time_ns` counts from
    the pool's creation (the clock of trace events). `kv` holds the pages of paged KV caches
    in the pool by state (`with_kv`). `regions` are the ranges with memory behind them (one
    unless the pool grew): bytes outside them are absent, neither free nor allocated.
    """

    pool: str
    config: dict[str, Any]
    time_ns: int
    blocks: tuple[BlockRecord, ...]
    free_runs: tuple[Extent, ...]
    slab_cached: tuple[Extent, ...]
    untracked: tuple[Extent, ...]
    stats: PoolStats
    label: str = field(default="")
    kv: tuple[KVPages, ...] = field(default=())
    regions: tuple[Extent, ...] = field(default=())
    # `Pool._id` of the pool it was taken from, in this process (None once read from a file):
    # `with_kv` checks caches against it. Not part of the value.
    _pool_id: int | None = field(default=None, compare=False, repr=False)

    # Compared by value, but not hashable: it holds dicts and a `PoolStats` (itself
    # unhashable), so `hash()` says "unhashable type: 'Snapshot'" rather than naming a dict.
    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def _from_core(cls, pool: Pool, raw: RawSnapshot) -> Snapshot:
        """Build from what the extension records (`Pool.snapshot()` comes here through
        `npumem._views`). The collector is paused: a block's record holds no cycle, and with a
        million blocks the collections that their making set off took most of the time."""
        with gc_paused():
            return cls._from_raw(pool, raw)

    @classmethod
    def _from_raw(cls, pool: Pool, raw: RawSnapshot) -> Snapshot:
        return cls(
            pool=str(pool.name),
            config=pool_config(pool),
            time_ns=raw.time_ns,
            blocks=tuple(
                BlockRecord(
                    b.offset, b.nbytes, b.block_bytes, b.align, b.core, b.tag, b.pins, b.handle
                )
                for b in raw.blocks
            ),
            free_runs=tuple(Extent(o, n) for o, n in raw.free_runs),
            slab_cached=tuple(Extent(o, n) for o, n in raw.slab_cached),
            untracked=tuple(Extent(o, n) for o, n in raw.untracked),
            stats=raw.stats,
            regions=tuple(Extent(o, n) for o, n in raw.regions),
            _pool_id=pool._id,
        )

    def with_label(self, label: str) -> Snapshot:
        """The same snapshot with a label (shown in reports and pictures)."""
        return Snapshot(
            self.pool,
            self.config,
            self.time_ns,
            self.blocks,
            self.free_runs,
            self.slab_cached,
            self.untracked,
            self.stats,
            label,
            self.kv,
            self.regions,
            self._pool_id,
        )

    def with_kv(self, *caches: KVCache) -> Snapshot:
        """The same snapshot with the pages of `caches` (paged KV caches of this pool) by
        state, read now: take it right after `pool.snapshot()`, and give every cache in one
        call.

        The pages must fit the snapshot as a file of it must (each page inside a live block,
        no two pages overlapping, also with the pages the snapshot shows already). A cache that
        changed since the snapshot was taken (another thread appended to it or freed a
        sequence) may not: for a snapshot of a live pool that shows no KV pages yet, the pool's
        snapshot is then taken again with the pages, until the two agree (`PoolBusyError` if
        they never do in `READ_TRIES` tries); the result is that later snapshot.

        A cache of another pool raises `InvalidArgumentError` (for a snapshot read from a
        file, whose pool is gone: a cache of a pool of another name), as do the same cache
        given twice, a page outside the regions of a snapshot read from a file and pages that
        do not fit a snapshot that shows KV pages already; a closed cache raises
        `InvalidHandleError`, anything else `ArgumentTypeError`. Nothing is added then."""
        from npumem.errors import InvalidArgumentError, PoolBusyError

        for i, cache in enumerate(caches):
            self._check_cache(cache, i)
            for j in range(i):
                if caches[j] is cache:
                    raise InvalidArgumentError(
                        f"cache {i} of with_kv is cache {j} again: give each cache once"
                    )
        snapshot = self
        for _ in range(READ_TRIES):
            pages = tuple(KVPages.of(cache) for cache in caches)
            problem = snapshot._kv_misfit(pages)
            if problem is None:
                return Snapshot(
                    snapshot.pool,
                    snapshot.config,
                    snapshot.time_ns,
                    snapshot.blocks,
                    snapshot.free_runs,
                    snapshot.slab_cached,
                    snapshot.untracked,
                    snapshot.stats,
                    snapshot.label,
                    (*snapshot.kv, *pages),
                    snapshot.regions,
                    snapshot._pool_id,
                )
            if self._pool_id is None or self.kv:
                raise InvalidArgumentError(problem)
            # A live pool whose caches changed since the snapshot: take both again.
            snapshot = caches[0].pool.snapshot().with_label(self.label)
        raise PoolBusyError(
            f"with_kv: the KV caches changed at each of {READ_TRIES} snapshots of pool "
            f"{shown(self.pool)}: their pages never fitted the snapshot"
        )

    def _check_cache(self, cache: KVCache, index: int) -> None:
        """`cache` (argument `index` of `with_kv`) is an open cache of this pool."""
        from npumem.errors import ArgumentTypeError, InvalidArgumentError, InvalidHandleError
        from npumem.kv.cache import KVCache

        what = f"cache {index} of with_kv"
        if not isinstance(cache, KVCache):
            raise ArgumentTypeError(f"{what} must be a KVCache, got {type(cache).__name__}")
        if cache.closed:
            raise InvalidHandleError(f"{what} is closed: it has no pages to show")
        owner = cache.pool
        # A snapshot read from a file has no pool left to compare with: its name, then.
        if self._pool_id is not None:
            foreign = owner._id != self._pool_id
        else:
            foreign = str(owner.name) != self.pool
        if foreign:
            raise InvalidArgumentError(
                f"{what} is a cache of pool {shown(str(owner.name))}, not of pool "
                f"{shown(self.pool)} that "
                "this snapshot shows"
            )

    def _kv_misfit(self, pages: tuple[KVPages, ...]) -> str | None:
        """Why `pages` (of the caches given to `with_kv`, in order) do not fit this snapshot
        (the checks of its reader), or None."""
        spans = self.regions or (Extent(0, self.capacity),)
        for index, kv in enumerate(pages):
            for offset, _ in kv.pages:
                end = offset + kv.page_bytes
                if not any(r.offset <= offset and end <= r.end for r in spans):
                    return (
                        f"cache {index} of with_kv has a page at [{offset}, {end}), outside the "
                        f"arena of pool {shown(self.pool)} that this snapshot shows (a cache of "
                        "another pool, or a page taken after the pool grew since the snapshot)"
                    )
        problem = layout_contradiction((*self.kv, *pages), ((b.offset, b.end) for b in self.blocks))
        if problem is None:
            return None
        first = len(self.kv)
        given = f"kv {first} on" if pages[1:] else f"kv {first}"
        return (
            f"the pages do not fit this snapshot: {problem} ({given}: the caches given to "
            "with_kv; a cache shown twice, or one that changed since the snapshot was taken)"
        )

    # ----- figures ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Bytes in the arena."""
        return int(self.config["capacity"])

    @property
    def usable_capacity(self) -> int:
        """Bytes blocks can use."""
        return self.stats.usable_capacity

    @property
    def bytes_free(self) -> int:
        """Free bytes: the sum of the free runs."""
        return sum(r.length for r in self.free_runs)

    @property
    def bytes_in_slab_caches(self) -> int:
        """Unused bytes inside slabs (free objects of their size class): the stats count them
        as free, since an allocation reclaims all-free slabs before it fails."""
        return sum(r.length for r in self.slab_cached)

    @property
    def bytes_in_blocks(self) -> int:
        """Bytes held by live blocks."""
        return sum(b.block_bytes for b in self.blocks)

    def largest_free_runs(self, n: int = 10) -> list[Extent]:
        """The `n` longest free runs, longest first (ties: lower offset first)."""
        return sorted(self.free_runs, key=lambda r: (-r.length, r.offset))[:n]

    def bytes_by(self, key: str = "tag") -> dict[str, tuple[int, int]]:
        """`label -> (blocks, block bytes)` grouped by `"tag"` or `"core"`, largest first."""
        if key not in ("tag", "core"):
            from npumem.errors import InvalidArgumentError

            raise InvalidArgumentError(f"key must be 'tag' or 'core', got {shown(key)}")
        groups: dict[str, list[int]] = {}
        for b in self.blocks:
            label = (b.tag or "(no tag)") if key == "tag" else f"core {b.core}"
            g = groups.setdefault(label, [0, 0])
            g[0] += 1
            g[1] += b.block_bytes
        ordered = sorted(groups.items(), key=lambda kv: (-kv[1][1], kv[0]))
        return {k: (v[0], v[1]) for k, v in ordered}

    # ----- JSON ------------------------------------------------------------------------------

    def to_json_obj(self) -> dict[str, Any]:
        """The snapshot as a JSON-ready dict (format `npumem-snapshot`, version 2; the schema
        is `npumem/schemas/snapshot.schema.json`). Handles are decimal text, so that readers
        that hold numbers as doubles keep them exact."""
        return {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "pool": self.pool,
            "label": self.label,
            "config": self.config,
            "time_ns": self.time_ns,
            "block_fields": list(_BLOCK_FIELDS),
            "blocks": [
                [b.offset, b.nbytes, b.block_bytes, b.align, b.core, b.tag, b.pins, str(b.handle)]
                for b in self.blocks
            ],
            "free_runs": [[r.offset, r.length] for r in self.free_runs],
            "slab_cached": [[r.offset, r.length] for r in self.slab_cached],
            "untracked": [[r.offset, r.length] for r in self.untracked],
            "stats": self.stats.as_dict(),
            **({"kv": [k.to_json_obj() for k in self.kv]} if self.kv else {}),
            **({"regions": [[r.offset, r.length] for r in self.regions]} if self.regions else {}),
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the snapshot as JSON to `path`; returns the path."""
        return write_json(path, self.to_json_obj())

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any], *, where: str = "snapshot") -> Snapshot:
        """Read a dict made by `to_json_obj()`; `FileFormatError` names what is
        wrong."""
        r = Reader(where)
        version = r.header(obj, SNAPSHOT_FORMAT, _READ_VERSIONS)
        config = r.field(obj, "config", dict)
        for key in POSITIVE_CONFIG:
            r.non_negative(r.field(config, key, int), f"config.{key}")
        check_config(config, where)
        if r.field(obj, "block_fields", list) != list(_BLOCK_FIELDS):
            raise r.fail(f"block_fields must be {list(_BLOCK_FIELDS)}")
        blocks = []
        for i, row in enumerate(r.field(obj, "blocks", list)):
            row = r.int_row(row, len(_BLOCK_FIELDS), "block", i)
            tag = row[5]
            if tag is not None and not isinstance(tag, str):
                raise r.fail(f"block {i}: tag must be a string or null, got {shown(tag)}")
            n = [r.non_negative(v, f"block {i}") for v in row[:5]]
            pins = r.non_negative(row[6], f"block {i}")
            handle = r.handle(row[7], f"block {i}", version)
            blocks.append(BlockRecord(n[0], n[1], n[2], n[3], n[4], tag, pins, handle))
        runs: dict[str, tuple[Extent, ...]] = {}
        for key in ("free_runs", "slab_cached", "untracked", "regions"):
            items = []
            rows = r.field(obj, key, list) if key != "regions" or key in obj else []
            for i, row in enumerate(rows):
                row = r.int_row(row, 2, key, i)
                items.append(Extent(r.non_negative(row[0], key), r.non_negative(row[1], key)))
            runs[key] = tuple(items)
        stats = r.field(obj, "stats", dict)
        for key in STATS_COUNTS:
            r.non_negative(r.field(stats, key, int), f"stats.{key}")
        r.field(stats, "external_fragmentation", float)
        for i, core in enumerate(r.field(stats, "per_core", list)):
            if not isinstance(core, dict):
                raise r.fail(f"stats.per_core {i} must be an object, got {shown(core)}")
            for key in CORE_COUNTS:
                r.non_negative(r.field(core, key, int), f"stats.per_core {i}: {key}")
        typed_stats = stats_from_dict(stats, where)
        snapshot = cls(
            pool=r.field(obj, "pool", str),
            config=config,
            time_ns=r.non_negative(r.field(obj, "time_ns", int), "time_ns"),
            blocks=tuple(blocks),
            free_runs=runs["free_runs"],
            slab_cached=runs["slab_cached"],
            untracked=runs["untracked"],
            stats=typed_stats,
            label=r.field(obj, "label", str),
            kv=tuple(
                KVPages.from_json_obj(k, r, i)
                for i, k in enumerate(r.field(obj, "kv", list) if "kv" in obj else [])
            ),
            regions=runs["regions"],
        )
        check_snapshot(snapshot, where)
        return snapshot

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Snapshot:
        """Read a snapshot file written by `save()`."""
        return cls.from_json_obj(read_json(path), where=str(path))

    def __repr__(self) -> str:
        return (
            f"<Snapshot of {self.pool!r}{' ' + repr(self.label) if self.label else ''}: "
            f"{len(self.blocks)} blocks, {len(self.free_runs)} free runs, "
            f"{self.bytes_free:,} bytes free>"
        )


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read a snapshot file (the same as `Snapshot.load()`)."""
    return Snapshot.load(path)
