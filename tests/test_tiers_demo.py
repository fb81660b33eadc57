"""``npumem demo`` serves its weights from per-worker SRAM and shared HBM (``--tiers``, the
default), prints the tiers and the policies compared, and writes the tier snapshot and picture;
``--no-tiers`` keeps every weight in the demo's pool."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from monitor_helpers import assert_png
from npumem.cli import main
from npumem.tiers.observe import load_tier_snapshot
from npumem.workloads.tiered import run_tiered_demo


def test_demo_with_tiers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    status = main(["demo", "--requests", "40", "--workers", "2", "--tiers", "--output", str(out)])
    assert status == 0
    text = capsys.readouterr().out
    for figure in ("tiered demo: 2 cores", "fast-tier hit rate", "fast[1]", "size-only"):
        assert figure in text, figure
    snap = load_tier_snapshot(out / "tiers.json")
    assert len(snap.stats.fast) == 2 and snap.stats.accesses > 0
    assert set(snap.snapshots) == {"fast[0]", "fast[1]", "slow"}
    assert_png(out / "tiers.png")
    assert "tiers.json" in text and "tiers.png" in text


def test_demo_without_tiers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from npumem.monitor import load_snapshot

    out = tmp_path / "demo"
    status = main(["demo", "--requests", "20", "--workers", "1", "--no-tiers", "-o", str(out)])
    assert status == 0
    text = capsys.readouterr().out
    assert "requests served" in text and "fast-tier hit rate" not in text
    assert not (out / "tiers.json").exists()
    end = load_snapshot(out / "snapshot-end.json")
    assert sorted(str(b.tag) for b in end.blocks) == [
        "mobilenet_v2.weights",
        "resnet50.weights",
        "text.weights",
    ]


def test_report_and_plot_read_a_tier_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import npumem
    from npumem.tiers import TieredPool

    mem = TieredPool(
        [npumem.Pool(2 << 20, cores=1, name=f"sram{c}") for c in range(2)],
        npumem.Pool(16 << 20, cores=2, name="hbm"),
    )
    tb = mem.alloc(10_000, core=1, hot=True, tag="hot")
    mem.touch(tb, 2)
    path = mem.snapshot(label="now").save(tmp_path / "tiers.json")
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "tier snapshot 'now'" in text and "tier fast[1] (pool 'sram1')" in text
    assert main(["plot", str(path), "-o", str(tmp_path / "tiers.png")]) == 0
    assert_png(tmp_path / "tiers.png")


def test_ctrl_c_while_the_tiered_demo_serves_stops_its_workers_at_once() -> None:
    """Ctrl-C reaches the main thread, which waits for the workers: they stop at their next
    request and the interrupt goes on, rather than the rest of the requests being served
    first (the interpreter waits for every worker before it exits)."""
    requests = 4_000
    served = 0
    lock = threading.Lock()
    before = set(threading.enumerate())

    def on_request() -> None:
        nonlocal served
        with lock:
            served += 1
            if served == 20:  # Ctrl-C as a terminal sends it, to the main thread
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        run_tiered_demo(cores=2, requests=requests, compare=(), on_request=on_request)
    assert [t.name for t in set(threading.enumerate()) - before] == []
    assert served < requests // 4
