"""Pages of paged KV caches by state in snapshots (saved and loaded), the report, Prometheus and
the address map."""

from __future__ import annotations

from pathlib import Path

import pytest

import npumem
from kv_helpers import SHAPE
from monitor_helpers import assert_png
from npumem.kv import KVCache
from npumem.monitor import PrometheusCollector, Snapshot, plot_address_map, report_text


def _caches() -> tuple[npumem.Pool, KVCache, KVCache]:
    pool = npumem.Pool(8 << 20, cores=1, name="kvpool")
    reserved = KVCache(pool, page_tokens=4, capacity_tokens=64, tag="kv.reserved", **SHAPE)
    reserved.add_sequence(0, num_tokens=6)
    reserved.fork(0, 1)
    reserved.append(1)  # pages: one shared, two exclusive, the rest free
    on_demand = KVCache(pool, page_tokens=4, tag="kv.paged", **SHAPE)
    on_demand.add_sequence(5, num_tokens=9)
    return pool, reserved, on_demand


def test_snapshot_carries_pages_by_state(tmp_path: Path) -> None:
    pool, reserved, on_demand = _caches()
    snap = pool.snapshot().with_kv(reserved, on_demand).with_label("kv")
    a, b = snap.kv
    assert (a.tag, a.page_bytes) == ("kv.reserved", reserved.page_bytes)
    assert a.counts() == {"free": 13, "exclusive": 2, "shared": 1}
    assert b.counts() == {"free": 0, "exclusive": 3, "shared": 0}
    assert a.stats["copies"] == 1 and b.stats["tokens"] == 9
    kv_blocks = {x.offset for x in snap.blocks if x.tag == "kv.paged"}
    assert kv_blocks == {o for o, _ in b.pages}
    loaded = Snapshot.load(snap.save(tmp_path / "s.json"))
    assert loaded.kv == snap.kv and loaded.label == "kv"
    plain = pool.snapshot()
    assert plain.kv == () and "kv" not in plain.to_json_obj()


def test_report_shows_waste_and_sharing() -> None:
    pool, reserved, _ = _caches()
    text = report_text(snapshot=pool.snapshot().with_kv(reserved), width=120)
    assert "KV cache 'kv.reserved'" in text
    for figure in ("pages shared", "pages free", "KV waste", "vLLM: under 4%", "saved by sharing"):
        assert figure in text, figure


def test_prometheus_exports_pages_by_state() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    pool, reserved, on_demand = _caches()
    registry = prometheus_client.CollectorRegistry()
    registry.register(PrometheusCollector(pool, kv=(reserved, on_demand)))
    text = prometheus_client.generate_latest(registry).decode()
    for line in (
        'npumem_kv_pages{cache="kv.reserved",pool="kvpool",state="shared"} 1.0',
        'npumem_kv_pages{cache="kv.reserved",pool="kvpool",state="free"} 13.0',
        'npumem_kv_pages{cache="kv.paged",pool="kvpool",state="exclusive"} 3.0',
        'npumem_kv_copies_total{cache="kv.reserved",pool="kvpool"} 1.0',
        'npumem_kv_tokens{cache="kv.paged",pool="kvpool"} 9.0',
    ):
        assert line in text, line
    with pytest.raises(npumem.ArgumentTypeError):
        PrometheusCollector(pool, kv=(pool,))  # type: ignore[arg-type]


def test_a_closed_cache_drops_out_of_the_scrape() -> None:
    # A closed cache made every scrape raise, the pools' metrics lost with it.
    prometheus_client = pytest.importorskip("prometheus_client")
    pool, reserved, on_demand = _caches()
    registry = prometheus_client.CollectorRegistry()
    registry.register(PrometheusCollector(pool, kv=(reserved, on_demand)))
    reserved.close()
    text = prometheus_client.generate_latest(registry).decode()
    assert 'cache="kv.paged"' in text and 'cache="kv.reserved"' not in text
    assert 'npumem_in_use_bytes{pool="kvpool"}' in text


def test_address_map_colours_pages_by_state(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pool, reserved, on_demand = _caches()
    path = plot_address_map(pool.snapshot().with_kv(reserved, on_demand), tmp_path / "map.png")
    assert_png(path)


def test_with_kv_refuses_a_cache_of_another_pool(tmp_path: Path) -> None:
    pool, reserved, _ = _caches()
    # Another pool of the same name: the pages even fit this arena, the pool is still another.
    twin = npumem.Pool(64 << 20, cores=1, name="kvpool")
    filler = twin.alloc(40 << 20)  # the foreign pages lie beyond this arena
    foreign = KVCache(twin, page_tokens=4, capacity_tokens=64, **SHAPE)
    foreign.add_sequence(0, num_tokens=20)
    snap = pool.snapshot().with_kv(reserved)
    with pytest.raises(npumem.InvalidArgumentError, match="cache 1 of with_kv is a cache of pool"):
        snap.with_kv(reserved, foreign)
    other = npumem.Pool(64 << 20, cores=1, name="other")
    with pytest.raises(npumem.InvalidArgumentError, match="not of pool 'kvpool'"):
        snap.with_kv(KVCache(other, **SHAPE))
    assert len(snap.kv) == 1  # nothing was added
    # A snapshot read back has no live pool: a cache of a pool of another name, or one whose
    # pages lie outside its arena, is refused.
    loaded = Snapshot.load(pool.snapshot().save(tmp_path / "s.json"))
    assert loaded.with_kv(reserved).kv[-1] == snap.kv[0]
    with pytest.raises(npumem.InvalidArgumentError, match="not of pool 'kvpool'"):
        loaded.with_kv(KVCache(other, **SHAPE))
    with pytest.raises(npumem.InvalidArgumentError, match=r"outside the arena of pool 'kvpool'"):
        loaded.with_kv(foreign)
    filler.free()


def test_with_kv_refuses_a_closed_cache_and_what_is_no_cache() -> None:
    pool, reserved, on_demand = _caches()
    snap = pool.snapshot()
    on_demand.close()
    with pytest.raises(npumem.InvalidHandleError, match="cache 1 of with_kv is closed"):
        snap.with_kv(reserved, on_demand)
    with pytest.raises(npumem.ArgumentTypeError, match="must be a KVCache, got Pool"):
        snap.with_kv(pool)  # type: ignore[arg-type]


def test_with_kv_keeps_the_pool_check_through_labels_and_copies() -> None:
    import copy
    import pickle

    pool, reserved, _ = _caches()
    other = npumem.Pool(8 << 20, cores=1, name="kvpool")
    foreign = KVCache(other, **SHAPE)
    snap = pool.snapshot().with_label("x")
    for same in (snap, copy.copy(snap), pickle.loads(pickle.dumps(snap))):
        assert same == snap
        same.with_kv(reserved)
        with pytest.raises(npumem.InvalidArgumentError, match="is a cache of pool 'kvpool'"):
            same.with_kv(foreign)
