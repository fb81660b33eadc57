"""The file tools under load: memory and output bounded as traces and snapshots grow.

The sizes are small (the checks are about how things grow, not about the absolute figures);
BENCHMARKS.md ("The file tools on large inputs") has the full-size figures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

import npumem
from npumem.cli import main
from npumem.fileio import json_text
from npumem.monitor import Trace, TraceRecorder, viewer
from npumem.monitor.perfetto import chrome_trace, write_chrome_trace
from npumem.monitor.trace import TraceEvent

MIB = 1 << 20
CONFIG = {
    "capacity": 1 << 30,
    "cores": 4,
    "chunk_size": 2 * MIB,
    "min_block": 256,
    "bank_size": 2 * MIB,
    "alignment": 256,
    "slab_sizes": [],
}


def synthetic_trace(n: int, *, seed: int = 1, live_target: int = 500) -> Trace:
    """A trace of `n` alloc and free events from four cores, as a pool would record it."""
    rng = random.Random(seed)
    events: list[TraceEvent] = []
    live: list[tuple[int, int, int]] = []
    handle = 1 << 64
    t = 1000
    for _ in range(n):
        t += rng.randrange(1, 200)
        core = rng.randrange(4)
        if live and (len(live) >= live_target or rng.random() < 0.5):
            h, off, size = live.pop(rng.randrange(len(live)))
            events.append(TraceEvent(t, "free", off, size, core, "w", h, 0))
        else:
            size = rng.choice((256, 4096, 65536, 3000))
            handle += 1
            off = rng.randrange(0, (1 << 30) - size) & ~255
            live.append((handle, off, size))
            events.append(TraceEvent(t, "alloc", off, size, core, f"t{core}", handle, 256))
    return Trace(pool="load", config=dict(CONFIG), events=events)


def peak_bytes(fn: object, *args: object) -> int:
    """Bytes allocated at the peak of `fn(*args)` beyond what was allocated before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn(*args)  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_reading_a_small_file_reserves_no_large_buffer(tmp_path: Path) -> None:
    """A read of a file reserves its size, not the limit of `MAX_INPUT_BYTES` (1 GiB), which a
    machine that does not overcommit memory refuses."""
    from npumem.fileio import read_json_object

    path = synthetic_trace(100).save(tmp_path / "t.json")
    assert peak_bytes(read_json_object, path) < 16 * MIB


# ----- npumem export --------------------------------------------------------------------------


def test_the_export_streams_its_output(tmp_path: Path) -> None:
    """Writing the export takes memory for the live blocks and a batch of entries, not for the
    whole file: its peak is a small part of the output, and the text is the same as the
    object's."""
    trace = synthetic_trace(20_000)
    out = tmp_path / "t.perfetto.json"
    peak = peak_bytes(write_chrome_trace, trace, out)
    size = out.stat().st_size
    assert peak < size / 2, (peak, size)
    assert out.read_text() == json_text(chrome_trace(trace))
    obj = json.loads(out.read_text())
    begins = sum(1 for e in obj["traceEvents"] if e["ph"] == "b")
    assert begins == trace.counts()["alloc"]  # no event lost


def test_an_interrupted_export_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from npumem.monitor import perfetto

    out = tmp_path / "t.json"
    out.write_text("old")
    made = perfetto._chrome_events

    def interrupted(trace: Trace):  # type: ignore[no-untyped-def]
        for i, entry in enumerate(made(trace)):
            if i == 3 * perfetto._BATCH:  # after some batches reached the file
                raise KeyboardInterrupt
            yield entry

    monkeypatch.setattr(perfetto, "_chrome_events", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_chrome_trace(synthetic_trace(20_000), out)
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no temporary file left


# ----- npumem view ----------------------------------------------------------------------------


def test_the_trace_page_holds_at_most_max_shapes_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(viewer, "MAX_SHAPES", 300)
    trace = synthetic_trace(4000)
    data = viewer.page_data(trace)
    blocks = trace.counts()["alloc"]
    assert len(data["rects"]) == len(data["infos"]) == 300
    assert f"shows the 300 largest of the {blocks:,} blocks" in data["subtitle"]
    # every rectangle points at its own details, and the kept ones are the largest
    assert [r[5] for r in data["rects"]] == list(range(300))
    assert all(data["infos"][r[5]][4] == r[3] - r[2] for r in data["rects"])


def test_the_page_size_stops_growing_with_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(viewer, "MAX_SHAPES", 200)
    sizes = []
    for n in (4000, 16000):
        page = tmp_path / f"{n}.html"
        viewer.write_view(synthetic_trace(n), page)
        sizes.append(page.stat().st_size)
    assert sizes[1] < 1.3 * sizes[0], sizes


def test_the_page_of_a_small_trace_holds_every_block() -> None:
    trace = synthetic_trace(2000)
    data = viewer.page_data(trace)
    assert len(data["rects"]) == trace.counts()["alloc"]
    assert "largest" not in data["subtitle"]


def test_compaction_marks_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(viewer, "MAX_MARKS", 5)
    events = [TraceEvent(1000 + i * 10_000_000, "move", 0, 256, 0, None, 7, 256) for i in range(20)]
    data = viewer.page_data(Trace(pool="m", config=dict(CONFIG), events=events))
    assert sum(m["kind"] == "compaction" for m in data["marks"]) == 5
    assert "20 moves in 20 compactions" in data["subtitle"]
    assert "only the first 5 compaction lines are drawn" in data["subtitle"]


def test_the_snapshot_page_keeps_the_largest_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = npumem.Pool(64 * MIB, cores=1, name="many")
    held = [pool.alloc(4096 if i % 10 else 65536, tag="x") for i in range(600)]
    snap = pool.snapshot()
    monkeypatch.setattr(viewer, "MAX_SHAPES", 50)
    data = viewer.page_data(snap)
    total = len(snap.blocks) + len(snap.free_runs) + len(snap.slab_cached) + len(snap.untracked)
    assert len(data["infos"]) == 50
    assert f"shows the 50 largest of the {total:,} blocks and free runs" in data["subtitle"]
    big = [i for i in data["infos"] if i[0] == "s"]
    assert big and all(i[5] >= 65536 for i in big)
    del held


# ----- reading a trace ------------------------------------------------------------------------


def test_reading_a_trace_file_does_not_hold_rows_and_events_at_once(tmp_path: Path) -> None:
    """`Trace.load` lets the parsed rows go as their events are made: its peak stays well
    below the parsed object plus the events."""
    path = synthetic_trace(30_000).save(tmp_path / "t.json")
    from npumem.monitor._files import read_json

    parsed = peak_bytes(read_json, path)
    loaded = peak_bytes(Trace.load, path)
    assert loaded < 1.1 * parsed, (loaded, parsed)


def test_a_recorded_trace_reads_back_the_same(tmp_path: Path) -> None:
    pool = npumem.Pool(16 * MIB, cores=1, name="rt")
    with TraceRecorder(pool) as rec:
        for i in range(300):
            pool.alloc(1000 + i, tag="é" * (i % 3) or None).free()
    path = rec.trace.save(tmp_path / "t.json")
    back = Trace.load(path)
    assert back.events == rec.trace.events
    assert {e.kind for e in back.events} == {"alloc", "free"}
    assert main(["export", str(path), "-o", str(tmp_path / "p.json")]) == 0


# ----- npumem plot ----------------------------------------------------------------------------


def test_a_trace_picture_draws_a_bounded_number_of_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed allocations and compactions are lines of one collection each, at most
    `_LINES_ACROSS` of them: one artist per failure took minutes for 100,000 failures."""
    pytest.importorskip("matplotlib")
    from npumem.monitor import plots

    trace = synthetic_trace(2000)
    t = trace.events[-1].time_ns
    trace.events += [TraceEvent(t + i, "failed", 0, 4096, 0, "x", 0, 256) for i in range(8000)]
    trace.events += [
        TraceEvent(t + 9000 + i * 2_000_000, "move", 0, 4096, 0, None, 1, 0) for i in range(50)
    ]
    figures = []
    real = plots.save_figure
    monkeypatch.setattr(
        plots, "save_figure", lambda fig, path: figures.append(fig) or real(fig, path)
    )
    plots.plot_trace(trace, tmp_path / "t.png")
    top = figures[0].axes[0]
    assert len(top.lines) < 10  # the bytes live and the capacity
    segments = {c.get_label(): len(c.get_segments()) for c in top.collections}
    assert 0 < segments["failed allocation"] <= plots._LINES_ACROSS
    assert segments["compaction (blocks moved)"] == 50


# ----- interrupted commands -------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_write_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """`kill` (SIGTERM) or Ctrl-C (SIGINT) while `npumem export` writes its file: the output
    keeps its old content and no temporary file is left next to it."""
    trace = synthetic_trace(150_000).save(tmp_path / "t.json")
    out = tmp_path / "out.json"
    out.write_text("old")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "npumem", "export", str(trace), "-o", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        # Ctrl-C as a terminal delivers it: a test run started in the background of a
        # non-interactive shell ignores SIGINT, and its children would inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".out.json.*.tmp")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert proc.poll() is None, "the export ended before it could be interrupted"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    said = "terminated" if sig == signal.SIGTERM else "interrupted"
    assert err.decode() == f"npumem export: {said}\n"
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "t.json"]


# `npumem export` through `main()`, with the signal sent at the first point where its handler
# can raise once the temporary file exists (a C call returning): where a signal sent the moment
# the file appears, as above, lands when the command is slow to run on.
_SIGNAL_AS_THE_TEMPORARY_FILE_APPEARS = r"""
import signal
import sys
from pathlib import Path

from npumem.cli import main

trace, out, sig = sys.argv[1], Path(sys.argv[2]), signal.Signals[sys.argv[3]]
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)


def hook(frame, event, arg):
    if event != "c_return":
        return
    if any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir()):
        sys.setprofile(None)
        signal.raise_signal(sig)


sys.setprofile(hook)
sys.exit(main(["export", trace, "-o", str(out)]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_as_the_temporary_file_appears_leaves_the_old_file_and_none(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The signal of the test above at the worst moment, every time: right after the temporary
    file is made."""
    trace = synthetic_trace(200).save(tmp_path / "t.json")
    out = tmp_path / "out.json"
    out.write_text("old")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SIGNAL_AS_THE_TEMPORARY_FILE_APPEARS,
            str(trace),
            str(out),
            sig.name,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 128 + sig, done.stderr
    assert "Traceback" not in done.stderr
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "t.json"]
