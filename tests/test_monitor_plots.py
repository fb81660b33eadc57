"""Pictures: each function writes a valid PNG of the expected dimensions and a plausible size."""

from __future__ import annotations

import contextlib
import html
import os
import subprocess
import sys
from pathlib import Path

import pytest

import npumem
from monitor_helpers import assert_png
from npumem import plan
from npumem.monitor import (
    Monitor,
    Thresholds,
    TraceRecorder,
    plot_address_map,
    plot_before_after,
    plot_plan,
    plot_timeline,
    plot_trace,
)
from npumem.plan import networks

MIB = 1 << 20


@pytest.fixture(scope="module")
def scene() -> dict[str, object]:
    pool = npumem.Pool(64 * MIB, cores=2, name="pics")
    mon = Monitor(pool)
    with TraceRecorder(pool) as rec:
        held = []
        for i in range(200):
            held.append(pool.alloc(1000 + (i % 40) * 7000, tag=f"model{i % 3}"))
            if i % 3 == 0:
                held.pop(len(held) // 2).free()
            if i % 20 == 0:
                mon.sample()
        with contextlib.suppress(npumem.OutOfMemoryError):
            pool.alloc(60 * MIB)
        mon.sample()
        busy = pool.snapshot().with_label("busy")
        for b in held[::2]:
            b.free()
        later = pool.snapshot().with_label("later")
        for b in held[1::2]:
            b.free()
    return {"history": mon.history, "busy": busy, "later": later, "trace": rec.trace}


def test_timeline(tmp_path: Path, scene: dict[str, object]) -> None:
    out = plot_timeline(scene["history"], tmp_path / "t.png", thresholds=Thresholds())  # type: ignore[arg-type]
    assert_png(out, (1100, 660))


@pytest.mark.parametrize("color_by", ["tag", "core"])
def test_address_map(tmp_path: Path, scene: dict[str, object], color_by: str) -> None:
    out = plot_address_map(scene["busy"], tmp_path / "m.png", color_by=color_by)  # type: ignore[arg-type]
    assert_png(out, (1210, 770))


def test_before_after(tmp_path: Path, scene: dict[str, object]) -> None:
    out = plot_before_after(scene["busy"], scene["later"], tmp_path / "ba.png")  # type: ignore[arg-type]
    assert_png(out, (1760, 770))


def test_trace_picture(tmp_path: Path, scene: dict[str, object]) -> None:
    out = plot_trace(scene["trace"], tmp_path / "tr.png")  # type: ignore[arg-type]
    assert_png(out, (1100, 660))


def test_plan_picture(tmp_path: Path) -> None:
    problem = plan.Problem.from_graph(networks.mobilenet_v2(), alignment=64)
    out = plot_plan(plan.solve(problem, time_limit=1.0), tmp_path / "p.png")
    assert_png(out, (1210, 660))


def test_bad_arguments(tmp_path: Path, scene: dict[str, object]) -> None:
    with pytest.raises(npumem.InvalidArgumentError, match="color_by"):
        plot_address_map(scene["busy"], tmp_path / "x.png", color_by="size")  # type: ignore[arg-type]
    with pytest.raises(npumem.InvalidArgumentError, match="at least one sample"):
        plot_timeline([], tmp_path / "x.png")
    with pytest.raises(FileNotFoundError):
        plot_address_map(scene["busy"], tmp_path / "missing" / "x.png")  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["$\\frac{$", "$x^{$", "cost $5 and $6", "$\\alpha$"])
def test_names_tags_and_labels_are_drawn_as_text_not_math(text: str, tmp_path: Path) -> None:
    pool = npumem.Pool(16 * MIB, cores=1, name=text)
    with TraceRecorder(pool) as rec:
        block = pool.alloc(1000, tag=text)
        snap = pool.snapshot().with_label(text)
        block.free()
    assert_png(plot_address_map(snap, tmp_path / "map.png"))
    assert_png(plot_address_map(snap, tmp_path / "cores.png", color_by="core"))
    assert_png(plot_trace(rec.trace, tmp_path / "trace.png"))
    svg = plot_address_map(snap, tmp_path / "map.svg").read_text()
    assert f"({text}), by tag" in html.unescape(svg)  # the label, in the title


@pytest.mark.parametrize("command", ["plot", "demo"])
def test_an_unwritable_home_adds_no_matplotlib_warning(
    command: str, scene: dict[str, object], tmp_path: Path
) -> None:
    """matplotlib warns twice on stderr when it cannot write its folders under `HOME`; a
    command that succeeds prints nothing on stderr all the same."""
    snap = scene["busy"]
    assert isinstance(snap, npumem.monitor.Snapshot)
    src = snap.save(tmp_path / "s.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPL", "XDG_"))}
    env["HOME"] = "/proc/npumem-no-home"  # no folder can be made there, even by root
    argv = {
        "plot": ["plot", str(src), "-o", str(tmp_path / "p.png")],
        "demo": ["demo", "--quick", "--requests", "5", "--workers", "1", "--no-tiers"],
    }[command]
    if command == "demo":
        argv += ["-o", str(tmp_path / "demo")]
    # A temporary folder of the command's own: the other case of this test, in another
    # worker at the same time, makes its folder in the shared one.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env["TMPDIR"] = str(temporary)
    done = subprocess.run(
        [sys.executable, "-m", "npumem", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert list(temporary.glob("npumem-matplotlib-*")) == []  # its folder is gone
