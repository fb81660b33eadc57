"""Prometheus export: a collector that reads `stats()` of one or more pools (and of paged KV
caches in them) at every scrape.

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> import npumem
    >>> from npumem.monitor import PrometheusCollector
    >>> pool = npumem.Pool(16 << 20, cores=1, name="gpu0")
    >>> registry = CollectorRegistry()
    >>> registry.register(PrometheusCollector(pool))
    >>> 'npumem_free_bytes{pool="gpu0"} 1.6777216e+07' in generate_latest(registry).decode()
    True

Needs the `prometheus` extra (`pip install npumem[prometheus]`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from npumem.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    InvalidHandleError,
    MissingDependencyError,
)

if TYPE_CHECKING:
    from npumem import Pool, PoolStats
    from npumem.kv.cache import KVCache
    from npumem.kv.stats import KVStats

__all__ = ["COUNTERS", "GAUGES", "KV_GAUGES", "TAG_GAUGES", "PrometheusCollector"]

GAUGES: tuple[tuple[str, str, str], ...] = (
    ("npumem_capacity_bytes", "capacity", "Bytes in the arena."),
    (
        "npumem_usable_capacity_bytes",
        "usable_capacity",
        "Bytes blocks can use (the capacity less a tail too short for one block).",
    ),
    ("npumem_in_use_bytes", "bytes_in_use", "Bytes held by live blocks (block sizes)."),
    (
        "npumem_requested_in_use_bytes",
        "requested_bytes_in_use",
        "Bytes the live blocks asked for (in use less rounding).",
    ),
    ("npumem_free_bytes", "bytes_free", "Usable bytes any allocation can use."),
    (
        "npumem_slab_cached_bytes",
        "slab_cached_bytes",
        "Unused bytes inside slabs that hold objects (neither in use nor free).",
    ),
    ("npumem_peak_in_use_bytes", "peak_bytes_in_use", "Highest in-use bytes seen."),
    (
        "npumem_largest_free_block_bytes",
        "largest_free_block",
        "Bytes of the largest block one allocation could get now.",
    ),
    (
        "npumem_external_fragmentation_ratio",
        "external_fragmentation",
        "1 - largest free block / free bytes (0 when nothing is free).",
    ),
    ("npumem_usage_ratio", "usage", "In-use bytes / usable capacity."),
    ("npumem_live_blocks", "blocks_in_use", "Live blocks."),
)
"""`(metric, PoolStats field, help)` of every gauge. Names end in their unit, as the
Prometheus naming guide asks (`_bytes`, `_ratio`; counts have no unit)."""

COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("npumem_allocs_total", "alloc_count", "Allocations since the pool was made."),
    ("npumem_frees_total", "free_count", "Frees since the pool was made."),
    (
        "npumem_failed_allocs_total",
        "failed_allocs",
        "Allocations that failed for lack of memory, requests larger than the arena included.",
    ),
    (
        "npumem_overflow_allocs_total",
        "overflow_allocs",
        "Allocations served outside the caller's own core pool.",
    ),
)
"""`(metric, PoolStats field, help)` of every counter (exposed with the `_total` suffix)."""

TAG_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "npumem_tag_requested_in_use_bytes",
        "requested_bytes_in_use",
        "Bytes the live blocks of a tag asked for.",
    ),
    (
        "npumem_tag_peak_requested_in_use_bytes",
        "peak_requested_bytes_in_use",
        "The highest bytes the live blocks of a tag asked for.",
    ),
    ("npumem_tag_live_blocks", "blocks_in_use", "Live blocks of a tag."),
)
"""`(metric, TagStats field, help)` of the gauges by tag, labelled `pool` and `tag`. A pool
counts its first 63 tags apart and the rest together (`tag="(other tags)"`), so the number of
series stays bounded; blocks without a tag have `tag=""`."""


KV_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("npumem_kv_sequences", "sequences", "Sequences in the KV cache."),
    ("npumem_kv_tokens", "tokens", "Tokens of all sequences (a shared prompt once per sequence)."),
    (
        "npumem_kv_waste_bytes",
        "waste_bytes",
        "Bytes of partly filled pages that hold no token (at most a page per sequence).",
    ),
    (
        "npumem_kv_shared_saved_bytes",
        "shared_saved_bytes",
        "Bytes that sharing pages between sequences saves.",
    ),
)
"""`(metric, KVStats field, help)` of every KV cache gauge, labelled `pool` and `cache`
(the cache's tag); `npumem_kv_pages` (labelled `state` too: free, exclusive, shared) and
the counter `npumem_kv_copies_total` come with them."""


def _families() -> Any:
    try:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError(
            "Prometheus export needs prometheus-client: pip install npumem[prometheus]"
        ) from exc
    return GaugeMetricFamily, CounterMetricFamily


class PrometheusCollector:
    """A `prometheus_client` collector for `pool` (and any further pools): every metric is
    labelled `pool` with the pool's name, so names must differ. Register it in any
    `CollectorRegistry`; each scrape calls `stats()` once per pool. `kv` adds paged KV
    caches (`npumem.kv.KVCache`): their pages by state and their
    `KV_GAUGES`, labelled with the cache's pool name and tag, so no two caches may have both
    the same (nor may a cache be given twice), and each cache's pool must be one of the pools
    collected (the same pool object, not only its name): otherwise `InvalidArgumentError`."""

    def __reduce__(self) -> NoReturn:
        # A copy would read the same live pools (copy.copy, deepcopy and pickle all come here).
        raise TypeError(
            "cannot copy or pickle a 'PrometheusCollector' object: it reads live pools "
            "(make a new collector)"
        )

    def __init__(self, pool: Pool, *pools: Pool, kv: tuple[KVCache, ...] = ()) -> None:
        _families()
        all_pools = (pool, *pools)
        for p in all_pools:
            if not all(hasattr(p, a) for a in ("stats", "name")):
                raise ArgumentTypeError(
                    f"PrometheusCollector takes npumem.Pool objects, got {type(p).__name__}"
                )
        names = [str(p.name) for p in all_pools]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(
                f"pool names must differ (they label the metrics), got {names}"
            )
        try:
            kv = tuple(kv)
        except TypeError:
            raise ArgumentTypeError(
                f"kv must be a tuple of npumem.kv.KVCache objects, got {type(kv).__name__}"
            ) from None
        for cache in kv:
            if not all(hasattr(cache, a) for a in ("stats", "tag", "pool")):
                raise ArgumentTypeError(
                    f"kv takes npumem.kv.KVCache objects, got {type(cache).__name__}"
                )
        # Each cache's series are labelled (pool, cache tag): two caches with the same labels
        # (or one cache given twice) would export the same series twice.
        labels: dict[tuple[str, str], int] = {}
        for i, cache in enumerate(kv):
            key = (str(cache.pool.name), str(cache.tag))
            if key in labels:
                j = labels[key]
                what = "is the same cache as" if kv[j] is cache else "has the same pool and tag as"
                raise InvalidArgumentError(
                    f"kv caches must differ in pool name and tag (they label the metrics): "
                    f"kv[{i}] {what} kv[{j}] (pool {key[0]!r}, tag {key[1]!r})"
                )
            labels[key] = i
        # A cache's series carry its pool's name: that pool must be one of those collected
        # (the same object, not only the same name), or the series would name a pool whose
        # own series are missing, or another pool's.
        for i, cache in enumerate(kv):
            if not any(cache.pool is p for p in all_pools):
                name = str(cache.pool.name)
                hint = (
                    "; the cache's pool is another pool of that name)"
                    if name in names
                    else "): give that pool too"
                )
                raise InvalidArgumentError(
                    f"kv[{i}] is in pool {name!r}, which the collector does not read "
                    f"(its pools: {names}{hint}"
                )
        self._kv = kv
        self._pools = all_pools

    @property
    def pools(self) -> tuple[Pool, ...]:
        """The pools collected, as given (read-only: the checks above hold for the
        collector's life)."""
        return self._pools

    @property
    def kv(self) -> tuple[KVCache, ...]:
        """The KV caches collected, as given (read-only)."""
        return self._kv

    def _build(
        self, stats: list[tuple[str, PoolStats]], kv: list[tuple[str, str, KVStats]]
    ) -> Iterator[Any]:
        gauge, counter = _families()
        for metric, attr, doc in GAUGES:
            g = gauge(metric, doc, labels=["pool"])
            for name, s in stats:
                g.add_metric([name], float(getattr(s, attr)))
            yield g
        for metric, attr, doc in COUNTERS:
            c = counter(metric, doc, labels=["pool"])
            for name, s in stats:
                c.add_metric([name], float(getattr(s, attr)))
            yield c
        for metric, attr, doc in TAG_GAUGES:
            g = gauge(metric, doc, labels=["pool", "tag"])
            for name, s in stats:
                for t in s.by_tag:
                    g.add_metric([name, t.tag or ""], float(getattr(t, attr)))
            yield g
        pages = gauge(
            "npumem_kv_pages", "KV cache pages by state.", labels=["pool", "cache", "state"]
        )
        for pool, tag, k in kv:
            for state, n in (
                ("free", k.pages_free if k.preallocated else 0),
                ("exclusive", k.pages_exclusive),
                ("shared", k.pages_shared),
            ):
                pages.add_metric([pool, tag, state], float(n))
        yield pages
        for metric, attr, doc in KV_GAUGES:
            g = gauge(metric, doc, labels=["pool", "cache"])
            for pool, tag, k in kv:
                g.add_metric([pool, tag], float(getattr(k, attr)))
            yield g
        c = counter(
            "npumem_kv_copies",
            "KV pages copied on write (a shared page appended to).",
            labels=["pool", "cache"],
        )
        for pool, tag, k in kv:
            c.add_metric([pool, tag], float(k.copies))
        yield c

    def collect(self) -> Iterator[Any]:
        """The metric families with the pools' values now (called by the registry). A KV
        cache closed since has no series any more: the pools' still come."""
        kv: list[tuple[str, str, KVStats]] = []
        for c in self.kv:
            try:
                kv.append((str(c.pool.name), str(c.tag), c.stats()))
            except InvalidHandleError:  # closed
                continue
        yield from self._build([(str(p.name), p.stats()) for p in self.pools], kv)

    def describe(self) -> Iterator[Any]:
        """The metric families without values (lets a registry detect duplicate names)."""
        yield from self._build([], [])
