"""PrometheusCollector: registrable in any registry, the text exposition parses, and every metric
carries the pool's current value under its name label."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import npumem
from npumem.monitor import PrometheusCollector
from npumem.monitor.prometheus import COUNTERS, GAUGES

MIB = 1 << 20


def scrape(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """``(sample name, pool label) -> value`` from the parsed text exposition."""
    text = generate_latest(registry).decode()
    out: dict[tuple[str, str], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[(sample.name, sample.labels["pool"])] = sample.value
    for metric, _, _ in GAUGES:
        assert types[metric] == "gauge"
    for metric, _, _ in COUNTERS:
        assert types[metric.removesuffix("_total")] == "counter"
    return out


def test_exposition_carries_the_right_values() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, core_reserve=0, name="npu0")
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(pool))
    blocks = [pool.alloc(2 * MIB) for _ in range(4)]
    blocks[1].free()
    blocks[3].free()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(3 * MIB)
    s = pool.stats()
    got = scrape(registry)
    expected = {
        "npumem_in_use_bytes": 4 * MIB,
        "npumem_free_bytes": 4 * MIB,
        "npumem_peak_in_use_bytes": 8 * MIB,
        "npumem_largest_free_block_bytes": 2 * MIB,
        "npumem_external_fragmentation_ratio": 0.5,
        "npumem_allocs_total": 4,
        "npumem_frees_total": 2,
        "npumem_failed_allocs_total": 1,
        "npumem_overflow_allocs_total": s.overflow_allocs,
        "npumem_capacity_bytes": 8 * MIB,
        "npumem_usable_capacity_bytes": s.usable_capacity,
        "npumem_requested_in_use_bytes": 4 * MIB,
        "npumem_slab_cached_bytes": 0,
        "npumem_usage_ratio": 0.5,
        "npumem_live_blocks": 2,
        "npumem_tag_requested_in_use_bytes": 4 * MIB,  # the blocks have no tag
        "npumem_tag_peak_requested_in_use_bytes": 8 * MIB,
        "npumem_tag_live_blocks": 2,
    }
    assert {name for name, _ in got} == set(expected)
    for name, value in expected.items():
        assert got[(name, "npu0")] == pytest.approx(value), name
    # Values follow the pool at every scrape.
    blocks[0].free()
    blocks[2].free()
    got = scrape(registry)
    assert got[("npumem_in_use_bytes", "npu0")] == 0
    assert got[("npumem_frees_total", "npu0")] == 4
    assert got[("npumem_external_fragmentation_ratio", "npu0")] == 0


def test_several_pools_are_labelled_by_name() -> None:
    a = npumem.Pool(4 * MIB, cores=1, name="a")
    b = npumem.Pool(8 * MIB, cores=1, name="b")
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(a, b))
    blk = b.alloc(1000)
    got = scrape(registry)
    assert got[("npumem_free_bytes", "a")] == 4 * MIB
    assert got[("npumem_in_use_bytes", "b")] == blk.block_bytes
    assert got[("npumem_allocs_total", "a")] == 0 and got[("npumem_allocs_total", "b")] == 1
    blk.free()


def test_registries_refuse_a_second_collector_with_the_same_names() -> None:
    pool = npumem.Pool(4 * MIB, cores=1, name="dup")
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(pool))
    with pytest.raises(ValueError, match="Duplicated"):
        registry.register(PrometheusCollector(pool))


def test_bad_arguments() -> None:
    pool = npumem.Pool(4 * MIB, cores=1, name="same")
    other = npumem.Pool(4 * MIB, cores=1, name="same")
    with pytest.raises(npumem.InvalidArgumentError, match="names must differ"):
        PrometheusCollector(pool, other)
    with pytest.raises(npumem.ArgumentTypeError, match=r"npumem\.Pool"):
        PrometheusCollector("pool")  # type: ignore[arg-type]


def kv_token_lines(collector: PrometheusCollector) -> list[str]:
    """The `npumem_kv_tokens` lines of a scrape of `collector` alone, sorted."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if line.startswith("npumem_kv_tokens"))


def test_kv_caches_with_the_same_labels_are_refused() -> None:
    from npumem.kv import KVCache

    shape = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 8}
    pool = npumem.Pool(8 * MIB, cores=1, name="gpu0")
    other = npumem.Pool(8 * MIB, cores=1, name="gpu1")
    a = KVCache(pool, **shape)  # tag "kv"
    b = KVCache(pool, **shape)  # tag "kv" too
    c = KVCache(other, **shape)
    d = KVCache(pool, tag="kv.other", **shape)
    with pytest.raises(
        npumem.InvalidArgumentError,
        match=r"kv\[1\] has the same pool and tag as kv\[0\] \(pool 'gpu0', tag 'kv'\)",
    ):
        PrometheusCollector(pool, kv=(a, b))
    with pytest.raises(npumem.InvalidArgumentError, match=r"kv\[2\] is the same cache as kv\[0\]"):
        PrometheusCollector(pool, kv=(a, c, a))
    with pytest.raises(npumem.ArgumentTypeError, match=r"kv must be a tuple of .*got KVCache"):
        PrometheusCollector(pool, kv=a)  # type: ignore[arg-type]
    # Caches that differ in pool or tag each have their series, once.
    assert kv_token_lines(PrometheusCollector(pool, other, kv=[a, c, d])) == [
        'npumem_kv_tokens{cache="kv",pool="gpu0"} 0.0',
        'npumem_kv_tokens{cache="kv",pool="gpu1"} 0.0',
        'npumem_kv_tokens{cache="kv.other",pool="gpu0"} 0.0',
    ]


def test_a_kv_cache_in_a_pool_the_collector_does_not_read_is_refused() -> None:
    from npumem.kv import KVCache

    shape = {"num_layers": 2, "num_kv_heads": 1, "head_dim": 8}
    pool = npumem.Pool(8 * MIB, cores=1, name="gpu0")
    other = npumem.Pool(8 * MIB, cores=1, name="gpu1")
    namesake = npumem.Pool(8 * MIB, cores=1, name="gpu0")  # another pool, a collected name
    kept = KVCache(pool, **shape)
    stray = KVCache(other, tag="kv.stray", **shape)
    twin = KVCache(namesake, tag="kv.twin", **shape)
    stray.add_sequence(1, 5)
    with pytest.raises(
        npumem.InvalidArgumentError,
        match=r"^kv\[1\] is in pool 'gpu1', which the collector does not read "
        r"\(its pools: \['gpu0'\]\)",
    ):
        PrometheusCollector(pool, kv=(kept, stray))
    with pytest.raises(
        npumem.InvalidArgumentError,
        match=r"^kv\[0\] is in pool 'gpu0', which the collector does not read "
        r"\(its pools: \['gpu0'\]; the cache's pool is another pool of that name\)",
    ):
        PrometheusCollector(pool, kv=[twin])
    # The refusal changed nothing: the caches still work, and a collector that reads their
    # pools exports them.
    assert stray.stats().tokens == 5 and twin.stats().sequences == 0
    assert kv_token_lines(PrometheusCollector(pool, other, kv=(kept, stray))) == [
        'npumem_kv_tokens{cache="kv",pool="gpu0"} 0.0',
        'npumem_kv_tokens{cache="kv.stray",pool="gpu1"} 5.0',
    ]
    # What was checked stays as it was: the caches and pools cannot be replaced afterwards.
    collector = PrometheusCollector(pool, kv=(kept,))
    with pytest.raises(AttributeError):
        collector.kv = (kept, stray)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        collector.pools = (other,)  # type: ignore[misc]
    assert collector.kv == (kept,) and collector.pools == (pool,)
