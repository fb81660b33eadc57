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


def _kv_pool() -> tuple[npumem.Pool, list[Any]]:
    """A pool with a preallocated cache and an on-demand cache, both with pages shared by a
    fork and a page copied on write, and a cache whose pages are slab objects."""
    from npumem.kv import KVCache

    pool = npumem.Pool(8 * MIB, cores=2, name="kvsnap")
    shape = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 8, "dtype_bytes": 2}
    reserved = KVCache(pool, page_tokens=4, capacity_tokens=64, tag="kv.reserved", **shape)
    on_demand = KVCache(pool, page_tokens=4, tag="kv.paged", **shape)
    tiny = KVCache(
        pool, num_layers=1, num_kv_heads=1, head_dim=1, dtype_bytes=1, page_tokens=4, tag="tiny"
    )
    for cache in (reserved, on_demand, tiny):
        cache.add_sequence(0, num_tokens=10)
        cache.fork(0, 1)
        cache.append(1, 3)  # copies the shared, partly filled last page
        cache.add_sequence(2, num_tokens=0)
    return pool, [reserved, on_demand, tiny]


def test_snapshots_with_kv_caches_read_back(tmp_path: Path) -> None:
    pool, caches = _kv_pool()
    snap = pool.snapshot().with_kv(*caches)
    assert [k.counts()["shared"] for k in snap.kv] == [2, 2, 2]
    assert snap.kv[0].counts()["free"] > 0 and snap.kv[1].stats["copies"] == 1
    loaded = load_snapshot(snap.save(tmp_path / "kv.json"))
    assert loaded == snap
    # Caches given one call after another, and a snapshot read back given a cache again.
    stepwise = pool.snapshot().with_kv(caches[0]).with_kv(caches[1], caches[2])
    assert load_snapshot(stepwise.save(tmp_path / "kv2.json")).kv == snap.kv
    fresh = load_snapshot(pool.snapshot().save(tmp_path / "plain.json"))
    assert fresh.with_kv(*caches).kv == snap.kv
    for cache in caches:
        cache.close()


def test_with_kv_after_the_cache_changed_takes_the_snapshot_again(tmp_path: Path) -> None:
    from npumem.monitor.kv_pages import layout_contradiction

    pool, caches = _kv_pool()
    on_demand = caches[1]
    snap = pool.snapshot().with_label("late")
    on_demand.add_sequence(7, num_tokens=40)  # pages where the snapshot has free space
    got = snap.with_kv(*caches)
    assert layout_contradiction(got.kv, [(b.offset, b.end) for b in got.blocks]) is None
    assert got.label == "late" and got.kv[1].stats["sequences"] == 4
    assert got.stats.blocks_in_use > snap.stats.blocks_in_use
    assert load_snapshot(got.save(tmp_path / "late.json")) == got
    # A snapshot read from a file cannot be taken again: the pages are refused.
    loaded = load_snapshot(snap.save(tmp_path / "early.json"))
    with pytest.raises(npumem.InvalidArgumentError, match="lies in no block"):
        loaded.with_kv(on_demand)
    for cache in caches:
        cache.close()


def test_with_kv_refuses_a_cache_given_twice() -> None:
    pool, (reserved, on_demand, tiny) = _kv_pool()
    snap = pool.snapshot()
    with pytest.raises(npumem.InvalidArgumentError, match="cache 2 of with_kv is cache 0 again"):
        snap.with_kv(reserved, on_demand, reserved)
    shown = snap.with_kv(reserved)
    with pytest.raises(npumem.InvalidArgumentError, match=r"kv 0 page 0 .* overlaps kv 1 page 0"):
        shown.with_kv(reserved)
    assert snap.kv == () and len(shown.kv) == 1  # nothing added
    for cache in (reserved, on_demand, tiny):
        cache.close()


def _kv_file(tmp_path: Path, mutate: Callable[[dict[str, Any]], object]) -> Path:
    pool, caches = _kv_pool()
    obj = pool.snapshot().with_kv(*caches).to_json_obj()
    for cache in caches:
        cache.close()
    mutate(obj)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    return path


def _set_page(kv: int, page: int, value: list[int]) -> Callable[[dict[str, Any]], object]:
    return lambda d: d["kv"][kv]["pages"].__setitem__(page, value)


def _set_stat(kv: int, key: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda d: d["kv"][kv]["stats"].__setitem__(key, value)


def _overlap_in_one_cache(d: dict[str, Any]) -> None:
    pages = d["kv"][0]["pages"]
    pages[1][0] = pages[0][0] + 64


def _page_in_free_space(d: dict[str, Any]) -> None:
    d["kv"][1]["pages"][0][0] = d["free_runs"][-1][0]


def _overlap_two_caches(d: dict[str, Any]) -> None:
    d["kv"][1]["pages"][0][0] = d["kv"][0]["pages"][0][0]


@pytest.mark.parametrize(
    ("mutate", "text"),
    [
        (_overlap_in_one_cache, r"kv 0 page 0 \[\d+, \d+\) overlaps kv 0 page 1 starting at"),
        (_overlap_two_caches, r"kv 0 page 0 \[\d+, \d+\) overlaps kv 1 page 0"),
        (_page_in_free_space, r"kv 1 page 0 \[\d+, \d+\) lies in no block of the snapshot"),
        (_set_page(0, 0, [0, -2]), r"kv 0 page 0: references must be an integer >= 0, got -2"),
        (_set_page(0, 1, [-64, 1]), r"kv 0 page 1: offset must be an integer >= 0, got -64"),
        (_set_stat(0, "pages_in_use", 99), r"kv 0 stats.pages_in_use is 99, but \d+ of its"),
        (_set_stat(1, "pages_shared", 0), r"kv 1 stats.pages_shared is 0, but 2 of its pages"),
        (_set_stat(0, "pages_free", 0), r"kv 0 stats.pages_free is 0, but \d+ of its pages are"),
        (_set_stat(0, "pages_total", 3), r"kv 0 stats.pages_total is 3, but it lists \d+ pages"),
        (_set_stat(1, "pages_total", 3), r"kv 1 stats.pages_total is 3, but pages_in_use and"),
        (_set_stat(2, "pages_logical", 1), r"kv 2 stats.pages_logical is 1, but the references"),
        (_set_stat(0, "page_bytes", 128), r"kv 0 stats.page_bytes is 128, but page_bytes is"),
        (_set_stat(1, "shared_saved_bytes", 1), r"kv 1 stats.shared_saved_bytes is 1, but"),
        (_set_stat(1, "waste_share", 0.5), r"kv 1 stats.waste_share is 0.5, but its pages give"),
        (_set_stat(1, "waste_bytes", 1 << 40), r"kv 1 stats.waste_bytes is \d+, more than"),
        (
            _set_stat(0, "bytes_copied", 1),
            r"kv 0 stats.bytes_copied is 1, but its copies \(1 pages\) make",
        ),
        (_set_stat(1, "preallocated", True), r"kv 1 stats.pages_total is \d+, but it lists"),
        (_set_page(1, 0, [0, 0]), r"kv 1 page 0 has 0 references, but the cache is not"),
    ],
)
def test_contradictory_kv_sections_are_refused(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], text: str
) -> None:
    path = _kv_file(tmp_path, mutate)
    with pytest.raises(FileFormatError, match=text) as info:
        load_snapshot(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message


def test_snapshots_with_caches_that_other_threads_change_read_back() -> None:
    import sys
    import threading

    from npumem.kv import KVCache

    pool = npumem.Pool(8 * MIB, cores=1, name="busykv")
    shape = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 64, "page_tokens": 4}
    on_demand = KVCache(pool, tag="od", **shape)
    reserved = KVCache(pool, capacity_tokens=256, tag="res", **shape)
    stop = threading.Event()

    def worker() -> None:
        i = 0
        while not stop.is_set():
            for cache in (on_demand, reserved):
                with contextlib.suppress(npumem.OutOfMemoryError):
                    cache.add_sequence(i, 5)
                    cache.fork(i, i + 1)
                    cache.append(i + 1, 3)
                for seq in cache.sequences()[:-4]:
                    cache.free_sequence(seq)
            i += 2

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=worker)
    thread.start()
    try:
        for _ in range(300):
            snap = pool.snapshot().with_kv(on_demand, reserved)
            assert Snapshot.from_json_obj(snap.to_json_obj()) == snap
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    on_demand.close()
    reserved.close()
