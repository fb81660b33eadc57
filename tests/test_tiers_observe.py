"""Seeing the tiers: snapshots (saved and read back), the report, Prometheus with a ``tier``
label, the pictures."""

from __future__ import annotations

import dataclasses
import doctest
from pathlib import Path

import pytest

import npumem
import npumem.tiers
import npumem.tiers.prometheus
from npumem import plan
from npumem.monitor import plot_address_map
from npumem.monitor.errors import FileFormatError
from npumem.plan.networks import mobilenet_v2
from npumem.tiers import TieredPool
from npumem.tiers.observe import TierSnapshot, load_tier_snapshot, tiers_report_text
from npumem.tiers.plots import plot_tiered_plan, plot_tiers

MIB = 1 << 20


def busy_pool() -> TieredPool:
    mem = TieredPool(
        [npumem.Pool(2 * MIB, cores=1, name=f"sram{c}") for c in range(2)],
        npumem.Pool(16 * MIB, cores=2, name="hbm"),
    )
    hot = [mem.alloc(100_000, core=c % 2, hot=True, tag="hot") for c in range(4)]
    cold = [mem.alloc(300_000, core=c % 2, tag="cold") for c in range(3)]
    for tb in hot:
        mem.touch(tb, 3)
    mem.touch(cold[0], 10)
    mem.rebalance()
    return mem


def test_docstrings_run() -> None:
    for module in (npumem.tiers, npumem.tiers.prometheus):
        failures, tried = doctest.testmod(module, verbose=False)
        assert tried > 0 and failures == 0


def test_snapshot_has_every_tier_and_round_trips(tmp_path: Path) -> None:
    mem = busy_pool()
    snap = mem.snapshot(label="after rebalance")
    assert list(snap.snapshots) == ["fast[0]", "fast[1]", "slow"]
    assert snap.snapshots["fast[0]"].label == "fast[0]"
    assert snap.snapshots["slow"].pool == "hbm"
    in_blocks = sum(len(s.blocks) for s in snap.snapshots.values())
    assert in_blocks == 7 == sum(t.blocks for t in (*snap.stats.fast, snap.stats.slow))
    path = snap.save(tmp_path / "tiers.json")
    again = load_tier_snapshot(path)
    assert again.stats == snap.stats and again.label == "after rebalance"
    assert again.snapshots["slow"].blocks == snap.snapshots["slow"].blocks
    plot_address_map(again.snapshots["fast[1]"], tmp_path / "fast1.png")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "npumem-snapshot"}')
    with pytest.raises(FileFormatError):
        TierSnapshot.load(bad)


def test_report_shows_each_tier() -> None:
    stats = busy_pool().stats()
    text = tiers_report_text(stats)
    assert "fast-tier hit rate" in text and "promotions" in text
    for name in ("fast[0]", "fast[1]", "slow"):
        assert name in text


def test_prometheus_has_a_tier_label() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from npumem.tiers.prometheus import TierCollector

    mem = busy_pool()
    registry = CollectorRegistry()
    registry.register(TierCollector(mem))
    text = generate_latest(registry).decode()
    assert 'npumem_tier_hits_total{core="",pool="hbm",tier="slow"}' in text
    assert 'npumem_tier_promotions_total{core="0",pool="sram0",tier="fast"}' in text
    assert 'npumem_tier_hit_ratio{policy="frequency"}' in text
    with pytest.raises(npumem.ArgumentTypeError):
        TierCollector(mem.slow)  # type: ignore[arg-type]


def test_pictures(tmp_path: Path) -> None:
    mem = busy_pool()
    assert plot_tiers(mem.snapshot(), tmp_path / "tiers.png").stat().st_size > 1000
    assert plot_tiers(mem.stats(), tmp_path / "tiers2.png").exists()
    problem = plan.Problem.from_graph(mobilenet_v2(), alignment=64)
    sol = plan.solve(problem, pools=[("sram", MIB), ("hbm", None)], time_limit=0.3)
    assert plot_tiered_plan(sol, tmp_path / "plan.png").stat().st_size > 1000


@pytest.mark.parametrize("text", ["[/]", "w[/x]", "[bold]x[/bold]"])
def test_report_prints_title_and_policy_as_text_not_markup(text: str) -> None:
    stats = dataclasses.replace(busy_pool().stats(), policy=text)
    assert f"{text} ({text}):" in tiers_report_text(stats, title=text)


@pytest.mark.parametrize(("suffix", "magic"), [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_pictures_take_the_format_of_their_extension(
    suffix: str, magic: bytes, tmp_path: Path
) -> None:
    path = plot_tiers(busy_pool().snapshot(), tmp_path / f"tiers{suffix}")
    assert path.read_bytes().startswith(magic)


@pytest.mark.parametrize("name", ["tiers.txt", "tiers"])
def test_pictures_refuse_other_extensions(name: str, tmp_path: Path) -> None:
    with pytest.raises(npumem.InvalidArgumentError, match=r"use \.png, \.svg or \.pdf"):
        plot_tiers(busy_pool().stats(), tmp_path / name)
    assert not (tmp_path / name).exists()
