"""The text report: the figures it prints come from the stats and the snapshot given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import npumem
from npumem.monitor import Monitor, human_bytes, report_text

MIB = 1 << 20


def test_report_of_a_snapshot_and_history() -> None:
    pool = npumem.Pool(8 * MIB, cores=2, core_reserve=0, name="rep")
    mon = Monitor(pool, thresholds={"usage": 0.5})
    mon.sample()
    blocks = [pool.alloc(2 * MIB, tag="big") for _ in range(4)]
    blocks[0].free()
    blocks[2].free()
    mon.sample()
    snap = pool.snapshot().with_label("now")
    text = report_text(snapshot=snap, history=mon.history, alerts=mon.alerts, title="T")
    assert "T (snapshot now)" in text
    assert "4.0 MiB" in text  # bytes in use and free
    assert "50.0%" in text  # fragmentation
    assert "Largest free runs (2 runs, 4.0 MiB free)" in text
    assert "Live blocks by tag (2 blocks)" in text and "big" in text
    assert "Per core" in text
    assert "Per size class" in text and "waste bytes" in text
    assert "samples" in text and "alerts fired" in text and "usage" in text
    for b in (blocks[1], blocks[3]):
        b.free()


def test_report_from_stats_alone_and_per_class_figures_when_present() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    stats = pool.stats().as_dict()
    text = report_text(stats=stats)
    assert "Largest free runs" not in text and "capacity" in text
    stats["size_classes"] = [
        {"size": 64, "blocks_in_use": 10, "bytes_free": 4032},
        {"size": 128, "blocks_in_use": 3, "bytes_free": 3712},
    ]
    text = report_text(stats=stats)
    assert "Per size class" in text and "4,032" in text and "3,712" in text
    assert "not reported" not in text

    class SizeClass:  # the shape a binding class with as_dict() would have
        def as_dict(self) -> dict[str, int]:
            return {"size": 256, "blocks_in_use": 77}

    stats["size_classes"] = [SizeClass()]
    text = report_text(stats=stats)
    assert "Per size class" in text and "77" in text


def test_human_bytes() -> None:
    assert human_bytes(1000) == "1000 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * MIB) == "3.0 MiB"
    assert human_bytes(5 << 30) == "5.0 GiB"


@pytest.mark.parametrize("text", ["[/]", "w[/x]", "[bold]x[/bold]", "[red]"])
def test_names_tags_and_labels_are_text_not_markup(text: str) -> None:
    pool = npumem.Pool(8 * MIB, cores=1, name=text)
    block = pool.alloc(1000, tag=text)
    snap = pool.snapshot().with_label(text)
    stats = pool.stats().as_dict()
    stats["size_classes"] = [{text: 1}]
    out = report_text(snapshot=snap, stats=stats, title=text, width=120)
    assert f"{text} (snapshot {text})" in out
    assert f"│ {text} " in out  # the tag's row
    assert f" {text} ┃" in out  # a column the pool reports per size class
    block.free()


def test_json_report_of_a_tier_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from npumem.cli import main
    from npumem.monitor.report import report_json
    from npumem.tiers import TieredPool

    mem = TieredPool(
        [npumem.Pool(2 * MIB, cores=1, name=f"sram{c}") for c in range(2)],
        npumem.Pool(16 * MIB, cores=2, name="hbm"),
    )
    held = [mem.alloc(100_000 * (i + 1), core=i % 2, tag=f"t{i}") for i in range(5)]
    mem.touch(held[0], 3)
    snap = mem.snapshot(label="now")
    path = snap.save(tmp_path / "tiers.json")
    assert main(["report", str(path), "--json", "--top", "2"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["format"] == "npumem-tier-report" and obj["version"] == 1
    assert obj["label"] == "now" and obj["stats"] == snap.stats.as_dict()
    assert list(obj["tiers"]) == ["fast[0]", "fast[1]", "slow"]
    for name, tier in snap.snapshots.items():
        assert obj["tiers"][name] == report_json(tier, top=2)
