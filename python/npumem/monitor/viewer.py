"""`npumem view`: a snapshot or a trace as one self-contained HTML page.

The page needs nothing but a browser: the data, the script and the styles are inside the file,
and it fetches nothing. A trace is drawn as a timeline: every block a rectangle from its
allocation to its free (across) at its addresses (up), coloured by tag, compactions as dashed
red lines and failed allocations as dotted ones. A snapshot is drawn as an address map: rows of
addresses like `npumem.monitor.plot_address_map()`. Both zoom with the mouse wheel and pan
by dragging; hovering a block shows its size, tag, core, handle, times and, when the trace
recorded them (`TraceRecorder(pool, stacks=True)`), the Python stack that allocated it.

Handles are written as text in the page's data, so JavaScript keeps them exact.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, cast

from npumem.fileio import write_text
from npumem.monitor.colors import (
    FREE_COLOR,
    SLAB_CACHE_COLOR,
    UNTRACKED_COLOR,
    tag_color,
)
from npumem.monitor.snapshot import BlockRecord, Extent, Snapshot
from npumem.monitor.trace import Frame, Trace
from npumem.sizes import format_bytes

__all__ = [
    "COMPACTION_GAP_NS",
    "MAX_MARKS",
    "MAX_SHAPES",
    "page_data",
    "render_html",
    "write_view",
]

COMPACTION_GAP_NS = 1_000_000
"""Moves less than this apart (1 ms) belong to one compaction mark."""
MAX_MARKS = 1000
"""Failed-allocation lines, and compaction lines, drawn at most (the subtitle gives the full
counts and says when some are not drawn)."""
MAX_SHAPES = 100_000
"""Blocks (and, in a snapshot, free runs and other extents) the page holds at most: a browser
draws every one on each redraw, and a page of millions of them is hundreds of megabytes that
no browser opens. Beyond it the page keeps the largest ones (in a trace, by size times
lifetime; in a snapshot, by bytes) and its subtitle says how many of how many it shows."""
_COMPACTION_COLOR = "#d62728"
_FAILED_COLOR = "#ff7f0e"
_MAP_ROWS = 128


class _Tags:
    """Tag names by index and their colours (the picture colours)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}

    def of(self, tag: str | None) -> int:
        if tag is None:
            return -1
        if tag not in self.index:
            self.index[tag] = len(self.names)
            self.names.append(tag)
        return self.index[tag]


def _colors(tags: _Tags, extra: list[str]) -> list[str]:
    """Colour table: one per tag, then the colours of `extra` (no tag first)."""
    return [tag_color(t) for t in tags.names] + extra


def _trace_data(trace: Trace) -> dict[str, Any]:
    events = trace.events
    t0 = events[0].time_ns if events else 0
    end = (events[-1].time_ns - t0) / 1e9 if events else 1.0
    tags = _Tags()
    stacks: dict[tuple[Frame, ...], int] = {}
    # The largest MAX_SHAPES blocks by size times lifetime, as (area, order, rect, info) in a
    # heap whose smallest comes first, so that memory stays bounded however long the trace.
    kept: list[tuple[float, int, list[Any], list[Any]]] = []
    order = itertools.count()
    marks: list[dict[str, Any]] = []
    live: dict[
        int, list[Any]
    ] = {}  # handle -> [start, offset, size, tag, core, alloc, stack, from]
    moves: list[tuple[int, int]] = []  # (time_ns, size)
    failed = 0

    def close(handle: int, at: float | None) -> None:
        start, offset, size, tag, core, alloc_t, stack, moved_from = live.pop(handle)
        seq = next(order)
        stop = end if at is None else at
        area = (stop - start) * max(size, 1)
        if len(kept) == MAX_SHAPES and area <= kept[0][0]:
            return
        info = ["b", str(handle), tag, core, size, offset, alloc_t, at, stack, moved_from]
        color = tag  # -1 (no tag) is resolved after the loop, once every tag is known
        rect = [start, stop, offset, offset + max(size, 1), color, -1]
        if len(kept) < MAX_SHAPES:
            heapq.heappush(kept, (area, seq, rect, info))
        else:
            heapq.heapreplace(kept, (area, seq, rect, info))

    for e in events:
        t = (e.time_ns - t0) / 1e9
        if e.kind == "alloc":
            stack = -1 if e.stack is None else stacks.setdefault(e.stack, len(stacks))
            live[e.handle] = [t, e.offset, e.size, tags.of(e.tag), e.core, t, stack, None]
        elif e.kind == "free":
            if e.handle in live:
                close(e.handle, t)
        elif e.kind == "move":
            moves.append((e.time_ns, e.size))
            if e.handle in live:
                old = live[e.handle]
                close(e.handle, t)
                live[e.handle] = [t, e.offset, old[2], old[3], old[4], old[5], old[6], e.aux]
        else:
            failed += 1
            if failed <= MAX_MARKS:
                marks.append(
                    {
                        "x": t,
                        "kind": "failed",
                        "color": _FAILED_COLOR,
                        "text": f"failed allocation at {t:.6f} s: {format_bytes(e.size)} "
                        f"({e.size:,} B), tag {e.tag or '(no tag)'}",
                    }
                )
    for handle in list(live):
        close(handle, None)
    blocks = next(order)  # every block closed, kept or not
    rects, infos = _in_order(kept)
    # No-tag rectangles point one past the tags: the colour table ends with the no-tag colour.
    for r in rects:
        if r[4] < 0:
            r[4] = len(tags.names)
    compaction_marks, compactions = _compaction_marks(moves, t0)
    marks += compaction_marks
    counts = trace.counts()
    legend: list[dict[str, Any]] = [
        {"label": name, "color": tag_color(name)} for name in tags.names
    ]
    if any(r[4] == len(tags.names) for r in rects):
        legend.append({"label": "(no tag)", "color": tag_color(None)})
    legend.append({"label": "compaction (blocks moved)", "color": _COMPACTION_COLOR, "line": True})
    legend.append({"label": "failed allocation", "color": _FAILED_COLOR, "line": True})
    capacity = int(trace.config.get("capacity", 1))
    return {
        "title": f"trace of pool {trace.pool!r}",
        "subtitle": (
            f"{counts['alloc']:,} allocations, {counts['free']:,} frees, {counts['move']:,} "
            f"moves in {compactions:,} compactions, {counts['failed']:,} failed allocations, "
            f"{trace.dropped:,} events dropped"
            + (f", {trace.discarded:,} discarded" if trace.discarded else "")
            + f"; {end:.3f} s; arena "
            f"{format_bytes(capacity)}"
            + _shown(len(rects), blocks, "blocks", "by size times lifetime")
            + _marks_shown(failed, compactions)
        ),
        "x": {"min": 0.0, "max": max(end, 1e-9), "kind": "seconds", "label": "time (seconds)"},
        "y": {"min": 0, "max": capacity, "kind": "bytes", "label": "offset", "down": False},
        "tags": tags.names,
        "colors": _colors(tags, [tag_color(None)]),
        "rects": rects,
        "infos": infos,
        "marks": marks,
        "stacks": [[list(f) for f in s] for s in stacks],
        "legend": legend,
    }


def _in_order(
    kept: list[tuple[float, int, list[Any], list[Any]]],
) -> tuple[list[list[Any]], list[list[Any]]]:
    """The kept rectangles and their details in the order they were made (the page draws
    later ones on top), each rectangle pointing at its details."""
    rects: list[list[Any]] = []
    infos: list[list[Any]] = []
    for _, _, rect, info in sorted(kept, key=lambda k: k[1]):
        rect[5] = len(infos)
        infos.append(info)
        rects.append(rect)
    return rects, infos


def _shown(shown: int, total: int, what: str, by: str) -> str:
    """The subtitle's note when the page holds fewer shapes than the file has."""
    if shown >= total:
        return ""
    return (
        f"; the page shows the {shown:,} largest of the {total:,} {what} ({by}; "
        f"at most {MAX_SHAPES:,})"
    )


def _marks_shown(failed: int, compactions: int) -> str:
    """The subtitle's note when some failed-allocation or compaction lines are not drawn."""
    cut = [
        f"the first {MAX_MARKS:,} {what} lines"
        for what, n in (("failed-allocation", failed), ("compaction", compactions))
        if n > MAX_MARKS
    ]
    return f"; only {' and '.join(cut)} are drawn" if cut else ""


def _compaction_marks(moves: list[tuple[int, int]], t0: int) -> tuple[list[dict[str, Any]], int]:
    """The first `MAX_MARKS` compaction marks (moves less than `COMPACTION_GAP_NS` apart are
    one compaction), and how many compactions there are."""
    marks: list[dict[str, Any]] = []
    group: list[tuple[int, int]] = []
    count = 0
    moves.sort()
    for move in [*moves, None]:
        if group and (move is None or move[0] - group[-1][0] > COMPACTION_GAP_NS):
            count += 1
            if count <= MAX_MARKS:
                t = (group[0][0] - t0) / 1e9
                nbytes = sum(size for _, size in group)
                marks.append(
                    {
                        "x": t,
                        "kind": "compaction",
                        "color": _COMPACTION_COLOR,
                        "text": f"compaction at {t:.6f} s: {len(group):,} blocks moved, "
                        f"{format_bytes(nbytes)}",
                    }
                )
            group = []
        if move is not None:
            group.append(move)
    return marks, count


def _snapshot_data(snap: Snapshot) -> dict[str, Any]:
    chunk = int(snap.config.get("chunk_size", 1 << 21))
    usable = max(snap.usable_capacity, 1)
    row = chunk * math.ceil(math.ceil(usable / chunk) / _MAP_ROWS)
    rows = max(1, math.ceil(usable / row))
    tags = _Tags()
    for b in snap.blocks:
        tags.of(b.tag)
    n = len(tags.names)
    colors = _colors(tags, [tag_color(None), FREE_COLOR, SLAB_CACHE_COLOR, UNTRACKED_COLOR])
    rects: list[list[Any]] = []
    infos: list[list[Any]] = []

    def add(offset: int, length: int, color: int) -> None:
        at, stop = offset, offset + length
        while at < stop:
            r = at // row
            cut = min(stop, (r + 1) * row)
            rects.append([at - r * row, cut - r * row, r, r + 0.9, color, len(infos) - 1])
            at = cut

    # Every extent and block, free ones first (the page draws later ones on top), as
    # (order, bytes, what, item); the largest MAX_SHAPES of them are kept, in that order.
    shapes = itertools.chain(
        ((0, e.length, "free", e) for e in snap.free_runs),
        ((1, e.length, "cached in slabs", e) for e in snap.slab_cached),
        ((2, e.length, "untracked", e) for e in snap.untracked),
        ((3, b.block_bytes, "block", b) for b in snap.blocks),
    )
    total = len(snap.free_runs) + len(snap.slab_cached) + len(snap.untracked) + len(snap.blocks)
    numbered = ((i, *shape) for i, shape in enumerate(shapes))
    if total > MAX_SHAPES:
        kept = sorted(heapq.nlargest(MAX_SHAPES, numbered, key=lambda s: (s[2], -s[0])))
    else:
        kept = list(numbered)
    extent_color = {"free": n + 1, "cached in slabs": n + 2, "untracked": n + 3}
    for _, _, _, what, item in kept:
        if isinstance(item, Extent):
            infos.append(["f", item.offset, item.length, what])
            add(item.offset, item.length, extent_color[what])
            continue
        b = cast(BlockRecord, item)
        tag = tags.of(b.tag)
        infos.append(
            ["s", str(b.handle), tag, b.core, b.nbytes, b.block_bytes, b.offset, b.align, b.pins]
        )
        add(b.offset, b.block_bytes, tag if tag >= 0 else n)
    legend: list[dict[str, Any]] = [
        {"label": name, "color": tag_color(name)} for name in tags.names
    ]
    if any(b.tag is None for b in snap.blocks):
        legend.append({"label": "(no tag)", "color": tag_color(None)})
    for label, extents, color in (
        ("free", snap.free_runs, FREE_COLOR),
        ("cached in slabs (free objects)", snap.slab_cached, SLAB_CACHE_COLOR),
        ("untracked (raw API)", snap.untracked, UNTRACKED_COLOR),
    ):
        if extents:
            legend.append({"label": label, "color": color})
    s = snap.stats
    label = f" ({snap.label})" if snap.label else ""
    return {
        "title": f"snapshot of pool {snap.pool!r}{label}",
        "subtitle": (
            f"{len(snap.blocks):,} blocks, {format_bytes(s.bytes_in_use)} in use, "
            f"{len(snap.free_runs):,} free runs, largest free block "
            f"{format_bytes(s.largest_free_block)}, fragmentation "
            f"{s.external_fragmentation:.1%}; rows of {format_bytes(row)}"
            + _shown(len(kept), total, "blocks and free runs", "by bytes")
        ),
        "x": {"min": 0, "max": row, "kind": "bytes", "label": "offset within the row"},
        "y": {
            "min": 0,
            "max": rows,
            "kind": "rows",
            "label": "row (its first address)",
            "down": True,
            "scale": row,
        },
        "tags": tags.names,
        "colors": colors,
        "rects": rects,
        "infos": infos,
        "marks": [],
        "stacks": [],
        "legend": legend,
    }


def page_data(source: Snapshot | Trace) -> dict[str, Any]:
    """What the page draws, as the JSON object it embeds."""
    return _snapshot_data(source) if isinstance(source, Snapshot) else _trace_data(source)


_SCRIPT_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
"""JSON escapes of the characters that could end or alter the script element holding the
page's data."""

_PLACEHOLDER = re.compile("__TITLE__|__DATA__")
"""The template's placeholders (`assets/viewer.html`)."""


def render_html(source: Snapshot | Trace) -> str:
    """The page for `source` as HTML text."""
    template = resources.files("npumem.monitor").joinpath("assets/viewer.html")
    html = template.read_text(encoding="utf-8")
    data = page_data(source)
    # Inside a script element only text that starts with "<" ("</script", "<!--") changes how
    # the HTML parser reads it: with every "<" (and ">", "&") written as a JSON escape, no
    # data can end the element early or make it swallow the rest of the page.
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).translate(_SCRIPT_ESCAPES)
    title = data["title"].replace("&", "&amp;").replace("<", "&lt;")
    # One pass over the template: a value that holds a placeholder's name stays as it is.
    values = {"__TITLE__": title, "__DATA__": text}
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], html)


def write_view(source: Snapshot | Trace, path: str | os.PathLike[str]) -> Path:
    """Write the page for `source` to `path` (one HTML file, nothing else needed)."""
    return write_text(path, render_html(source))
