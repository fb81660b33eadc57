"""The file tools under load: memory and output bounded as traces and snapshots grow.

The sizes are small (the checks are about how things grow, not about the absolute figures);
BENCHMARKS.md ("The file tools on large inputs") has the full-size figures.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pytest

from npumem.fileio import json_text
from npumem.monitor import Trace
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
