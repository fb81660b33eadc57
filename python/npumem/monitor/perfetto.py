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
the header (`format` `npumem-chrome-trace`, `version` 1) and the pool's configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from npumem.fileio import write_json
from npumem.monitor.trace import Trace

__all__ = ["CHROME_TRACE_FORMAT", "chrome_trace", "write_chrome_trace"]

CHROME_TRACE_FORMAT = "npumem-chrome-trace"
"""The `format` in `otherData` of an exported file."""
_PID = 1


def chrome_trace(trace: Trace) -> dict[str, Any]:
    """The trace as a Chrome trace event object (see the module docstring)."""
    events = trace.events
    t0 = events[0].time_ns if events else 0
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": _PID, "args": {"name": f"npumem {trace.pool}"}}
    ]
    cores = sorted({e.core for e in events})
    for core in cores:
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": _PID,
                "tid": core,
                "args": {"name": f"core {core}"},
            }
        )
    live: dict[int, tuple[str, int]] = {}  # handle -> (name, size)
    live_bytes = 0
    for e in events:
        ts = (e.time_ns - t0) / 1e3
        name = e.tag or "(no tag)"
        if e.kind == "alloc":
            live[e.handle] = (name, e.size)
            live_bytes += e.size
            out.append(_slice("b", e.handle, name, ts, e.core, e.size, e.offset))
        elif e.kind == "free":
            if e.handle in live:
                name, size = live.pop(e.handle)
                live_bytes -= size
                out.append(_slice("e", e.handle, name, ts, e.core, size, e.offset))
        elif e.kind == "move":
            if e.handle in live:
                name, size = live[e.handle]
                out.append(_slice("e", e.handle, name, ts, e.core, size, e.aux))
                out.append(_slice("b", e.handle, name, ts, e.core, size, e.offset))
            out.append(
                {
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
            )
            continue
        else:
            out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": f"failed allocation ({name})",
                    "cat": "failed",
                    "pid": _PID,
                    "tid": e.core,
                    "ts": ts,
                    "args": {"size": e.size, "tag": e.tag},
                }
            )
            continue
        out.append(
            {"ph": "C", "name": "bytes live", "pid": _PID, "ts": ts, "args": {"bytes": live_bytes}}
        )
    end = (events[-1].time_ns - t0) / 1e3 if events else 0.0
    for handle, (name, size) in live.items():  # still live when the trace ended
        out.append(_slice("e", handle, name, end, 0, size, None))
    return {
        "traceEvents": out,
        "displayTimeUnit": "ns",
        "otherData": {
            "format": CHROME_TRACE_FORMAT,
            "version": 1,
            "pool": trace.pool,
            "config": trace.config,
            "dropped": trace.dropped,
        },
    }


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
    """Write `chrome_trace()` of `trace` to `path`; returns the path."""
    return write_json(path, chrome_trace(trace))
