"""Prometheus export of a tiered pool: every figure of `stats()` per tier, labelled `tier`
(`fast` or `slow`), `core` (empty for the slow tier) and `pool` (the pool's name).

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> import npumem
    >>> from npumem.tiers import TieredPool
    >>> from npumem.tiers.prometheus import TierCollector
    >>> mem = TieredPool([npumem.Pool(4 << 20, cores=1, name="sram0")],
    ...                  npumem.Pool(16 << 20, cores=1, name="hbm"))
    >>> registry = CollectorRegistry()
    >>> registry.register(TierCollector(mem))
    >>> text = generate_latest(registry).decode()
    >>> 'npumem_tier_capacity_bytes{core="0",pool="sram0",tier="fast"} 4.194304e+06' in text
    True

The per-pool metrics of `npumem.monitor.PrometheusCollector` stay available for each
pool; these add what only the tiered pool knows. Needs the `prometheus` extra.

`TierCollector(mem, pools=True)` also exports the per-pool metrics (`npumem_in_use_bytes`,
`npumem_allocs_total`, ... of `npumem.monitor.prometheus`) of every tier's pool with the same
`tier`, `core` and `pool` labels, so that every series of a tiered pool can be selected by
tier; register it instead of a `PrometheusCollector` of those pools (the same names twice in
one registry are refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

from npumem.errors import ArgumentTypeError, MissingDependencyError
from npumem.monitor.prometheus import COUNTERS, GAUGES
from npumem.tiers.block import Tier
from npumem.tiers.pool import TieredPool
from npumem.tiers.report import TierStats, TierUsage

__all__ = ["TIER_COUNTERS", "TIER_GAUGES", "TierCollector"]

TIER_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("npumem_tier_capacity_bytes", "capacity", "Bytes in the tier's pool."),
    ("npumem_tier_bytes_in_use", "bytes_in_use", "Bytes held by blocks in the tier's pool."),
    ("npumem_tier_blocks", "blocks", "Tiered blocks held by the tier now."),
)
"""`(metric, TierUsage field, help)` of every per-tier gauge."""

TIER_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("npumem_tier_hits_total", "hits", "Accesses served by the tier."),
    ("npumem_tier_hit_bytes_total", "hit_bytes", "Bytes of the accesses served by the tier."),
    ("npumem_tier_allocs_total", "allocs", "Tiered blocks placed in the tier at allocation."),
    (
        "npumem_tier_promotions_total",
        "promotions",
        "Blocks promoted into this fast tier (slow tier: all promotions).",
    ),
    (
        "npumem_tier_demotions_total",
        "demotions",
        "Blocks demoted out of this fast tier (slow tier: all demotions).",
    ),
    (
        "npumem_tier_spills_total",
        "spills",
        "Blocks that asked for this core's fast tier and went to the slow tier.",
    ),
)
"""`(metric, TierUsage field, help)` of every per-tier counter."""

_LABELS = ["tier", "core", "pool"]


def _families() -> Any:
    try:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError(
            "Prometheus export needs prometheus-client: pip install npumem[prometheus]"
        ) from exc
    return GaugeMetricFamily, CounterMetricFamily


class TierCollector:
    """A `prometheus_client` collector for a `TieredPool`; each scrape
    calls `mem.stats()` once. `npumem_tier_hit_ratio` is the fast-tier hit rate, labelled
    with the policy."""

    def __reduce__(self) -> NoReturn:
        # A copy would read the same live tiered pool (copy.copy, deepcopy and pickle all come
        # here).
        raise TypeError(
            "cannot copy or pickle a 'TierCollector' object: it reads a live TieredPool "
            "(make a new collector)"
        )

    def __init__(self, mem: TieredPool, *, pools: bool = False) -> None:
        _families()
        if not isinstance(mem, TieredPool):
            raise ArgumentTypeError(f"TierCollector takes a TieredPool, got {type(mem).__name__}")
        if not isinstance(pools, bool):
            raise ArgumentTypeError(f"pools must be a bool, got {type(pools).__name__}")
        self.mem = mem
        self.pools = pools

    def _labels(self, t: TierUsage) -> list[str]:
        pool = self.mem.slow if t.core is None else self.mem.fast[t.core]
        return [t.tier, "" if t.core is None else str(t.core), str(pool.name)]

    def _build(self, stats: TierStats | None) -> Iterator[Any]:
        gauge, counter = _families()
        tiers = () if stats is None else (*stats.fast, stats.slow)
        if self.pools:
            pool_stats = [
                (self._labels(t), self.mem.pool_of(Tier(t.tier, t.core)).stats()) for t in tiers
            ]
            for families, make in ((GAUGES, gauge), (COUNTERS, counter)):
                for metric, attr, doc in families:
                    family = make(metric, doc, labels=_LABELS)
                    for labels, s in pool_stats:
                        family.add_metric(labels, float(getattr(s, attr)))
                    yield family
        for metric, attr, doc in TIER_GAUGES:
            g = gauge(metric, doc, labels=_LABELS)
            for t in tiers:
                g.add_metric(self._labels(t), float(getattr(t, attr)))
            yield g
        for metric, attr, doc in TIER_COUNTERS:
            c = counter(metric, doc, labels=_LABELS)
            for t in tiers:
                c.add_metric(self._labels(t), float(getattr(t, attr)))
            yield c
        ratio = gauge(
            "npumem_tier_hit_ratio", "Share of accesses served by a fast tier.", labels=["policy"]
        )
        if stats is not None:
            ratio.add_metric([stats.policy], stats.hit_rate)
        yield ratio

    def collect(self) -> Iterator[Any]:
        """The metric families with the tiers' values now (called by the registry)."""
        yield from self._build(self.mem.stats())

    def describe(self) -> Iterator[Any]:
        """The metric families without values."""
        yield from self._build(None)
