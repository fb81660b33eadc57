"""pool.snapshot() from Python: blocks and free runs tile the arena; snapshots round-trip through
JSON exactly; damaged files fail with a message that names the file and the field."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import npumem
from npumem.errors import ArgumentTypeError
from npumem.monitor import BlockRecord, Extent, FileFormatError, Snapshot, load_snapshot
from npumem.monitor.saved_file import (
    load_saved_file,
    saved_file_from_json_obj,
    solution_from_json_obj,
)
from npumem.monitor.trace import Trace, load_trace
from npumem.tiers.observe import TierSnapshot, is_tier_snapshot, load_tier_snapshot

MIB = 1 << 20


def busy_pool() -> tuple[npumem.Pool, list[npumem.Block]]:
    pool = npumem.Pool(24 * MIB + 5 * 4096, cores=2, name="snap")
    rng = random.Random(3)
    blocks = []
    for i in range(300):
        size = rng.choice([rng.randint(1, 4096), rng.randint(4097, 900_000), 3 * MIB])
        with contextlib.suppress(npumem.OutOfMemoryError):
            blocks.append(pool.alloc(size, tag=f"t{i % 5}" if i % 7 else None))
    kept = []
    for i, b in enumerate(blocks):
        if i % 3:
            b.free()
        else:
            kept.append(b)
    return pool, kept


def assert_tiles(snap: Snapshot) -> None:
    pieces = sorted(
        [(b.offset, b.block_bytes) for b in snap.blocks]
        + [(r.offset, r.length) for r in snap.free_runs]
        + [(r.offset, r.length) for r in snap.slab_cached]
        + [(r.offset, r.length) for r in snap.untracked]
    )
    at = 0
    for offset, length in pieces:
        assert offset == at and length > 0
        at += length
    assert at == snap.usable_capacity


def largest_free_or_cached(snap: Snapshot) -> int:
    """The longest stretch of free runs and slab caches that touch one another."""
    best = end = length = 0
    for offset, n in sorted((e.offset, e.length) for e in [*snap.free_runs, *snap.slab_cached]):
        length = length + n if offset == end else n
        end = offset + n
        best = max(best, length)
    return best


def test_snapshot_lists_every_block_and_free_run() -> None:
    pool, kept = busy_pool()
    snap = pool.snapshot()
    assert_tiles(snap)
    assert snap.untracked == ()
    by_handle = {b.handle: b for b in snap.blocks}
    assert set(by_handle) == {b.handle for b in kept}
    for blk in kept:
        rec = by_handle[blk.handle]
        assert (rec.offset, rec.nbytes, rec.block_bytes, rec.tag, rec.align) == (
            blk.offset,
            blk.nbytes,
            blk.block_bytes,
            blk.tag,
            blk.align,
        )
        assert rec.pins == 0 and not rec.pinned
    stats = snap.stats
    assert snap.bytes_free + snap.bytes_in_slab_caches == stats.bytes_free + stats.slab_cached_bytes
    assert snap.bytes_in_blocks == snap.stats.bytes_in_use
    # An allocation takes all-free slabs back before it fails, so the statistics count them as
    # free: the largest free block lies inside free runs and slab caches side by side.
    assert largest_free_or_cached(snap) >= snap.stats.largest_free_block
    assert snap.config["capacity"] == pool.capacity and snap.pool == "snap"
    assert snap.largest_free_runs(2) == sorted(snap.free_runs, key=lambda r: -r.length)[:2]
    groups = snap.bytes_by("tag")
    assert sum(n for n, _ in groups.values()) == len(kept)
    assert set(snap.bytes_by("core")) <= {"core 0", "core 1"}
    with pytest.raises(npumem.InvalidArgumentError):
        snap.bytes_by("size")
    for b in kept:
        b.free()


def test_pinned_blocks_show_their_pins() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    blk = pool.alloc(5000, tag="pinned")
    view = memoryview(blk)
    (rec,) = pool.snapshot().blocks
    assert rec.pins == 1 and rec.pinned
    view.release()
    blk.free()


def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    pool, kept = busy_pool()
    snap = pool.snapshot().with_label("busy")
    path = snap.save(tmp_path / "s.json")
    back = load_snapshot(path)
    assert back == snap
    assert back.label == "busy"
    assert back.stats.external_fragmentation == snap.stats.external_fragmentation
    assert Snapshot.from_json_obj(json.loads(path.read_text())) == snap
    for b in kept:
        b.free()


def damaged(tmp_path: Path, mutate: object) -> Path:
    pool = npumem.Pool(8 * MIB, cores=1)
    blk = pool.alloc(1000, tag="x")
    obj = pool.snapshot().to_json_obj()
    blk.free()
    assert callable(mutate)
    mutate(obj)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.parametrize(
    ("mutate", "text"),
    [
        (lambda o: o.update(format="something-else"), "format is 'something-else'"),
        (lambda o: o.update(version=99), "version 99 is not supported"),
        (lambda o: o.pop("blocks"), "missing field 'blocks'"),
        (lambda o: o["blocks"][0].__setitem__(0, -1), "block 0 must be an integer >= 0"),
        (lambda o: o["blocks"][0].__setitem__(5, 7), "tag must be a string or null"),
        (lambda o: o["blocks"].append([1, 2]), "block 1 must be a list of 8 values"),
        (lambda o: o["free_runs"].append("x"), "free_runs 1 must be a list of 2 values"),
        (lambda o: o["stats"].pop("bytes_free"), "missing field 'bytes_free'"),
        (lambda o: o["config"].__setitem__("capacity", "big"), "'capacity' must be int"),
        (lambda o: o.update(time_ns=True), "'time_ns' must be int, got bool"),
        (lambda o: o["stats"]["per_core"][0].pop("chunks"), "missing field 'chunks'"),
        (lambda o: o["stats"]["per_core"].append(3), "stats.per_core 1 must be an object"),
    ],
)
def test_damaged_files_are_refused_clearly(tmp_path: Path, mutate: object, text: str) -> None:
    path = damaged(tmp_path, mutate)
    with pytest.raises(FileFormatError) as info:
        load_snapshot(path)
    assert str(path) in str(info.value) and text in str(info.value)
    assert isinstance(info.value, npumem.NpumemError) and isinstance(info.value, ValueError)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(FileFormatError, match="no such file"):
        load_snapshot(tmp_path / "missing.json")
    (tmp_path / "text.json").write_text("not json {")
    with pytest.raises(FileFormatError, match="not JSON"):
        load_snapshot(tmp_path / "text.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(FileFormatError, match="expected a JSON object"):
        load_snapshot(tmp_path / "list.json")
    with pytest.raises(FileFormatError, match="is a directory"):
        load_snapshot(tmp_path)


def test_records() -> None:
    b = BlockRecord(4096, 100, 256, 64, 0, None, 0, 7)
    assert b.end == 4096 + 256
    assert Extent(10, 5).end == 15


# ----- the readers given arguments of the wrong type -----------------------------------------

PATH_READERS = [
    load_snapshot,
    load_trace,
    load_tier_snapshot,
    load_saved_file,
    Snapshot.load,
    Trace.load,
    TierSnapshot.load,
    is_tier_snapshot,
]


@pytest.mark.parametrize("reader", PATH_READERS)
@pytest.mark.parametrize("path", [None, 0, 123, b"s.json", ["s.json"], 1.5])
def test_readers_refuse_a_path_of_the_wrong_type(reader: Callable[[Any], Any], path: Any) -> None:
    with pytest.raises(ArgumentTypeError, match=r"a file path must be a str or an os\.PathLike"):
        reader(path)


@pytest.mark.parametrize("reader", PATH_READERS[:-1])
def test_readers_refuse_a_path_with_a_nul_character(reader: Callable[[Any], Any]) -> None:
    with pytest.raises(FileFormatError, match="contains a NUL character"):
        reader("a\x00b")


def test_a_path_with_a_nul_character_is_no_tier_snapshot() -> None:
    assert is_tier_snapshot("a\x00b") is False


@pytest.mark.parametrize(
    "from_obj",
    [
        Snapshot.from_json_obj,
        Trace.from_json_obj,
        TierSnapshot.from_json_obj,
        saved_file_from_json_obj,
        solution_from_json_obj,
    ],
)
@pytest.mark.parametrize("obj", [None, [], ["format"], "npumem-snapshot", 5])
def test_from_json_obj_refuses_what_is_not_an_object(
    from_obj: Callable[..., Any], obj: Any
) -> None:
    with pytest.raises(FileFormatError, match="here: expected a JSON object"):
        from_obj(obj, where="here")


def test_snapshots_compare_by_value_but_say_clearly_that_they_are_unhashable() -> None:
    """A snapshot holds dicts and a `PoolStats` (unhashable, as every stats value): `hash()`
    names the snapshot's own class, not a dict inside it, and `Hashable` says no."""
    import dataclasses
    from collections.abc import Hashable

    from npumem.kv import KVCache
    from npumem.monitor.kv_pages import KVPages
    from npumem.tiers import TieredPool

    pool, kept = busy_pool()
    cache = KVCache(pool, num_layers=1, num_kv_heads=1, head_dim=8, capacity_tokens=64)
    cache.add_sequence(1, 5)
    snap = pool.snapshot().with_kv(cache)
    tiered = TieredPool([npumem.Pool(MIB, cores=1)], npumem.Pool(4 * MIB, cores=1))
    values: list[tuple[object, str]] = [
        (snap, "Snapshot"),
        (snap.kv[0], "KVPages"),
        (tiered.snapshot(), "TierSnapshot"),
        (pool.stats(), "npumem._core.PoolStats"),
    ]
    for value, name in values:
        with pytest.raises(TypeError, match=f"^unhashable type: '{name}'$"):
            hash(value)
        assert not isinstance(value, Hashable)
    assert isinstance(snap.kv[0], KVPages)
    assert dataclasses.replace(snap) == snap and dataclasses.replace(snap, label="x") != snap
    cache.close()
    for b in kept:
        b.free()
