"""Export a trace in the Chrome trace event format, which ui.perfetto.dev and chrome://tracing
open (`npumem export --format perfetto TRACE`).

What the file shows, in one process named after the pool:

* every block as an async slice from its allocation to its free, named by its tag, on one
  track per tag (`args`: size, offset, core, handle as text); a move ends the slice and
  starts a new one at the new offset;
* a counter `bytes live` (bytes asked for by the live blocks) over time;
* instant events for failed allocations (on the thread track of the core that asked) and
  for moves.

Timestamps are microseconds from the first event. The file is a JSON object:
`{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}`; `otherData` holds
the header (`format` `npumem-chrome-trace`, `version` 1), the pool's name and configuration,
and the events the trace lost (`dropped` by the rings, `discarded` by a bounded recorder).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from npumem.fileio import path_argument, text_writer
from npumem.monitor.trace import Trace

__all__ = ["CHROME_TRACE_FORMAT", "chrome_trace", "write_chrome_trace"]

CHROME_TRACE_FORMAT = "npumem-chrome-trace"
"""The `format` in `otherData` of an exported file."""
_PID = 1
_BATCH = 4096
"""Entries encoded before each write of `write_chrome_trace`."""


def chrome_trace(trace: Trace) -> dict[str, Any]:
    """The trace as a Chrome trace event object (see the module docstring)."""
    return {
        "traceEvents": list(_chrome_events(trace)),
        "displayTimeUnit": "ns",
        "otherData": _other_data(trace),
    }


def _other_data(trace: Trace) -> dict[str, Any]:
    return {
        "format": CHROME_TRACE_FORMAT,
        "version": 1,
        "pool": trace.pool,
        "config": trace.config,
        "dropped": trace.dropped,
        "discarded": trace.discarded,
    }


def _chrome_events(trace: Trace) -> Iterator[dict[str, Any]]:
    """The entries of `traceEvents`, one at a time, in the order of the file."""
    events = trace.events
    t0 = events[0].time_ns if events else 0
    yield {
        "ph": "M",
        "name": "process_name",
        "pid": _PID,
        "args": {"name": f"npumem {trace.pool}"},
    }
    cores = sorted({e.core for e in events})
    for core in cores:
        yield {
            "ph": "M",
            "name": "thread_name",
            "pid": _PID,
            "tid": core,
            "args": {"name": f"core {core}"},
        }
    live: dict[int, tuple[str, int]] = {}  # handle -> (name, size)
    live_bytes = 0
    for e in events:
        ts = (e.time_ns - t0) / 1e3
        name = e.tag or "(no tag)"
        if e.kind == "alloc":
            live[e.handle] = (name, e.size)
            live_bytes += e.size
            yield _slice("b", e.handle, name, ts, e.core, e.size, e.offset)
        elif e.kind == "free":
            if e.handle in live:
                name, size = live.pop(e.handle)
                live_bytes -= size
                yield _slice("e", e.handle, name, ts, e.core, size, e.offset)
        elif e.kind == "move":
            if e.handle in live:
                name, size = live[e.handle]
                yield _slice("e", e.handle, name, ts, e.core, size, e.aux)
                yield _slice("b", e.handle, name, ts, e.core, size, e.offset)
            yield {
                "ph": "i",
                "s": "p",
                "name": "move",
                "cat": "compaction",
                "pid": _PID,
                "tid": e.core,
                "ts": ts,
                "args": {
                    "from": e.aux,
                    "to": e.offset,
                    "size": e.size,
                    "handle": str(e.handle),
                },
            }
            continue
        else:
            yield {
                "ph": "i",
                "s": "t",
                "name": f"failed allocation ({name})",
                "cat": "failed",
                "pid": _PID,
                "tid": e.core,
                "ts": ts,
                "args": {"size": e.size, "tag": e.tag},
            }
            continue
        yield {
            "ph": "C",
            "name": "bytes live",
            "pid": _PID,
            "ts": ts,
            "args": {"bytes": live_bytes},
        }
    end = (events[-1].time_ns - t0) / 1e3 if events else 0.0
    for handle, (name, size) in live.items():  # still live when the trace ended
        yield _slice("e", handle, name, end, 0, size, None)


def _slice(
    ph: str, handle: int, name: str, ts: float, core: int, size: int, offset: int | None
) -> dict[str, Any]:
    args: dict[str, Any] = {"size": size, "core": core, "handle": str(handle)}
    if offset is not None:
        args["offset"] = offset
    return {
        "ph": ph,
        "cat": name,
        "name": name,
        "id": str(handle),
        "pid": _PID,
        "tid": core,
        "ts": ts,
        "args": args,
    }


def write_chrome_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write `chrome_trace()` of `trace` to `path` (the same text as `fileio.json_text()`
    of it), atomically; returns the path.

    The entries are written as they are made, a batch at a time, so that the memory used does
    not grow with the length of the trace beyond the trace itself and its live blocks (the
    whole object of a trace of a million events takes gigabytes).
    """
    out = path_argument(path, "the output path")
    encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
    with text_writer(out) as f:
        f.write('{"traceEvents":[')
        batch: list[str] = []
        sep = ""
        for entry in _chrome_events(trace):
            batch.append(encode(entry))
            if len(batch) == _BATCH:
                f.write(sep + ",".join(batch))
                sep, batch = ",", []
        if batch:
            f.write(sep + ",".join(batch))
        f.write('],"displayTimeUnit":"ns","otherData":' + encode(_other_data(trace)) + "}\n")
    return out
